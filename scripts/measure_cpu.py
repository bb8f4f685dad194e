"""Re-measure the CPU facts ``core/`` relies on that no test asserts: ``python scripts/measure_cpu.py``.

Prints one Markdown table row per fact (``docs/measurements.md`` quotes the output). Each fact is
hardware- and build-dependent, so it is measured and printed here rather than asserted in a test:

* ``threads``: fp32 results of ``nn.Linear`` (K=3072, N=18432, M=32) and of a 4 Mi-element ``.sum()``
  at 1 thread vs 2 threads (why the thread count is pinned by a policy and part of the fingerprint).
* ``fill``: ``torch.empty`` of 256 MiB with deterministic algorithms off vs on
  (``torch.utils.deterministic.fill_uninitialized_memory``, default True, NaN-fills new memory).

Runs in a few seconds; needs no ComfyUI. Restores the thread count and the deterministic flag.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch


def _at_threads(n: int, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(previous)


def thread_rows() -> list[str]:
    """Rows comparing the bytes of fp32 results computed with 1 and with 2 intra-op threads."""
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(3072, 18432).requires_grad_(False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen) / 64)
        linear.bias.zero_()
    x = torch.randn(32, 3072, generator=gen)
    big = torch.randn(4 * 2**20, generator=gen)
    rows = []
    for name, fn in (("Linear 3072->18432, M=32", lambda: linear(x)), ("sum of 4 Mi values", big.sum)):
        with torch.inference_mode():
            one, two = _at_threads(1, fn), _at_threads(2, fn)
        equal = torch.equal(one.view(torch.int32), two.view(torch.int32))
        diff = float((one.double() - two.double()).abs().max())
        rows.append(
            f"| threads | fp32 {name}: 1 vs 2 threads | {'bit-equal' if equal else 'differ'}, "
            f"max abs diff {diff:.2g} |"
        )
    return rows


def fill_row(mib: int = 256, repeats: int = 5) -> str:
    """Row with the best-of-``repeats`` seconds of ``torch.empty`` with deterministic algorithms off / on."""
    n = mib * 2**20 // 4

    def best() -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            t = torch.empty(n)
            times.append(time.perf_counter() - t0)
            del t
        return min(times)

    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        off = best()
        torch.use_deterministic_algorithms(True)
        on = best()
        filled = bool(torch.isnan(torch.empty(8)).all())
    finally:
        torch.use_deterministic_algorithms(was)
    return (
        f"| fill | torch.empty {mib} MiB fp32, deterministic algorithms off / on | {off:.2g} s / {on:.2g} s"
        f"{' (NaN-filled)' if filled else ''} |"
    )


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    cpu = platform.processor() or "unknown CPU"
    if Path("/proc/cpuinfo").exists():
        names = [
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    print(f"torch {torch.__version__}, {cpu}, {torch.get_num_threads()} threads by default\n")
    print("| fact | what | result |\n|---|---|---|")
    for row in (*thread_rows(), fill_row()):
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
