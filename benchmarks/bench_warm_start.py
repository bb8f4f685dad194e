"""Warm start of one regional-compile unit: what each of torch's caching routes saves on a restart.

The unit is the first ``DoubleStreamBlock`` of ComfyUI's ``Flux`` (reduced width, seeded weights: the model of
``bench_compile_latency.py``), called with the inputs ComfyUI's ``Flux.forward_orig`` hands it (captured by a
forward pre-hook), SDPA attention. Every row is a FRESH process; its first call (compile or load included) is
timed:

* ``jit cold``: ``torch.compile(block)`` in an empty inductor cache folder (A); it saves torch's mega-cache
  (``torch.compiler.save_cache_artifacts``) after its first call;
* ``jit warm``: the same in folder A (a restart: inductor's FX-graph/AOTAutograd caches hit, Dynamo still traces);
* ``mega-cache``: an empty folder (B) primed with ``torch.compiler.load_cache_artifacts`` from the cold process;
* ``precompile cold``: ``torch.compiler.precompile`` (a make_fx capture lowered by inductor to a self-contained
  Python artifact) in an empty folder (C), then ``precompile.load`` and the first call;
* ``precompile load``: ``precompile.load`` of that artifact in folder C (a restart: no tracing at all);
* ``precompile load, empty``: the same in an empty folder (D): what the artifact alone carries.
* ``pack cold (jit + save)``: the pack's route (``core.compile.swap.compile_blocks`` with a
  ``core.compile.warm.precompiled.PrecompiledState``, under a managed compile cache E, ComfyUI's guard filter): the jit
  compiles, then the precompiled artifact is saved (``save s`` column; not in the first call's time);
* ``pack precompiled warm``: the same in a fresh process on cache E: the artifact answers (a row whose call the jit
  answered instead fails the benchmark).

Every process first does what a server does at start (:mod:`core.compile.warm.preload`: the compile stack's import,
inductor's CPU ISA pick, the heap frozen; ``at start s``), then times the row's first call: the block's own
compile or load and its call, the same start-up for every row. Inductor blocks run under the pack's
``core.torch_compat.trusted_cpu_isa`` (as Optimize Model runs them).
Each output is compared with eager (max |d|) and with ``jit cold``.

``torch.compiler.precompile`` specializes to its example: shapes, control flow and every non-tensor argument
(ComfyUI's ``transformer_options``, with its patches) are baked in and NOT checked at call time; the pack does not
use it (docs/benchmarks.md section 8 says why). Usage: ``python benchmarks/bench_warm_start.py [--hidden 256]``
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

ROWS = [
    ("jit cold", "jit", "A", True),
    ("jit warm", "jit", "A", False),
    ("mega-cache", "mega", "B", False),
    ("precompile cold", "pre-cold", "C", False),
    ("precompile load", "pre-load", "C", False),
    ("precompile load, empty", "pre-load", "D", False),
    ("pack cold (jit + save)", "pack", "E", False),
    ("pack precompiled warm", "pack", "E", False),
]


def child(mode: str, work: Path, hidden: int, save_mega: bool) -> dict[str, Any]:
    """One fresh process: build the block, run ``mode`` once, return its first-call seconds and output file."""
    sf = _common.import_pack()
    import bench_compile_latency as bcl
    import torch

    import comfy.ldm.flux.math as flux_math
    import comfy.ldm.modules.attention as comfy_attention

    flux_math.optimized_attention = comfy_attention.attention_pytorch  # SDPA (sub_quad graph-breaks on CPU)
    params = dict(bcl.flux_params(1, 1), hidden_size=hidden, vec_in_dim=hidden, context_in_dim=hidden)
    model = bcl.build_flux(params)
    captured: dict[str, Any] = {}

    def keep(module: Any, args: tuple, kwargs: dict) -> None:
        captured.setdefault("kwargs", dict(kwargs))

    hook = model.double_blocks[0].register_forward_pre_hook(keep, with_kwargs=True)
    with torch.no_grad():
        model(
            bcl._randn((1, 16, 32, 32), "x"),
            torch.tensor([0.5]),
            bcl._randn((1, 16, hidden), "ctx"),
            y=bcl._randn((1, hidden), "y"),
            transformer_options={},
        )
    hook.remove()
    inputs = tuple(captured["kwargs"][k].detach().clone() for k in ("img", "txt", "vec", "pe"))
    block = model.double_blocks[0]

    def call(blk: Any, img: Any, txt: Any, vec: Any, pe: Any) -> Any:
        with torch.no_grad():
            return blk(img=img, txt=txt, vec=vec, pe=pe, transformer_options={})

    def fresh() -> tuple:  # the block updates img/txt in place (addcmul_): every call gets its own copies
        return tuple(t.clone() for t in inputs)

    artifact = work / "precompiled.pkl"
    from steadfast.core.compile.warm import preload

    t0 = time.perf_counter()  # a server's start-up work (core.compile.warm.preload), before any row's timed first call
    sf.core.torch_compat.import_compile_stack()
    sf.core.torch_compat.pick_cpu_isa()
    preload.freeze_heap()
    start_seconds = time.perf_counter() - t0
    with sf.core.torch_compat.trusted_cpu_isa():
        t0 = time.perf_counter()
        if mode in ("jit", "mega"):
            if mode == "mega":
                torch.compiler.load_cache_artifacts((work / "mega.bin").read_bytes())
            compiled = torch.compile(block)
            out = call(compiled, *fresh())
        elif mode == "pack":
            from steadfast.core.compile.guards import comfy_guard_filter
            from steadfast.core.compile.options import CompileOptions
            from steadfast.core.compile.swap import compile_blocks
            from steadfast.core.compile.warm import cache as compile_cache
            from steadfast.core.compile.warm.precompiled import PrecompiledState

            state = PrecompiledState.detect()
            if not state.enabled:
                raise RuntimeError(f"the precompiled route is off here: {state.reason}")
            cache = compile_cache.open_cache(work / "E-root", "bench", device="cpu")
            wrapped = compile_blocks(
                model, ["double_blocks.0"], CompileOptions(), comfy_guard_filter(), precompiled=state
            )["double_blocks.0"]
            with cache.activate(), state.call_scope():
                out = call(wrapped, *fresh())
        elif mode == "pre-cold":
            code, cache = torch.compiler.precompile(call, block, *fresh())
            out = torch.compiler.precompile.load(code, cache)(block, *fresh())
            artifact.write_bytes(pickle.dumps((code, cache)))
        else:
            code, cache = pickle.loads(artifact.read_bytes())
            out = torch.compiler.precompile.load(code, cache)(block, *fresh())
        seconds = time.perf_counter() - t0
        extra: dict[str, Any] = {}
        if mode == "pack":
            t1 = time.perf_counter()
            with cache.activate():
                state.flush()
            extra = {"save_seconds": time.perf_counter() - t1, "precompiled": state.as_dict()}
            if state.hits == 0 and state.saves == 0:
                raise RuntimeError(f"the precompiled route neither saved nor answered: {state.as_dict()}")
    if save_mega:
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            raise RuntimeError("torch.compiler.save_cache_artifacts() returned None after a compile")
        (work / "mega.bin").write_bytes(saved[0])
    out = tuple(t.clone() for t in out)
    eager = call(block, *fresh())
    if max(float((e - i).abs().max()) for e, i in zip(eager, inputs)) == 0:
        raise RuntimeError("the block's output equals its input: the benchmark would compare nothing")
    name = work / f"out-{mode}-{os.getpid()}.pt"
    torch.save(tuple(out), name)
    return {
        "seconds": seconds,
        "start_seconds": start_seconds,
        "out": str(name),
        **extra,
        "vs_eager": max(float((o - e).abs().max()) for o, e in zip(out, eager)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=256, help="Flux hidden size (Flux.1-dev: 3072)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["mode"], Path(spec["work"]), args.hidden, spec["save_mega"])))
        return 0
    import torch

    _common.print_header("Warm start of one regional unit (Flux DoubleStreamBlock)", {"hidden": args.hidden})
    work = Path(tempfile.mkdtemp(prefix="steadfast-warm-"))
    results: dict[str, dict[str, Any]] = {}
    rows_run = [r for r in ROWS if not (r[1].startswith("pre-") and not hasattr(torch.compiler, "precompile"))]
    if len(rows_run) < len(ROWS):
        print(f"torch {torch.__version__} has no torch.compiler.precompile: its rows are left out")
    for label, mode, folder, save_mega in rows_run:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(work / folder), TRITON_CACHE_DIR=str(work / folder / "t"))
        spec = json.dumps({"mode": mode, "work": str(work), "save_mega": save_mega})
        proc = subprocess.run(
            [sys.executable, __file__, "--hidden", str(args.hidden), "--child", spec],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
        results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{label}: {results[label]['seconds']:.2f} s", flush=True)
    ref = torch.load(results["jit cold"]["out"])
    cold = results["jit cold"]["seconds"]
    cold_total = cold + results["jit cold"]["start_seconds"]
    rows = []
    for label, *_ in rows_run:
        r = results[label]
        out = torch.load(r["out"])
        same = all(torch.equal(a, b) for a, b in zip(out, ref))
        if label == "pack precompiled warm" and r["precompiled"]["hits"] == 0:
            raise RuntimeError(f"the pack's warm row was not answered by a precompiled block: {r['precompiled']}")
        rows.append(
            [
                label,
                _common.fmt_s(r["start_seconds"], 2),
                _common.fmt_s(r["seconds"], 2),
                f"{r['seconds'] / cold:.3f}",
                f"{(r['seconds'] + r['start_seconds']) / cold_total:.3f}",
                _common.fmt_d(r["vs_eager"]),
                "yes" if same else "no",
                f"{r['save_seconds']:.2f}" if "save_seconds" in r else "-",
            ]
        )
    print()
    print(
        _common.markdown_table(
            [
                "route",
                "at start s",
                "first call s",
                "/ jit cold",
                "with start / jit cold's",
                "max |d| vs eager",
                "bit-equal to jit cold",
                "save s",
            ],
            rows,
        )
    )
    print(f"\nload average at end: {_common.loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
