"""Tiny, seeded, random-weight diffusers pipelines built on the spot (no download): test fixtures and ``--tiny``.

Two architectures, small enough that a 4-step 64x64 generation takes a fraction of a second on a CPU:

* ``"sd"``: :class:`diffusers.StableDiffusionPipeline` with a ``UNet2DConditionModel`` (blocks 32/64,
  cross-attention dim 32, declares ``_repeated_blocks``), an ``AutoencoderKL`` (blocks 32/64, 4 latent
  channels, ``sample_size=32`` so VAE tiling engages at 64x64), a 2-layer ``CLIPTextModel`` (width 32)
  with a byte-level ``CLIPTokenizer`` built from a generated vocabulary, and an ``EulerDiscreteScheduler``.
* ``"flux"``: :class:`diffusers.FluxPipeline` with a ``FluxTransformer2DModel`` (2 double + 2 single
  blocks, 2 heads x 16), an ``AutoencoderKL`` (4 latent channels), a CLIP text model as above, a 2-layer
  ``T5EncoderModel`` (width 32) with a Unigram ``T5Tokenizer`` built from a generated vocabulary, and a
  ``FlowMatchEulerDiscreteScheduler``.

The configurations follow diffusers' own fast-test dummies (``tests/pipelines/*/test_*.py``
``get_dummy_components``); the tokenizers are generated here because those tests download theirs.
Weights come from each module's default initialisation under ``torch.manual_seed(seed)``, inside
:func:`torch.random.fork_rng`, so the caller's global RNG state is untouched. The weights therefore
depend on ``seed``, :data:`TINY_VERSION` and the torch/diffusers/transformers versions (their init code).
The outputs are noise-like images, never meaningful ones. diffusers and transformers are imported lazily.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "TINY_KINDS",
    "TINY_VERSION",
    "build_tiny_pipeline",
    "build_tiny_sd",
    "build_tiny_flux",
    "tiny_lora_state_dict",
    "save_tiny_lora",
]

TINY_KINDS = ("sd", "flux")
TINY_VERSION = "1"
"""Bump whenever the built pipelines change."""

_CLIP_BOS, _CLIP_EOS = "<|startoftext|>", "<|endoftext|>"
_MAX_LEN = 77


# --------------------------------------------------------------------------- tokenizers


def _clip_tokenizer(out_dir: Path) -> Any:
    """Byte-level CLIP BPE tokenizer with one token per byte (and per word-final byte), no merges.

    Vocabulary: the two special tokens, then the 256 byte-level symbols and the same symbols with the
    ``</w>`` end-of-word suffix (514 ids). Every text tokenizes (one id per byte).
    """
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {_CLIP_BOS: 0, _CLIP_EOS: 1}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
        vocab[ch + "</w>"] = len(vocab)
    tok = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=_MAX_LEN)
    tok.save_pretrained(str(out_dir))
    return tok


def _t5_tokenizer(out_dir: Path) -> Any:
    """Unigram T5 tokenizer over printable ASCII (each character with and without the U+2581 word prefix)."""
    from transformers import T5Tokenizer

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    for code in range(33, 127):
        ch = chr(code)
        pieces.append(("\u2581" + ch, -3.0))
        pieces.append((ch, -4.0))
    tok = T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=512)
    tok.save_pretrained(str(out_dir))
    return tok


def _clip_text_model(vocab_size: int) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=_MAX_LEN,
        projection_dim=32,
        hidden_act="gelu",
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        layer_norm_eps=1e-5,
    )
    return CLIPTextModel(cfg).eval()


def _vae(latent_channels: int = 4, **extra: Any) -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=latent_channels,
        norm_num_groups=32,
        sample_size=32,
        **extra,
    ).eval()


# --------------------------------------------------------------------------- pipelines


def _prepare(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; give an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _save(pipe: Any, out: Path, kind: str, seed: int) -> Path:
    pipe.save_pretrained(str(out), safe_serialization=True)
    (out / "steadfast_tiny.json").write_text(
        json.dumps({"kind": kind, "seed": seed, "version": TINY_VERSION, "torch": torch.version.__version__}, indent=1)
    )
    return out


def build_tiny_sd(out_dir: str | Path, seed: int = 0) -> Path:
    """Build the tiny Stable-Diffusion-style pipeline and ``save_pretrained`` it into ``out_dir``.

    ``out_dir`` must be new or empty. Returns it as a :class:`Path`. The folder loads with
    ``StableDiffusionPipeline.from_pretrained`` (``safety_checker``/``feature_extractor`` are ``None``).
    Image size must be a multiple of 2 (VAE scale factor 2; 64x64 -> 32x32 latents).

    Raises:
        FileExistsError: ``out_dir`` holds files.
    """
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel

    out = _prepare(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = _clip_tokenizer(Path(tmp))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet = UNet2DConditionModel(
            sample_size=32,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=(32, 64),
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=32,
            transformer_layers_per_block=2,
        ).eval()
        torch.manual_seed(seed + 1)
        vae = _vae(scaling_factor=0.18215)
        torch.manual_seed(seed + 2)
        text_encoder = _clip_text_model(len(tokenizer) + 486)
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        timestep_spacing="leading",
        steps_offset=1,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return _save(pipe, out, "sd", seed)


def build_tiny_flux(out_dir: str | Path, seed: int = 0) -> Path:
    """Build the tiny Flux-style pipeline and ``save_pretrained`` it into ``out_dir`` (new or empty).

    Image size must be a multiple of 4 (VAE factor 2 x 2x2 latent packing). Returns ``out_dir``.

    Raises:
        FileExistsError: ``out_dir`` holds files.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    out = _prepare(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = _clip_tokenizer(Path(tmp) / "clip")
        tokenizer_2 = _t5_tokenizer(Path(tmp) / "t5")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=(4, 4, 8),
        ).eval()
        torch.manual_seed(seed + 1)
        vae = _vae(use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
        torch.manual_seed(seed + 2)
        text_encoder = _clip_text_model(len(tokenizer) + 486)
        torch.manual_seed(seed + 3)
        t5 = T5EncoderModel(
            T5Config(
                vocab_size=len(tokenizer_2) + 56,
                d_model=32,
                d_kv=8,
                d_ff=37,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                pad_token_id=0,
                eos_token_id=1,
                decoder_start_token_id=0,
            )
        ).eval()
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=t5,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    return _save(pipe, out, "flux", seed)


def build_tiny_pipeline(kind: str, out_dir: str | Path, seed: int = 0) -> Path:
    """:func:`build_tiny_sd` or :func:`build_tiny_flux` by ``kind`` ("sd" | "flux").

    Raises:
        ValueError: unknown ``kind``. FileExistsError: ``out_dir`` holds files.
    """
    builders = {"sd": build_tiny_sd, "flux": build_tiny_flux}
    if kind not in builders:
        raise ValueError(f"unknown tiny pipeline {kind!r}; expected one of {', '.join(TINY_KINDS)}")
    try:
        return builders[kind](out_dir, seed)
    except BaseException:
        if Path(out_dir).exists() and not (Path(out_dir) / "model_index.json").exists():
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


# --------------------------------------------------------------------------- LoRA


def tiny_lora_state_dict(
    denoiser: torch.nn.Module,
    rank: int,
    seed: int = 0,
    *,
    prefix: str = "unet",
    targets: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0"),
    scale: float = 0.5,
) -> dict[str, torch.Tensor]:
    """A random LoRA for ``denoiser`` in the diffusers/PEFT key format, ``{prefix}.{path}.lora_A/B.weight``.

    One pair per linear layer (``in_features``/``out_features``) whose dotted path ends with one of ``targets``:
    ``lora_A`` ``[rank, in]`` and ``lora_B`` ``[out, rank]`` float32, drawn from a private generator seeded with
    ``seed`` (std ``scale / sqrt(in)`` and ``scale / sqrt(rank)``, so the adapter visibly changes the output). Load it
    with ``pipe.load_lora_weights(state_dict)``; ``prefix`` is the pipeline component ("unet" / "transformer").

    Raises:
        ValueError: ``rank < 1`` or no target layer found.
    """
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for path, mod in denoiser.named_modules():
        n_in, n_out = getattr(mod, "in_features", None), getattr(mod, "out_features", None)
        if not isinstance(n_in, int) or not isinstance(n_out, int):
            continue  # Linear layers, and PEFT's LoRA wrappers around them (same features)
        if not any(path == t or path.endswith("." + t) for t in targets):
            continue
        out[f"{prefix}.{path}.lora_A.weight"] = torch.randn(rank, n_in, generator=gen) * (scale / n_in**0.5)
        out[f"{prefix}.{path}.lora_B.weight"] = torch.randn(n_out, rank, generator=gen) * (scale / rank**0.5)
    if not out:
        raise ValueError(f"no Linear layer of {type(denoiser).__name__} ends with any of {targets}")
    return out


def save_tiny_lora(state_dict: dict[str, torch.Tensor], out_file: str | Path) -> Path:
    """Write a LoRA state dict as a ``.safetensors`` file (what ``load_lora_weights(path)`` reads)."""
    from safetensors.torch import save_file

    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(out))
    return out
