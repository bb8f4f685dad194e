"""Subprocess worker for tests/comfy/test_architectures.py: ComfyUI's own model classes under regional compile.

Runs in its OWN process (the pytest process must never import ``comfy``). It makes ComfyUI importable
(``$COMFYUI_PATH``, default ``~/comfy/ComfyUI``), forces CPU and ComfyUI's PyTorch (SDPA) attention
(``args.use_pytorch_cross_attention``; the CPU default sub_quad graph-breaks under Dynamo), loads this
pack's ``core`` as ``steadfast.core`` without running the pack's ``__init__`` (which would import the
ComfyUI nodes) and prints ONE JSON document on stdout.

Modes::

    python arch_worker.py structure [ARCH ...]     # real-size configs built on the meta device
    python arch_worker.py run [--backend eager|inductor] [--calls 3] [--threads 1] ITEM ...
        ITEM = arch[:dynamic=none|true|false,contiguous=0|1,specialize=0|1,filter=comfy|skip,patch=0|1]
        (arch: sd15 sdxl flux sd3 wan)
    python arch_worker.py swaptable [ARCH ...]     # NON_GENERIC_PARENTS against the small models (same archs)

``structure``: per architecture the declared blocks (:func:`core.compile.blocks.choose_blocks`), their count
against the count read from the model's own containers, auto-discovery
(:func:`core.compile.blocks.choose_blocks` with ``discover=True``) and :func:`core.compile.blocks.safe_to_swap`,
and whether a chosen block's caller dispatches on its class (``caller_dispatch``:
:func:`core.compile.blocks.isinstance_dispatch`, the swap table's oracle, read here only). Nothing is allocated
(meta tensors).

``swaptable``: :func:`swap_table` (blocks swapped for wrappers that are not instances of their class).

``run``: a SMALL seeded instance (every parameter and float buffer written from one generator; ComfyUI
layers skip weight init) is run eagerly, then with the chosen blocks compiled (``compile_blocks`` +
``swap_in`` with :func:`comfy_guard_filter`, or ComfyUI-style ``SkipGuardsOn`` with ``filter=skip``)
``--calls`` times, each call with a fresh sampler-like ``transformer_options`` (new sigma per step,
cond_or_uncond, uuids, the node's SDPA ``optimized_attention_override``). Reported:
blocks and counts, whether the output depends on the input, run-to-run equality of compiled outputs,
max |compiled - eager| (absolute and relative to max |eager|), graphs after the first call, recompiles
(with Dynamo's reasons) on the first call and after it, seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import math
import os
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _import_comfy() -> None:
    root = Path(os.environ.get("COMFYUI_PATH", str(Path.home() / "comfy" / "ComfyUI"))).expanduser()
    if not (root / "comfy").is_dir():
        raise SystemExit(f"ComfyUI not found at {root} (set COMFYUI_PATH)")
    sys.path.insert(0, str(root))
    import comfy.options  # noqa: F401  (keeps ComfyUI's argument parsing off)
    from comfy.cli_args import args

    if "comfy.model_management" in sys.modules:  # pragma: no cover
        raise RuntimeError("comfy.model_management imported before the CPU/attention args were set")
    args.cpu = True
    args.use_pytorch_cross_attention = True


def _import_core() -> None:
    pkg = types.ModuleType("steadfast")
    pkg.__path__ = [str(REPO)]  # package without running REPO/__init__.py
    sys.modules["steadfast"] = pkg


_import_comfy()
_import_core()

import torch  # noqa: E402

import comfy.ops  # noqa: E402
from comfy.ldm.modules import attention as comfy_attention  # noqa: E402

from steadfast.core.compile import blocks as sblocks  # noqa: E402
from steadfast.core.compile.guards import SkipGuardsOn, comfy_guard_filter  # noqa: E402
from steadfast.core.compile.options import CompileOptions  # noqa: E402
from steadfast.core.compile.swap import compile_blocks, swap_in  # noqa: E402

OPS = comfy.ops.disable_weight_init


# ---------------------------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------------------------
def _cls(module: str, name: str) -> type:
    return getattr(importlib.import_module(module), name)


def _unet_cfg(**kw: Any) -> dict[str, Any]:
    cfg = dict(
        use_checkpoint=False,
        image_size=32,
        use_spatial_transformer=True,
        legacy=False,
        in_channels=4,
        out_channels=4,
        use_temporal_resblock=False,
        use_temporal_attention=False,
        num_heads=-1,
        num_head_channels=64,
    )
    cfg.update(kw)
    return cfg


SD15_FULL = _unet_cfg(
    model_channels=320,
    num_res_blocks=[2, 2, 2, 2],
    channel_mult=[1, 2, 4, 4],
    transformer_depth=[1, 1, 1, 1, 1, 1, 0, 0],
    transformer_depth_middle=1,
    transformer_depth_output=[1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
    context_dim=768,
    adm_in_channels=None,
    use_linear_in_transformer=False,
    num_heads=8,
    num_head_channels=-1,
)
SDXL_FULL = _unet_cfg(
    model_channels=320,
    num_res_blocks=[2, 2, 2],
    channel_mult=[1, 2, 4],
    transformer_depth=[0, 0, 2, 2, 10, 10],
    transformer_depth_middle=10,
    transformer_depth_output=[0, 0, 0, 2, 2, 2, 10, 10, 10],
    context_dim=2048,
    adm_in_channels=2816,
    num_classes="sequential",
    use_linear_in_transformer=True,
)
FLUX_FULL = dict(
    in_channels=16,
    out_channels=16,
    vec_in_dim=768,
    context_in_dim=4096,
    hidden_size=3072,
    mlp_ratio=4.0,
    num_heads=24,
    depth=19,
    depth_single_blocks=38,
    axes_dim=[16, 56, 56],
    theta=10000,
    patch_size=2,
    qkv_bias=True,
    guidance_embed=True,
    txt_ids_dims=[],
)
FLUX2_FULL = dict(
    FLUX_FULL,
    axes_dim=[32, 32, 32, 32],
    num_heads=48,
    hidden_size=6144,
    mlp_ratio=3.0,
    theta=2000,
    out_channels=128,
    in_channels=128,
    global_modulation=True,
    mlp_silu_act=True,
    qkv_bias=False,
    ops_bias=False,
    txt_ids_dims=[3],
    patch_size=1,
    depth=8,
    depth_single_blocks=48,
    vec_in_dim=None,
    context_in_dim=15360,
    guidance_embed=True,
)
CHROMA_FULL = dict(
    in_channels=64,
    out_channels=64,
    context_in_dim=4096,
    hidden_size=3072,
    mlp_ratio=4.0,
    num_heads=24,
    depth=19,
    depth_single_blocks=38,
    axes_dim=[16, 56, 56],
    theta=10000,
    patch_size=2,
    qkv_bias=True,
    in_dim=64,
    out_dim=3072,
    hidden_dim=5120,
    n_layers=5,
    txt_ids_dims=[],
    vec_in_dim=None,
)
CHROMA_RADIANCE_FULL = dict(
    CHROMA_FULL,
    in_channels=3,
    out_channels=3,
    patch_size=16,
    nerf_hidden_size=64,
    nerf_mlp_ratio=4,
    nerf_depth=4,
    nerf_max_freqs=8,
    nerf_tile_size=512,
    nerf_final_head_type="conv",
    nerf_embedder_dtype=torch.float32,
    use_x0=False,
)
HUNYUAN_VIDEO_FULL = dict(
    in_channels=16,
    out_channels=16,
    vec_in_dim=768,
    context_in_dim=4096,
    hidden_size=3072,
    mlp_ratio=4.0,
    num_heads=24,
    depth=20,
    depth_single_blocks=40,
    axes_dim=[16, 56, 56],
    theta=256,
    patch_size=[1, 2, 2],
    qkv_bias=True,
    guidance_embed=True,
    byt5=False,
    meanflow=False,
    use_cond_type_embedding=False,
    vision_in_dim=None,
    meanflow_sum=False,
)
SD3_MEDIUM = dict(
    input_size=None,
    patch_size=2,
    in_channels=16,
    out_channels=16,
    depth=24,
    adm_in_channels=2048,
    pos_embed_max_size=192,
    num_patches=36864,
    context_embedder_config={"target": "torch.nn.Linear", "params": {"in_features": 4096, "out_features": 1536}},
)
SD35_MEDIUM = dict(
    SD3_MEDIUM, pos_embed_max_size=384, num_patches=147456, qk_norm="rms", x_block_self_attn_layers=list(range(13))
)
HIDREAM_FULL = dict(
    attention_head_dim=128,
    axes_dims_rope=[64, 32, 32],
    caption_channels=[4096, 4096],
    max_resolution=[128, 128],
    in_channels=16,
    llama_layers=list(range(32)) + [31] * 16,
    num_attention_heads=20,
    num_routed_experts=4,
    num_activated_experts=2,
    num_layers=16,
    num_single_layers=32,
    out_channels=16,
    patch_size=2,
    text_emb_dim=2048,
)
MOCHI_FULL = dict(
    depth=48,
    patch_size=2,
    num_heads=24,
    hidden_size_x=3072,
    hidden_size_y=1536,
    mlp_ratio_x=4.0,
    mlp_ratio_y=4.0,
    learn_sigma=False,
    in_channels=12,
    qk_norm=True,
    qkv_bias=False,
    out_bias=True,
    attn_drop=0.0,
    patch_embed_bias=True,
    posenc_preserve_area=True,
    timestep_mlp_bias=True,
    attend_to_padding=False,
    timestep_scale=1000.0,
    use_t5=True,
    t5_feat_dim=4096,
    t5_token_length=256,
    rope_theta=10000.0,
)
COSMOS_7B = dict(
    max_img_h=240,
    max_img_w=240,
    max_frames=128,
    in_channels=16,
    out_channels=16,
    patch_spatial=2,
    patch_temporal=1,
    model_channels=4096,
    block_config="FA-CA-MLP",
    concat_padding_mask=True,
    pos_emb_cls="rope3d",
    pos_emb_learnable=False,
    pos_emb_interpolation="crop",
    block_x_format="THWBD",
    affline_emb_norm=True,
    use_adaln_lora=True,
    adaln_lora_dim=256,
    num_blocks=28,
    num_heads=32,
    extra_per_block_abs_pos_emb=True,
    rope_h_extrapolation_ratio=1.0,
    rope_w_extrapolation_ratio=1.0,
    rope_t_extrapolation_ratio=2.0,
    extra_per_block_abs_pos_emb_type="learnable",
)
COSMOS2_2B = dict(
    max_img_h=240,
    max_img_w=240,
    max_frames=128,
    in_channels=16,
    out_channels=16,
    patch_spatial=2,
    patch_temporal=1,
    model_channels=2048,
    concat_padding_mask=True,
    crossattn_emb_channels=1024,
    pos_emb_cls="rope3d",
    pos_emb_learnable=True,
    pos_emb_interpolation="crop",
    min_fps=1,
    max_fps=30,
    use_adaln_lora=True,
    adaln_lora_dim=256,
    num_blocks=28,
    num_heads=16,
    extra_per_block_abs_pos_emb=False,
    rope_h_extrapolation_ratio=4.0,
    rope_w_extrapolation_ratio=4.0,
    rope_t_extrapolation_ratio=1.0,
)

# ComfyUI 0.33.0 architectures (absent from 0.8.0): real-size configs from 0.33.0's model_detection.py, or the
# constructor defaults where detection returns only {"image_model": ...} (PixelDiT, TripoSplat, HiDream-O1) or the
# defaults are the released model's (checked against detection's derivation where it has one)
SEEDVR2_3B = dict(vid_dim=2560, heads=20, num_layers=32, norm_eps=1e-5, mlp_type="swiglu", vid_out_norm=True)
TRELLIS2_FULL = dict(resolution=64)  # model_detection: 64 unless metadata is_512; shape model only (no texture)
ANIMA_FULL = COSMOS2_2B  # model_detection: cosmos_predict2 detection + llm_adapter -> "anima" (2B)
# LTX-2.3-style switches (0.33.0 LTXAVModel parameters; detection reads them from a checkpoint's metadata "config"),
# sizes: the constructor defaults as the ltxav row
LTXAV_NEW_SWITCHES = dict(apply_gated_attention=True, cross_attention_adaln=True, caption_proj_before_connector=True)
# Z-Image (model_detection's dim == 3840 branch) with SigLIP features (0.33.0: NextDiT's siglip_feat_dim, the Omni
# variant; its siglip_refiner is a third refiner list of JointTransformerBlocks). 1152: a SigLIP width (any works)
ZIMAGE_OMNI = dict(
    patch_size=2,
    in_channels=16,
    dim=3840,
    cap_feat_dim=2560,
    n_layers=30,
    n_refiner_layers=2,
    qk_norm=True,
    n_heads=30,
    n_kv_heads=30,
    axes_dims=[32, 48, 48],
    axes_lens=[1536, 512, 512],
    rope_theta=256.0,
    ffn_dim_multiplier=8.0 / 3.0,
    z_image_modulation=True,
    time_scale=1000.0,
    pad_tokens_multiple=32,
    siglip_feat_dim=1152,
)


def _n(*attrs: str) -> Callable[[Any], int]:
    """Count of blocks read from the model's own containers (independent of class-name matching)."""

    def count(m: Any) -> int:
        total = 0
        for a in attrs:
            obj = m
            for part in a.split("."):
                obj = getattr(obj, part)
            total += len(obj)
        return total

    return count


