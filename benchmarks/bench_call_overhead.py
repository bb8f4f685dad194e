"""Per-call overhead of the pack on a warm ComfyUI server: regional compile + Seeded Sampler vs eager KSampler.

One ComfyUI server (the tiny SD1.5-architecture checkpoint, ``headless/tiny_sd15.py``), two workflows that differ
only in the sampling chain, queued alternately with a new seed each time (ComfyUI re-runs only the sampler and
what follows; the checkpoint, the text encodes and Optimize Model stay cached):

* ``eager``: CheckpointLoaderSimple -> KSampler (euler) -> VAEDecode -> PreviewImage;
* ``steadfast``: CheckpointLoaderSimple -> SteadfastOptimizeModel (compile regional, inductor, the managed compile
  cache ``default`` under ``$STEADFAST_COMPILE_CACHE``) -> SteadfastSeededSampler (euler) -> VAEDecode -> PreviewImage.

Both are warmed first (the compile happens there); the server is then restarted on the same compile cache and
warmed again, so that the precompiled blocks answer the steady prompts (as on a warm-started server), with their
per-call checks (hooks, carried guards: ``precompiled.check_seconds`` of ``/steadfast/compile_state``, printed per
prompt and as a share of the Steadfast prompt). Phase ``0 extra files`` times them as they are; then 3,000
extra files (1 KiB each, in 2-character sub-folders as inductor lays them out) are dropped into the compile
cache's key folder, as a GPU inductor/Triton cache holds thousands of files, and phase ``3000 extra files`` times
them again. The number is the median wall time queue -> done of the steady prompts, and the ratio
steadfast / eager per phase (target <= 1.05, issue 23).

``--micro [--against REV]``: no server; the cost of the cache's part of one model call alone
(``core.compile.cache.run_cached`` around a call that compiles nothing, 30 calls, with ``--files`` files in the key
folder), for this checkout and, with ``--against``, for ``core/compile/cache.py`` as it was at git revision REV
(loaded from ``git show``), side by side.

Usage: ``python benchmarks/bench_call_overhead.py [--steps 8] [--side 256] [--repeats 10] [--files 3000]``
or ``python benchmarks/bench_call_overhead.py --micro --against d89627c``
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common._scripts_on_path()
from comfy_server import ComfyServer  # noqa: E402

tiny_sd15 = _common.tiny_sd15_module()
CKPT = "steadfast_tiny_sd15.safetensors"


def workflow(config: str, seed: int, steps: int, side: int) -> dict[str, Any]:
    """The API-format prompt for ``config`` (``eager`` or ``steadfast``, see the module docstring)."""
    wf: dict[str, Any] = {
        **_common.tiny_prompt_base(side, ckpt=CKPT),
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["1", 2]}},
        "8": {"class_type": "PreviewImage", "inputs": {"images": ["7", 0]}},
    }
    common = {"seed": seed, "steps": steps, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal",
              "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0], "denoise": 1.0}
    if config == "eager":
        wf["6"] = {"class_type": "KSampler", "inputs": {"model": ["1", 0], **common}}
    else:
        wf["5"] = {"class_type": "SteadfastOptimizeModel", "inputs": {
            "model": ["1", 0], "qkv_fusion": False, "channels_last": False, "attention": "auto",
            "compile": "regional", "backend": "inductor", "mode": "default", "dynamic": "auto",
            "fullgraph": False, "strict_recompiles": False, "compile_cache": "default"}}
        wf["6"] = {"class_type": "SteadfastSeededSampler", "inputs": {"model": ["5", 0], **common,
                                                                      "batch_seed_mode": "incremental"}}
    return wf


def add_files(cache_root: Path, n: int) -> Path:
    """Drop ``n`` 1 KiB files into the (single) key folder under ``cache_root/default``; returns that folder."""
    (key_dir,) = [p for p in (cache_root / "default").iterdir() if p.is_dir() and ".bad-" not in p.name]
    for i in range(n):
        sub = key_dir / f"{i % 256:02x}"
        sub.mkdir(exist_ok=True)
        (sub / f"extra{i:05d}.py").write_bytes(b"#" * 1024)
    return key_dir


def micro(files: int, against: str | None) -> None:
    """Per-call cost of the compile cache's activation, this checkout vs ``core/compile/cache.py`` at ``against``."""
    import importlib.util
    import subprocess

    _common.import_pack()
    from steadfast.core.compile import cache as current

    mods = [("this checkout", current)]
    if against:
        src = subprocess.run(["git", "show", f"{against}:core/compile/cache.py"], cwd=_common.ROOT, check=True,
                             capture_output=True, text=True).stdout
        old = Path(tempfile.mkdtemp(prefix="steadfast-then-")) / "compile_cache_then.py"
        old.write_text(src, encoding="utf-8")  # the file at that commit, loaded as a module of the package
        spec = importlib.util.spec_from_file_location("steadfast.core._compile_cache_then", old)
        then = importlib.util.module_from_spec(spec)
        then.__package__ = "steadfast.core"
        sys.modules[then.__name__] = then
        spec.loader.exec_module(then)
        mods.append((f"git {against}", then))
    rows = []
    for label, mod in mods:
        with tempfile.TemporaryDirectory() as tmp:
            cache = mod.open_cache(tmp, device="cpu")
            for i in range(files):
                sub = cache.path / f"{i % 256:02x}"
                sub.mkdir(exist_ok=True)
                (sub / f"extra{i:05d}.py").write_bytes(b"#" * 1024)
            mod.run_cached(cache, lambda: None)
            times = []
            for _ in range(30):
                t0 = time.perf_counter()
                mod.run_cached(cache, lambda: None)
                times.append(time.perf_counter() - t0)
        rows.append([label, f"{statistics.median(times) * 1e3:.3f}", f"{min(times) * 1e3:.3f}"])
    print(_common.markdown_table(["compile_cache.py", f"ms per model call, {files} files (median)", "(min)"], rows))


