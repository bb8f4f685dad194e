"""``CUBLAS_WORKSPACE_CONFIG`` and ``CUBLASLT_WORKSPACE_SIZE``: set them before cuBLAS starts, and judge whether the
first took effect in this process.

cuBLAS reads the variable once, when PyTorch first creates its workspace (``getChosenWorkspaceSize`` in
``aten/src/ATen/cuda/CublasHandlePool.cpp``: at the first cuBLAS call, not when CUDA is initialised); only ``:4096:8``
and ``:16:8`` make its matmuls deterministic (PyTorch "Reproducibility" notes). ComfyUI initialises CUDA before custom
nodes load, so "CUDA initialised" says nothing about cuBLAS: the judgement is whether a cuBLAS call can have run,
i.e. whether any CUDA tensor was ever allocated (:func:`cuda_memory_ever_allocated`; a cuBLAS call needs operands
in CUDA memory, and its workspace comes from the same allocator). The pack's ``__init__`` calls
:func:`ensure_cublas_workspace_config` at import, the earliest point it can act (docs/architecture.md, "Process-wide
changes"). ``CUBLASLT_WORKSPACE_SIZE`` (KiB; PyTorch reads it when it first sizes the cuBLASLt workspace) is set
beside it to :data:`CUBLASLT_WORKSPACE_KIB`, vLLM's recipe for Hopper and Blackwell (``batch_invariant.py``: with a
1 KiB workspace cuBLASLt cannot pick a split-K kernel, whose reduction order depends on the problem size, so a
matmul's bits do not depend on the batch); without a GPU both variables are inert. The only global changes here are
those two environment variables, each set only when unset and never unset. No ComfyUI imports.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = [
    "CUBLAS_DETERMINISTIC_VALUES",
    "CUBLASLT_WORKSPACE_KIB",
    "CublasConfigRecord",
    "ensure_cublas_workspace_config",
    "cublas_config_record",
    "cublas_env",
    "cublas_config_effective",
    "cublas_problem",
    "cuda_memory_ever_allocated",
]

#: Values of ``CUBLAS_WORKSPACE_CONFIG`` that PyTorch accepts as deterministic.
CUBLAS_DETERMINISTIC_VALUES = (":4096:8", ":16:8")

#: ``CUBLASLT_WORKSPACE_SIZE`` (KiB) set when unset: vLLM's batch-invariance recipe for SM90/SM100 (no split-K).
CUBLASLT_WORKSPACE_KIB = "1"


@dataclass(frozen=True)
class CublasConfigRecord:
    """What :func:`ensure_cublas_workspace_config` found and did.

    ``value``: the variable after the call (``None`` if unset); ``set_by_steadfast``: this pack set it;
    ``cuda_initialized_before``: CUDA was already initialised at that time (ComfyUI does so before loading custom
    nodes; informative only); ``cublas_may_have_run``: CUDA memory had been allocated by then, so a cuBLAS call may
    have read the variable before it was set (the setting may be too late for this process); ``lt_workspace_size``:
    ``CUBLASLT_WORKSPACE_SIZE`` after the call (KiB, ``None`` if unset); ``lt_set_by_steadfast``: this pack set it.
    """

    value: str | None
    set_by_steadfast: bool
    cuda_initialized_before: bool
    cublas_may_have_run: bool = False
    lt_workspace_size: str | None = None
    lt_set_by_steadfast: bool = False


def cuda_memory_ever_allocated() -> bool:
    """Whether any CUDA tensor was ever allocated in this process (PyTorch's allocator statistics, every device).

    False without CUDA or before CUDA is initialised (nothing can have been allocated); reading the statistics
    never initialises CUDA. A cuBLAS call needs its operands in CUDA memory, so False means no cuBLAS call ran.
    """
    try:
        if not torch.cuda.is_initialized():
            return False
        for device in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(device)
            if (
                stats.get("allocated_bytes.all.allocated", 0)
                or stats.get("allocated_bytes.all.peak", 0)
                or torch.cuda.max_memory_allocated(device)
            ):
                return True
    except (RuntimeError, AssertionError):  # a build or allocator without statistics: assume the worst
        return True
    return False


_cublas_record: CublasConfigRecord | None = None


def ensure_cublas_workspace_config(value: str = ":4096:8") -> bool:
    """Set ``CUBLAS_WORKSPACE_CONFIG`` to ``value`` and ``CUBLASLT_WORKSPACE_SIZE`` to :data:`CUBLASLT_WORKSPACE_KIB`
    where unset, and record the circumstances.

    cuBLAS reads the variables when PyTorch first creates its workspaces, so they must be set before
    CUDA/cuBLAS starts (ComfyUI's ``--deterministic`` does the same for the first in ``main.py``). An existing value
    is never overwritten (an operator's choice stands, and is recorded). The first call's record is kept (later
    calls do not replace it, because the first one is the earliest point this pack could act).

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
        blas_ran = cuda_memory_ever_allocated()
        set_now = "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        if set_now:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = value
        lt_now = "CUBLASLT_WORKSPACE_SIZE" not in os.environ
        if lt_now:
            os.environ["CUBLASLT_WORKSPACE_SIZE"] = CUBLASLT_WORKSPACE_KIB
        _cublas_record = CublasConfigRecord(
            value=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            set_by_steadfast=set_now,
            cuda_initialized_before=cuda_started,
            cublas_may_have_run=blas_ran,
            lt_workspace_size=os.environ.get("CUBLASLT_WORKSPACE_SIZE"),
            lt_set_by_steadfast=lt_now,
        )
    return cublas_config_effective()


def cublas_env() -> dict[str, str | None]:
    """The two variables as this process has them now: ``{"CUBLAS_WORKSPACE_CONFIG": ..., "CUBLASLT_WORKSPACE_SIZE":
    ...}`` (None where unset), for the environment fingerprint."""
    return {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE")}


def cublas_config_record() -> CublasConfigRecord | None:
    """The record of the first :func:`ensure_cublas_workspace_config` call, or ``None``."""
    return _cublas_record


def cublas_config_effective() -> bool:
    """Whether ``CUBLAS_WORKSPACE_CONFIG`` holds a deterministic value that was in place before cuBLAS started.

    Uses the record of :func:`ensure_cublas_workspace_config` when there is one (was CUDA memory allocated before
    it was set?), otherwise judges from the current state (:func:`cuda_memory_ever_allocated` now). PyTorch does
    not expose whether cuBLAS handles exist; "CUDA memory was allocated" is the closest public sign, and errs on
    the side of a warning (memory allocated without any matmul also counts).
    """
    current = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if current not in CUBLAS_DETERMINISTIC_VALUES:
        return False
    if _cublas_record is not None and _cublas_record.value == current:
        return not _cublas_record.cublas_may_have_run
    return not cuda_memory_ever_allocated()


def cublas_problem() -> str | None:
    """Why ``CUBLAS_WORKSPACE_CONFIG`` may not make cuBLAS deterministic in this process (a sentence), or None."""
    value = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if value is None:
        return "CUBLAS_WORKSPACE_CONFIG is not set: cuBLAS matmuls may be nondeterministic"
    if value not in CUBLAS_DETERMINISTIC_VALUES:
        return (
            f"CUBLAS_WORKSPACE_CONFIG={value!r} is not a deterministic value "
            f"({' or '.join(CUBLAS_DETERMINISTIC_VALUES)})"
        )
    if not cublas_config_effective():
        return (
            "CUBLAS_WORKSPACE_CONFIG set after CUDA memory was first allocated: a cuBLAS call may have run "
            "before, and the setting may not take effect in this process"
        )
    return None
