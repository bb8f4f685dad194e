"""Cost of portable noise (``core.portable_randn``, issue 17) against ``torch.randn`` on the CPU.

For each case both draws are timed INTERLEAVED (portable, torch, portable, torch, ...) over ``--rounds``
rounds, each from a freshly seeded private CPU generator; printed: median and min milliseconds per
draw and the ratio portable / torch. The cases are the ones the issue asks for: one 1x16x128x128 latent
and a batch of 4, the batch both as one draw (``comfy`` mode: one stream) and as four per-item draws
(``incremental`` mode: item i from seed + i, what ``seeded_noise`` does). Also printed: whether the
bytes are equal (they are wherever torch runs its AVX2 kernel: x86 with AVX2/AVX512).

No ComfyUI needed. Usage::

    python benchmarks/bench_portable_noise.py [--rounds 30] [--seed 42] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30, help="interleaved timed rounds per case")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: on a shared 2-core machine OpenMP spin-waiting made the "
                        "per-item torch.cat 80 ms with 2 threads); both draws are single-threaded anyway")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _common._scripts_on_path()
    from _steadfast_import import import_steadfast

    import_steadfast()
    import torch
    from steadfast.core.portable_randn import portable_randn

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

    cases = [("1x16x128x128, one draw", one, (1, 16, 128, 128)),
             ("4x16x128x128, one draw (comfy mode)", one, (4, 16, 128, 128)),
             ("4x16x128x128, 4 per-item draws (incremental mode)", per_item, (4, 16, 128, 128))]
    rows = []
    for name, make, shape in cases:
        ours, theirs = make(portable_randn, shape), make(torch_draw, shape)
        equal = torch.equal(ours().view(torch.int32), theirs().view(torch.int32))  # also warms up
        t_ours, t_theirs = [], []
        for _ in range(args.rounds):
            for fn, acc in ((ours, t_ours), (theirs, t_theirs)):
                t0 = time.perf_counter()
                fn()
                acc.append(time.perf_counter() - t0)
        m_ours, m_theirs = statistics.median(t_ours), statistics.median(t_theirs)
        rows.append([name, f"{m_ours * 1e3:.1f}", f"{min(t_ours) * 1e3:.1f}", f"{m_theirs * 1e3:.2f}",
                     f"{min(t_theirs) * 1e3:.2f}", f"{m_ours / m_theirs:.1f}", "yes" if equal else "NO"])
    print(_common.markdown_table(["case", "portable median ms", "portable min ms", "torch.randn median ms",
                                  "torch.randn min ms", "median ratio portable/torch", "bytes equal"], rows))
    print()
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