def precompiled_state(server: ComfyServer) -> dict[str, Any]:
    """The precompiled route's counters of the newest compile record (``GET /steadfast/compile_state``)."""
    records = server.get("/steadfast/compile_state")["records"]
    return max(records, key=lambda r: r["created"]).get("precompiled") or {"check_seconds": 0.0, "hits": 0,
                                                                           "fallbacks": 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--side", type=int, default=256, help="image side in pixels (latent side / 8)")
    ap.add_argument("--repeats", type=int, default=10, help="timed prompts per config and phase")
    ap.add_argument("--files", type=int, default=3000, help="extra files dropped into the compile cache's folder")
    ap.add_argument("--micro", action="store_true", help="no server: the cache's per-call cost alone")
    ap.add_argument("--against", default=None, help="with --micro: also core/compile/cache.py at this git revision")
    args = ap.parse_args()
    t_start = time.perf_counter()
    if args.micro:
        _common.print_header("Compile cache: cost of its activation per model call (no compile in the call)",
                             {"files": args.files, "against": args.against})
        micro(args.files, args.against)
        _common.print_footer(t_start)
        return 0
    _common.print_header("Per-call overhead on a warm ComfyUI server: regional compile + Seeded Sampler vs eager "
                         "KSampler", {"steps": args.steps, "side": args.side, "repeats": args.repeats,
                                      "extra_files": args.files})
    ckpt = tiny_sd15.cached_tiny_sd15(in_subprocess=True)
    configs = ("eager", "steadfast")
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_overhead_") as tmp:
        cache_root = Path(tmp) / "steadfast"
        env = {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"), "STEADFAST_COMPILE_CACHE": str(cache_root)}
        with ComfyServer({CKPT: ckpt}, env=env) as server:
            seed = 0
            for config in configs:  # warm-up: loads, compiles
                for _ in range(2):
                    seed += 1
                    server.run(workflow(config, seed, args.steps, args.side), timeout=900)
            server.restart()  # a warm start: the precompiled blocks answer from now on
            for config in configs:
                for _ in range(2):
                    seed += 1
                    server.run(workflow(config, seed, args.steps, args.side), timeout=900)
            for phase in ("0 extra files", f"{args.files} extra files"):
                if phase != "0 extra files":
                    key_dir = add_files(cache_root, args.files)
                    print(f"  {sum(1 for _ in key_dir.rglob('*'))} entries in the key folder now", flush=True)
                before = precompiled_state(server)
                for _ in range(args.repeats):
                    for config in configs:  # interleaved: the machine's load falls on both
                        seed += 1
                        t0 = time.perf_counter()
                        server.run(workflow(config, seed, args.steps, args.side), timeout=900)
                        times.setdefault((phase, config), []).append(time.perf_counter() - t0)
                med = {c: statistics.median(times[phase, c]) for c in configs}
                print(f"  {phase}: eager {med['eager']:.3f} s, steadfast {med['steadfast']:.3f} s, "
                      f"ratio {med['steadfast'] / med['eager']:.3f}", flush=True)
                after = precompiled_state(server)
                checks = (after["check_seconds"] - before["check_seconds"]) / args.repeats
                hits = (after["hits"] - before["hits"]) / args.repeats
                print(f"  {phase}: precompiled route per Steadfast prompt: {hits:.0f} hits, {checks * 1e3:.3f} ms of "
                      f"per-call checks = {checks / med['steadfast'] * 100:.3f}% of the prompt "
                      f"(target <= 1%, issue 34); fallbacks {after['fallbacks'] - before['fallbacks']}", flush=True)
    rows = []
    for phase in dict.fromkeys(p for p, _ in times):
        e, s = (statistics.median(times[phase, c]) for c in configs)
        rows.append([phase, f"{e:.3f}", f"{min(times[phase, 'eager']):.3f}", f"{s:.3f}",
                     f"{min(times[phase, 'steadfast']):.3f}", f"{s / e:.3f}"])
    print()
    print(_common.markdown_table(["compile cache folder", "eager KSampler s (median)", "(min)",
                                  "regional + Seeded Sampler s (median)", "(min)", "ratio (medians)"], rows))
    print(f"\nwall seconds queue -> done per prompt, {args.repeats} prompts per cell, interleaved; steps "
          f"{args.steps}, {args.side}x{args.side}, euler; target ratio <= 1.05 (issue 23)")
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
