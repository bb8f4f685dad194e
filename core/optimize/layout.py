"""channels_last memory format for 4-D (conv) weights, in place and reversible.

Same conversion as ``Module.to(memory_format=torch.channels_last)`` (what ComfyUI's
``--force-channels-last`` does), restricted to parameters and done per parameter so the Parameter
objects keep their identity (``.data`` is replaced). Values are unchanged; only strides change.

Measured on CPU (``tests/core/test_optimize_layout.py``, figures in ``docs/measurements.md``): **not**
bit-equal (conv and GroupNorm pick different kernels), run-to-run bit-equal. So channels_last belongs in
the output fingerprint. Convert before compiling: changed strides change Dynamo guards.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["to_channels_last_", "to_contiguous_", "is_channels_last", "as_channels_last"]


def _four_d_params(module: nn.Module) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for p in module.parameters():
        if p.dim() == 4 and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _convert(module: nn.Module, fmt: torch.memory_format) -> int:
    n = 0
    with torch.no_grad():
        for p in _four_d_params(module):
            if p.is_contiguous(memory_format=fmt):
                continue
            with torch.inference_mode(p.is_inference()):
                p.data = p.data.contiguous(memory_format=fmt)
            n += 1
    return n


def to_channels_last_(module: nn.Module) -> int:
    """Convert every 4-D parameter of ``module`` (conv weights ``[out, in, kh, kw]``) to channels_last, in place.

    Returns how many parameters were actually re-laid-out (0 on a second call: idempotent; tensors that
    are already channels_last-contiguous, e.g. 1x1 kernels with in=1, are not counted). Buffers and
    non-4-D parameters are untouched. Raises nothing for modules without convs (returns 0).
    """
    return _convert(module, torch.channels_last)


def to_contiguous_(module: nn.Module) -> int:
    """Undo :func:`to_channels_last_`: make every 4-D parameter C-contiguous again; returns the count changed."""
    return _convert(module, torch.contiguous_format)


def is_channels_last(module: nn.Module) -> bool:
    """True when ``module`` has at least one 4-D parameter and every 4-D parameter is channels_last-contiguous."""
    params = _four_d_params(module)
    return bool(params) and all(p.is_contiguous(memory_format=torch.channels_last) for p in params)


def as_channels_last(x: Tensor) -> Tensor:
    """Return a 4-D tensor ``[B, C, H, W]`` in channels_last format (a copy unless already so); other ranks unchanged.

    A channels_last model fed a contiguous input is also not bit-equal to the contiguous model, so
    callers converting the model usually convert the latent too.
    """
    if x.dim() != 4:
        return x
    return x.contiguous(memory_format=torch.channels_last)
