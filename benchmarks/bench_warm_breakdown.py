"""Where a warm first run spends its time: tracing, cache load, the compile stack's import, first calls.

The tiny SD1.5-architecture checkpoint in ComfyUI, in-process (no server), 4 euler steps: each (config, cache
state) runs in a FRESH process, ``cold`` with empty cache folders and ``warm`` on the folders the cold process
left (a restart). Configs: ``eager`` (nothing), ``steadfast`` (Optimize Model: compile regional, inductor, SDPA
auto, the persistent compile cache). The first sampling call is split with Dynamo's per-frame compilation metrics
(``torch._dynamo.utils.get_compilation_metrics``):

* ``at start``: the pack's preload (:mod:`core.compile.warm.preload`), run first, as a server runs it when it loads the
  pack: on a warm start it imports the compile stack, picks inductor's CPU ISA and freezes the heap; on a cold start
  (nothing compiled yet) it does nothing;
* ``gc``: the garbage collector's pauses inside the first sampling call (``gc.callbacks``), with its full
  collections counted (each walks every tracked object not frozen);
* ``optimize``: the Optimize Model node's execution (it imports inductor's config: the compile stack's import
  lands here when the process has not imported it yet; ``preloaded`` says what was imported before);
* ``import``: what was left of importing ``torch._dynamo`` + ``torch._inductor.compile_fx`` (before sampling);
* ``trace``: Dynamo's time per frame minus its backend time (bytecode tracing, guard building), summed;
* ``backend``: AOTAutograd + inductor per frame (on a warm start: the cache lookups and loading the compiled
  ``.so``/Python modules), summed;
* ``precompiled load`` / ``save``: the pack's precompiled blocks (:mod:`core.compile.warm.precompiled`) loaded from the
  cache (a warm start: nothing traced) or saved after the call that compiled them (a cold start), and their hits;
* ``rest``: the first sampling call minus all of the above and the same call's steady time (a second sampling call
  with another seed): first calls of the loaded kernels, guard checks, the pack's wrappers.

Usage: ``python benchmarks/bench_warm_breakdown.py [--repeats 3] [--steps 4] [--side 64]``; run it with each
ComfyUI row's venv and ``COMFYUI_PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import _common
tiny = _common.tiny_sd15_module()
steadfast = _common.import_pack()
config, ckpt, steps, side = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
import gc, torch
from pathlib import Path
t_start, start_state = 0.0, {}
if config == "steadfast":  # what the server does when it loads the pack (nodes/__init__.py), before any prompt
    from steadfast.core.compile.warm import preload
    t0 = time.perf_counter()
    start_state = preload.preload(Path(os.environ["STEADFAST_COMPILE_CACHE"]))
    t_start = time.perf_counter() - t0
gc_pause = {"on": False, "t": None, "s": 0.0, "full": 0}
def _gc_cb(phase, info):
    if gc_pause["on"] and phase == "start":
        gc_pause["t"] = time.perf_counter()
    elif gc_pause["on"] and gc_pause["t"] is not None:
        gc_pause["s"] += time.perf_counter() - gc_pause["t"]
        gc_pause["full"] += info["generation"] == 2
gc.callbacks.append(_gc_cb)
import comfy.sd, comfy.sample, comfy.samplers, comfy.utils
t0 = time.perf_counter()
model, clip, _vae, _ = comfy.sd.load_checkpoint_guess_config(ckpt, output_vae=True, output_clip=True)
t_load = time.perf_counter() - t0

def cond(text):
    tokens = clip.tokenize(text)
    return clip.encode_from_tokens_scheduled(tokens)

pos, neg = cond("a lighthouse at dusk"), cond("")
t_import = t_optimize = 0.0
preloaded = sorted(m for m in ("torch._dynamo", "torch._inductor", "torch._inductor.compile_fx") if m in sys.modules)
if config == "steadfast":
    from steadfast.nodes import optimize_node
    t0 = time.perf_counter()
    model = optimize_node.SteadfastOptimizeModel.execute(
        model=model, qkv_fusion=False, channels_last=False, attention="auto", compile="regional",
        backend="inductor", mode="default", dynamic="auto", fullgraph=False).args[0]
    t_optimize = time.perf_counter() - t0
    t0 = time.perf_counter()
    import torch._dynamo, torch._inductor.compile_fx  # noqa: F401  (the compile stack's import, timed alone)
    t_import = time.perf_counter() - t0
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics
    clear_compilation_metrics()

def sample(seed):
    latent = torch.zeros(1, 4, side // 8, side // 8)
    noise = comfy.sample.prepare_noise(latent, seed)
    t0 = time.perf_counter()
    out = comfy.sample.sample(model, noise, steps, 7.0, "euler", "normal", pos, neg, latent, denoise=1.0,
                              seed=seed)
    return time.perf_counter() - t0, out

gc_pause["on"] = True
first, out1 = sample(1)
gc_pause["on"] = False
frames = trace = backend = 0.0
hits = 0
if config == "steadfast":
    for m in get_compilation_metrics():
        entire = m.entire_frame_compile_time_s or 0.0
        back = m.backend_compile_time_s or 0.0
        frames += 1
        trace += max(entire - back, 0.0)
        backend += back
        hits += (m.inductor_fx_local_cache_hit_count or 0)
pre = {}
if config == "steadfast":
    from steadfast.core.compile.registry import REGISTRY
    pre = (REGISTRY.records()[-1].summary().get("precompiled") or {}) if REGISTRY.records() else {}
second, out2 = sample(2)
print("RESULT " + json.dumps({"start": t_start, "start_gc_frozen": start_state.get("gc_frozen") or 0,
                              "gc": gc_pause["s"], "gc_full": gc_pause["full"],
                              "load": t_load, "optimize": t_optimize, "import": t_import, "preloaded": preloaded,
                              "first": first, "second": second, "frames": frames, "trace": trace, "backend": backend,
                              "fx_cache_hits": hits, "pre_load": pre.get("load_seconds", 0.0),
                              "pre_save": pre.get("save_seconds", 0.0), "pre_hits": pre.get("hits", 0),
                              "depends_on_seed": not torch.equal(out1, out2)}), flush=True)
os._exit(0)  # torch 2.11 may die at exit after compiled code ran (docs/compatibility.md, torch 2.11 exit row)
"""


