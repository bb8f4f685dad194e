"""Dynamic int8 quantization (torchao) vs fp32, eager and regional inductor, side by side on the CPU.

A script, not a timed test. One process builds ComfyUI's ``comfy.ldm.flux.model.Flux`` at reduced size
(``bench_compile_latency.build_flux``: seeded weights; here hidden ``--hidden`` (default 512, 8 heads of 64),
``--double`` double + ``--single`` single blocks; input ``[1, 16, 64, 64]`` = 1024 image tokens + 32 text
tokens), where Linear layers dominate the work, twice with the same weights: one copy stays fp32, in the other
every Linear that :func:`core.optimize.quantize.choose_linears` picks is swapped for a
:class:`core.optimize.quantize.QuantizedLinear` (``int8-dynamic``, what Optimize Model's ``quantize`` input
does). Four variants, each a forward of the denoiser (one sampling step without CFG):

* ``eager fp32``, ``eager int8``;
* ``regional fp32``, ``regional int8``: ``core.compile.swap.compile_blocks`` + ``swap_in`` on the blocks
  ``core.compile.blocks.choose_blocks`` picks, with the Optimize node's default compile options (inductor) and
  guard filter.

Each variant is compiled/warmed by two calls (the second checks run-to-run bit equality), then timed
interleaved ``E Q R RQ E Q R RQ ...`` for ``--rounds`` rounds; before each round it waits (at most
``--wait-quiet`` s) for idle cores, and only rounds in which other processes used <= ``--max-others`` of the
cores count (all rounds, said so, when fewer than 3 are clean). Medians and minimums are printed, with ratios
against eager fp32 and max |d| of every output against eager fp32.

Usage::

    python benchmarks/bench_quantize.py [--hidden 512] [--double 2] [--single 4] [--rounds 9] [--threads 0]
        [--wait-quiet 15] [--max-others 0.25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--hidden", type=int, default=512, help="Flux hidden size (heads of 64)")
    p.add_argument("--double", type=int, default=2, help="double-stream blocks")
    p.add_argument("--single", type=int, default=4, help="single-stream blocks")
    p.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds")
    p.add_argument("--wait-quiet", type=float, default=15.0, help="seconds to wait for idle cores before a round")
    p.add_argument("--max-others", type=float, default=0.25, help="a round counts if others used <= this share")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    return p.parse_args(argv)


def quantize_copy(dm: Any, mode: str = "int8-dynamic") -> tuple[int, str]:
    """Swap the chosen Linears of ``dm`` for built :class:`QuantizedLinear` s; ``(count, choice text)``."""
    from steadfast.core.optimize import quantize as qz

    choice = qz.quantize_in_place(dm, mode)
    return len(choice.paths), choice.as_text()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    _common.import_pack(cpu=True)
    import bench_compile_latency as bcl
    import torch
    import torchao

    if args.threads:
        torch.set_num_threads(args.threads)
    params = dict(
        bcl.flux_params(args.double, args.single),
        hidden_size=args.hidden,
        num_heads=args.hidden // 64,
        vec_in_dim=args.hidden,
        context_in_dim=args.hidden,
    )
    info = _common.print_header(
        "bench_quantize: int8-dynamic (torchao) vs fp32, eager and regional inductor",
        {
            "torchao": torchao.__version__,
            "model": f"Flux (ComfyUI), hidden {args.hidden}, {args.double} double + "
            f"{args.single} single blocks, 1024 image + 32 text tokens, fp32 CPU",
        },
    )
    del info
    fp32 = bcl.build_flux(params)
    int8 = bcl.build_flux(params)
    n_q, choice = quantize_copy(int8)
    n_params = sum(p.numel() for p in fp32.parameters())
    print(f"parameters: {n_params / 1e6:.1f} M; quantized: {choice}\n", flush=True)

    def call_for(dm: Any) -> Callable[[Any], Any]:
        from steadfast.nodes.patches.attention import attention_override

        attn = attention_override("auto")
        x = bcl._randn((1, 16, 64, 64), "flux.x")
        t = torch.tensor([0.5])
        ctx = bcl._randn((1, 32, args.hidden), "flux.context")
        y = bcl._randn((1, args.hidden), "flux.y")
        return lambda m: m(x, t, ctx, y=y, transformer_options={"optimized_attention_override": attn})

    call = call_for(fp32)
    runners = {
        "eager fp32": bcl.make_runner(fp32, call, "eager"),
        "eager int8": bcl.make_runner(int8, call, "eager"),
        "regional fp32": bcl.make_runner(fp32, call, "regional"),
        "regional int8": bcl.make_runner(int8, call, "regional"),
    }
    outs: dict[str, Any] = {}
    first: dict[str, float] = {}
    same: dict[str, bool] = {}
    with torch.no_grad():
        for name, fn in runners.items():
            t0 = time.perf_counter()
            a = fn()
            first[name] = time.perf_counter() - t0
            b = fn()
            outs[name], same[name] = a, torch.equal(a, b)
            print(f"{name}: first call {first[name]:.1f} s; run-to-run bit-equal {same[name]}", flush=True)
        rounds: list[tuple[float | None, dict[str, float]]] = []
        for _ in range(args.rounds):
            _common.wait_for_quiet(args.wait_quiet)
            one: dict[str, float] = {}
            with _common.OthersMeter() as meter:
                for name, fn in runners.items():
                    t0 = time.perf_counter()
                    fn()
                    one[name] = time.perf_counter() - t0
            rounds.append((meter.share, one))
    clean = [r for s, r in rounds if s is not None and s <= args.max_others]
    used = clean if len(clean) >= 3 else [r for _, r in rounds]
    times = {n: [r[n] for r in used] for n in runners}
    others = [s for s, _ in rounds if s is not None]
    ref = outs["eager fp32"]
    base = statistics.median(times["eager fp32"])
    rows = []
    for name in runners:
        med = statistics.median(times[name])
        d = (outs[name] - ref).abs().max().item()
        rel = ((outs[name] - ref).norm() / ref.norm()).item()
        rows.append(
            [
                name,
                _common.fmt_s(med),
                _common.fmt_s(min(times[name])),
                f"{base / med:.2f}x",
                f"{first[name]:.1f}",
                "yes" if same[name] else "NO",
                _common.fmt_d(d),
                f"{rel:.2e}",
            ]
        )
    print()
    print(
        _common.markdown_table(
            [
                "variant",
                "median s/step",
                "min s/step",
                "speed vs eager fp32",
                "first call s",
                "run-to-run bit-equal",
                "max |d| vs eager fp32",
                "rel. L2 vs eager fp32",
            ],
            rows,
        )
    )
    r = {n: statistics.median(times[n]) for n in runners}
    print(
        f"\nint8 / fp32 time: eager {r['eager int8'] / r['eager fp32']:.2f}, regional inductor "
        f"{r['regional int8'] / r['regional fp32']:.2f}; quantized layers {n_q}"
    )
    if others:
        print(
            f"others' CPU share per round: {', '.join(f'{s:.0%}' for s in others)}; "
            f"{len(clean)} of {len(rounds)} rounds <= {args.max_others:.0%} (clean); timings from "
            f"{'the clean rounds' if used is clean else 'ALL rounds (fewer than 3 clean)'}"
        )
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
