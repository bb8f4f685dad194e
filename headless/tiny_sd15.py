"""Build a tiny, seeded, ComfyUI-loadable checkpoint with the SD1.5 *architecture* (test fixture).

The file is meant for tests and demos only: every weight is random (seeded), so images are noise-like,
but ComfyUI treats it exactly like an SD1.5 checkpoint:

* UNet (``model.diffusion_model.*``, 25.8 M params): ``model_channels=320``, ``context_dim=768``,
  ``channel_mult=[1]``, ``num_res_blocks=[1]``, ``transformer_depth=[1]``, ``transformer_depth_output=[1, 1]``,
  ``transformer_depth_middle=1``, conv ``proj_in`` (``use_linear_in_transformer=False``) -> detected as ``SD15``.
* VAE: TAESD (``first_stage_model.taesd_encoder.*`` / ``taesd_decoder.*``, 2.45 M params) with the SD1.5
  ``vae_scale=0.18215`` that ComfyUI's VAELoader uses for ``taesd``.
* Text encoder: a full CLIP-L text model (12 layers, width 768, 123 M params;
  ``cond_stage_model.transformer.text_model.*``), so the stock ``CLIPTextEncode`` node works.

Every tensor is drawn from its own ``torch.Generator`` seeded from ``sha256(seed, key)``, so the bytes depend only
on ``seed``, ``BUILDER_VERSION``, torch's CPU RNG and ComfyUI's parameter names/shapes (no forward passes,
no thread-count dependence).
ComfyUI's layers skip weight init (``comfy.ops.disable_weight_init``), so *every* parameter is written here:
norm weights are 1, biases are small (std 0.02), matrices are ``N(0, gain/sqrt(fan_in))`` (UNet, VAE) or
``N(0, 0.02)`` (CLIP, as in CLIP's own init). The output-layer gains were chosen (measured once, fixed
constants) so the UNet's eps prediction and the VAE's image stay in a sane range: images are neither
saturated nor constant. Tensors are stored as float16 (ComfyUI's CPU text-encoder dtype is float16 anyway).

Known, inherent gap: SD1.5 checkpoints cannot carry ``transformer.text_projection.weight``: ComfyUI's
``SD15.process_clip_state_dict`` renames it under ``text_model.`` where it is ignored. ComfyUI therefore
leaves that projection uninitialised for *every* SD1.5 checkpoint; it only feeds ``pooled_output``, which
SD1.5's UNet does not use (``adm_in_channels=None``), so images do not depend on it.

Usage::

    python headless/tiny_sd15.py OUT.safetensors [--seed 0] [--verify]

Needs ComfyUI importable (``COMFYUI_PATH``, default ``~/comfy/ComfyUI``) to build; a cached file
(:func:`cached_tiny_sd15`) needs nothing.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

BUILDER_VERSION = "1"
"""Bump whenever the produced bytes change; it is part of the cache file name."""

CHECKPOINT_NAME = "steadfast_tiny_sd15.safetensors"
"""Name under which test servers expose the checkpoint (``models/checkpoints/``)."""

UNET_CONFIG: dict[str, Any] = {
    "use_checkpoint": False,
    "image_size": 32,
    "use_spatial_transformer": True,
    "legacy": False,
    "adm_in_channels": None,
    "in_channels": 4,
    "out_channels": 4,
    "model_channels": 320,
    "num_res_blocks": [1],
    "transformer_depth": [1],
    "transformer_depth_output": [1, 1],
    "channel_mult": [1],
    "transformer_depth_middle": 1,
    "use_linear_in_transformer": False,
    "context_dim": 768,
    "use_temporal_resblock": False,
    "use_temporal_attention": False,
}

STORE_DTYPE = torch.float16
BIAS_STD = 0.02
CLIP_STD = 0.02
CLIP_POS_STD = 0.01
SD15_VAE_SCALE = 0.18215
# Gains of the final layers: fixed constants (powers of two), measured once with seed 0 (no forward pass at
# build time, so the bytes cannot depend on BLAS/threads). UNET_OUT_GAIN=2 gives eps std ~0.9 at sigma 0.5..14.6;
# VAE_DEC_OUT_GAIN=1/4 gives a 4-step euler cfg-7 image with std ~0.2 around 0.47 and ~2 % clipped pixels.
UNET_OUT_GAIN = 2.0
VAE_DEC_OUT_GAIN = 0.25
VAE_DEC_OUT_BIAS = 0.5  # TAESD's decoder emits images in [0, 1]; centre them.


def comfyui_path() -> Path:
    """ComfyUI checkout: ``$COMFYUI_PATH`` or ``~/comfy/ComfyUI`` (not checked for existence)."""
    return Path(os.environ.get("COMFYUI_PATH", str(Path.home() / "comfy" / "ComfyUI"))).expanduser()


def import_comfy(cpu: bool = True) -> None:
    """Make ``comfy`` importable in this process without parsing ``sys.argv``, forced to CPU by default.

    Inserts :func:`comfyui_path` into ``sys.path`` and, when ``cpu``, sets ``comfy.cli_args.args.cpu =
    True`` before ``comfy.model_management`` is imported. Raises ``FileNotFoundError`` when ComfyUI is
    absent and ``RuntimeError`` when ``comfy.model_management`` was already imported without ``cpu``.
    """
    root = comfyui_path()
    if not (root / "comfy").is_dir():
        raise FileNotFoundError(f"ComfyUI not found at {root} (set COMFYUI_PATH)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import comfy.options  # noqa: F401  (argument parsing stays disabled: cli_args parses [])
    from comfy.cli_args import args

    if not cpu:
        return
    if "comfy.model_management" in sys.modules:
        if not args.cpu:
            raise RuntimeError("comfy.model_management was imported before args.cpu could be set")
        return
    args.cpu = True


def _key_generator(seed: int, key: str) -> torch.Generator:
    digest = hashlib.sha256(f"steadfast-tiny-sd15|{seed}|{key}".encode()).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _normal(shape: torch.Size, std: float, seed: int, key: str) -> torch.Tensor:
    return torch.randn(shape, generator=_key_generator(seed, key), dtype=torch.float32) * std


def _init_module_tree(
    root: torch.nn.Module, prefix: str, seed: int, *, clip: bool, fixed: dict[str, float] | None = None
) -> dict[str, torch.Tensor]:
    """Seeded values for every parameter of ``root`` (keys = ``prefix + name``), float32.

    ``fixed`` maps parameter names (without ``prefix``) to constant values used instead of a rule.

    Raises ``RuntimeError`` if a parameter belongs to a module type without a rule, or if ``root`` holds
    buffers (they would not be initialised).
    """
    out: dict[str, torch.Tensor] = {}
    for mod_name, mod in root.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            key = prefix + name
            if fixed and name in fixed:
                value = torch.full(p.shape, float(fixed[name]))
            elif isinstance(mod, (torch.nn.GroupNorm, torch.nn.LayerNorm)):
                value = torch.ones(p.shape) if p_name == "weight" else _normal(p.shape, BIAS_STD, seed, key)
            elif isinstance(mod, torch.nn.Embedding):
                std = CLIP_POS_STD if "position" in mod_name else CLIP_STD
                value = _normal(p.shape, std, seed, key)
            elif isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)):
                if p_name == "bias":
                    value = _normal(p.shape, BIAS_STD, seed, key)
                elif clip:
                    value = _normal(p.shape, CLIP_STD, seed, key)
                else:
                    fan_in = math.prod(p.shape[1:])
                    value = _normal(p.shape, 1.0 / math.sqrt(fan_in), seed, key)
            else:
                raise RuntimeError(f"no init rule for {key} ({type(mod).__name__})")
            out[key] = value
    buffers = [n for n, _ in root.named_buffers()]
    if buffers:
        raise RuntimeError(f"unexpected buffers (would stay uninitialised): {buffers[:5]}")
    return out


def build_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (float16, contiguous, CPU) for ``seed``. Needs ComfyUI (see :func:`import_comfy`).

    Raises ``RuntimeError`` if ComfyUI would not detect the UNet config as ``SD15``.
    """
    import_comfy()
    import comfy.clip_model
    import comfy.ldm.modules.diffusionmodules.openaimodel
    import comfy.model_detection
    import comfy.ops
    import comfy.sd1_clip
    import comfy.supported_models
    import comfy.taesd.taesd

    mc = comfy.model_detection.model_config_from_unet_config(dict(UNET_CONFIG))
    if type(mc) is not comfy.supported_models.SD15:
        raise RuntimeError(f"UNet config detected as {type(mc).__name__}, expected SD15")
    # Structure only (meta tensors): every value is drawn below, nothing is left to ComfyUI's skipped init.
    with torch.device("meta"):
        unet = comfy.ldm.modules.diffusionmodules.openaimodel.UNetModel(
            **mc.unet_config, device="meta", operations=comfy.ops.disable_weight_init
        )
    sd = _init_module_tree(unet, "model.diffusion_model.", seed, clip=False)
    sd["model.diffusion_model.out.2.weight"] *= UNET_OUT_GAIN
    del unet

    with torch.device("meta"):
        taesd = comfy.taesd.taesd.TAESD(latent_channels=4)
    vae = _init_module_tree(
        taesd, "first_stage_model.", seed, clip=False, fixed={"vae_scale": SD15_VAE_SCALE, "vae_shift": 0.0}
    )
    last = f"first_stage_model.taesd_decoder.{len(taesd.taesd_decoder) - 1}"
    vae[f"{last}.weight"] *= VAE_DEC_OUT_GAIN
    vae[f"{last}.bias"] += VAE_DEC_OUT_BIAS
    sd.update(vae)
    del taesd

    cfg_path = Path(comfy.sd1_clip.__file__).with_name("sd1_clip_config.json")
    config = json.loads(cfg_path.read_text())
    with torch.device("meta"):  # shapes only; 123 M params need no real storage here
        text = comfy.clip_model.CLIPTextModel(config, torch.float32, "meta", comfy.ops.disable_weight_init)
    clip = _init_module_tree(text, "cond_stage_model.transformer.", seed, clip=True)
    # Not loadable from an SD1.5 checkpoint (see module docstring); never write it.
    clip.pop("cond_stage_model.transformer.text_projection.weight")
    sd.update(clip)
    return {k: v.to(STORE_DTYPE).contiguous() for k, v in sorted(sd.items())}


