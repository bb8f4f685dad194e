"""The process-global torch flags determinism touches: read them all at once (snapshot), put them back (restore).

:func:`snapshot_state` reads every flag into a frozen :class:`TorchGlobalState` without side effects;
:func:`restore_state` writes a snapshot back. TF32 flags: PyTorch >= 2.9 keeps both the legacy flags
(``allow_tf32``, ``float32_matmul_precision``) and new per-backend ``fp32_precision`` values; mixing the two APIs
makes the legacy getters raise. A snapshot therefore records the legacy values where readable (``None`` when they
raise) *and* every per-backend ``fp32_precision`` value (:mod:`core.torch_compat`), and restores the latter last,
so the per-backend state comes back exactly. ``torch.use_deterministic_algorithms`` also flips inductor's
``deterministic`` config, part of the FX-graph cache key: a restore puts the snapshot's value back. No ComfyUI
imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import torch_compat

__all__ = ["TorchGlobalState", "snapshot_state", "restore_state", "set_fp32_precision_values", "FP32_LEAVES"]

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
#: The (backend, op) pairs below the "all" parents: setting each to "ieee" leaves nothing to inherit TF32.
FP32_LEAVES = tuple(p for p in _FP32_PAIRS if p[1] != "all")


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
        """JSON-safe dict; ``fp32_precision`` becomes ``{"cuda.matmul": "ieee", ...}``. The other fields are scalars:
        read directly (``dataclasses.asdict`` deep-copies, and this is read once per model call by the precompiled
        route's key, :func:`core.compile.warm.precompiled.flags_text`)."""
        d = {f.name: getattr(self, f.name) for f in _FIELDS}
        d["fp32_precision"] = dict(self.fp32_precision)
        return d


_FIELDS = dataclasses.fields(TorchGlobalState)


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


def set_fp32_precision_values(values: dict[str, str]) -> None:
    """Set per-backend fp32 precision values ``{"backend.op": value}``, parents first (explicit leaves win)."""
    if not values:
        return
    for backend, op in _FP32_PAIRS:  # parents first, so explicit leaf values win
        key = f"{backend}.{op}"
        if key in values:
            torch_compat.set_fp32_precision(backend, op, values[key])


def snapshot_state(*, load_inductor: bool = False) -> TorchGlobalState:
    """Read all determinism-related global torch flags (no side effects unless ``load_inductor``).

    Args:
        load_inductor: import inductor's config to read ``inductor_deterministic`` even when nothing has loaded
            it yet.
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
        allow_fp16_reduced_precision_reduction=_try(lambda: bool(matmul.allow_fp16_reduced_precision_reduction)),
        allow_fp16_reduced_precision_reduction_split_k=_try(
            lambda: bool(matmul.allow_fp16_reduced_precision_reduction_split_k)
        ),
        allow_bf16_reduced_precision_reduction=_try(lambda: bool(matmul.allow_bf16_reduced_precision_reduction)),
        allow_bf16_reduced_precision_reduction_split_k=_try(
            lambda: bool(matmul.allow_bf16_reduced_precision_reduction_split_k)
        ),
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
    torch.use_deterministic_algorithms(state.deterministic_algorithms, warn_only=state.deterministic_warn_only)
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
    set_fp32_precision_values(dict(state.fp32_precision))
    _set_reduction(
        "allow_fp16_reduced_precision_reduction",
        state.allow_fp16_reduced_precision_reduction,
        state.allow_fp16_reduced_precision_reduction_split_k,
    )
    _set_reduction(
        "allow_bf16_reduced_precision_reduction",
        state.allow_bf16_reduced_precision_reduction,
        state.allow_bf16_reduced_precision_reduction_split_k,
    )
    if state.allow_fp16_accumulation is not None:
        torch.backends.cuda.matmul.allow_fp16_accumulation = state.allow_fp16_accumulation
    if state.fill_uninitialized_memory is not None:
        import torch.utils.deterministic as tud  # noqa: PLC0415

        tud.fill_uninitialized_memory = state.fill_uninitialized_memory
    if torch.get_num_threads() != state.num_threads:
        torch.set_num_threads(state.num_threads)
    if state.inductor_deterministic is not None:
        torch_compat.set_inductor_deterministic(state.inductor_deterministic)