def _unet_count(m: Any) -> int:
    return sum(len(mod.transformer_blocks) for mod in m.modules() if type(mod).__name__ == "SpatialTransformer")


# arch -> (module, class, kwargs, {block class: counter}) ; real sizes, meta device
STRUCTURE: dict[str, tuple[str, str, dict[str, Any], dict[str, Callable[[Any], int]]]] = {
    "sd15": (
        "comfy.ldm.modules.diffusionmodules.openaimodel",
        "UNetModel",
        SD15_FULL,
        {"BasicTransformerBlock": _unet_count},
    ),
    "sdxl": (
        "comfy.ldm.modules.diffusionmodules.openaimodel",
        "UNetModel",
        SDXL_FULL,
        {"BasicTransformerBlock": _unet_count},
    ),
    "flux": (
        "comfy.ldm.flux.model",
        "Flux",
        FLUX_FULL,
        {"DoubleStreamBlock": _n("double_blocks"), "SingleStreamBlock": _n("single_blocks")},
    ),
    "flux2": (
        "comfy.ldm.flux.model",
        "Flux",
        FLUX2_FULL,
        {"DoubleStreamBlock": _n("double_blocks"), "SingleStreamBlock": _n("single_blocks")},
    ),
    "chroma": (
        "comfy.ldm.chroma.model",
        "Chroma",
        CHROMA_FULL,
        {"DoubleStreamBlock": _n("double_blocks"), "SingleStreamBlock": _n("single_blocks")},
    ),
    "chroma_radiance": (
        "comfy.ldm.chroma_radiance.model",
        "ChromaRadiance",
        CHROMA_RADIANCE_FULL,
        {"DoubleStreamBlock": _n("double_blocks"), "SingleStreamBlock": _n("single_blocks")},
    ),
    "hunyuan_video": (
        "comfy.ldm.hunyuan_video.model",
        "HunyuanVideo",
        HUNYUAN_VIDEO_FULL,
        {"DoubleStreamBlock": _n("double_blocks"), "SingleStreamBlock": _n("single_blocks")},
    ),
    "hunyuan3d": (
        "comfy.ldm.hunyuan3d.model",
        "Hunyuan3Dv2",
        {},
        {"DoubleStreamBlock": _n("double_blocks"), "SingleStreamBlock": _n("single_blocks")},
    ),
    "sd3": (
        "comfy.ldm.modules.diffusionmodules.mmdit",
        "OpenAISignatureMMDITWrapper",
        SD3_MEDIUM,
        {"JointBlock": _n("joint_blocks")},
    ),
    "sd35": (
        "comfy.ldm.modules.diffusionmodules.mmdit",
        "OpenAISignatureMMDITWrapper",
        SD35_MEDIUM,
        {"JointBlock": _n("joint_blocks")},
    ),
    "auraflow": (
        "comfy.ldm.aura.mmdit",
        "MMDiT",
        {},
        {"MMDiTBlock": _n("double_layers"), "DiTBlock": _n("single_layers")},
    ),
    "wan": ("comfy.ldm.wan.model", "WanModel", {}, {"WanAttentionBlock": _n("blocks")}),
    "wan_i2v": ("comfy.ldm.wan.model", "WanModel", {"model_type": "i2v"}, {"WanAttentionBlock": _n("blocks")}),
    "wan_vace": (
        "comfy.ldm.wan.model",
        "VaceWanModel",
        {"vace_layers": 8, "vace_in_dim": 96},
        {"WanAttentionBlock": _n("blocks")},
    ),
    "wan_camera": ("comfy.ldm.wan.model", "CameraWanModel", {}, {"WanAttentionBlock": _n("blocks")}),
    "wan_s2v": ("comfy.ldm.wan.model", "WanModel_S2V", {}, {"WanAttentionBlock": _n("blocks")}),
    "wan_humo": ("comfy.ldm.wan.model", "HumoWanModel", {}, {"WanAttentionBlockAudio": _n("blocks")}),
    "wan_animate": ("comfy.ldm.wan.model_animate", "AnimateWanModel", {}, {"WanAttentionBlock": _n("blocks")}),
    "ltxv": ("comfy.ldm.lightricks.model", "LTXVModel", {}, {"BasicTransformerBlock": _n("transformer_blocks")}),
    "ltxav": (
        "comfy.ldm.lightricks.av_model",
        "LTXAVModel",
        {},
        {"BasicAVTransformerBlock": _n("transformer_blocks")},
    ),
    "lumina2": (
        "comfy.ldm.lumina.model",
        "NextDiT",
        {},
        {"JointTransformerBlock": _n("layers", "noise_refiner", "context_refiner")},
    ),
    "qwen_image": (
        "comfy.ldm.qwen_image.model",
        "QwenImageTransformer2DModel",
        {},
        {"QwenImageTransformerBlock": _n("transformer_blocks")},
    ),
    "hidream": (
        "comfy.ldm.hidream.model",
        "HiDreamImageTransformer2DModel",
        HIDREAM_FULL,
        {
            "HiDreamImageTransformerBlock": _n("double_stream_blocks"),
            "HiDreamImageSingleTransformerBlock": _n("single_stream_blocks"),
        },
    ),
    "pixart": ("comfy.ldm.pixart.pixartms", "PixArtMS", {}, {"PixArtMSBlock": _n("blocks")}),
    "hunyuan_dit": ("comfy.ldm.hydit.models", "HunYuanDiT", {}, {"HunYuanDiTBlock": _n("blocks")}),
    "hunyuan3d21": ("comfy.ldm.hunyuan3dv2_1.hunyuandit", "HunYuanDiTPlain", {}, {"HunYuanDiTBlock": _n("blocks")}),
    "mochi": (
        "comfy.ldm.genmo.joint_model.asymm_models_joint",
        "AsymmDiTJoint",
        MOCHI_FULL,
        {"AsymmetricJointBlock": _n("blocks")},
    ),
    "cosmos": ("comfy.ldm.cosmos.model", "GeneralDIT", COSMOS_7B, {"GeneralDITTransformerBlock": _n("blocks")}),
    "cosmos_predict2": ("comfy.ldm.cosmos.predict2", "MiniTrainDIT", COSMOS2_2B, {"Block": _n("blocks")}),
    "ace": (
        "comfy.ldm.ace.model",
        "ACEStepTransformer2DModel",
        {},
        {"LinearTransformerBlock": _n("transformer_blocks")},
    ),
    "stable_audio": (
        "comfy.ldm.audio.dit",
        "AudioDiffusionTransformer",
        {},
        {"TransformerBlock": _n("transformer.layers")},
    ),
    "kandinsky5": (
        "comfy.ldm.kandinsky5.model",
        "Kandinsky5",
        {},
        {
            "TransformerEncoderBlock": _n("text_transformer_blocks"),
            "TransformerDecoderBlock": _n("visual_transformer_blocks"),
        },
    ),
    "omnigen2": (
        "comfy.ldm.omnigen.omnigen2",
        "OmniGen2Transformer2DModel",
        {},
        {"OmniGen2TransformerBlock": _n("noise_refiner", "ref_image_refiner", "context_refiner", "layers")},
    ),
    # ---- new in ComfyUI 0.33.0 (SINCE) ----
    "anima": ("comfy.ldm.anima.model", "Anima", ANIMA_FULL, {"Block": _n("blocks")}),
    "ace15": (
        "comfy.ldm.ace.ace_step15",
        "AceStepConditionGenerationModel",
        {},
        {
            "AceStepDiTLayer": _n("decoder.layers"),
            "AceStepEncoderLayer": _n(
                "encoder.lyric_encoder.layers",
                "encoder.timbre_encoder.layers",
                "tokenizer.attention_pooler.layers",
                "detokenizer.layers",
            ),
        },
    ),
    "boogu": (
        "comfy.ldm.boogu.model",
        "BooguTransformer2DModel",
        {},
        {
            "OmniGen2TransformerBlock": _n(
                "noise_refiner", "ref_image_refiner", "context_refiner", "single_stream_layers"
            ),
            "BooguDoubleStreamBlock": _n("double_stream_layers"),
        },
    ),
    "cogvideox": ("comfy.ldm.cogvideo.model", "CogVideoXTransformer3DModel", {}, {"CogVideoXBlock": _n("blocks")}),
    "ernie": ("comfy.ldm.ernie.model", "ErnieImageModel", {}, {"ErnieImageSharedAdaLNBlock": _n("layers")}),
    "hidream_o1": (
        "comfy.ldm.hidream_o1.model",
        "HiDreamO1Transformer",
        {},
        {"TransformerBlock": _n("language_model.layers")},
    ),
    "ideogram4": (
        "comfy.ldm.ideogram4.model",
        "Ideogram4Transformer2DModel",
        {},
        {"Ideogram4TransformerBlock": _n("layers")},
    ),
    "joyimage": (
        "comfy.ldm.joyimage.model",
        "JoyImageTransformer3DModel",
        {},
        {"JoyImageTransformerBlock": _n("double_blocks")},
    ),
    "krea2": ("comfy.ldm.krea2.model", "SingleStreamDiT", {}, {"SingleStreamBlock": _n("blocks")}),
    "lens": ("comfy.ldm.lens.model", "LensTransformer2DModel", {}, {"LensTransformerBlock": _n("transformer_blocks")}),
    "ltxav_switches": (
        "comfy.ldm.lightricks.av_model",
        "LTXAVModel",
        LTXAV_NEW_SWITCHES,
        {"BasicAVTransformerBlock": _n("transformer_blocks")},
    ),
    "zimage_omni": (
        "comfy.ldm.lumina.model",
        "NextDiT",
        ZIMAGE_OMNI,
        {"JointTransformerBlock": _n("layers", "noise_refiner", "context_refiner", "siglip_refiner")},
    ),
    "zimage_pixel": (
        "comfy.ldm.lumina.model",
        "NextDiTPixelSpace",
        {},
        {"JointTransformerBlock": _n("layers", "noise_refiner", "context_refiner")},
    ),
    "mage_flow": (
        "comfy.ldm.mage_flow.model",
        "MageFlowTransformer2DModel",
        {},
        {"QwenImageTransformerBlock": _n("transformer_blocks")},
    ),
    "minimax_h3": ("comfy.ldm.minimax.model", "MiniMaxH3Model", {}, {"DiTBlock": _n("blocks")}),
    "minimax_music3": (
        "comfy.ldm.minimax_music.dit",
        "MiniMaxMusic3DiT",
        {},
        {"TransformerBlock": _n("diffusion_transformer.transformer.layers")},
    ),
    "pixeldit": (
        "comfy.ldm.pixeldit.model",
        "PixDiT_T2I",
        {},
        {"MMDiTBlockT2I": _n("patch_blocks"), "PiTBlock": _n("pixel_blocks")},
    ),
    "pid": (
        "comfy.ldm.pixeldit.pid",
        "PidNet",
        {},
        {"MMDiTBlockT2I": _n("patch_blocks"), "PiTBlock": _n("pixel_blocks")},
    ),
    "seedvr2": ("comfy.ldm.seedvr.model", "NaDiT", SEEDVR2_3B, {"NaMMSRTransformerBlock": _n("blocks")}),
    "trellis2": (
        "comfy.ldm.trellis2.model",
        "Trellis2",
        TRELLIS2_FULL,
        {
            "ModulatedSparseTransformerCrossBlock": _n("img2shape.blocks", "img2shape_512.blocks"),
            "ModulatedTransformerCrossBlock": _n("structure_model.blocks"),
        },
    ),
    "triposplat": (
        "comfy.ldm.triposplat.model",
        "LatentSeqMMFlowModel",
        {},
        {"UnifiedTransformerBlock": _n("noise_refiner", "context_refiner", "blocks")},
    ),
    "wan_causal": ("comfy.ldm.wan.ar_model", "CausalWanModel", {}, {"CausalWanAttentionBlock": _n("blocks")}),
    "wan_scail": ("comfy.ldm.wan.model", "SCAILWanModel", {}, {"WanAttentionBlock": _n("blocks")}),
    "wan_scail2": ("comfy.ldm.wan.model", "SCAIL2WanModel", {}, {"WanAttentionBlock": _n("blocks")}),
    "wan_dancer": ("comfy.ldm.wan.model_wandancer", "WanDancerModel", {}, {"WanAttentionBlock": _n("blocks")}),
    "wan_animate2": ("comfy.ldm.wan.model_animate2", "WanAnimate2Model", {}, {"WanAnimate2Block": _n("blocks")}),
    "stable_cascade_c": ("comfy.ldm.cascade.stage_c", "StageC", {}, {}),
    "stable_cascade_b": ("comfy.ldm.cascade.stage_b", "StageB", {}, {}),
}


