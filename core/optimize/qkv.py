"""Zero-copy fused Q/K/V projections for attention modules with separate ``to_q``/``to_k``/``to_v`` Linears.

Technique credit: diffusers ``Attention.fuse_projections`` / ``fuse_qkv_projections`` (one ``Linear(K, 3N)``
instead of three ``Linear(K, N)``; for cross-attention only K and V are fused because Q reads a different
input). diffusers *adds* ``to_qkv``/``to_kv`` layers next to the originals (more parameters:
``docs/measurements.md``). Here the fused weight is built once and the existing ``to_q.weight``/``to_k.weight``/... are
re-pointed at slices of it, so:

* no extra memory is kept (the old separate storages are released),
* ``state_dict()`` keys and values are unchanged (the fused tensors live in a plain private attribute,
  not a Parameter or buffer),
* in-place weight updates (e.g. ``param.data.copy_(...)``, as ComfyUI's ``weight_inplace_update`` does)
  are seen by the fused path too, because both are the same memory.

Any operation that gives a projection new storage (``module.to(other_dtype)``, assigning a new Parameter with
``setattr``) silently breaks the sharing; :func:`is_fused` detects that by checking storage pointers, and
:func:`core.optimize.qkv_project.fused_project` then falls back to the separate projections and records that it did.

Parity (measured on CPU by ``tests/core/test_optimize_qkv.py``, figures in ``docs/measurements.md``):
fp32 fused == unfused bit-for-bit; bf16 at large in_features is not (hardware-dependent). Fusion belongs in the
fingerprint.
The projection itself (the forward path through the fusion) is :mod:`core.optimize.qkv_project`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "FusedQKV",
    "FusionStats",
    "NotFusableError",
    "find_fusable_attention",
    "fuse_qkv_",
    "unfuse_qkv_",
    "is_fused",
    "qkv_stats",
    "fuse_all_qkv_",
    "unfuse_all_qkv_",
    "release_stale_fusions_",
]

_FUSED_ATTR = "_steadfast_fused_qkv"
_STATS_ATTR = "_steadfast_qkv_stats"


class NotFusableError(ValueError):
    """Raised by :func:`fuse_qkv_` when the module's projections cannot be fused (message says why)."""


@dataclass
class FusionStats:
    """Which projection path :func:`core.optimize.qkv_project.fused_project` took, per module (never silent).

    ``fused_calls``: q, k, v from one matmul. ``kv_fused_calls``: k, v from one matmul, q separately.
    ``unfused_calls``: three separate projections; ``last_reason`` says why.
    ``last_path`` is ``"qkv"``, ``"kv"`` or ``"separate"`` (``""`` before the first call).
    """

    fused_calls: int = 0
    kv_fused_calls: int = 0
    unfused_calls: int = 0
    last_path: str = ""
    last_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FusedQKV:
    """Record of one fused attention module, stored on it as a private (non-Parameter) attribute.

    ``kind`` is ``"qkv"`` (self-attention: ``weight`` = cat(q, k, v) along dim 0, shape
    ``[Nq + Nk + Nv, K]``) or ``"kv"`` (cross-attention: cat(k, v), q untouched). ``bias`` is the fused
    bias (``None`` when the projections have none). ``splits`` are the output widths in fusion order,
    ``names`` the child attribute names in fusion order. ``stats`` is shared with :func:`qkv_stats`.
    """

    kind: str
    names: tuple[str, ...]
    q_name: str
    k_name: str
    v_name: str
    splits: tuple[int, ...]
    weight: Tensor | None
    bias: Tensor | None
    stats: FusionStats = field(default_factory=FusionStats)

    @property
    def nbytes(self) -> int:
        """Bytes of the fused storage (equal to the sum of the separate projections it replaced)."""
        n = 0 if self.weight is None else self.weight.numel() * self.weight.element_size()
        if self.bias is not None:
            n += self.bias.numel() * self.bias.element_size()
        return n


def _linear_like(mod: Any) -> bool:
    w = getattr(mod, "weight", None)
    return isinstance(mod, nn.Module) and isinstance(w, Tensor) and w.dim() == 2


def _children(attn: nn.Module, q: str, k: str, v: str) -> tuple[nn.Module, nn.Module, nn.Module]:
    mods = tuple(getattr(attn, n, None) for n in (q, k, v))
    for name, mod in zip((q, k, v), mods):
        if not _linear_like(mod):
            raise NotFusableError(
                f"{type(attn).__name__}.{name} is not a Linear-like module with a 2-D .weight"
                f" (got {type(mod).__name__})"
            )
    return mods  # type: ignore[return-value]


def _bias(mod: nn.Module) -> Tensor | None:
    b = getattr(mod, "bias", None)
    return b if isinstance(b, Tensor) else None


