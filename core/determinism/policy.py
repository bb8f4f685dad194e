"""What a determinism policy asks for, and what it cannot promise: the policy, its description and its report.

A :class:`DeterminismPolicy` is a frozen value (nodes carry it on a model or pipeline); :mod:`core.determinism.apply`
applies it. :func:`describe_policy` says what it will set without applying anything; :func:`make_report` reads the
flags back after applying and lists what is still not guaranteed (thread count not pinned, TF32 allowed,
``CUBLAS_WORKSPACE_CONFIG`` problems) and side effects (the compile-cache key change). Sources: PyTorch
"Reproducibility" notes, diffusers ``enable_full_determinism``; figures in ``docs/measurements.md``. No ComfyUI
imports; changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import torch_compat
from .cublas import cublas_problem
from .noise import check_seed
from .torch_state import TorchGlobalState, snapshot_state

__all__ = ["DeterminismPolicy", "DeterminismReport", "describe_policy", "make_report"]


@dataclass(frozen=True)
class DeterminismPolicy:
    """What :func:`apply_policy` sets.

    Attributes:
        strict: ``use_deterministic_algorithms(True, warn_only=not strict)``; strict raises on ops
            without a deterministic implementation, non-strict only warns.
        allow_tf32: allow TF32 for CUDA matmul and cuDNN (``float32_matmul_precision`` "high");
            False sets "highest" and every per-backend fp32 precision to "ieee".
        num_threads: pin ``torch.set_num_threads``; ``None`` keeps (and records) the current count.
        seed: when given, :func:`seed_everything` is called with it.
        fill_uninitialized_memory: set ``torch.utils.deterministic.fill_uninitialized_memory`` (restored after);
            ``None`` keeps the current value. Default False (torch's own default is True): filling changes only
            what reads of uninitialised memory see, costs a memset per ``torch.empty``, and ComfyUI's
            non-blocking preview copies (``latent_preview.py``: ``.to("cpu", non_blocking=True)`` then ``.numpy()``)
            could show fill bytes. Deterministic ops never read uninitialised memory.
    Raises:
        ValueError / TypeError from ``__post_init__`` for a bad ``num_threads`` or ``seed``.
    """

    strict: bool = True
    allow_tf32: bool = False
    num_threads: int | None = None
    seed: int | None = None
    fill_uninitialized_memory: bool | None = False

    def __post_init__(self) -> None:
        if self.num_threads is not None:
            if isinstance(self.num_threads, bool) or not isinstance(self.num_threads, int):
                raise TypeError("num_threads must be an int or None")
            if self.num_threads < 1:
                raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.seed is not None:
            check_seed(self.seed)

    def as_dict(self) -> dict[str, Any]:
        """The policy's fields as a plain JSON-safe dict."""
        return dataclasses.asdict(self)


@dataclass
class DeterminismReport:
    """What a policy set, and what it cannot promise.

    ``applied``: the flags as read back after applying (``TorchGlobalState.as_dict()`` plus
    ``num_threads_pinned``, ``seed`` and ``CUBLAS_WORKSPACE_CONFIG``). ``not_guaranteed``: short
    human-readable reasons the run may still not be bit-reproducible. ``notes``: side effects worth
    knowing (e.g. the compile-cache key change).
    """

    applied: dict[str, Any]
    not_guaranteed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict with keys ``applied``, ``not_guaranteed`` and ``notes``."""
        return {"applied": dict(self.applied), "not_guaranteed": list(self.not_guaranteed), "notes": list(self.notes)}

    def as_text(self) -> str:
        """Multi-line human summary."""
        lines = ["Determinism applied:"]
        for key, value in self.applied.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
            lines.append(f"  {key}: {value}")
        lines.append("Not guaranteed:" if self.not_guaranteed else "Not guaranteed: nothing known")
        lines += [f"  - {item}" for item in self.not_guaranteed]
        if self.notes:
            lines.append("Notes:")
            lines += [f"  - {item}" for item in self.notes]
        return "\n".join(lines)


def _policy_limits(policy: DeterminismPolicy) -> list[str]:
    """What ``policy`` cannot guarantee in this process, independent of the flags' current values."""
    ng = []
    if not policy.strict:
        ng.append("warn_only mode: ops without a deterministic implementation only warn (strict=False)")
    if policy.num_threads is None:
        ng.append(
            f"thread count not pinned (currently {torch.get_num_threads()}); fp32 CPU results "
            "can differ between thread counts"
        )
    if policy.allow_tf32:
        ng.append("TF32 allowed: GPU fp32 matmul/conv results depend on the GPU generation")
    if torch.cuda.is_available():
        problem = cublas_problem()
        if problem:
            ng.append(problem)
    return ng


def describe_policy(policy: DeterminismPolicy) -> str:
    """Human-readable text of what ``policy`` will set and what it cannot guarantee, WITHOUT applying it.

    For a node that applies the policy later (around sampling); the report of the actual application
    comes from :func:`deterministic` / :func:`make_report`.
    """
    threads = (
        f"pinned to {policy.num_threads}"
        if policy.num_threads is not None
        else f"not pinned (currently {torch.get_num_threads()})"
    )
    lines = [
        "Determinism policy (applied around sampling, restored after):",
        f"  torch.use_deterministic_algorithms(True, warn_only={not policy.strict})",
        "  cudnn.deterministic=True, cudnn.benchmark=False, mkldnn.deterministic=True",
        "  TF32: "
        + (
            "allowed (float32_matmul_precision=high)"
            if policy.allow_tf32
            else "off (float32_matmul_precision=highest, per-backend fp32 precision ieee)"
        )
        + ("" if torch.cuda.is_available() else "; no effect here (no CUDA device)"),
        "  fp16/bf16 reduced-precision reductions and fp16 accumulation: off",
        f"  threads: {threads}",
        f"  seed: {policy.seed if policy.seed is not None else 'not set by the policy'}",
        "  fill_uninitialized_memory: "
        + ("unchanged" if policy.fill_uninitialized_memory is None else str(policy.fill_uninitialized_memory)),
        f"  CUBLAS_WORKSPACE_CONFIG: {os.environ.get('CUBLAS_WORKSPACE_CONFIG')}",
    ]
    limits = _policy_limits(policy)
    lines.append("Not guaranteed:" if limits else "Not guaranteed: nothing known")
    lines += [f"  - {item}" for item in limits]
    lines.append(
        "Note: switching deterministic algorithms on changes torch.compile's cache key "
        f"({torch_compat.INDUCTOR_DETERMINISTIC_SETTING}), so compiled graphs recompile once."
    )
    return "\n".join(lines)


def make_report(policy: DeterminismPolicy, previous: TorchGlobalState | None = None) -> DeterminismReport:
    """Describe the *current* global state against ``policy`` (call it after :func:`apply_policy`).

    ``previous`` (the state before applying) lets the report note a change of the inductor
    deterministic flag, which changes ``torch.compile`` cache keys.
    """
    state = snapshot_state()
    applied = state.as_dict()
    applied["num_threads_pinned"] = policy.num_threads is not None
    applied["seed"] = policy.seed
    applied["CUBLAS_WORKSPACE_CONFIG"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    report = DeterminismReport(applied=applied, not_guaranteed=_policy_limits(policy))
    ng = report.not_guaranteed
    expected = {
        "deterministic_algorithms": True,
        "deterministic_warn_only": not policy.strict,
        "cudnn_deterministic": True,
        "cudnn_benchmark": False,
        "float32_matmul_precision": "high" if policy.allow_tf32 else "highest",
        "cuda_matmul_allow_tf32": policy.allow_tf32,
        "cudnn_allow_tf32": policy.allow_tf32,
    }
    if policy.num_threads is not None:
        expected["num_threads"] = policy.num_threads
    for key, want in expected.items():
        if applied.get(key) != want:
            ng.append(f"{key} should be {want!r} but reads {applied.get(key)!r}")
    report.notes.append(
        f"torch.use_deterministic_algorithms also sets {torch_compat.INDUCTOR_DETERMINISTIC_SETTING}, which "
        "is part of torch.compile's cache key: toggling it causes cache misses / recompiles"
    )
    if previous is not None and previous.deterministic_algorithms != state.deterministic_algorithms:
        report.notes.append(
            "deterministic algorithms were switched on by this policy: compiled graphs built before will recompile"
        )
    if state.fill_uninitialized_memory:
        report.notes.append(
            "fill_uninitialized_memory is on: torch.empty fills memory (slower allocation, NaN for floats)"
        )
    report.notes.append(
        "outside this policy: custom attention kernels (sage/flash/xformers), "
        "torch.compile max-autotune, and noise drawn on a GPU generator"
    )
    return report