#: Parameters a newer ComfyUI added to a config: ``{arch: ((module, callable whose signature is asked), {name:
#: value})}``; each is passed only where the running ComfyUI's signature has it (``inspect.signature``).
OPTIONAL_KWARGS: dict[str, tuple[tuple[str, str], dict[str, Any]]] = {
    # 0.33.0: ChromaRadianceParams gained use_sequential_txt_ids (model_detection: False unless `__sequential__`)
    "chroma_radiance": (
        ("comfy.ldm.chroma_radiance.model", "ChromaRadianceParams"),
        {"use_sequential_txt_ids": False},
    ),
}


def accepted_kwargs(arch: str) -> dict[str, Any]:
    """The :data:`OPTIONAL_KWARGS` of ``arch`` that the running ComfyUI's signature accepts."""
    if arch not in OPTIONAL_KWARGS:
        return {}
    import inspect

    (module, name), optional = OPTIONAL_KWARGS[arch]
    params = inspect.signature(_cls(module, name)).parameters
    return {k: v for k, v in optional.items() if k in params}


#: Architectures newer than some supported ComfyUI: ``{arch: first tested ComfyUI that has it}``. Where the running
#: ComfyUI (``comfyui_version.__version__``) is older and lacks the class, the arch is reported skipped, not failed.
SINCE: dict[str, str] = {
    a: "0.33.0"
    for a in (
        "anima",
        "ace15",
        "boogu",
        "cogvideox",
        "ernie",
        "hidream_o1",
        "ideogram4",
        "joyimage",
        "krea2",
        "lens",
        "zimage_pixel",
        "mage_flow",
        "minimax_h3",
        "minimax_music3",
        "pixeldit",
        "pid",
        "seedvr2",
        "trellis2",
        "triposplat",
        "wan_causal",
        "wan_scail",
        "wan_scail2",
        "wan_dancer",
        "wan_animate2",
        "zimage_omni",
        "ltxav_switches",
    )
}
#: Architectures of an older class that need a newer constructor parameter: ``{arch: parameter names}``
#: (missing where the running ComfyUI is older than ``SINCE``: skipped like a missing class).
NEEDS_PARAMS: dict[str, tuple[str, ...]] = {
    "zimage_omni": ("siglip_feat_dim",),
    "ltxav_switches": tuple(LTXAV_NEW_SWITCHES),
}


