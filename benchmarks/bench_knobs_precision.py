"""Precision and inductor-preset knobs of Optimize Model, side by side on the tiny SD1.5 checkpoint (CPU).

Configurations (each a clone made by the pack's node, ``SteadfastOptimizeModel.execute``; attention SDPA auto):

=======================  ========================================================================
``fp32 eager``           precision "model" (the fp32 checkpoint as loaded), compile off: the baseline
``bf16 eager``           precision bf16 (ComfyUI's ``set_model_compute_dtype``), compile off
``fp16 eager``           precision fp16, compile off
``fp32 regional``        fp32, regional ``torch.compile`` (inductor, inductor_preset none)
``fp32 regional fast``   ... with inductor_preset diffusers-fast (compared with the row above)
``fp32 full``            fp32, full ``torch.compile`` of the UNet (inductor, preset none)
``fp32 full fast``       ... with diffusers-fast (the UNet's 1x1 convolutions are compiled here, not in
                         the regional blocks: conv_1x1_as_mm can only act on them in a full compile)
=======================  ========================================================================

Timing and parity are those of ``benchmarks/bench_tiny_sd15.py`` (its ``run_size``): a first call per
configuration (compiles; no further warm-up by default: fp16 on a CPU without fp16 arithmetic is slow), then
interleaved rounds ``A B C D E A B C ...`` with the wait-for-quiet /
others'-CPU filter; seconds per sample and the fastest sampler step, ratios to the baseline (> 1 = faster), max |d|
of the latent vs the baseline (fp32 eager) and vs the previous row (so ``fp32 regional fast`` is measured against
``fp32 regional``). Inductor compiles cold, into a fresh temporary ``TORCHINDUCTOR_CACHE_DIR``.

Usage::

    python benchmarks/bench_knobs_precision.py [--sizes 16] [--steps 3] [--rounds 3] [--max-rounds 3] [--wait-quiet 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import bench_tiny_sd15  # noqa: E402  (run_size, compile_note: same timing and parity method)

# name -> (precision, compile, inductor_preset)
CONFIGS: dict[str, tuple[str, str, str]] = {
    "fp32 eager": ("model", "off", "none"),
    "bf16 eager": ("bf16", "off", "none"),
    "fp16 eager": ("fp16", "off", "none"),
    "fp32 regional": ("model", "regional", "none"),
    "fp32 regional fast": ("model", "regional", "diffusers-fast"),
    "fp32 full": ("model", "full", "none"),
    "fp32 full fast": ("model", "full", "diffusers-fast"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16", help="latent sides, comma separated (16 = 128x128 px)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--cfg", type=float, default=7.0)
    p.add_argument("--rounds", type=int, default=3, help="clean interleaved timed rounds wanted per size")
    p.add_argument("--max-rounds", type=int, default=3)
    p.add_argument("--max-others", type=float, default=0.10)
    p.add_argument("--warmup", type=int, default=0, help="untimed calls after the first (fp16 on CPU is slow)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--wait-quiet", type=float, default=10.0)
    return p.parse_args(argv)


def build_configs(model: Any, names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``({name: ModelPatcher clone}, {name: CompileRecord})`` made by the node (records taken right away: the
    registry keeps one record per underlying model, each clone's wrapper keeps its own)."""
    from steadfast.core.compile import registry
    from steadfast.nodes.optimize_node import SteadfastOptimizeModel

    out: dict[str, Any] = {}
    records: dict[str, Any] = {}
    for name in names:
        precision, compile_, preset = CONFIGS[name]
        res = SteadfastOptimizeModel.execute(
            model,
            qkv_fusion=False,
            channels_last=False,
            attention="auto",
            compile=compile_,
            backend="inductor",
            mode="default",
            dynamic="auto",
            fullgraph=False,
            compile_cache="off",
            precision=precision,
            inductor_preset=preset,
        )
        out[name] = res.result[0]
        if compile_ != "off":
            records[name] = registry.REGISTRY.get(out[name].model)
        print(f"[{name}] " + res.result[1].replace("\n", "; "), flush=True)
    return out, records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names, sizes = bench_tiny_sd15.names_and_sizes(args, CONFIGS)
    tmp_cache = tempfile.mkdtemp(prefix="steadfast_bench_knobs_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp_cache
    t_start = time.perf_counter()
    try:
        _common.import_pack()
        import torch

        ckpt = _common.tiny_sd15_module().cached_tiny_sd15()
        _common.print_header(
            "bench_knobs_precision",
            {
                "checkpoint": f"{ckpt.name} (tiny SD1.5 architecture, random seeded weights, fp32 weights on CPU)",
                "sampling": f"euler / normal, {args.steps} steps, cfg {args.cfg} (UNet batch 2), seed {args.seed}",
                "timing": f"{args.rounds} clean interleaved rounds per size wanted (at most {args.max_rounds})",
                "inductor cache": "fresh empty dir (cold)",
            },
        )
        with torch.inference_mode():  # as ComfyUI's prompt executor runs nodes
            model, sample = bench_tiny_sd15.load_and_sampler(ckpt, args)
            configs, records = build_configs(model, names)
            rows, notes = bench_tiny_sd15.run_sizes(sizes, configs, records, sample, args)
    finally:
        shutil.rmtree(tmp_cache, ignore_errors=True)

    print()
    print(
        _common.markdown_table(
            [
                "latent",
                "config",
                "first call s",
                "sample min s",
                "sample median s",
                "step min s",
                "vs fp32 eager (sample min)",
                "vs fp32 eager (sample median)",
                "vs fp32 eager (step min)",
                "bit-equal to fp32 eager",
                "max abs diff vs fp32 eager",
                "bit-equal to previous row (max abs diff)",
                "rerun bit-equal",
            ],
            rows,
        )
    )
    print()
    print("- timings from: " + "; ".join(notes.pop("_rounds", [])))
    for name, lines in notes.items():
        print(f"- compile state of `{name}`: " + "; ".join(lines))
    print(
        "\nratio = fp32 eager time / config time (> 1 is faster); preset vs default compiled = the ratio of the "
        "two regional rows. step min = fastest single sampler step (steps 2..N)."
    )
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