def _check_group(attn: nn.Module, names: tuple[str, ...], mods: tuple[nn.Module, ...]) -> None:
    """Raise NotFusableError unless the given projections can share one fused weight."""
    ws = [m.weight for m in mods]
    if len({w.shape[1] for w in ws}) != 1:
        raise NotFusableError(f"{type(attn).__name__}: in_features differ among {names}: {[w.shape[1] for w in ws]}")
    if len({(w.dtype, w.device) for w in ws}) != 1:
        raise NotFusableError(
            f"{type(attn).__name__}: dtype/device differ among {names}: {[(w.dtype, str(w.device)) for w in ws]}"
        )
    if len({id(w) for w in ws}) != len(ws):
        raise NotFusableError(f"{type(attn).__name__}: {names} share a Parameter object (tied weights)")
    biases = [_bias(m) for m in mods]
    if len({b is None for b in biases}) != 1:
        raise NotFusableError(
            f"{type(attn).__name__}: bias present on only some of {names}; fusing would change the math"
        )
    if biases[0] is not None and len({(b.dtype, b.device) for b in biases}) != 1:  # type: ignore[union-attr]
        raise NotFusableError(f"{type(attn).__name__}: bias dtype/device differ among {names}")


def find_fusable_attention(
    root: nn.Module, q: str = "to_q", k: str = "to_k", v: str = "to_v"
) -> list[tuple[str, nn.Module]]:
    """Find attention modules under ``root`` (itself included) whose q/k/v projections can be fused.

    A module qualifies when its children ``q``, ``k``, ``v`` are modules with a 2-D ``.weight``
    (``nn.Linear`` and its subclasses such as ComfyUI's ``comfy.ops`` Linears), K and V share
    ``in_features``, dtype and device, and bias is present on all or none of them.

    Returns ``[(dotted_name, module), ...]`` in ``named_modules()`` order (``""`` for ``root``).
    Never raises for non-qualifying modules; it just skips them.
    """
    found: list[tuple[str, nn.Module]] = []
    for name, mod in root.named_modules():
        try:
            mq, mk, mv = _children(mod, q, k, v)
            _check_group(mod, (k, v), (mk, mv))
        except NotFusableError:
            continue
        found.append((name, mod))
    return found


def qkv_stats(attn: nn.Module) -> FusionStats:
    """Return (creating if needed) the :class:`FusionStats` counters of ``attn``; survives unfuse/refuse."""
    stats = attn.__dict__.get(_STATS_ATTR)
    if stats is None:
        stats = FusionStats()
        attn.__dict__[_STATS_ATTR] = stats
    return stats


def _record(attn: nn.Module) -> FusedQKV | None:
    return attn.__dict__.get(_FUSED_ATTR)


def _shares(t: Tensor | None, fused: Tensor | None, offset: int, shape: tuple[int, ...]) -> bool:
    if t is None or fused is None:
        return False
    return (
        t.device == fused.device
        and t.dtype == fused.dtype
        and t.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
        and t.storage_offset() == offset
        and tuple(t.shape) == shape
        and t.is_contiguous()
    )


def _live(attn: nn.Module, rec: FusedQKV) -> bool:
    if rec.weight is None:
        return False
    k_in = rec.weight.shape[1]
    row = rec.weight.storage_offset()
    brow = rec.bias.storage_offset() if rec.bias is not None else 0
    for name, n_out in zip(rec.names, rec.splits):
        mod = getattr(attn, name, None)
        if not _linear_like(mod):
            return False
        if not _shares(mod.weight, rec.weight, row, (n_out, k_in)):
            return False
        b = _bias(mod)
        if (b is None) != (rec.bias is None):
            return False
        if b is not None and not _shares(b, rec.bias, brow, (n_out,)):
            return False
        row += n_out * k_in
        brow += n_out
    return True


def is_fused(attn: nn.Module) -> bool:
    """True when ``attn`` was fused *and* its projection weights (and biases) are still views of the fused storage.

    Returns False for a never-fused module, after :func:`unfuse_qkv_`, and after anything that gave a
    projection new storage (``module.to(other_dtype)``, ``setattr(lin, "weight", nn.Parameter(...))``,
    replacing a child module). Checks storage pointers, offsets, shapes, dtype and device; no side effects.
    """
    rec = _record(attn)
    return rec is not None and _live(attn, rec)


def _drop_stale(attn: nn.Module) -> None:
    rec = _record(attn)
    if rec is not None and not _live(attn, rec):
        # The projections no longer use the fused storage: release it so it holds no memory.
        del attn.__dict__[_FUSED_ATTR]


