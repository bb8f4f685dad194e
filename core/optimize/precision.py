"""The compute dtype of a diffusion model as an explicit choice: fp32, bf16 or fp16, or "model" (as loaded).

Optimize Model hands the dtype to ComfyUI's ``ModelPatcher.set_model_compute_dtype`` (the official
``ModelComputeDtype`` node's mechanism: weights stay as stored and are cast per op). A compute dtype other than
the weights' changes output bits (measured: ``tests/comfy/test_knob_precision.py``, docs/benchmarks.md); the run
record names it in ``fingerprint.dtype`` (``"torch.float32 (compute torch.bfloat16)"``). No ComfyUI imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

__all__ = ["PRECISIONS", "precision_dtype"]

PRECISIONS: Mapping[str, torch.dtype | None] = MappingProxyType(
    {"model": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
)


def precision_dtype(name: str, device: torch.device | str | None = None) -> torch.dtype | None:
    """The compute dtype for precision ``name`` (None for "model": as loaded). Raises ``ValueError`` for an
    unknown name, or for bf16 on a CUDA device without bf16 (fp16 and bf16 run on CPU, often slower than fp32)."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
    dtype = PRECISIONS[name]
    dev = torch.device(device) if device is not None else None
    if dtype is torch.bfloat16 and dev is not None and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision bf16: {torch.cuda.get_device_name(dev)} has no bf16 support; pick fp16 or fp32")
    return dtype
