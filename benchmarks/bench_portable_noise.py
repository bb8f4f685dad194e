"""Cost of portable noise (``core.determinism.randn``, issue 17) against ``torch.randn`` on the CPU.

Three draws are timed INTERLEAVED over ``--rounds`` rounds, each from a freshly seeded private CPU generator:
``portable_randn`` as the pack calls it (``auto``: ``torch.randn`` itself where its bytes are the portable
ones, issue 23), the numpy emulation (``backend="numpy"``: what ARM and CPUs without AVX2 run) and
``torch.randn``. Printed: median and min milliseconds per draw and the ratios to ``torch.randn`` (issue 23's
target for the numpy path: <= 5x at 1x4x128x128). Cases: the SDXL latent 1x4x128x128, a 1x16x128x128 latent
and a batch of 4 as four per-item draws (``incremental`` mode: item i from seed + i, what ``seeded_noise``
does). Also printed: whether the bytes equal torch's (they do wherever torch runs its AVX2 kernel: x86 with
AVX2/AVX512).

No ComfyUI needed. Usage::

    python benchmarks/bench_portable_noise.py [--rounds 30] [--seed 42] [--threads 1] [--profile]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30, help="interleaved timed rounds per case")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--profile",
        action="store_true",
        help="also print where the numpy path's time goes at 1x4x128x128 (min of --rounds per part)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: on a shared 2-core machine OpenMP spin-waiting made the "
        "per-item torch.cat 80 ms with 2 threads); both draws are single-threaded anyway",
    )
    return p.parse_args(argv)


def _profile(rounds: int, seed: int) -> str:
    """Where the numpy path's time goes for one 1x4x128x128 draw: min milliseconds of each part over ``rounds``."""
    import numpy as np
    import torch

    from steadfast.core.determinism import randn as pr

    n = 4 * 128 * 128
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(seed)).numpy().reshape(-1, 16)
    rows = pr._BLOCK_ROWS
    blocks = [uniforms[i : i + rows] for i in range(0, uniforms.shape[0], rows)]
    calls = {"n": 0}

    class Counting(pr._FastFMA):
        def __call__(self, a, b, c):
            calls["n"] += 1
            return super().__call__(a, b, c)

    def no_fma(a, b, c):
        return a

    parts = {
        "uniforms (torch.rand)": lambda: torch.rand(n, generator=torch.Generator().manual_seed(seed)),
        "log256 (all blocks)": lambda: [pr._log256(pr._ONE - b[:, :8], pr._FastFMA((b.shape[0], 8))) for b in blocks],
        "log256 without its FMAs": lambda: [pr._log256(pr._ONE - b[:, :8], no_fma) for b in blocks],
        "sincos256 (all blocks)": lambda: [
            pr._sincos256(b[:, 8:] * pr._TWO_PI, pr._FastFMA((b.shape[0], 8))) for b in blocks
        ],
        "sincos256 without its FMAs": lambda: [pr._sincos256(b[:, 8:] * pr._TWO_PI, no_fma) for b in blocks],
        "whole numpy draw": lambda: pr.portable_randn(
            (1, 4, 128, 128), torch.Generator().manual_seed(seed), backend="numpy"
        ),
        "torch.randn": lambda: torch.randn((1, 4, 128, 128), generator=torch.Generator().manual_seed(seed)),
    }
    with np.errstate(all="ignore"):  # the no-FMA variants compute garbage on purpose
        pr._log256(pr._ONE - blocks[0][:, :8], Counting((blocks[0].shape[0], 8)))
        log_calls = calls["n"]
        pr._sincos256(blocks[0][:, 8:] * pr._TWO_PI, Counting((blocks[0].shape[0], 8)))
        sincos_calls = calls["n"] - log_calls
        best = {}
        for _ in range(rounds):
            for name, fn in parts.items():  # interleaved
                t0 = time.perf_counter()
                fn()
                best[name] = min(best.get(name, math.inf), time.perf_counter() - t0)
    out = [[name, f"{sec * 1e3:.3f}", f"{sec / best['torch.randn']:.1f}"] for name, sec in best.items()]
    return (
        f"numpy path profile, 1x4x128x128 ({len(blocks)} blocks of {rows} rows; fused multiply-adds emulated "
        f"per lane: {log_calls} in log256, {sincos_calls} in sincos256):\n\n"
        + _common.markdown_table(["part", "min ms", "x torch.randn"], out)
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _common._scripts_on_path()
    from _steadfast_import import import_steadfast

    import_steadfast()
    import torch

    from steadfast.core.determinism.randn import draw_method, portable_randn

    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    _common.print_header("Portable noise vs torch.randn (CPU generator)", {"rounds": args.rounds})

    def one(draw, shape):
        return lambda: draw(shape, torch.Generator().manual_seed(args.seed))

    def per_item(draw, shape):
        item = (1, *shape[1:])
        return lambda: torch.cat([draw(item, torch.Generator().manual_seed(args.seed + i)) for i in range(shape[0])])

    def torch_draw(shape, gen):
        return torch.randn(shape, generator=gen)

    def numpy_draw(shape, gen):
        return portable_randn(shape, gen, backend="numpy")

    print(f"draw method here (float32): {draw_method(torch.float32)}\n")
    cases = [
        ("1x4x128x128 (SDXL latent), one draw", one, (1, 4, 128, 128)),
        ("1x16x128x128, one draw", one, (1, 16, 128, 128)),
        ("4x16x128x128, 4 per-item draws (incremental mode)", per_item, (4, 16, 128, 128)),
    ]
    rows = []
    for name, make, shape in cases:
        fns = {"auto": make(portable_randn, shape), "numpy": make(numpy_draw, shape), "torch": make(torch_draw, shape)}
        ref = fns["torch"]().view(torch.int32)  # also warms up
        equal = {k: torch.equal(fns[k]().view(torch.int32), ref) for k in ("auto", "numpy")}
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, fn in fns.items():  # interleaved
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        rows.append(
            [
                name,
                f"{med['auto'] * 1e3:.2f}",
                f"{med['numpy'] * 1e3:.2f}",
                f"{low['numpy'] * 1e3:.2f}",
                f"{med['torch'] * 1e3:.2f}",
                f"{low['torch'] * 1e3:.2f}",
                f"{med['auto'] / med['torch']:.2f}",
                f"{med['numpy'] / med['torch']:.1f}",
                f"{low['numpy'] / low['torch']:.1f}",
                "yes" if equal["auto"] else "NO",
                "yes" if equal["numpy"] else "NO",
            ]
        )
    print(
        _common.markdown_table(
            [
                "case",
                "portable (auto) median ms",
                "numpy path median ms",
                "numpy path min ms",
                "torch.randn median ms",
                "torch.randn min ms",
                "auto/torch (median)",
                "numpy/torch (median)",
                "numpy/torch (min)",
                "auto bytes = torch",
                "numpy bytes = torch",
            ],
            rows,
        )
    )
    if args.profile:
        print()
        print(_profile(args.rounds, args.seed))
    print()
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
