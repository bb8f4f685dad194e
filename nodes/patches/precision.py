"""Optimize Model's ``precision``: ComfyUI's own compute-dtype patch (the ModelComputeDtype node's), on the clone."""

from __future__ import annotations

import torch

from ...core.optimize import precision
from ...core.optimize.plan import StepReport

__all__ = ["compute_dtype", "set_precision", "add_precision"]


def compute_dtype(model) -> torch.dtype:
    """The dtype ``model``'s (a ModelPatcher's) diffusion model computes in: ``manual_cast_dtype`` as this clone sees
    it (object patches included: ComfyUI's ``set_model_compute_dtype``), else the weight dtype. For fp8 weights
    (``--fp8_e4m3fn-unet``, fp8 checkpoints) this is the cast dtype (bf16/fp16/fp32), never fp8."""
    cast = model.get_model_object("manual_cast_dtype")
    return cast if isinstance(cast, torch.dtype) else model.model.get_dtype()


def set_precision(model, name: str) -> torch.dtype | None:
    """Set the compute dtype of ``model`` (a clone) for precision ``name`` ("model": leave it; returns None) with
    ``ModelPatcher.set_model_compute_dtype``. Raises ``ValueError`` for an unknown name or a dtype the load device
    lacks (:func:`core.optimize.precision.precision_dtype`)."""
    dtype = precision.precision_dtype(name, model.load_device)
    if dtype is not None:
        model.set_model_compute_dtype(dtype)  # the run record reads it back as fingerprint.dtype
    return dtype


def add_precision(model, name: str) -> StepReport:
    """Set precision ``name`` on ``model`` (a clone; :func:`set_precision`) and report the dtype it computes in.

    Args:
        model: a ComfyUI ``ModelPatcher`` clone.
        name: a precision of :data:`core.optimize.precision.PRECISIONS` ("model": as loaded).
    Returns:
        a "precision" :class:`StepReport`: applied unless ``name`` is "model"; ``details["dtype"]`` the compute
        dtype as text (e.g. ``"torch.bfloat16"``), for a set precision one report line.
    Raises:
        ValueError: unknown name, or a dtype the load device lacks.
    """
    dtype = set_precision(model, name) or compute_dtype(model)  # ValueError for a dtype the device lacks
    step = StepReport(
        "precision",
        name != "model",
        ["diffusion_model"] if name != "model" else [],
        {"name": name, "dtype": str(dtype)},
    )
    if name != "model":
        step.lines.append(
            f"precision: {name}, compute {dtype} (weights {model.model.get_dtype()}; ComfyUI's "
            "set_model_compute_dtype)" + ("" if name == "fp32" else ": changes bits vs fp32")
        )
    return step