@contextlib.contextmanager
def _ace15_fsq_off_meta() -> Iterator[None]:
    """ACE-Step 1.5's FSQ quantizer calls ``.item()`` on a buffer in ``__init__`` (impossible on meta): built on
    the CPU (levels, a 64000x6 codebook, two 2048x6 linears: ~2 MB), then moved to meta; everything else is meta."""
    mod = importlib.import_module("comfy.ldm.ace.ace_step15")
    original = mod.FSQ

    class CpuFSQ(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            meta = kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "meta"
            super().__init__(*args, **{**kwargs, "device": "cpu" if meta else kwargs.get("device")})
            if meta:
                self.to("meta")

    mod.FSQ = CpuFSQ
    try:
        yield
    finally:
        mod.FSQ = original


#: Per-arch context the meta build runs in (a ComfyUI constructor that cannot run on meta as is).
BUILD_CONTEXT: dict[str, Callable[[], contextlib.AbstractContextManager]] = {"ace15": _ace15_fsq_off_meta}


def comfyui_version() -> str:
    import comfyui_version

    return comfyui_version.__version__


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".")[:3] if p.isdigit())


def _caller(root: torch.nn.Module, path: str) -> torch.nn.Module:
    """The module that calls the block at ``path``: its nearest ancestor that is not a ModuleList/ModuleDict."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        mod = root.get_submodule(".".join(parts[:cut]))
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            return mod
    return root


def structure(arch: str) -> dict[str, Any]:
    module, name, kwargs, counters = STRUCTURE[arch]
    t0 = time.perf_counter()
    try:
        cls = _cls(module, name)
        import inspect

        params = inspect.signature(cls).parameters
        if missing := [p for p in NEEDS_PARAMS.get(arch, ()) if p not in params]:
            raise AttributeError(f"{name} has no parameter {', '.join(missing)}")
    except (ImportError, AttributeError) as e:
        since, running = SINCE.get(arch), comfyui_version()
        if since is None or _version_tuple(running) >= _version_tuple(since):
            raise  # should exist here: a real error
        return {
            "skipped": f"{arch}: ComfyUI {running} lacks {module}.{name} as this config needs it "
            f"(the table covers it from ComfyUI {since}): {type(e).__name__}: {e}"
        }
    optional = accepted_kwargs(arch)
    with BUILD_CONTEXT.get(arch, contextlib.nullcontext)():
        model = _cls(module, name)(**kwargs, **optional, device="meta", operations=OPS)
    # elements ComfyUI's constructors put off meta anyway (computed rope/positional buffers): reported
    off_meta = sum(t.numel() for t in [*model.parameters(), *model.buffers()] if not t.is_meta)
    choice = sblocks.choose_blocks(model)
    auto = sblocks.choose_blocks(model, discover=True)
    disc, auto_check = auto.discovery, auto.check
    dispatch = {}  # the swap table's oracle: does a chosen block's caller dispatch on its class? (source, test only)
    for path in dict.fromkeys([*choice.paths, *disc.paths]):
        hits = sblocks.isinstance_dispatch(type(_caller(model, path)), type(model.get_submodule(path)))
        if hits:
            dispatch[path] = hits[:3]
    return {
        "class": type(model).__name__,
        "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "how": choice.how,
        "reason": choice.reason,
        "declared": list(sblocks.declaration(type(model))[0] or ()),
        "found": choice.classes,
        "expected": {k: c(model) for k, c in counters.items()},
        "paths": choice.paths,
        "refused": choice.check.refused if choice.check else {},
        "variants": choice.check.variants if choice.check else {},
        "warnings": choice.check.warnings if choice.check else [],
        "auto_paths": disc.paths,
        "auto_groups": {k: len(v) for k, v in disc.groups.items()},
        "auto_dropped": disc.dropped,
        "auto_refused_count": len(disc.refused),
        "auto_refused_sample": dict(list(disc.refused.items())[:2]),
        "auto_check_ok": not auto_check.refused,
        "auto_equals_declared": disc.paths == choice.paths,
        "caller_dispatch": dispatch,
        "optional_kwargs": optional,
        "off_meta_numel": off_meta,
        "seconds": round(time.perf_counter() - t0, 2),
    }


# ---------------------------------------------------------------------------------------------
# Small runnable instances
# ---------------------------------------------------------------------------------------------
def seed_(model: torch.nn.Module, seed: int = 0) -> int:
    """Write every parameter and floating buffer from one generator; returns how many tensors.

    Norm-like 1-D weights ("norm"/"scale" in the name) ~ 1 + N(0, 0.02); other 1-D tensors (biases)
    ~ N(0, 0.02); matrices ~ N(0, 1/fan_in) with fan_in = numel / shape[0] (``Linear``/``Conv``).
    """
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        tensors = list(model.named_parameters()) + [(k, b) for k, b in model.named_buffers() if b.is_floating_point()]
        for name, t in tensors:
            r = torch.randn(t.shape, generator=g, dtype=torch.float32)
            low = name.lower()
            if t.ndim <= 1:
                r = (
                    (1.0 + 0.02 * r)
                    if ("norm" in low or "scale" in low) and name.endswith(("weight", "scale"))
                    else 0.02 * r
                )
            else:
                fan_in = max(1, t.numel() // t.shape[0])
                r = r / math.sqrt(fan_in)
            t.copy_(r.to(t.dtype))
            n += 1
    return n


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


Small = tuple[torch.nn.Module, Callable[[int], dict[str, Any]], dict[str, int]]


def small_sd15() -> Small:
    cfg = _unet_cfg(
        model_channels=32,
        num_res_blocks=[1, 1],
        channel_mult=[1, 2],
        transformer_depth=[1, 1],
        transformer_depth_middle=1,
        transformer_depth_output=[1, 1, 1, 1],
        context_dim=32,
        adm_in_channels=None,
        use_linear_in_transformer=False,
        num_heads=2,
        num_head_channels=-1,
    )
    m = _cls("comfy.ldm.modules.diffusionmodules.openaimodel", "UNetModel")(**cfg, operations=OPS)

    def inputs(seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {"x": _randn(g, 1, 4, 16, 16), "timesteps": torch.tensor([500.0]), "context": _randn(g, 1, 7, 32)}

    return m, inputs, {"BasicTransformerBlock": 1 + 1 + 1 + 4}


def small_sdxl() -> Small:
    cfg = _unet_cfg(
        model_channels=32,
        num_res_blocks=[1, 1],
        channel_mult=[1, 2],
        transformer_depth=[0, 2],
        transformer_depth_middle=2,
        transformer_depth_output=[0, 0, 2, 2],
        context_dim=48,
        adm_in_channels=24,
        num_classes="sequential",
        use_linear_in_transformer=True,
        num_head_channels=16,
    )
    m = _cls("comfy.ldm.modules.diffusionmodules.openaimodel", "UNetModel")(**cfg, operations=OPS)

    def inputs(seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {
            "x": _randn(g, 1, 4, 16, 16),
            "timesteps": torch.tensor([500.0]),
            "context": _randn(g, 1, 7, 48),
            "y": _randn(g, 1, 24),
        }

    return m, inputs, {"BasicTransformerBlock": 2 + 2 + 2 + 2}


def small_flux() -> Small:
    m = _cls("comfy.ldm.flux.model", "Flux")(
        in_channels=4,
        out_channels=4,
        vec_in_dim=16,
        context_in_dim=16,
        hidden_size=64,
        mlp_ratio=2.0,
        num_heads=2,
        depth=2,
        depth_single_blocks=3,
        axes_dim=[8, 12, 12],
        theta=10000,
        patch_size=2,
        qkv_bias=True,
        guidance_embed=True,
        txt_ids_dims=[],
        operations=OPS,
    )

    def inputs(seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {
            "x": _randn(g, 1, 4, 16, 16),
            "timestep": torch.tensor([0.7]),
            "context": _randn(g, 1, 8, 16),
            "y": _randn(g, 1, 16),
            "guidance": torch.tensor([3.5]),
        }

    return m, inputs, {"DoubleStreamBlock": 2, "SingleStreamBlock": 3}


def small_sd3() -> Small:
    m = _cls("comfy.ldm.modules.diffusionmodules.mmdit", "OpenAISignatureMMDITWrapper")(
        input_size=None,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        depth=2,
        num_blocks=4,
        adm_in_channels=16,
        pos_embed_max_size=8,
        num_patches=64,
        qk_norm="rms",
        x_block_self_attn_layers=[1],
        context_embedder_config={"target": "torch.nn.Linear", "params": {"in_features": 32, "out_features": 128}},
        operations=OPS,
    )

    def inputs(seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {
            "x": _randn(g, 1, 4, 16, 16),
            "timesteps": torch.tensor([0.6]),
            "context": _randn(g, 1, 6, 32),
            "y": _randn(g, 1, 16),
        }

    return m, inputs, {"JointBlock": 4}


def small_wan() -> Small:
    m = _cls("comfy.ldm.wan.model", "WanModel")(
        model_type="t2v",
        patch_size=(1, 2, 2),
        in_dim=4,
        dim=64,
        ffn_dim=128,
        freq_dim=32,
        text_dim=32,
        out_dim=4,
        num_heads=2,
        num_layers=3,
        operations=OPS,
    )

    def inputs(seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {"x": _randn(g, 1, 4, 2, 8, 8), "timestep": torch.tensor([0.4]), "context": _randn(g, 1, 6, 32)}

    return m, inputs, {"WanAttentionBlock": 3}


SMALL: dict[str, Callable[[], Small]] = {
    "sd15": small_sd15,
    "sdxl": small_sdxl,
    "flux": small_flux,
    "sd3": small_sd3,
    "wan": small_wan,
}


class _RecompileTap(logging.Handler):
    """Collects Dynamo's recompile messages (``torch._dynamo.guards.__recompiles``)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _cpu_seconds() -> float:
    """CPU seconds of this process plus its waited-for children (the C++ compiler runs as a child;
    with TORCHINDUCTOR_COMPILE_THREADS=1 no long-lived pool hides it). Less load-sensitive than wall time."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _reason(msg: str) -> str:
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:300]


def sdpa_override(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``optimized_attention_override`` as the Optimize node installs it: ComfyUI's PyTorch SDPA path."""
    return comfy_attention.attention_pytorch(*args, **kwargs)


