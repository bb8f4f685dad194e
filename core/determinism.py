"""Scoped, recorded and reversible control of PyTorch's global determinism state.

Everything this module changes is process-global torch state. It is changed only through
:func:`apply_policy` / :func:`deterministic` / :func:`enable_full_determinism`, and every change is
recorded in a :class:`TorchGlobalState` snapshot that :func:`restore_state` puts back.

Sources for the recipe: PyTorch "Reproducibility" notes
(https://pytorch.org/docs/stable/notes/randomness.html), diffusers ``enable_full_determinism``
(``diffusers/utils/testing_utils.py``), and these facts (figures and how to reproduce them in
``docs/measurements.md``):

* fp32 CPU output differs between 1 and 2 threads, so the thread count is part of the contract;
* ``torch.use_deterministic_algorithms`` also flips inductor's ``deterministic`` config
  (``torch/__init__.py``; :func:`core.torch_compat.inductor_deterministic`), which is part of the FX-graph cache key: toggling it makes ``torch.compile``
  miss its cache and recompile;
* ``torch.utils.deterministic.fill_uninitialized_memory`` (default True) NaN-fills ``torch.empty``
  while deterministic algorithms are on, which costs time in proportion to the memory allocated.

TF32 flags: PyTorch >= 2.9 keeps both the legacy flags (``allow_tf32``,
``float32_matmul_precision``) and new per-backend ``fp32_precision`` values; mixing the two APIs
makes the legacy getters raise. A snapshot therefore records the legacy values where readable
(``None`` when they raise) *and* every per-backend ``fp32_precision`` value, and restores the latter
last, so the per-backend state comes back exactly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from . import torch_compat
from .noise import check_seed

__all__ = [
    "CUBLAS_DETERMINISTIC_VALUES",
    "CublasConfigRecord",
    "DeterminismPolicy",
    "DeterminismReport",
    "TorchGlobalState",
    "apply_policy",
    "cublas_config_effective",
    "cublas_config_record",
    "describe_policy",
    "deterministic",
    "enable_full_determinism",
    "ensure_cublas_workspace_config",
    "make_report",
    "restore_state",
    "seed_everything",
    "snapshot_state",
]

#: Values of ``CUBLAS_WORKSPACE_CONFIG`` that PyTorch accepts as deterministic.
CUBLAS_DETERMINISTIC_VALUES = (":4096:8", ":16:8")
# (backend, op) pairs of the per-backend fp32 precision API (torch >= 2.9), parents first.
_FP32_PAIRS = (
    ("generic", "all"),
    ("cuda", "all"),
    ("cuda", "matmul"),
    ("cuda", "conv"),
    ("cuda", "rnn"),
    ("mkldnn", "all"),
    ("mkldnn", "matmul"),
    ("mkldnn", "conv"),
    ("mkldnn", "rnn"),
)
_FP32_LEAVES = tuple(p for p in _FP32_PAIRS if p[1] != "all")


# --------------------------------------------------------------------------- cuBLAS workspace


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
        cuda_started = _cuda_initialized()
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
    return not _cuda_initialized()


def _cuda_initialized() -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - torch builds without CUDA support
        return False


def _cuda_available() -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


# --------------------------------------------------------------------------- global state snapshot


@dataclass(frozen=True)
class TorchGlobalState:
    """Every global torch flag that determinism touches, as read at one moment.

    ``None`` means "not available in this torch build" or, for the legacy TF32 getters, "unreadable
    because legacy and new fp32-precision APIs were mixed". ``fp32_precision`` holds the per-backend
    values of the new API as ``(("cuda.matmul", "ieee"), ...)`` (empty before torch 2.9).
    ``inductor_deterministic`` is reporting-only (read when inductor's config is loaded) and
    is excluded from equality because loading that module is itself a side effect of
    ``torch.use_deterministic_algorithms``.
    """

    deterministic_algorithms: bool
    deterministic_warn_only: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    mkldnn_deterministic: bool | None
    cuda_matmul_allow_tf32: bool | None
    cudnn_allow_tf32: bool | None
    float32_matmul_precision: str | None
    fp32_precision: tuple[tuple[str, str], ...]
    allow_fp16_reduced_precision_reduction: bool | None
    allow_fp16_reduced_precision_reduction_split_k: bool | None
    allow_bf16_reduced_precision_reduction: bool | None
    allow_bf16_reduced_precision_reduction_split_k: bool | None
    allow_fp16_accumulation: bool | None
    fill_uninitialized_memory: bool | None
    num_threads: int
    inductor_deterministic: bool | None = field(default=None, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe dict; ``fp32_precision`` becomes ``{"cuda.matmul": "ieee", ...}``."""
        d = dataclasses.asdict(self)
        d["fp32_precision"] = dict(self.fp32_precision)
        return d


def _try(getter: Any) -> Any:
    try:
        return getter()
    except (AttributeError, RuntimeError):
        return None


def _read_fp32_precision() -> tuple[tuple[str, str], ...]:
    if not torch_compat.has_fp32_precision_api():  # before torch 2.9: no per-backend values to record
        return ()
    out = []
    for backend, op in _FP32_PAIRS:
        value = _try(lambda b=backend, o=op: torch_compat.get_fp32_precision(b, o))
        if value is not None:
            out.append((f"{backend}.{op}", value))
    return tuple(out)


def _set_fp32_precision(values: dict[str, str]) -> None:
    if not values:
        return
    for backend, op in _FP32_PAIRS:  # parents first, so explicit leaf values win
        key = f"{backend}.{op}"
        if key in values:
            torch_compat.set_fp32_precision(backend, op, values[key])


def snapshot_state(*, load_inductor: bool = False) -> TorchGlobalState:
    """Read all determinism-related global torch flags (no side effects unless ``load_inductor``).

    Args:
        load_inductor: import inductor's config (about 1 s the first time) to read
            ``inductor_deterministic`` even when nothing has loaded it yet.
    """
    matmul = torch.backends.cuda.matmul
    fill = None
    with contextlib.suppress(ImportError):
        import torch.utils.deterministic as tud  # noqa: PLC0415

        fill = _try(lambda: bool(tud.fill_uninitialized_memory))
    return TorchGlobalState(
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        mkldnn_deterministic=_try(lambda: bool(torch.backends.mkldnn.deterministic)),
        cuda_matmul_allow_tf32=_try(lambda: bool(matmul.allow_tf32)),
        cudnn_allow_tf32=_try(lambda: bool(torch.backends.cudnn.allow_tf32)),
        float32_matmul_precision=_try(torch.get_float32_matmul_precision),
        fp32_precision=_read_fp32_precision(),
        allow_fp16_reduced_precision_reduction=_try(
            lambda: bool(matmul.allow_fp16_reduced_precision_reduction)),
        allow_fp16_reduced_precision_reduction_split_k=_try(
            lambda: bool(matmul.allow_fp16_reduced_precision_reduction_split_k)),
        allow_bf16_reduced_precision_reduction=_try(
            lambda: bool(matmul.allow_bf16_reduced_precision_reduction)),
        allow_bf16_reduced_precision_reduction_split_k=_try(
            lambda: bool(matmul.allow_bf16_reduced_precision_reduction_split_k)),
        allow_fp16_accumulation=_try(lambda: bool(matmul.allow_fp16_accumulation)),
        fill_uninitialized_memory=fill,
        num_threads=torch.get_num_threads(),
        inductor_deterministic=torch_compat.inductor_deterministic(load=load_inductor),
    )


def _set_reduction(name: str, allow: bool | None, split_k: bool | None) -> None:
    if allow is None:
        return
    value: Any = (allow, split_k) if split_k is not None else allow
    setattr(torch.backends.cuda.matmul, name, value)


def restore_state(state: TorchGlobalState) -> None:
    """Put every flag of ``state`` back (fields that are ``None`` are left alone).

    Order matters for TF32: ``allow_tf32`` first, then ``float32_matmul_precision`` (which overrides
    it), then the exact per-backend ``fp32_precision`` values. ``torch.use_deterministic_algorithms``
    rewrites inductor's ``deterministic`` config; if the snapshot had read a different inductor value, that
    value is written back (:func:`core.torch_compat.set_inductor_deterministic`) so the compile cache key is
    what it was.
    """
    torch.use_deterministic_algorithms(
        state.deterministic_algorithms, warn_only=state.deterministic_warn_only
    )
    torch.backends.cudnn.deterministic = state.cudnn_deterministic
    torch.backends.cudnn.benchmark = state.cudnn_benchmark
    if state.mkldnn_deterministic is not None:
        torch.backends.mkldnn.deterministic = state.mkldnn_deterministic
    if state.cuda_matmul_allow_tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = state.cuda_matmul_allow_tf32
    if state.float32_matmul_precision is not None:
        torch.set_float32_matmul_precision(state.float32_matmul_precision)
    if state.cudnn_allow_tf32 is not None:
        torch.backends.cudnn.allow_tf32 = state.cudnn_allow_tf32
    _set_fp32_precision(dict(state.fp32_precision))
    _set_reduction("allow_fp16_reduced_precision_reduction",
                   state.allow_fp16_reduced_precision_reduction,
                   state.allow_fp16_reduced_precision_reduction_split_k)
    _set_reduction("allow_bf16_reduced_precision_reduction",
                   state.allow_bf16_reduced_precision_reduction,
                   state.allow_bf16_reduced_precision_reduction_split_k)
    if state.allow_fp16_accumulation is not None:
        torch.backends.cuda.matmul.allow_fp16_accumulation = state.allow_fp16_accumulation
    if state.fill_uninitialized_memory is not None:
        import torch.utils.deterministic as tud  # noqa: PLC0415

        tud.fill_uninitialized_memory = state.fill_uninitialized_memory
    if torch.get_num_threads() != state.num_threads:
        torch.set_num_threads(state.num_threads)
    if state.inductor_deterministic is not None:
        torch_compat.set_inductor_deterministic(state.inductor_deterministic)


# --------------------------------------------------------------------------- policy


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
        fill_uninitialized_memory: set ``torch.utils.deterministic.fill_uninitialized_memory``;
            ``None`` keeps the current value (torch's default is True).
    Raises:
        ValueError / TypeError from ``__post_init__`` for a bad ``num_threads`` or ``seed``.
    """

    strict: bool = True
    allow_tf32: bool = False
    num_threads: int | None = None
    seed: int | None = None
    fill_uninitialized_memory: bool | None = None

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
        _set_fp32_precision({f"{b}.{o}": "ieee" for b, o in _FP32_LEAVES})
    matmul = torch.backends.cuda.matmul
    for name in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
                 "allow_fp16_accumulation"):
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
    if _cuda_available():
        torch.cuda.manual_seed_all(seed)


# --------------------------------------------------------------------------- report


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
        return {"applied": dict(self.applied), "not_guaranteed": list(self.not_guaranteed),
                "notes": list(self.notes)}

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


def _cublas_problem() -> str | None:
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


def _policy_limits(policy: DeterminismPolicy) -> list[str]:
    """What ``policy`` cannot guarantee in this process, independent of the flags' current values."""
    ng = []
    if not policy.strict:
        ng.append("warn_only mode: ops without a deterministic implementation only warn (strict=False)")
    if policy.num_threads is None:
        ng.append(f"thread count not pinned (currently {torch.get_num_threads()}); fp32 CPU results "
                  "can differ between thread counts")
    if policy.allow_tf32:
        ng.append("TF32 allowed: GPU fp32 matmul/conv results depend on the GPU generation")
    if _cuda_available():
        problem = _cublas_problem()
        if problem:
            ng.append(problem)
    return ng


def describe_policy(policy: DeterminismPolicy) -> str:
    """Human-readable text of what ``policy`` will set and what it cannot guarantee, WITHOUT applying it.

    For a node that applies the policy later (around sampling); the report of the actual application
    comes from :func:`deterministic` / :func:`make_report`.
    """
    threads = (f"pinned to {policy.num_threads}" if policy.num_threads is not None
               else f"not pinned (currently {torch.get_num_threads()})")
    lines = [
        "Determinism policy (applied around sampling, restored after):",
        f"  torch.use_deterministic_algorithms(True, warn_only={not policy.strict})",
        "  cudnn.deterministic=True, cudnn.benchmark=False, mkldnn.deterministic=True",
        "  TF32: " + ("allowed (float32_matmul_precision=high)" if policy.allow_tf32
                     else "off (float32_matmul_precision=highest, per-backend fp32 precision ieee)"),
        "  fp16/bf16 reduced-precision reductions and fp16 accumulation: off",
        f"  threads: {threads}",
        f"  seed: {policy.seed if policy.seed is not None else 'not set by the policy'}",
        "  fill_uninitialized_memory: " + ("unchanged" if policy.fill_uninitialized_memory is None
                                           else str(policy.fill_uninitialized_memory)),
        f"  CUBLAS_WORKSPACE_CONFIG: {os.environ.get('CUBLAS_WORKSPACE_CONFIG')}",
    ]
    limits = _policy_limits(policy)
    lines.append("Not guaranteed:" if limits else "Not guaranteed: nothing known")
    lines += [f"  - {item}" for item in limits]
    lines.append("Note: switching deterministic algorithms on changes torch.compile's cache key "
                 f"({torch_compat.INDUCTOR_DETERMINISTIC_SETTING}), so compiled graphs recompile once.")
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
    expected = {"deterministic_algorithms": True, "deterministic_warn_only": not policy.strict,
                "cudnn_deterministic": True, "cudnn_benchmark": False,
                "float32_matmul_precision": "high" if policy.allow_tf32 else "highest",
                "cuda_matmul_allow_tf32": policy.allow_tf32, "cudnn_allow_tf32": policy.allow_tf32}
    if policy.num_threads is not None:
        expected["num_threads"] = policy.num_threads
    for key, want in expected.items():
        if applied.get(key) != want:
            ng.append(f"{key} should be {want!r} but reads {applied.get(key)!r}")
    report.notes.append(
        f"torch.use_deterministic_algorithms also sets {torch_compat.INDUCTOR_DETERMINISTIC_SETTING}, which "
        "is part of torch.compile's cache key: toggling it causes cache misses / recompiles")
    if previous is not None and previous.deterministic_algorithms != state.deterministic_algorithms:
        report.notes.append("deterministic algorithms were switched on by this policy: compiled "
                            "graphs built before will recompile")
    if state.fill_uninitialized_memory:
        report.notes.append("fill_uninitialized_memory is on: torch.empty fills memory (slower "
                            "allocation, NaN for floats)")
    report.notes.append("outside this policy: custom attention kernels (sage/flash/xformers), "
                        "torch.compile max-autotune, and noise drawn on a GPU generator")
    return report


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
    saved: dict[str, Any] = {"random": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if _cuda_initialized():
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
