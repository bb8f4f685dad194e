"""Optimize Model's ``quantize``: object patches that swap each chosen Linear for a ``QuantizedLinear``.

:class:`core.optimize.quantize.QuantizedLinear` registers the original weight/bias Parameters (LoRA patches land on
them, the shared model is never modified) and runs a torchao-quantized copy built at ``ON_PRE_RUN``, i.e. after
weight patches: a LoRA is quantized with the weight. The copies are dropped at ``ON_DETACH`` (model unloaded) and
rebuilt on the next run. Key: ``steadfast.quantize`` (the key table is in :mod:`.model_patches`).
"""
from __future__ import annotations

from comfy.patcher_extension import CallbacksMP

from ..core.optimize import quantize as qz
from .model_patches import FusedQKVCrossAttention, steadfast_options

KEY_QUANT = "steadfast.quantize"


def add_quantize(model, mode: str) -> qz.Choice:
    """Quantize the Linears of ``model``'s (a clone's) diffusion model with ``mode`` (:data:`qz.MODES`).

    The q/k/v projections of attention modules fused by :func:`add_qkv_fusion` are skipped (the fused matmul
    does not run them). Returns the choice (layers quantized, skipped with reasons). Imports torchao."""
    qz.require_torchao()  # "pip install torchao" before anything is patched
    root = model.get_model_object("diffusion_model")
    fused = {k[len("diffusion_model."):] for k, p in model.object_patches.items()
             if isinstance(p, FusedQKVCrossAttention)}
    choice = qz.choose_linears(root)
    paths, skipped = [], dict(choice.skipped)
    for path in choice.paths:
        parent, _, leaf = path.rpartition(".")
        if parent in fused and leaf in ("to_q", "to_k", "to_v"):
            skipped["fused by qkv_fusion"] = skipped.get("fused by qkv_fusion", 0) + 1
            continue
        mod = model.get_model_object(f"diffusion_model.{path}")  # this clone's view (another clone may be loaded)
        source = mod.source if isinstance(mod, qz.QuantizedLinear) else mod
        model.add_object_patch(f"diffusion_model.{path}", qz.QuantizedLinear(source, mode))
        paths.append(path)
    layers = [model.object_patches[f"diffusion_model.{p}"] for p in paths]

    def build(patcher):
        dtype = getattr(patcher.model, "manual_cast_dtype", None)
        for q in layers:
            q.refresh_(device=patcher.load_device, dtype=dtype, token=patcher.patches_uuid)

    def release(patcher, unpatch_all):
        for q in layers:
            q.release_()

    for kind, fn in ((CallbacksMP.ON_PRE_RUN, build), (CallbacksMP.ON_DETACH, release)):
        model.remove_callbacks_with_key(kind, KEY_QUANT)
        model.add_callback_with_key(kind, KEY_QUANT, fn)
    steadfast_options(model)["quantize"] = {"mode": mode, "layers": len(paths), "torchao": qz.torchao_version()}
    return qz.Choice(tuple(paths), skipped)
