"""Test-only node pack that patches a ComfyUI class, as attention-patching packs do (loaded only by the test server).

At import it replaces ``comfy.ldm.modules.attention.CrossAttention.forward`` on the class with a function that scales
the original's output. Dynamo guards no class method, so a compiled artifact traced without this patch passes every
torch guard in a server that has it (and the other way round): the precompiled route must tell them apart by the code
its trace ran (issue 45). No nodes.
"""

from __future__ import annotations

import comfy.ldm.modules.attention as attention

_original = attention.CrossAttention.forward


def forward(self, x, context=None, value=None, mask=None, transformer_options={}):  # noqa: B006 (ComfyUI's signature)
    out = _original(self, x, context=context, value=value, mask=mask, transformer_options=transformer_options)
    return out * 1.25


attention.CrossAttention.forward = forward

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