def fuse_qkv_(
    attn: nn.Module,
    *,
    self_attention: bool | None = None,
    q: str = "to_q",
    k: str = "to_k",
    v: str = "to_v",
) -> FusedQKV:
    """Fuse the q/k/v projection weights of ``attn`` into one storage, in place, with zero extra memory.

    ``self_attention``: ``None`` = auto (fuse q, k, v when all three share ``in_features``, otherwise
    k, v only); ``True`` = require q/k/v fusion (raises if in_features differ); ``False`` = fuse k, v only.
    The fused weight is ``cat(weights, dim=0)`` with shape ``[sum(out_features), in_features]`` in the
    projections' dtype/device; each projection's ``weight`` (and ``bias``) Parameter keeps its identity,
    ``requires_grad`` and values but its ``.data`` becomes a contiguous slice of the fused tensor, so
    the previous separate storages are freed. ``state_dict()`` is unchanged (keys and values).

    Idempotent: fusing a module whose fusion is still live returns the existing record (unless a
    different ``self_attention`` is requested, in which case it is unfused and re-fused). A stale
    record (see :func:`is_fused`) is discarded and the module is fused afresh from its current weights.

    Raises :class:`NotFusableError` (a ``ValueError``) when a child is missing / not Linear-like, the
    fused group's in_features, dtype or device differ, bias is present on only some, or two
    projections share one Parameter. Source: diffusers ``Attention.fuse_projections``.
    """
    mq, mk, mv = _children(attn, q, k, v)
    qkv_ok = mq.weight.shape[1] == mk.weight.shape[1] == mv.weight.shape[1]
    if self_attention is True and not qkv_ok:
        raise NotFusableError(
            f"{type(attn).__name__}: self_attention=True but in_features differ "
            f"(q {mq.weight.shape[1]}, k {mk.weight.shape[1]}, v {mv.weight.shape[1]})"
        )
    kind = "qkv" if (qkv_ok if self_attention is None else self_attention) else "kv"

    _drop_stale(attn)
    rec = _record(attn)
    if rec is not None:
        if rec.kind == kind and rec.names[-2:] == (k, v) and rec.q_name == q:
            return rec
        unfuse_qkv_(attn)

    names = (q, k, v) if kind == "qkv" else (k, v)
    mods = (mq, mk, mv) if kind == "qkv" else (mk, mv)
    _check_group(attn, names, mods)
    weights = [m.weight for m in mods]
    biases = [_bias(m) for m in mods]
    splits = tuple(int(w.shape[0]) for w in weights)

    # Keep the "inference tensor" property of the originals (params built under inference_mode are);
    # a normal Parameter may point at an inference tensor, but not the other way round.
    inference = any(t.is_inference() for t in weights + biases if t is not None)
    with torch.inference_mode(inference), torch.no_grad():
        fused_w = torch.cat([w.detach() for w in weights], dim=0)
        fused_b = None
        if biases[0] is not None:
            fused_b = torch.cat([b.detach() for b in biases], dim=0)  # type: ignore[union-attr]
        for w, part in zip(weights, fused_w.split(splits, dim=0)):
            w.data = part
        if fused_b is not None:
            for b, part in zip(biases, fused_b.split(splits, dim=0)):
                b.data = part  # type: ignore[union-attr]

    rec = FusedQKV(
        kind=kind,
        names=names,
        q_name=q,
        k_name=k,
        v_name=v,
        splits=splits,
        weight=fused_w,
        bias=fused_b,
        stats=qkv_stats(attn),
    )
    attn.__dict__[_FUSED_ATTR] = rec
    return rec


def unfuse_qkv_(attn: nn.Module) -> bool:
    """Give each fused projection its own storage again (bit-exact copy of the current values).

    Returns True when a live fusion was undone, False when ``attn`` was not (or no longer) fused; in both
    cases the private record is removed. The :func:`qkv_stats` counters are kept.
    """
    rec = _record(attn)
    if rec is None:
        return False
    live = _live(attn, rec)
    if live:
        with torch.no_grad():
            for name in rec.names:
                mod = getattr(attn, name)
                for t in (mod.weight, _bias(mod)):
                    if t is not None:
                        with torch.inference_mode(t.is_inference()):
                            t.data = t.data.clone(memory_format=torch.contiguous_format)
    del attn.__dict__[_FUSED_ATTR]
    return live


def fuse_all_qkv_(root: nn.Module, q: str = "to_q", k: str = "to_k", v: str = "to_v") -> dict[str, FusedQKV]:
    """Fuse every module :func:`find_fusable_attention` finds under ``root`` (auto self/cross choice).

    Returns ``{dotted_name: FusedQKV}``. Modules whose q cannot join k/v get k/v fusion only.
    """
    return {name: fuse_qkv_(mod, q=q, k=k, v=v) for name, mod in find_fusable_attention(root, q, k, v)}


def unfuse_all_qkv_(root: nn.Module) -> int:
    """Undo :func:`fuse_qkv_` on every module under ``root``; returns how many live fusions were undone."""
    return sum(unfuse_qkv_(mod) for mod in root.modules() if _record(mod) is not None)


def release_stale_fusions_(root: nn.Module) -> int:
    """Drop the record of every module under ``root`` whose fusion is no longer live (see :func:`is_fused`).

    Frees the stale fused storage and makes later :func:`core.optimize.qkv_project.fused_project` calls (compiled ones
    included, which cannot check liveness themselves) take the separate path. Returns how many were dropped.
    Call it eagerly, e.g. before each compiled run, after anything may have replaced weights.
    """
    n = 0
    for mod in root.modules():
        rec = _record(mod)
        if rec is not None and not _live(mod, rec):
            del mod.__dict__[_FUSED_ATTR]
            n += 1
    return n
