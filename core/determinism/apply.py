"""Apply a determinism policy to PyTorch's global state: scoped and restored (:func:`deterministic`), or for good.

Everything this module changes is process-global torch state, changed only through :func:`apply_policy` /
:func:`deterministic` / :func:`enable_full_determinism`; every change is recorded in a
:class:`~core.determinism.torch_state.TorchGlobalState` snapshot that
:func:`~core.determinism.torch_state.restore_state` puts back.
The policy and its report live in :mod:`core.determinism.policy`, the snapshot in :mod:`core.determinism.torch_state`,
``CUBLAS_WORKSPACE_CONFIG`` in :mod:`core.determinism.cublas`. Facts behind the recipe (figures and how to reproduce
them in ``docs/measurements.md``): fp32 CPU output differs between 1 and 2 threads, so the thread count is part of
the contract; ``torch.use_deterministic_algorithms`` also flips inductor's ``deterministic`` config, part of the
FX-graph cache key (toggling it recompiles); ``fill_uninitialized_memory`` (torch's default True) NaN-fills
``torch.empty`` while deterministic algorithms are on, at a cost proportional to the memory allocated: the policy's
default switches it off for the run (``DeterminismPolicy.fill_uninitialized_memory``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from .. import torch_compat
from .cublas import ensure_cublas_workspace_config
from .noise import check_seed
from .policy import DeterminismPolicy, DeterminismReport, make_report
from .torch_state import FP32_LEAVES, TorchGlobalState, restore_state, set_fp32_precision_values, snapshot_state

__all__ = ["apply_policy", "deterministic", "enable_full_determinism", "seed_everything"]


def apply_policy(policy: DeterminismPolicy) -> TorchGlobalState:
    """Apply ``policy`` to the global torch state and return the state *before* the change.

    Sets: deterministic algorithms (warn-only unless strict), ``cudnn.deterministic=True``,
    ``cudnn.benchmark=False``, ``mkldnn.deterministic=True``, TF32 per ``allow_tf32``,
    fp16/bf16 reduced-precision reductions and fp16 accumulation off, optionally the thread
    count, ``fill_uninitialized_memory`` and the seeds. Pass the returned state to
    :func:`restore_state` to undo (seeded RNG state is not part of it; :func:`deterministic` restores it).
    """
    previous = snapshot_state()
    torch.use_deterministic_algorithms(True, warn_only=not policy.strict)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    with contextlib.suppress(AttributeError, RuntimeError):
        torch.backends.mkldnn.deterministic = True
    tf32 = policy.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    if not tf32 and torch_compat.has_fp32_precision_api():  # nothing may inherit TF32 from a parent setting
        set_fp32_precision_values({f"{b}.{o}": "ieee" for b, o in FP32_LEAVES})
    matmul = torch.backends.cuda.matmul
    for name in (
        "allow_fp16_reduced_precision_reduction",
        "allow_bf16_reduced_precision_reduction",
        "allow_fp16_accumulation",
    ):
        with contextlib.suppress(AttributeError, RuntimeError):
            setattr(matmul, name, False)
    if policy.fill_uninitialized_memory is not None:
        import torch.utils.deterministic as tud  # noqa: PLC0415

        tud.fill_uninitialized_memory = policy.fill_uninitialized_memory
    if policy.num_threads is not None:
        torch.set_num_threads(policy.num_threads)
    if policy.seed is not None:
        seed_everything(policy.seed)
    return previous


def seed_everything(seed: int) -> None:
    """Seed Python ``random``, NumPy's global RNG and torch (CPU and, if available, all CUDA devices).

    NumPy's legacy seeder only takes 32 bits, so it gets ``seed % 2**32``.
    Raises: ``TypeError``/``ValueError`` unless ``0 <= seed <= 2**64 - 1``.
    """
    seed = check_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # CPU default generator, plus CUDA/MPS/XPU lazily
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


@contextlib.contextmanager
def deterministic(policy: DeterminismPolicy | None = None) -> Iterator[DeterminismReport]:
    """Apply ``policy`` (default ``DeterminismPolicy()``), yield its report, restore everything on exit.

    Restores the flags (:func:`restore_state`) even when the body raises. When ``policy.seed`` is
    given, the Python/NumPy/torch(/CUDA) RNG states are saved first and restored on exit too.
    """
    policy = policy or DeterminismPolicy()
    rng = _save_rng() if policy.seed is not None else None
    previous = apply_policy(policy)
    try:
        yield make_report(policy, previous)
    finally:
        restore_state(previous)
        if rng is not None:
            _restore_rng(rng)


def _save_rng() -> dict[str, Any]:
    saved: dict[str, Any] = {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_initialized():
        saved["cuda"] = torch.cuda.get_rng_state_all()
    return saved


def _restore_rng(saved: dict[str, Any]) -> None:
    random.setstate(saved["random"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    if "cuda" in saved:
        torch.cuda.set_rng_state_all(saved["cuda"])


def enable_full_determinism(seed: int = 0, strict: bool = True) -> DeterminismReport:
    """One call for library users (diffusers-style): apply a full policy for the rest of the process.

    Not restored. Also calls :func:`ensure_cublas_workspace_config` (effective only before CUDA
    starts) and pins the current thread count so it is recorded as part of the contract.

    Returns:
        the :class:`DeterminismReport` of the applied policy.
    """
    ensure_cublas_workspace_config()
    policy = DeterminismPolicy(strict=strict, seed=seed, num_threads=torch.get_num_threads())
    previous = apply_policy(policy)
    return make_report(policy, previous)
