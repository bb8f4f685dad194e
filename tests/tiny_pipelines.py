"""Test-only helpers around :mod:`steadfast.headless.tiny_pipelines`: tiny SD / Flux pipeline folders and tiny LoRAs.

The builder logic lives in ``headless/tiny_pipelines.py`` (the ``steadfast verify --tiny`` option uses it too); this
module only adds test conveniences (per-kind folders under a temp root, loaded pipelines).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from steadfast.headless import tiny_pipelines as tiny
from steadfast.core.pipelines import load_pipeline

#: size / steps that keep a tiny generation well under a second on 2 CPU cores
SIZE = 64
STEPS = 3


def build_tiny_sd(out_dir: str | Path, seed: int = 0) -> Path:
    """Tiny StableDiffusionPipeline folder (see :func:`steadfast.headless.tiny_pipelines.build_tiny_sd`)."""
    return tiny.build_tiny_sd(out_dir, seed)


def build_tiny_flux(out_dir: str | Path, seed: int = 0) -> Path:
    """Tiny FluxPipeline folder (see :func:`steadfast.headless.tiny_pipelines.build_tiny_flux`)."""
    return tiny.build_tiny_flux(out_dir, seed)


def tiny_dir(root: Path, kind: str, seed: int = 0) -> Path:
    """``root/<kind>-<seed>``, built on first use and reused afterwards."""
    out = Path(root) / f"{kind}-{seed}"
    if not (out / "model_index.json").exists():
        tiny.build_tiny_pipeline(kind, out, seed)
    return out


def fresh(folder: Path, **kw: Any) -> Any:
    """A freshly loaded pipeline from ``folder`` (optimizations mutate pipelines, so tests never share one)."""
    return load_pipeline(folder, **kw)


def tiny_lora(pipe: Any, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """A random LoRA state dict for the pipeline's UNet (see :func:`steadfast.headless.tiny_pipelines.tiny_lora_state_dict`)."""
    return tiny.tiny_lora_state_dict(pipe.unet, rank=rank, seed=seed, prefix="unet")
