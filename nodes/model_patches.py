"""Old import path of the MODEL patches, kept only for the modules another branch of issue 27 rewrites.

The patches live in :mod:`nodes.patches`, one concern a module. This re-exports the four names that
``nodes/sampler_node.py`` and ``nodes/identity.py`` still import from here; delete it once they import from
``nodes.patches`` (the merge of issue 27's branches).
"""
from __future__ import annotations

from .patches.compile import compile_state
from .patches.dynamic_vram import comfy_compiler_state
from .patches.options import steadfast_options
from .patches.qkv import qkv_counters

__all__ = ["comfy_compiler_state", "compile_state", "qkv_counters", "steadfast_options"]
