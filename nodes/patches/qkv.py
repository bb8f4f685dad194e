"""Optimize Model's ``qkv_fusion``: object patches that swap each ComfyUI ``CrossAttention`` for a module using fused
q/k/v projections, fused at ``ON_PRE_RUN``.

Key ``steadfast.qkv`` (object patches + ``CallbacksMP.ON_PRE_RUN``). The fused weight lives on the original module
(:func:`core.optimize.qkv.fuse_qkv_`); the q/k/v weights become views into it, so no memory is added.
"""

from __future__ import annotations

from typing import Any

import torch

import comfy.ldm.modules.attention as comfy_attention
from comfy.patcher_extension import CallbacksMP

from ...core.optimize import qkv, qkv_project
from ...core.optimize.plan import StepReport
from .dynamic_vram import NOT_APPLIED_DYNAMIC, is_dynamic
from .options import steadfast_options

__all__ = ["KEY_QKV", "FusedQKVCrossAttention", "fused_attention_modules", "qkv_counters", "add_qkv_fusion"]

KEY_QKV = "steadfast.qkv"


class FusedQKVCrossAttention(torch.nn.Module):
    """Drop-in for ComfyUI's ``CrossAttention`` that projects q/k/v with one fused matmul.

    It shares the original's ``to_q/to_k/to_v/to_out`` submodules (so state-dict keys, LoRA key
    paths and ModelPatcher weight patches are unchanged) and reads the fused weight that
    :func:`core.optimize.qkv.fuse_qkv_` keeps on the original (the q/k/v weights are views into it,
    so no memory is added). Input/output: ``x`` [B, N, C] -> [B, N, C], same as the original.
    """

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.to_q, self.to_k, self.to_v, self.to_out = inner.to_q, inner.to_k, inner.to_v, inner.to_out
        self.heads = inner.heads
        self.attn_precision = getattr(inner, "attn_precision", None)
        object.__setattr__(self, "inner", inner)  # not a registered child: no duplicate parameters

    def forward(self, x, context=None, value=None, mask=None, transformer_options=None):
        if transformer_options is None:
            transformer_options = {}
        q, k, v = qkv_project.fused_project(self.inner, x, context, value)
        if mask is None:
            out = comfy_attention.optimized_attention(
                q, k, v, self.heads, attn_precision=self.attn_precision, transformer_options=transformer_options
            )
        else:
            out = comfy_attention.optimized_attention_masked(
                q, k, v, self.heads, mask, attn_precision=self.attn_precision, transformer_options=transformer_options
            )
        return self.to_out(out)


def fused_attention_modules(model) -> list[torch.nn.Module]:
    """The attention modules that ``model``'s (a clone's) QKV-fusion object patches route through fusion."""
    return [p.inner for p in model.object_patches.values() if isinstance(p, FusedQKVCrossAttention)]


def qkv_counters(model) -> dict[str, Any]:
    """Fusion state of ``model``: modules patched, how many are live-fused now, and the cumulative
    projection-path counters of :func:`core.optimize.qkv.qkv_stats` (``qkv`` / ``kv`` / ``separate`` calls;
    calls inside a torch.compile region are not counted). ``{"modules": 0, ...}`` without fusion."""
    mods = fused_attention_modules(model)
    stats = [qkv.qkv_stats(m) for m in mods]
    reasons = sorted({s.last_reason for s in stats if s.last_path == "separate" and s.last_reason})
    return {
        "modules": len(mods),
        "live": sum(qkv.is_fused(m) for m in mods),
        "qkv": sum(s.fused_calls for s in stats),
        "kv": sum(s.kv_fused_calls for s in stats),
        "separate": sum(s.unfused_calls for s in stats),
        "separate_reasons": reasons,
    }


def _original_attention(model, name: str) -> torch.nn.Module:
    """The ComfyUI ``CrossAttention`` at ``diffusion_model.<name>``, seen through object patches.

    While another clone of the same model is loaded, its object patches (our fused wrappers) sit in
    the shared module tree; ``get_model_object`` returns the original from the shared backup, and a
    wrapper carried by this clone itself (Optimize applied twice) is unwrapped.
    """
    mod = model.get_model_object(f"diffusion_model.{name}")
    return mod.inner if isinstance(mod, FusedQKVCrossAttention) else mod


def _fusable_paths(model) -> list[tuple[str, torch.nn.Module]]:
    root = model.get_model_object("diffusion_model")
    names = [
        name
        for name, mod in root.named_modules()
        if type(mod).__name__ in ("CrossAttention", FusedQKVCrossAttention.__name__)
    ]
    found = []
    for name in names:
        mod = _original_attention(model, name)
        if type(mod).__name__ == "CrossAttention" and qkv.find_fusable_attention(mod)[:1] == [("", mod)]:
            found.append((name, mod))
    return found


def add_qkv_fusion(model) -> StepReport:
    """Fuse q/k/v projections of every ComfyUI ``CrossAttention`` of ``model`` (a clone).

    Fusion happens at ``ON_PRE_RUN``, after LoRA/weight patches are applied, and is re-done if weights were replaced
    since. Under Dynamic VRAM nothing is patched (``fused_project`` takes the separate path whenever
    ``comfy_cast_weights`` is set): the clone's ``SteadfastOptions.qkv_fusion`` says so.

    Args:
        model: a ComfyUI ``ModelPatcher`` clone.
    Returns:
        a "qkv_fusion" :class:`StepReport`: ``details["modules"]`` the number of attention modules patched (0 means
        the architecture has none, e.g. Flux, whose attention already uses a fused ``qkv`` Linear), their paths
        under ``diffusion_model`` in ``modules``; not applied under Dynamic VRAM; one report line.
    """
    if is_dynamic(model):  # fused_project takes the separate path whenever comfy_cast_weights is set
        steadfast_options(model).qkv_fusion = NOT_APPLIED_DYNAMIC
        return StepReport(
            "qkv_fusion",
            False,
            note=NOT_APPLIED_DYNAMIC,
            lines=[
                (
                    f"qkv_fusion: {NOT_APPLIED_DYNAMIC} (weights are cast per call; compile, or start ComfyUI "
                    "with --disable-dynamic-vram, to fuse)"
                )
            ],
        )
    found = _fusable_paths(model)
    for name, mod in found:
        model.add_object_patch(f"diffusion_model.{name}", FusedQKVCrossAttention(mod))
    modules = [m for _, m in found]

    def fuse_before_run(patcher):
        for m in modules:
            qkv.fuse_qkv_(m)

    model.remove_callbacks_with_key(CallbacksMP.ON_PRE_RUN, KEY_QKV)
    model.add_callback_with_key(CallbacksMP.ON_PRE_RUN, KEY_QKV, fuse_before_run)
    # in-place weight updates keep the q/k/v views (and compiled graphs' parameters) alive under LoRA
    model.weight_inplace_update = True
    steadfast_options(model).qkv_fusion = len(found)
    n = len(found)
    return StepReport(
        "qkv_fusion",
        bool(n),
        [name for name, _ in found],
        {"modules": n},
        lines=[
            f"qkv_fusion: {n} attention modules fused"
            if n
            else "qkv_fusion: nothing to fuse (this architecture has no separate q/k/v projections)"
        ],
    )
