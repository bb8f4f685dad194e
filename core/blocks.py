"""Declared repeated-block classes per model class: which blocks regional compilation compiles.

The idea is diffusers' ``_repeated_blocks`` (declared per model class, used by
``compile_repeated_blocks``), applied to ComfyUI's own model classes by *class name*, so this module
imports nothing from ComfyUI. Only blocks whose parents call them generically are listed: e.g. the
SD1.x/SDXL ``SpatialTransformer`` is dispatched with ``isinstance`` in ``forward_timestep_embed``, so
swapping it for a compiled wrapper would drop its context argument; its ``BasicTransformerBlock``
children are called as plain ``block(x, context=..., transformer_options=...)`` and are safe.

Unknown models fall back to auto-discovery (:func:`core.compile.find_repeated_blocks` without
class names: repeated same-class children of an ``nn.ModuleList``), and the chosen blocks are reported.
"""
from __future__ import annotations

# diffusion-model class name -> block class names (ComfyUI ``comfy/ldm/...`` classes)
COMFY_REPEATED_BLOCKS: dict[str, tuple[str, ...]] = {
    "UNetModel": ("BasicTransformerBlock",),              # SD1.x / SD2.x / SDXL
    "Flux": ("DoubleStreamBlock", "SingleStreamBlock"),   # Flux.1 / Flux Schnell
    "Chroma": ("DoubleStreamBlock", "SingleStreamBlock"),
    "MMDiT": ("JointBlock",),                             # SD3 / SD3.5
}


def declared_blocks_for(model_cls: type) -> tuple[str, ...] | None:
    """Block class names declared for ``model_cls`` or its nearest declared base class.

    Walks the MRO, so subclasses (e.g. SD3's ``OpenAISignatureMMDITWrapper(MMDiT)``) inherit the
    declaration. Returns ``None`` when the model is unknown (callers then auto-discover).
    """
    for klass in model_cls.__mro__:
        if klass.__name__ in COMFY_REPEATED_BLOCKS:
            return COMFY_REPEATED_BLOCKS[klass.__name__]
    return None