def one(config: str, caches: Path, ckpt: Path, steps: int, side: int) -> dict[str, Any]:
    """One fresh process; its RESULT dict (seconds)."""
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "STEADFAST_COMPILE_CACHE": str(caches / "steadfast"),
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(Path(__file__).resolve().parent), config, str(ckpt), str(steps), str(side)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"{config} child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(line[7:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--side", type=int, default=64, help="image side in pixels (latent side / 8)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    t_start = time.perf_counter()
    _common.print_header(
        "Where a warm first run spends its time (tiny SD1.5, in-process ComfyUI)",
        {"steps": args.steps, "side": args.side, "repeats": args.repeats},
    )
    ckpt = _common.tiny_sd15_module().cached_tiny_sd15(in_subprocess=True)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.repeats):
        for config in ("eager", "steadfast"):
            with tempfile.TemporaryDirectory(prefix=f"bench_warm_{config}_") as tmp:
                for state in ("cold", "warm"):
                    r = one(config, Path(tmp), ckpt, args.steps, args.side)
                    assert r["depends_on_seed"], "the tiny model's output must depend on its noise"
                    runs.setdefault((config, state), []).append(r)
                    shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
                    print(f"  {config} {state}: {json.dumps(shown)}", flush=True)
    rows = []
    eager_first = statistics.median(r["first"] for r in runs["eager", "cold"])
    for (config, state), rs in runs.items():
        med = {k: statistics.median(float(r[k]) for r in rs) for k in rs[0] if k != "preloaded"}
        rest = med["first"] - med["trace"] - med["backend"] - med["pre_load"] - med["pre_save"] - med["second"]
        rows.append(
            [
                config,
                state,
                f"{med['start']:.2f}",
                f"{med['first']:.2f}",
                f"{med['first'] / eager_first:.1f}",
                f"{med['gc']:.2f} ({int(med['gc_full'])})",
                f"{med['optimize']:.2f}",
                f"{med['import']:.2f}",
                f"{int(med['frames'])}",
                f"{med['trace']:.2f}",
                f"{med['backend']:.2f}",
                f"{med['pre_load']:.2f}",
                f"{med['pre_save']:.2f}",
                f"{int(med['pre_hits'])}",
                f"{rest:.2f}",
                f"{med['second']:.2f}",
                f"{int(med['fx_cache_hits'])}",
            ]
        )
    print()
    print(
        _common.markdown_table(
            [
                "config",
                "cache",
                "at start s",
                "first sampling s",
                "/ eager first",
                "gc s (full)",
                "Optimize node s",
                "import s",
                "frames",
                "trace s",
                "backend s",
                "precompiled load s",
                "save s",
                "precompiled hits",
                "rest s",
                "steady s",
                "fx cache hits",
            ],
            rows,
        )
    )
    print(
        "\nmedians of the repeats; at start = the pack's preload (core.compile.warm.preload: the compile stack's "
        "import, inductor's CPU ISA pick, the heap frozen), done where a server loads the pack; first sampling = "
        "the first comfy.sample.sample call after the checkpoint load (what is left of the compile stack's import "
        "is timed before it, alone); gc = the garbage collector's pauses inside the first sampling (full "
        "collections); rest = first - trace - backend - precompiled load - save - steady."
    )
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
