"""Optimize Model's ``quantize``: object patches that swap each chosen Linear for a ``QuantizedLinear``.

:class:`core.optimize.quantize.QuantizedLinear` registers the original weight/bias Parameters (LoRA patches land on
them, the shared model is never modified) and runs a torchao-quantized copy built at ``ON_PRE_RUN``, i.e. after
weight patches: a LoRA is quantized with the weight. The copies are dropped at ``ON_DETACH`` (model unloaded) and
rebuilt on the next run. Key: ``steadfast.quantize`` (the key table is in :mod:`nodes.patches`). When ComfyUI did
not apply a layer's weight patches (partial lowvram load, Dynamic VRAM) the run is refused at ``ON_PRE_RUN``
(:func:`unpatched_keys`) instead of quantizing weights without their LoRA; Optimize Model refuses quantize under
Dynamic VRAM up front.
"""

from __future__ import annotations

from comfy.patcher_extension import CallbacksMP

from ...core.optimize import quantize as qz
from ...core.optimize.plan import StepReport
from .dynamic_vram import is_dynamic
from .options import steadfast_options
from .qkv import FusedQKVCrossAttention

__all__ = ["KEY_QUANT", "unpatched_keys", "add_quantize"]

KEY_QUANT = "steadfast.quantize"


def unpatched_keys(patcher, paths: list[str], layers: list) -> list[str]:
    """The weight-patch keys (``diffusion_model.<path>.weight`` / ``.bias``) of quantized ``layers`` that ``patcher``
    has patches for but did not apply to the layer's Parameters.

    ComfyUI applies a patch to the Parameter only when it loads the module fully (``ModelPatcher.load`` marks it
    ``comfy_patched_weights`` and keeps the original in ``patcher.backup``); a module without
    ``comfy_cast_weights`` (a :class:`~core.optimize.quantize.QuantizedLinear`) that does not fit in legacy
    lowvram, or any such module under Dynamic VRAM (``ModelPatcherDynamic.load``'s plain branch:
    ``weight.to(device)``), keeps unpatched weights, and a quantized copy built from them would drop the LoRA
    silently."""
    patches = getattr(patcher, "patches", None) or {}
    backup = getattr(patcher, "backup", None) or {}
    missing = []
    for path, layer in zip(paths, layers):
        # loaded fully by ComfyUI: the wrapper, or the source Linear it adopts Parameters from (a copy with the same
        # patches loaded before: ComfyUI swaps object patches without patching again), carries the flag
        if getattr(layer, "comfy_patched_weights", False) or getattr(
            getattr(layer, "source", None), "comfy_patched_weights", False
        ):
            continue
        keys = (f"diffusion_model.{path}.weight", f"diffusion_model.{path}.bias")
        missing += [k for k in keys if k in patches and k not in backup]  # a backup: the patch was written
    return missing


def add_quantize(model, mode: str, device) -> StepReport:
    """Quantize the Linears of ``model``'s (a clone's) diffusion model with ``mode`` (:data:`qz.MODES`).

    The q/k/v projections of attention modules fused by :func:`nodes.patches.qkv.add_qkv_fusion` are skipped (the
    fused matmul does not run them). Imports torchao.

    Args:
        model: a ComfyUI ``ModelPatcher`` clone, not a Dynamic VRAM one.
        mode: a torchao mode of :data:`core.optimize.quantize.MODES`.
        device: the torch device the model runs on (:func:`core.optimize.quantize.check_supported`).
    Returns:
        a "quantize" :class:`StepReport` on the quantized layers' paths, ``details["choice"]`` the
        :class:`core.optimize.quantize.Choice` (layers quantized, skipped with reasons), one report line.
    Raises:
        ValueError: ``model`` is a Dynamic VRAM patcher (LoRA would be dropped), or ``mode`` is not supported on
            ``device``, before anything is patched; plus what :func:`core.optimize.quantize.require_torchao` raises.
    """
    if is_dynamic(model):
        raise ValueError(
            f"quantize={mode} under Dynamic VRAM: ComfyUI applies LoRA and other weight "
            "patches at cast time there, and the quantized layers would be built from unpatched "
            "weights (a LoRA silently dropped) while the full-precision weights stay on the GPU "
            "uncounted. Turn compile on (it runs a non-dynamic copy), or start ComfyUI with "
            "--disable-dynamic-vram, or set quantize to off."
        )
    qz.check_supported(mode, device)
    qz.require_torchao()  # "pip install torchao" before anything is patched
    root = model.get_model_object("diffusion_model")
    fused = {
        k[len("diffusion_model.") :] for k, p in model.object_patches.items() if isinstance(p, FusedQKVCrossAttention)
    }
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
        missing = unpatched_keys(patcher, paths, layers)
        if missing:
            raise RuntimeError(
                f"quantize={mode}: ComfyUI did not apply the weight patches (LoRA) of {len(missing)} quantized "
                f"layer(s), e.g. {missing[0]}: the model was loaded partially (lowvram: it does not fit in free VRAM) "
                "or dynamically, and those layers would run without their LoRA. Free VRAM (unload other models), "
                "start ComfyUI with --highvram / --disable-dynamic-vram, or set quantize to off."
            )
        dtype = getattr(patcher.model, "manual_cast_dtype", None)
        for q in layers:
            q.refresh_(device=patcher.load_device, dtype=dtype, token=patcher.patches_uuid)

    def release(patcher, unpatch_all):
        for q in layers:
            q.release_()

    for kind, fn in ((CallbacksMP.ON_PRE_RUN, build), (CallbacksMP.ON_DETACH, release)):
        model.remove_callbacks_with_key(kind, KEY_QUANT)
        model.add_callback_with_key(kind, KEY_QUANT, fn)
    steadfast_options(model).quantize = {"mode": mode, "layers": len(paths), "torchao": qz.torchao_version()}
    choice = qz.Choice(tuple(paths), skipped)
    return StepReport(
        "quantize",
        True,
        list(paths),
        {"mode": mode, "choice": choice},
        lines=[
            (
                f"quantize: {mode} (torchao), {choice.as_text()}; built at the first run from the "
                "weights as patched (LoRA included)"
            )
        ],
    )
