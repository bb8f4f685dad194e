"""SDXL's UNet for the GPU benchmarks, seeded: ComfyUI's own ``model_base.SDXL`` at SDXL 1.0's configuration (and
a tiny SDXL-shaped one for smoke runs), its conditioning and direct denoiser inputs.

Used by the GPU speed call (``benchmarks/gpu_speed.py``, models ``sdxl-b1`` / ``sdxl-b4``), whose SDXL-only command
line is ``benchmarks/bench_gpu_sdxl.py``. Needs ComfyUI importable (``_common``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

SDXL: dict[str, Any] = {
    "use_checkpoint": False,
    "image_size": 32,
    "out_channels": 4,
    "use_spatial_transformer": True,
    "legacy": False,
    "num_classes": "sequential",
    "adm_in_channels": 2816,
    "in_channels": 4,
    "model_channels": 320,
    "num_res_blocks": [2, 2, 2],
    "transformer_depth": [0, 0, 2, 2, 10, 10],
    "channel_mult": [1, 2, 4],
    "transformer_depth_middle": 10,
    "use_linear_in_transformer": True,
    "context_dim": 2048,
    "num_head_channels": 64,
    "transformer_depth_output": [0, 0, 0, 2, 2, 2, 10, 10, 10],
    "use_temporal_attention": False,
    "use_temporal_resblock": False,
}
"""SDXL 1.0 base, as ComfyUI's ``model_detection`` derives it from the checkpoint (``dtype`` is added at build)."""

SMOKE: dict[str, Any] = {
    **SDXL,
    "model_channels": 32,
    "channel_mult": [1, 2],
    "num_res_blocks": [1, 1],
    "transformer_depth": [0, 1],
    "transformer_depth_middle": 1,
    "transformer_depth_output": [0, 0, 1, 1],
    "context_dim": 64,
    "num_head_channels": 16,
}
"""A tiny SDXL-shaped UNet for ``--smoke`` on the CPU: the same classes and code paths (ResBlocks, a level without
attention, linear-in SpatialTransformers with cross-attention, the middle block, ADM) at 32 / 64 channels, two
levels, one resnet per level, one transformer layer where SDXL has some; the ADM input keeps SDXL's 2816 (pooled
1280 + 6 size embeddings). Kept small because tracing time in CI grows with the number of blocks."""

POOLED_DIM = 1280  # CLIP-G pooled output: SDXL's ADM input is this plus 6 x 256 size embeddings
CFG = 7.0


def _generator(device: Any, seed: int, key: str) -> Any:
    return _common.seeded_generator("steadfast-sdxl-bench", device, seed, key)


def build_sdxl(config: dict[str, Any], device: Any, dtype: Any, seed: int) -> Any:
    """A ``ModelPatcher`` around ComfyUI's ``model_base.SDXL`` (``UNetModel`` with ``config``) on ``device``.

    Args:
        config: a UNet configuration (:data:`SDXL` or :data:`SMOKE`); not modified.
        device: torch device the weights are made on.
        dtype: the weights' dtype (``torch.float16`` for the benchmark).
        seed: weights seed; each parameter's generator is seeded by ``seed`` and the parameter's name.
    Returns:
        ``comfy.model_patcher.ModelPatcher`` (load device ``device``, offload device CPU). Weights (ComfyUI's layers
        leave them uninitialised): matrices and convolution kernels ~ N(0, 1/fan_in), norm weights (1-D
        ``weight``) 1, biases ~ N(0, 0.02^2). No layer is zero-initialised, so the output depends on the input.
    Raises:
        RuntimeError: the UNet holds buffers (they would stay uninitialised).
    """
    return _common.seeded_comfy_model("SDXL", config, device, dtype, seed, "steadfast-sdxl-bench", "weight")


def conditioning(config: dict[str, Any], tokens: int, seed: int, width: int, height: int) -> tuple[list, list]:
    """``(positive, negative)`` SDXL CONDITIONING: seeded CLIP-like context ``[1, tokens, context_dim]`` (float32,
    CPU) and pooled output ``[1, 1280]`` each, with the image size SDXL's ADM embeds (``width`` / ``height`` in
    pixels)."""
    import torch

    out = []
    for which in ("positive", "negative"):
        ctx = torch.randn(1, tokens, config["context_dim"], generator=_generator("cpu", seed, f"{which} context"))
        pooled = torch.randn(1, POOLED_DIM, generator=_generator("cpu", seed, f"{which} pooled"))
        out.append([[ctx, {"pooled_output": pooled, "width": width, "height": height}]])
    return out[0], out[1]


def denoiser_inputs(
    config: dict[str, Any], latent_shape: tuple[int, ...], tokens: int, device: Any, dtype: Any, seed: int
) -> dict[str, Any]:
    """Keyword inputs of one direct ``UNetModel`` call at ``latent_shape`` (``x``, ``timesteps``, ``context``,
    ``y``), drawn from ``seed``; for the check that the random-weight model's output depends on its input."""
    import torch

    b = latent_shape[0]
    g = _generator("cpu", seed, "denoiser inputs")
    return {
        "x": torch.randn(latent_shape, generator=g).to(device, dtype),
        "timesteps": torch.full((b,), 500.0, device=device),
        "context": torch.randn(b, tokens, config["context_dim"], generator=g).to(device, dtype),
        "y": torch.randn(b, config["adm_in_channels"], generator=g).to(device, dtype),
    }
