"""Which blocks regional compilation compiles in each ComfyUI diffusion model, declared per model class.

The idea is diffusers' ``_repeated_blocks`` (declared per model class, used by ``compile_repeated_blocks``),
applied to ComfyUI's own model classes by *class name*, so this module imports nothing from ComfyUI. A compiled
block is swapped in for the original (an ``OptimizedModule`` in its parent's ``ModuleList``/``ModuleDict`` slot,
:func:`core.compile.swap_in`). That is only correct when the parent calls the block *generically*
(``block(...)``): an ``OptimizedModule`` forwards attribute reads to the original, but ``isinstance(block, Cls)``
is False. Every entry below was checked by reading the parent's ``forward`` in ComfyUI v0.8.0
(``comfy/ldm/**``); the comment names the file and the call. Tests: ``tests/comfy/test_architectures.py``
builds every model below (real-size configs on the meta device).
"""
from __future__ import annotations

__all__ = ["COMFY_REPEATED_BLOCKS", "REGIONAL_UNSUPPORTED", "NON_GENERIC_PARENTS", "declared_blocks_for",
           "regional_unsupported_reason"]

_FLUX_BLOCKS = ("DoubleStreamBlock", "SingleStreamBlock")

# Key: the diffusion model's class ``__name__``, or ``"module.QualName"`` where two ComfyUI classes
# share a name (both SD3 and AuraFlow call theirs ``MMDiT``). Value: block class ``__name__``s,
# matched inside that model only (outermost match wins). Verified parent call sites (v0.8.0):
COMFY_REPEATED_BLOCKS: dict[str, tuple[str, ...]] = {
    # SD1.x / SD2.x / SDXL / SVD / SD x4 upscaler / Lotus. modules/attention.py
    # SpatialTransformer.forward: `block(x, context=context[i], transformer_options=...)`;
    # SpatialVideoTransformer.forward: `block(x, context=..., ...)`, `mix_block(x_mix, context=...)`.
    # NOT SpatialTransformer/ResBlock/TimestepEmbedSequential: openaimodel.forward_timestep_embed
    # dispatches on isinstance(layer, SpatialTransformer/TimestepBlock/...), and UNetModel._forward
    # passes whole input/output blocks to it, which iterates them (see NON_GENERIC_PARENTS).
    "UNetModel": ("BasicTransformerBlock",),
    # Flux.1 / Flux.2 / Kontext. flux/model.py Flux.forward_orig: `block(img=..., txt=..., vec=..., pe=...)`
    # and `block(img, vec=..., pe=...)` (also inside the patches_replace `block_wrap` closures).
    "Flux": _FLUX_BLOCKS,
    # chroma/model.py Chroma.forward_orig: same calls as Flux (vec = per-block modulation slices).
    "Chroma": _FLUX_BLOCKS,
    # chroma_radiance/model.py (subclass of Chroma): same double/single loops. Its NerfGLUBlocks
    # (per-pixel MLP, tiled with varying tile counts) are left out on purpose.
    "ChromaRadiance": _FLUX_BLOCKS,
    # HunyuanVideo / 1.5 / HunyuanImage 2.1. hunyuan_video/model.py forward_orig: `block(img=..., txt=...)`,
    # `block(img, vec=..., pe=...)`. TokenRefinerBlocks (2, text only) are not compiled.
    "HunyuanVideo": _FLUX_BLOCKS,
    # hunyuan3d/model.py Hunyuan3Dv2.forward: flux blocks, plain calls.
    "Hunyuan3Dv2": _FLUX_BLOCKS,
    # SD3 / SD3.5. modules/diffusionmodules/mmdit.py MMDiT.forward_core_with_concat:
    # `self.joint_blocks[i](context, x, c=c_mod, ...)` (index access returns the swapped-in block).
    # The last block is pre_only and SD3.5 has x_block_self_attn blocks: 2-3 graphs on the first call.
    "comfy.ldm.modules.diffusionmodules.mmdit.MMDiT": ("JointBlock",),
    "OpenAISignatureMMDITWrapper": ("JointBlock",),
    # AuraFlow. aura/mmdit.py MMDiT.forward: `layer(c, x, global_cond, ...)`, `layer(cx, global_cond, ...)`.
    "comfy.ldm.aura.mmdit.MMDiT": ("MMDiTBlock", "DiTBlock"),
    # Wan 2.1 / 2.2 (t2v, i2v, camera, s2v, animate inherit it). wan/model.py WanModel.forward_orig:
    # `block(x, e=e0, freqs=..., context=..., ...)`. The first block gets a transposed (strided) x:
    # CompileOptions.contiguous_inputs avoids its extra graph.
    "WanModel": ("WanAttentionBlock",),
    # VACE: the main blocks as Wan. Its VaceWanAttentionBlocks (`self.vace_blocks[ii](c[iii], x=...)`,
    # plain) branch on an int `block_id`, which Dynamo specialises: one graph per block -> past
    # recompile_limit it would silently run eagerly, so they are not listed.
    "VaceWanModel": ("WanAttentionBlock",),
    # HuMo: wan/model.py HumoWanModel.forward_orig: `block(x, e=..., ..., audio=audio, ...)`.
    "HumoWanModel": ("WanAttentionBlockAudio",),
    # LTX-Video. lightricks/model.py LTXVModel._process_transformer_blocks: `block(x, context=..., ...)`
    # (lightricks' own BasicTransformerBlock class, same name as the UNet's).
    "LTXVModel": ("BasicTransformerBlock",),
    # LTX-2 audio+video. lightricks/av_model.py: `vx, ax = block((vx, ax), v_context=..., ...)`.
    "LTXAVModel": ("BasicAVTransformerBlock",),
    # Lumina 2 / Z-Image. lumina/model.py NextDiT: `layer(cap_feats, cap_mask, ...)` (context_refiner),
    # `layer(x, padded_img_mask, ...)` (noise_refiner), `layer(img, mask, freqs_cis, adaln_input, ...)`
    # (layers). Refiners without modulation are a second graph.
    "NextDiT": ("JointTransformerBlock",),
    # Qwen-Image. qwen_image/model.py forward: `block(hidden_states=..., encoder_hidden_states=..., ...)`.
    "QwenImageTransformer2DModel": ("QwenImageTransformerBlock",),
    # HiDream. hidream/model.py: the ModuleLists hold HiDreamImageBlock wrappers whose forward is
    # `return self.block(...)` (plain); the inner blocks are compiled. Their MoE feed-forward indexes
    # with boolean masks (data-dependent shapes): graph breaks, so fullgraph=True fails there.
    "HiDreamImageTransformer2DModel": ("HiDreamImageTransformerBlock", "HiDreamImageSingleTransformerBlock"),
    # PixArt alpha/sigma. pixart/pixartms.py: `block(x, y, t0, y_lens, (H, W), **kwargs)`.
    "PixArtMS": ("PixArtMSBlock",),
    # HunyuanDiT. hydit/models.py: `block(x, c, text_states, freqs_cis_img, skip)` (skip None in the
    # first half, a tensor in the second: 2 graphs).
    "HunYuanDiT": ("HunYuanDiTBlock",),
    # Hunyuan3D 2.1. hunyuan3dv2_1/hunyuandit.py: `block(combined, time_embedded, main_condition,
    # skip_tensor=...)`; MoE blocks (last layers) index with masks: graph breaks.
    "HunYuanDiTPlain": ("HunYuanDiTBlock",),
    # Mochi. genmo/joint_model/asymm_models_joint.py: `block(x, c, y_feat, rope_cos=..., ...)`.
    "AsymmDiTJoint": ("AsymmetricJointBlock",),
    # Cosmos 1 (GeneralDIT). cosmos/model.py: `for _, block in self.blocks.items(): x = block(x, ...)`
    # on an nn.ModuleDict; it also reads `block.x_format`, which OptimizedModule forwards.
    "GeneralDIT": ("GeneralDITTransformerBlock",),
    # Cosmos Predict2. cosmos/predict2.py MiniTrainDIT: `block(x_B_T_H_W_D, t_embedding_B_T_D, ...)`.
    "MiniTrainDIT": ("Block",),
    # ACE-Step. ace/model.py: `block(hidden_states=..., attention_mask=..., ...)`.
    "ACEStepTransformer2DModel": ("LinearTransformerBlock",),
    # Stable Audio. audio/dit.py ContinuousTransformer.forward: `layer(x, rotary_pos_emb=..., ...)`.
    "AudioDiffusionTransformer": ("TransformerBlock",),
    # Kandinsky 5. kandinsky5/model.py: `block(context, time_embed, freqs_text, ...)`,
    # `block(visual_embed, context, time_embed, freqs=..., ...)`.
    "Kandinsky5": ("TransformerEncoderBlock", "TransformerDecoderBlock"),
    # OmniGen2. omnigen/omnigen2.py: `layer(hidden_states, mask, rotary_emb, temb, ...)` (4 lists).
    "OmniGen2Transformer2DModel": ("OmniGen2TransformerBlock",),
}