def build_tiny_sd15(path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write the tiny SD1.5-architecture checkpoint for ``seed`` to ``path`` (safetensors, ~300 MB, float16).

    Deterministic: the same ``seed`` and ``BUILDER_VERSION`` give the same bytes. Written to a temporary file
    in the same folder and renamed, so readers never see a partial file. Returns the resolved path.
    Needs ComfyUI (raises ``FileNotFoundError`` without it).
    """
    from safetensors.torch import save_file

    path = Path(path).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    sd = build_state_dict(seed)
    # One metadata key only: safetensors writes the metadata map in hash order, so several keys would make
    # the header bytes differ between runs.
    info = {
        "builder": "scripts/tiny_sd15.py",
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "architecture": "stable-diffusion-v1 (random seeded weights; test fixture only)",
    }
    metadata = {"steadfast_tiny_sd15": json.dumps(info, sort_keys=True)}
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(sd, tmp, metadata=metadata)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache is meant to be shared
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def default_cache_dir() -> Path:
    """``$STEADFAST_CACHE`` or ``~/.cache/steadfast``."""
    return Path(os.environ.get("STEADFAST_CACHE", str(Path.home() / ".cache" / "steadfast"))).expanduser()


def cached_tiny_sd15(
    cache_dir: str | os.PathLike[str] | None = None, seed: int = 0, *, in_subprocess: bool = False
) -> Path:
    """Path of the tiny checkpoint in ``cache_dir`` (default :func:`default_cache_dir`), built on first use.

    The file name carries ``BUILDER_VERSION`` and ``seed``, so a builder change never reuses a stale file.
    Needs ComfyUI only when it has to build. ``in_subprocess=True`` builds with ``sys.executable`` in a child
    process, so this process never imports ``comfy`` (nor gets its CPU-only args); raises
    ``subprocess.CalledProcessError`` (output attached) if that build fails.
    """
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = folder / f"tiny_sd15_v{BUILDER_VERSION}_seed{seed}.safetensors"
    if not path.is_file():
        if in_subprocess:
            import subprocess

            subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), str(path), "--seed", str(seed)],
                check=True,
                capture_output=True,
                text=True,
            )
        else:
            build_tiny_sd15(path, seed=seed)
    return path


def verify_tiny_sd15(path: str | os.PathLike[str], steps: int = 4, size: int = 64) -> dict[str, Any]:
    """Load ``path`` with ComfyUI in-process and check it behaves like a usable SD1.5 checkpoint.

    Asserts (``AssertionError``): detected model config is ``SD15``, a CLIP and a TAESD VAE are present, the
    text conditioning is finite and differs between prompts, and decoded images (``[1,size,size,3]`` float
    in [0,1], euler, ``steps`` steps) are finite, not constant, and change with the prompt and with the seed.
    Returns measured statistics (model/vae class names, eps and image stds, max |d| between images).
    """
    import_comfy()
    with torch.inference_mode():
        return _verify(path, steps, size)


def _verify(path: str | os.PathLike[str], steps: int, size: int) -> dict[str, Any]:
    import comfy.sample
    import comfy.sd
    import comfy.supported_models
    import comfy.taesd.taesd

    # Capture ComfyUI's load report (some of it is DEBUG) without making the existing handlers chattier.
    records = _LogCapture()
    root_logger = logging.getLogger()
    old_level = root_logger.level
    old_handler_levels = [(h, h.level) for h in root_logger.handlers]
    for h, level in old_handler_levels:
        h.setLevel(max(level, root_logger.getEffectiveLevel()))
    root_logger.addHandler(records)
    root_logger.setLevel(logging.DEBUG)
    try:
        model, clip, vae, _ = comfy.sd.load_checkpoint_guess_config(str(path), output_vae=True, output_clip=True)
    finally:
        root_logger.removeHandler(records)
        root_logger.setLevel(old_level)
        for h, level in old_handler_levels:
            h.setLevel(level)
    info_loaded = [m for m in records.messages if m.startswith("clip missing: ")]
    # Every tensor must be consumed and every weight loaded, except the two keys no SD1.5 file can carry.
    allowed_missing = ("logit_scale", "transformer.text_projection.weight")
    for msg in records.messages:
        low = msg.lower()
        if msg.startswith("clip missing: "):
            keys = ast.literal_eval(msg[len("clip missing: ") :])
            assert all(k.endswith(allowed_missing) for k in keys), msg
        elif "missing" in low or "unexpected" in low or "left over" in low:
            raise AssertionError(f"load reported: {msg[:500]}")
    info: dict[str, Any] = {
        "model_config": type(model.model.model_config).__name__,
        "model_type": model.model.model_type.name,
        "clip": type(clip.cond_stage_model).__name__ if clip is not None else None,
        "vae": type(vae.first_stage_model).__name__ if vae is not None else None,
        "clip_missing": info_loaded,
    }
    assert type(model.model.model_config) is comfy.supported_models.SD15, info
    assert clip is not None, info
    assert isinstance(vae.first_stage_model, comfy.taesd.taesd.TAESD), info

    def cond(text: str) -> list:
        return clip.encode_from_tokens_scheduled(clip.tokenize(text))

    def render(text: str, seed: int) -> torch.Tensor:
        latent = torch.zeros(1, 4, size // 8, size // 8)
        noise = comfy.sample.prepare_noise(latent, seed)
        samples = comfy.sample.sample(
            model,
            noise,
            steps,
            7.0,
            "euler",
            "normal",
            cond(text),
            cond(""),
            latent,
            seed=seed,
            disable_pbar=True,
        )
        return vae.decode(samples).float()

    ca, cb = cond("a red fox in the snow")[0][0], cond("a blue car at night")[0][0]
    assert torch.isfinite(ca).all() and torch.isfinite(cb).all()
    assert ca.shape == (1, 77, 768), ca.shape
    info["cond_std"] = float(ca.std())
    info["cond_max_abs_diff"] = float((ca - cb).abs().max())
    assert info["cond_max_abs_diff"] > 0.0

    base = render("a red fox in the snow", 1)
    other_prompt = render("a blue car at night", 1)
    other_seed = render("a red fox in the snow", 2)
    again = render("a red fox in the snow", 1)
    for name, img in (("base", base), ("other_prompt", other_prompt), ("other_seed", other_seed)):
        assert torch.isfinite(img).all(), name
        assert float(img.std()) > 0.01, (name, float(img.std()))
    info["image_shape"] = tuple(base.shape)
    info["image_mean"] = float(base.mean())
    info["image_std"] = float(base.std())
    info["pct_saturated"] = float(((base <= 0.0) | (base >= 1.0)).float().mean() * 100)
    info["max_abs_diff_prompt"] = float((base - other_prompt).abs().max())
    info["max_abs_diff_seed"] = float((base - other_seed).abs().max())
    info["max_abs_diff_rerun"] = float((base - again).abs().max())
    assert info["max_abs_diff_prompt"] > 1 / 255, info
    assert info["max_abs_diff_seed"] > 1 / 255, info
    return info


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="output .safetensors path (with --check: the file to check)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify", action="store_true", help="after building, load it with ComfyUI and sample")
    parser.add_argument("--check", action="store_true", help="only verify an existing file (no build)")
    ns = parser.parse_args(argv)
    path = Path(ns.path)
    if not ns.check:
        t0 = time.perf_counter()
        path = build_tiny_sd15(path, seed=ns.seed)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(
            f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, sha256 {digest[:16]}) in "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    if ns.verify or ns.check:
        t0 = time.perf_counter()
        info = verify_tiny_sd15(path)
        info["verify_seconds"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(info))  # last line: machine-readable
    return 0


if __name__ == "__main__":
    sys.exit(main())