def step_options(step: int, **extra: Any) -> dict[str, Any]:
    """A fresh ``transformer_options`` like the sampler's (``samplers._calc_cond_batch``) for one step."""
    opts = {
        "cond_or_uncond": [0],
        "uuids": ["cond-0"],
        "sigmas": torch.tensor([14.6 / (step + 1)]),
        "optimized_attention_override": sdpa_override,
    }
    opts.update(extra)
    return opts


def attn2_patch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra_options: dict) -> torch.Tensor:
    """An ``attn2`` replace patch (like IPAdapter's): cross-attention with doubled values."""
    return comfy_attention.optimized_attention(q, k, v * 2.0, extra_options["n_heads"])


def run(
    arch: str, options: CompileOptions, calls: int, guard_filter: str = "comfy", patch: bool = False
) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model, make_inputs, expected = SMALL[arch]()
    model.eval()
    n_seeded = seed_(model)
    inp, other = make_inputs(0), make_inputs(1)
    choice = sblocks.choose_blocks(model)
    disc = sblocks.choose_blocks(model, discover=True).discovery
    res: dict[str, Any] = {
        "class": type(model).__name__,
        "how": choice.how,
        "found": choice.classes,
        "expected": expected,
        "seeded_tensors": n_seeded,
        "variants": choice.check.variants,
        "refused": choice.check.refused,
        "auto_equals_declared": disc.paths == choice.paths,
        "options": options.as_dict(),
    }
    tap = _RecompileTap()
    rec_logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    torch._logging.set_logs(recompiles=True)
    rec_logger.addHandler(tap)
    rec_logger.propagate = False
    try:
        with torch.inference_mode():
            t0 = time.perf_counter()
            eager = model(**inp, transformer_options=step_options(0))
            res["eager_seconds"] = round(time.perf_counter() - t0, 3)
            eager_other = model(**other, transformer_options=step_options(0))
            res["output_shape"] = list(eager.shape)
            res["finite"] = bool(torch.isfinite(eager).all())
            res["depends_on_input"] = not torch.equal(eager, eager_other)
            res["eager_max_abs"] = float(eager.abs().max())
            gfilter = comfy_guard_filter() if guard_filter == "comfy" else SkipGuardsOn("transformer_options")
            compiled = compile_blocks(model, choice.paths, options, gfilter)
            outs, seconds, cpu_seconds, graphs, recompiles = [], [], [], [], []
            for step in range(calls):
                before = len(tap.messages)
                t0, c0 = time.perf_counter(), _cpu_seconds()
                with swap_in(model, compiled):
                    outs.append(model(**inp, transformer_options=step_options(step)))
                seconds.append(round(time.perf_counter() - t0, 3))
                cpu_seconds.append(round(_cpu_seconds() - c0, 3))
                graphs.append(int(counters["stats"]["unique_graphs"]))
                recompiles.append([_reason(m) for m in tap.messages[before:]])
            with swap_in(model, compiled):  # a different input (same shapes): still no recompile
                before = len(tap.messages)
                other_out = model(**other, transformer_options=step_options(calls))
                recompiles_other = [_reason(m) for m in tap.messages[before:]]
            if patch:  # a per-block attn2 replace patch added AFTER warm-up (e.g. an IPAdapter node)
                key = ("input", 1, 0)
                patched = step_options(0, patches_replace={"attn2": {key: attn2_patch}})
                eager_patched = model(**inp, transformer_options=patched)
                before = len(tap.messages)
                with swap_in(model, compiled):
                    compiled_patched = model(
                        **inp, transformer_options=step_options(0, patches_replace={"attn2": {key: attn2_patch}})
                    )
                    compiled_unpatched = model(**inp, transformer_options=step_options(1))
                res["patch"] = {
                    "changes_output": not torch.equal(eager_patched, eager),
                    "max_abs_vs_eager_patched": float((compiled_patched - eager_patched).abs().max()),
                    "max_abs_vs_eager_unpatched_after": float((compiled_unpatched - eager).abs().max()),
                    "recompiles": len(tap.messages) - before,
                }
    finally:
        rec_logger.removeHandler(tap)
        torch._logging.set_logs()
    first = outs[0]
    d = (first - eager).abs()
    res.update(
        {
            "calls_seconds": seconds,
            "calls_cpu_seconds": cpu_seconds,
            "graphs_after_call": graphs,
            "recompiles_first_call": recompiles[0],
            "recompiles_after_first_call": [r for rs in recompiles[1:] for r in rs] + recompiles_other,
            "run_to_run_equal": all(torch.equal(first, o) for o in outs[1:]),
            "bit_equal_eager": bool(torch.equal(first, eager)),
            "max_abs_vs_eager": float(d.max()),
            "rel_vs_eager": float(d.max() / max(float(eager.abs().max()), 1e-30)),
            "other_input_max_abs_vs_eager": float((other_out - eager_other).abs().max()),
            "graph_breaks": {k: int(v) for k, v in counters["graph_break"].items()},
        }
    )
    return res


