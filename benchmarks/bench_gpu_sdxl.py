"""SDXL architecture on a GPU: ComfyUI's own SDXL UNet, eager vs Steadfast vs core, batch 1 and 4.

What it runs (the product path, not a re-implementation): ComfyUI's ``comfy.model_base.SDXL`` around
``comfy.ldm.modules.diffusionmodules.openaimodel.UNetModel`` with SDXL's configuration (the dict ComfyUI's
``model_detection`` derives from an SDXL checkpoint: 320 channels x [1, 2, 4], transformer depths [0, 0, 2, 2, 10,
10] / middle 10, context 2048, ADM 2816; about 2.57 B parameters) in fp16, every parameter drawn from a generator
seeded by its name (no download; random weights: the images are noise, while timings, kernels and bits behave as
with the real model). It is wrapped in a ``ModelPatcher`` and sampled with ``comfy.sample.sample`` (euler / normal,
cfg 7 with a positive and a negative conditioning, 28 steps, 1024x1024 = latent ``[batch, 4, 128, 128]``, 77 context
tokens), initial noise from the pack's CPU ``core.determinism.noise.seeded_noise``.

The rows (eager; Steadfast regional; Steadfast regional + Determinism Setup; core ``TorchCompileModel``; Steadfast
regional warm in a second process from the persistent compile cache) and their measurements are those of the GPU
speed call, ``benchmarks/gpu_speed.py``: this script is that call restricted to the SDXL models (``sdxl-b1``,
``sdxl-b4``), with the same options. The model itself is ``benchmarks/sdxl_model.py``.

Usage::

    python benchmarks/bench_gpu_sdxl.py --out /tmp/sdxl              # GPU: batch 1 and 4, every row
    python benchmarks/bench_gpu_sdxl.py --out /tmp/sdxl --batch 4 --rows eager,steadfast
    python benchmarks/bench_gpu_sdxl.py --out /tmp/sdxl --smoke      # tiny SDXL-shaped UNet on the CPU, 1 step

Needs a ComfyUI checkout (``COMFYUI_PATH``, default ``~/comfy/ComfyUI``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_speed, imported by main()


def parse_args(argv: list[str] | None = None) -> list[str]:
    """This script's options as the GPU speed call's arguments (``--models sdxl-b1,sdxl-b4`` unless ``--batch``
    names a subset). Raises ``SystemExit`` (argparse) for a batch other than 1 or 4."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", default="1,4", help="batch sizes: 1, 4 or 1,4 (default)")
    ns, rest = p.parse_known_args(argv)
    batches = [b.strip() for b in ns.batch.split(",") if b.strip()]
    if not batches or any(b not in ("1", "4") for b in batches):
        p.error(f"--batch takes 1, 4 or 1,4; got {ns.batch!r}")
    return ["--models", ",".join(f"sdxl-b{b}" for b in batches), *rest]


def main(argv: list[str] | None = None) -> int:
    import gpu_speed

    return gpu_speed.main(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
