"""``CUBLAS_WORKSPACE_CONFIG``: set it before CUDA starts, and judge whether it took effect in this process.

cuBLAS reads the variable once, when PyTorch first creates its workspace; only ``:4096:8`` and ``:16:8`` make its
matmuls deterministic (PyTorch "Reproducibility" notes). The pack's ``__init__`` calls
:func:`ensure_cublas_workspace_config` at import, the earliest point it can act (docs/architecture.md, "Process-wide
changes"). The only global change here is that environment variable, never unset. No ComfyUI imports.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = ["CUBLAS_DETERMINISTIC_VALUES", "CublasConfigRecord", "ensure_cublas_workspace_config",
           "cublas_config_record", "cublas_config_effective", "cublas_problem"]

#: Values of ``CUBLAS_WORKSPACE_CONFIG`` that PyTorch accepts as deterministic.
CUBLAS_DETERMINISTIC_VALUES = (":4096:8", ":16:8")


@dataclass(frozen=True)
class CublasConfigRecord:
    """What :func:`ensure_cublas_workspace_config` found and did.

    ``value``: the variable after the call (``None`` if unset); ``set_by_steadfast``: this pack set it;
    ``cuda_initialized_before``: CUDA (hence possibly cuBLAS) was already initialised at that time,
    in which case the setting may be too late for this process.
    """

    value: str | None
    set_by_steadfast: bool
    cuda_initialized_before: bool


_cublas_record: CublasConfigRecord | None = None


def ensure_cublas_workspace_config(value: str = ":4096:8") -> bool:
    """Set ``CUBLAS_WORKSPACE_CONFIG`` to ``value`` if it is unset, and record the circumstances.

    cuBLAS reads the variable when PyTorch first creates its workspace, so it must be set before
    CUDA/cuBLAS starts (ComfyUI's ``--deterministic`` does the same in ``main.py``). An existing value
    is never overwritten. The first call's record is kept (later calls do not replace it, because
    the first one is the earliest point this pack could act).

    Returns:
        :func:`cublas_config_effective` after the call.
    Raises:
        ValueError: ``value`` is not one of :data:`CUBLAS_DETERMINISTIC_VALUES`.
    """
    global _cublas_record
    if value not in CUBLAS_DETERMINISTIC_VALUES:
        raise ValueError(f"value must be one of {CUBLAS_DETERMINISTIC_VALUES}, got {value!r}")
    if _cublas_record is None:
        cuda_started = torch.cuda.is_initialized()
        set_now = "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        if set_now:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = value
        _cublas_record = CublasConfigRecord(
            value=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            set_by_steadfast=set_now,
            cuda_initialized_before=cuda_started,
        )
    return cublas_config_effective()


def cublas_config_record() -> CublasConfigRecord | None:
    """The record of the first :func:`ensure_cublas_workspace_config` call, or ``None``."""
    return _cublas_record


def cublas_config_effective() -> bool:
    """Whether ``CUBLAS_WORKSPACE_CONFIG`` holds a deterministic value that was in place before CUDA started.

    Uses the record of :func:`ensure_cublas_workspace_config` when there is one, otherwise judges from
    the current state (value now, CUDA initialised now). This is a best-effort check: PyTorch does not
    expose whether cuBLAS handles already exist, so "CUDA initialised" stands in for "cuBLAS started".
    """
    current = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if current not in CUBLAS_DETERMINISTIC_VALUES:
        return False
    if _cublas_record is not None and _cublas_record.value == current:
        return not _cublas_record.cuda_initialized_before
    return not torch.cuda.is_initialized()


def cublas_problem() -> str | None:
    """Why ``CUBLAS_WORKSPACE_CONFIG`` may not make cuBLAS deterministic in this process (a sentence), or None."""
    value = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if value is None:
        return "CUBLAS_WORKSPACE_CONFIG is not set: cuBLAS matmuls may be nondeterministic"
    if value not in CUBLAS_DETERMINISTIC_VALUES:
        return (f"CUBLAS_WORKSPACE_CONFIG={value!r} is not a deterministic value "
                f"({' or '.join(CUBLAS_DETERMINISTIC_VALUES)})")
    if not cublas_config_effective():
        return ("CUBLAS_WORKSPACE_CONFIG set after CUDA/cuBLAS started: it may not take effect "
                "in this process")
    return None