# Models whose repeated blocks cannot be swapped for compiled wrappers (use a full compile).
REGIONAL_UNSUPPORTED: dict[str, str] = {
    "StageC": "Stable Cascade stage C dispatches its ResBlock/AttnBlock/TimestepBlock children with "
              "isinstance() (cascade/stage_c.py _down_encode/_up_decode); a compiled wrapper would be "
              "called without its conditioning. Use a full compile.",
    "StageB": "Stable Cascade stage B dispatches its ResBlock/AttnBlock/TimestepBlock children with "
              "isinstance() (cascade/stage_b.py _down_encode/_up_decode). Use a full compile.",
}

# Callers that do not call (some of) their children generically: a compiled wrapper in a child's slot
# would be called with the wrong arguments or not be callable the way the parent uses it.
NON_GENERIC_PARENTS: dict[str, str] = {
    "UNetModel": "UNetModel._forward passes input/middle/output blocks to forward_timestep_embed, which "
                 "iterates them (an OptimizedModule is not iterable) and dispatches on isinstance",
    "TimestepEmbedSequential": "openaimodel.forward_timestep_embed dispatches on isinstance(layer, "
                               "VideoResBlock/TimestepBlock/SpatialVideoTransformer/SpatialTransformer/Upsample)",
    "StageC": "cascade/stage_c.py dispatches on isinstance(block, ResBlock/AttnBlock/TimestepBlock)",
    "StageB": "cascade/stage_b.py dispatches on isinstance(block, ResBlock/AttnBlock/TimestepBlock)",
}


