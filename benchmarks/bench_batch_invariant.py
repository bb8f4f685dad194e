"""Cost and effect of batch-invariant sampling (Determinism Setup's ``batch_invariant``) on the tiny SD1.5 model.

Runs ComfyUI in-process (``args.cpu``) on the cached tiny SD1.5-architecture checkpoint
(``headless/tiny_sd15.py``). Two ModelPatcher clones are made by the pack's own node,
``SteadfastDeterminismSetup.execute`` (defaults, ``num_threads`` pinned to the current count), one with
``batch_invariant=True`` (each batch item and each conditioning evaluated alone, attention pinned to
SDPA) and one with ``False`` (ComfyUI's own cond batching and attention, sub-quadratic on CPU).

For each batch size, both are timed INTERLEAVED (on, off, on, off, ...) over ``--rounds`` rounds of one
``comfy.sample.sample`` call (euler, ``--steps`` steps, cfg ``--cfg``, initial noise per item from
``core.determinism.noise.seeded_noise`` in ``incremental`` mode: item i = seed + i). Printed: min / median seconds
per sample and the ratio off/on (< 1: batch-invariant is slower), and the parity of each item of the
batch with the batch-1 sample at seed + i (bytes, max |d|), which is what the switch buys.

Usage::

    python benchmarks/bench_batch_invariant.py [--batches 1,2,4] [--side 16] [--steps 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,2,4", help="batch sizes, comma separated")
    p.add_argument("--side", type=int, default=16, help="latent side (16 = 128x128 px image)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--cfg", type=float, default=7.0)
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds per batch size")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=30.0,
        help="before each round, wait up to this many seconds for idle cores (0: never)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    t_start = time.perf_counter()
    _common.import_pack()
    import torch

    import comfy.sample
    import comfy.sd

    from steadfast.core.determinism.noise import seeded_noise
    from steadfast.core.record.compare import compare_outputs
    from steadfast.nodes.determinism_node import SteadfastDeterminismSetup

    ckpt = _common.tiny_sd15_module().cached_tiny_sd15()
    _common.print_header(
        "bench_batch_invariant",
        {
            "checkpoint": f"{ckpt.name} (tiny SD1.5 architecture, random seeded weights, UNet fp32 on CPU)",
            "sampling": f"euler / normal, {args.steps} steps, cfg {args.cfg}, latent {args.side}x{args.side}, "
            f"seed {args.seed} (item i: seed + i)",
            "timing": f"{args.rounds} interleaved rounds per batch size after one untimed call each",
        },
    )
    rows: list[list[Any]] = []
    with torch.inference_mode():
        model, clip, _, _ = comfy.sd.load_checkpoint_guess_config(str(ckpt), output_vae=False, output_clip=True)
        pos = clip.encode_from_tokens_scheduled(clip.tokenize("a red fox in the snow, photograph"))
        neg = clip.encode_from_tokens_scheduled(clip.tokenize(""))
        threads = torch.get_num_threads()
        configs = {
            on: SteadfastDeterminismSetup.execute(
                model, strict=True, allow_tf32=False, num_threads=threads, batch_invariant=on
            ).result[0]
            for on in (True, False)
        }

        def sample(patcher: Any, batch: int, seed: int) -> torch.Tensor:
            latent = torch.zeros(batch, 4, args.side, args.side)
            noise = seeded_noise(tuple(latent.shape), seed, mode="incremental", dtype=latent.dtype)
            return comfy.sample.sample(
                patcher, noise, args.steps, args.cfg, "euler", "normal", pos, neg, latent, seed=seed, disable_pbar=True
            )

        singles = {on: {} for on in configs}
        for batch in batches:
            for on, patcher in configs.items():
                sample(patcher, batch, args.seed)  # untimed first call
                for i in range(batch):
                    if i not in singles[on]:
                        singles[on][i] = sample(patcher, 1, args.seed + i)
            times: dict[bool, list[float]] = {True: [], False: []}
            outs: dict[bool, Any] = {}
            for _r in range(args.rounds):
                _common.wait_for_quiet(args.wait_quiet)
                for on, patcher in configs.items():
                    t0 = time.perf_counter()
                    outs[on] = sample(patcher, batch, args.seed)
                    times[on].append(time.perf_counter() - t0)
            for on in configs:
                pars = [compare_outputs(outs[on][i : i + 1], singles[on][i]) for i in range(batch)]
                tmin, tmed = _common.summarize(times[on])
                omin, omed = _common.summarize(times[False])
                rows.append(
                    [
                        batch,
                        "on" if on else "off",
                        _common.fmt_s(tmin),
                        _common.fmt_s(tmed),
                        f"{omin / tmin:.2f}x",
                        f"{omed / tmed:.2f}x",
                        "yes" if all(p.bit_equal for p in pars) else "no",
                        _common.fmt_d(max(p.max_abs for p in pars)),
                    ]
                )
            print(f"  batch {batch}: on {min(times[True]):.3f} s, off {min(times[False]):.3f} s", flush=True)
    print()
    print(
        _common.markdown_table(
            [
                "batch",
                "batch_invariant",
                "sample min s",
                "sample median s",
                "off/on (min)",
                "off/on (median)",
                "items == batch-1 at seed+i",
                "max abs diff item vs batch-1",
            ],
            rows,
        )
    )
    print(
        "\noff/on < 1: batch-invariant sampling is slower by that factor. Parity: every item of the batch "
        "against the batch-1 sample at seed + i of the same configuration."
    )
    print(f"load average at end: {_common.loadavg()}; total wall time: {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
