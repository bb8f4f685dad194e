"""The forward path through a QKV fusion made by :mod:`core.optimize.qkv`: ``(q, k, v)`` from one matmul where the
fusion is live and the call allows it, the separate projections otherwise, every path counted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .qkv import _STATS_ATTR, _bias, _drop_stale, _live, _record, qkv_stats

__all__ = ["fused_project"]


def _forward_intercepted(mod: nn.Module) -> str:
    """Why calling F.linear on ``mod``'s weight would not equal ``mod(x)`` ('' when it would)."""
    if mod._forward_hooks or mod._forward_pre_hooks:
        return "projection has forward hooks"
    # Duck-typed ComfyUI ops: weights cast / LoRA-patched at forward time (lowvram).
    if getattr(mod, "comfy_cast_weights", False):
        return "projection casts its weights at forward time"
    if getattr(mod, "weight_function", None) or getattr(mod, "bias_function", None):
        return "projection patches its weights at forward time"
    return ""


def _mismatch(t: Tensor, w: Tensor) -> str:
    if t.dtype != w.dtype or t.device != w.device:
        return f"input {t.dtype}/{t.device} != fused weight {w.dtype}/{w.device}"
    return ""


def fused_project(
    attn: nn.Module, x: Tensor, context: Tensor | None = None, value: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Compute ``(q, k, v)`` for ``attn`` like ComfyUI's ``CrossAttention.forward`` does, using the fusion.

    ``x``: ``[..., K_q]``; ``context`` (default ``x``) and ``value`` (default ``context``): ``[..., K_kv]``.
    Returns tensors ``[..., N_q]``, ``[..., N_k]``, ``[..., N_v]`` in ``x``'s dtype.

    Paths (recorded in :func:`qkv_stats` / ``FusedQKV.stats``, never silent):

    * ``"qkv"``: ``context`` and ``value`` are None and the module is q/k/v fused: one matmul, the
      results are non-contiguous slices (like diffusers' ``FusedAttnProcessor2_0``).
    * ``"kv"``: ``value`` is None (k/v fused, or q/k/v fused with a ``context``): k, v from one matmul,
      q from ``attn.to_q(x)``.
    * ``"separate"``: fusion not live (see :func:`is_fused`), the input dtype/device differs from the
      fused weight, a projection has forward hooks / casts or patches weights at forward time,
      ``value`` is given, or grad mode is on while projection weights require grad (the fused tensors
      are detached, so gradients would not reach the Parameters). Calls the three modules;
      ``stats.last_reason`` says why. Inference (``inference_mode``/``no_grad``, or weights with
      ``requires_grad=False`` as ComfyUI loads them) takes the fused paths.

    Inside a ``torch.compile`` region (``torch.compiler.is_compiling()``) the storage-liveness check
    and the counters are skipped, because neither is traceable (storage pointers are not, and
    mutating an int counter would force a recompile per call): the compiled code trusts the record.
    Call :func:`release_stale_fusions_` eagerly before each compiled run; dropping a stale record
    changes what Dynamo guarded on, so the next compiled call retraces onto the separate path.

    Bit parity with the separate projections is measured, not assumed (module docstring): fp32 on CPU
    is bit-equal; bf16 is not at large in_features, so treat fusion as part of the output fingerprint.
    """
    compiling = torch.compiler.is_compiling()
    stats = attn.__dict__.get(_STATS_ATTR) if compiling else qkv_stats(attn)
    rec = _record(attn)
    qn, kn, vn = (rec.q_name, rec.k_name, rec.v_name) if rec is not None else ("to_q", "to_k", "to_v")
    stale = rec is not None and not compiling and not _live(attn, rec)
    if stale:
        _drop_stale(attn)
        rec = None
    mq, mk, mv = getattr(attn, qn), getattr(attn, kn), getattr(attn, vn)
    ctx = x if context is None else context

    reason = ""
    if rec is None:
        reason = "fusion no longer live (projection storage replaced)" if stale else "not fused"
    elif value is not None:
        reason = "separate value tensor given"
    elif torch.is_grad_enabled() and any(
        t is not None and t.requires_grad
        for n in rec.names
        for t in (getattr(attn, n).weight, _bias(getattr(attn, n)))
    ):
        reason = "grad mode on and projection weights require grad (fused tensors are detached)"
    else:
        for name in rec.names:
            reason = _forward_intercepted(getattr(attn, name))
            if reason:
                break
    if not reason and rec is not None and rec.weight is not None:
        use_qkv = rec.kind == "qkv" and context is None
        reason = _mismatch(x if use_qkv else ctx, rec.weight)
        if not reason:
            if use_qkv:
                out = F.linear(x, rec.weight, rec.bias)
                q_out, k_out, v_out = out.split(rec.splits, dim=-1)
                if not compiling:
                    stats.fused_calls += 1
                    stats.last_path, stats.last_reason = "qkv", ""
                return q_out, k_out, v_out
            nq = rec.splits[0] if rec.kind == "qkv" else 0
            w_kv = rec.weight[nq:] if nq else rec.weight
            b_kv = None if rec.bias is None else (rec.bias[nq:] if nq else rec.bias)
            q_out = mq(x)
            kv = F.linear(ctx, w_kv, b_kv)
            k_out, v_out = kv.split(rec.splits[-2:], dim=-1)
            if not compiling:
                stats.kv_fused_calls += 1
                stats.last_path, stats.last_reason = "kv", ""
            return q_out, k_out, v_out

    q_out = mq(x)
    k_out = mk(ctx)
    v_out = mv(ctx if value is None else value)
    if not compiling:
        stats.unfused_calls += 1
        stats.last_path, stats.last_reason = "separate", reason
    return q_out, k_out, v_out