def _declaration(model_cls: type) -> tuple[tuple[str, ...] | None, str | None]:
    """(declared block names or None, unsupported reason or None) from the nearest declared class."""
    for klass in model_cls.__mro__:
        for key in (f"{klass.__module__}.{klass.__qualname__}", klass.__name__):
            if key in REGIONAL_UNSUPPORTED:
                return (), REGIONAL_UNSUPPORTED[key]
            if key in COMFY_REPEATED_BLOCKS:
                return COMFY_REPEATED_BLOCKS[key], None
    return None, None


def declared_blocks_for(model_cls: type) -> tuple[str, ...] | None:
    """Block class names declared for ``model_cls`` or its nearest declared base class.

    Walks the MRO, so subclasses (e.g. ``CameraWanModel(WanModel)``) inherit the declaration; at
    each class a ``"module.QualName"`` key wins over a bare ``__name__`` key. Returns ``()`` for a
    model listed in :data:`REGIONAL_UNSUPPORTED` (nothing can be compiled regionally), ``None``
    when the model is unknown (callers then auto-discover).
    """
    return _declaration(model_cls)[0]


def regional_unsupported_reason(model_cls: type) -> str | None:
    """Why regional compilation is refused for ``model_cls`` (see :data:`REGIONAL_UNSUPPORTED`), or None."""
    return _declaration(model_cls)[1]