class _Stranger(torch.nn.Module):
    """Calls the block it holds and counts the calls; is not an instance of the block's class (as an
    ``OptimizedModule`` is not): a caller that dispatches on ``isinstance`` treats it differently."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls = block, 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.inner(*args, **kwargs)


def swap_table(arch: str) -> dict[str, Any]:
    """``core.compile.blocks.NON_GENERIC_PARENTS`` against ComfyUI, by running a small model (no source read): every
    chosen block swapped for a :class:`_Stranger` must be called and give the eager output bit for bit (its caller
    is generic); each block refused by a table row (auto-discovery's candidates and their children), swapped
    alone, shows whether the output changes (or the call fails, or the wrapper is never called)."""
    model, make_inputs, _ = SMALL[arch]()
    model.eval()
    seed_(model)
    inp = make_inputs(0)
    choice = sblocks.choose_blocks(model)
    disc = sblocks.choose_blocks(model, discover=True).discovery

    def forward(swapped: dict[str, torch.nn.Module]) -> tuple[torch.Tensor | None, str | None]:
        try:
            with swap_in(model, swapped):
                return model(**inp, transformer_options=step_options(0)), None
        except Exception as e:  # noqa: BLE001 - a non-generic caller may fail on the wrapper: a measured fact
            return None, f"{type(e).__name__}: {e}"[:200]

    with torch.inference_mode():
        eager, _ = forward({})
        wrappers = {p: _Stranger(model.get_submodule(p)) for p in choice.paths}
        out, err = forward(wrappers)
        chosen = {
            "count": len(wrappers),
            "error": err,
            "uncalled": [p for p, w in wrappers.items() if not w.calls],
            "equal": out is not None and torch.equal(out, eager),
        }
        refused = {}
        candidates = [
            *disc.refused,
            *(f"{p}.{n}" for p in disc.refused for n, _ in model.get_submodule(p).named_children()),
        ]
        for path in candidates:
            reason = sblocks.swap_refusal(model, path)
            if reason is None or not reason.startswith("called by"):
                continue
            caller = type(_caller(model, path)).__name__
            w = _Stranger(model.get_submodule(path))
            out, err = forward({path: w})
            changed = err is not None or not w.calls or not torch.equal(out, eager)
            refused[path] = {"caller": caller, "changed": changed, "error": err, "called": w.calls}
    return {"class": type(model).__name__, "chosen": chosen, "refused": refused}


def parse_item(item: str, backend: str) -> tuple[str, CompileOptions, dict[str, str]]:
    """``"arch"`` or ``"arch:dynamic=true,contiguous=0,specialize=0,filter=skip,patch=1"`` -> (arch,
    options, extra). ``filter``: "comfy" (default, :func:`comfy_guard_filter`) or "skip" (drop every
    transformer_options guard, as ComfyUI's TorchCompileModel); ``patch=1``: also run with an attn2
    replace patch added after warm-up (UNet only)."""
    arch, _, spec = item.partition(":")
    if arch not in SMALL:
        raise SystemExit(f"unknown arch {arch!r}; choose from {sorted(SMALL)}")
    kw: dict[str, Any] = {"backend": backend, "dynamic": None}
    extra: dict[str, str] = {}
    for part in filter(None, spec.split(",")):
        key, _, val = part.partition("=")
        if key == "dynamic":
            kw["dynamic"] = {"none": None, "true": True, "false": False}[val]
        elif key == "contiguous":
            kw["contiguous_inputs"] = val == "1"
        elif key == "specialize":
            kw["specialize_ints"] = val == "1"
        elif key in ("filter", "patch"):
            extra[key] = val
        else:
            raise SystemExit(f"unknown option {key!r} in {item!r}")
    return arch, CompileOptions(**kw), extra


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    ps = sub.add_parser("structure", help="declared vs discovered blocks on real-size meta models")
    ps.add_argument("archs", nargs="*", help=f"default: all of {sorted(STRUCTURE)}")
    pr = sub.add_parser("run", help="small seeded models, eager vs regional compile")
    pr.add_argument(
        "items", nargs="+", help="arch[:dynamic=..,contiguous=0|1,specialize=0|1,filter=comfy|skip,patch=0|1]"
    )
    pr.add_argument("--backend", default="eager")
    pr.add_argument("--calls", type=int, default=3)
    pr.add_argument("--threads", type=int, default=1, help="torch threads (0 = leave torch's default)")
    pw = sub.add_parser("swaptable", help="NON_GENERIC_PARENTS against small models: blocks swapped for wrappers")
    pw.add_argument("archs", nargs="*", help=f"default: all of {sorted(SMALL)}")
    a = p.parse_args(argv)
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "attention": getattr(comfy_attention.optimized_attention, "__name__", "?"),
    }
    if a.mode == "structure":
        out["comfyui_version"] = comfyui_version()
        for arch in a.archs or list(STRUCTURE):
            try:
                out[arch] = structure(arch)
            except Exception as e:  # reported; the test decides
                out[arch] = {"error": f"{type(e).__name__}: {e}"}
    elif a.mode == "swaptable":
        for arch in a.archs or list(SMALL):
            try:
                out[arch] = swap_table(arch)
            except Exception as e:  # reported; the test decides
                out[arch] = {"error": f"{type(e).__name__}: {e}"}
    else:
        if a.threads:
            torch.set_num_threads(a.threads)
        for item in a.items:
            arch, opts, extra = parse_item(item, a.backend)
            t0 = time.perf_counter()
            try:
                out[item] = run(
                    arch, opts, a.calls, guard_filter=extra.get("filter", "comfy"), patch=extra.get("patch") == "1"
                )
            except Exception as e:
                import traceback

                out[item] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            out[item]["seconds"] = round(time.perf_counter() - t0, 2)
    json.dump(out, sys.stdout, indent=1, default=repr)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
