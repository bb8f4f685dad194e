"""Per-call overhead of the pack on a warm ComfyUI server: regional compile + Seeded Sampler vs eager KSampler.

One ComfyUI server (the tiny SD1.5-architecture checkpoint, ``headless/tiny_sd15.py``), two workflows that differ
only in the sampling chain, queued alternately with a new seed each time (ComfyUI re-runs the sampler and what
follows; the checkpoint and the text encodes stay cached, and Optimize Model runs again in every Steadfast prompt
that follows an eager one, whose prompt has evicted its output: ComfyUI 0.33.0's RAM-pressure cache and 0.8.0's
classic cache both drop the outputs the running prompt does not use. Each phase prints how many Steadfast prompts
ran it again, and the paired ratio of those and of the others apart):

* ``eager``: CheckpointLoaderSimple -> KSampler (euler) -> VAEDecode -> PreviewImage;
* ``steadfast``: CheckpointLoaderSimple -> SteadfastOptimizeModel (compile regional, inductor, the managed compile
  cache ``default`` under ``$STEADFAST_COMPILE_CACHE``) -> SteadfastSeededSampler (euler) -> VAEDecode -> PreviewImage.

Both are warmed first (the compile happens there, and the precompiled blocks are saved); phase ``compiling server``
times them in that process (the artifacts it saved answer, read back after its save). The server is then restarted on
the same compile cache and warmed again, so that the precompiled blocks answer (phase ``warm-started server``); with
``--files N``, N extra files (1 KiB each, in 2-character sub-folders as inductor lays them out) are then dropped into
the compile cache's key folder, as a GPU inductor/Triton cache holds thousands of files, and the last phase times them
again.

Each prompt is timed by the server's own ``execution_start`` -> ``execution_success`` timestamps (a client polling
``/history`` adds a quantum as large as the difference). The configurations run in rounds, in ABBA order, and the
number is the median of the paired ratios config / eager within a round, with its quartiles (target <= 1.05, issue
35): on a shared 2-core guest the machine's speed drifts by 5-10 % within a minute, which moves each median alone
but falls on both prompts of a round. Per phase the precompiled route's split is printed per
Steadfast prompt (``split_seconds`` of ``GET /steadfast/compile_state``,
:data:`core.compile.warm.precompiled.SPLIT_PHASES`: the hook walk, the call key, the carried guards, torch's
``guard_check``, the artifact's call), in ms and as a share of the prompt.

``--micro [--against REV]``: no server; the cost of the cache's part of one model call alone
(``core.compile.warm.cache.run_cached`` around a call that compiles nothing, 30 calls, with ``--files`` files in the
key folder), for this checkout and, with ``--against``, for the compile cache module as it was at git revision REV
(loaded from ``git show``, from where it lived then), side by side.

Usage: ``python benchmarks/bench_call_overhead.py [--steps 8] [--side 256] [--repeats 10] [--files 3000]``
or ``python benchmarks/bench_call_overhead.py --micro --against d89627c``
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

_common._scripts_on_path()
from comfy_server import ComfyServer, cached_nodes  # noqa: E402

tiny_sd15 = _common.tiny_sd15_module()
CKPT = "steadfast_tiny_sd15.safetensors"


OPTIMIZE_NODE = "5"  # Optimize Model's node id in :func:`workflow`


def workflow(config: str, seed: int, steps: int, side: int) -> dict[str, Any]:
    """The API-format prompt for ``config``: ``eager`` or ``steadfast`` (see the module docstring), or, for
    ``--split``, ``seeded`` (eager model, Seeded Sampler) or ``compiled`` (Optimize Model, KSampler)."""
    wf: dict[str, Any] = {
        **_common.tiny_prompt_base(side, ckpt=CKPT),
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["1", 2]}},
        "8": {"class_type": "PreviewImage", "inputs": {"images": ["7", 0]}},
    }
    common = {
        "seed": seed,
        "steps": steps,
        "cfg": 7.0,
        "sampler_name": "euler",
        "scheduler": "normal",
        "positive": ["2", 0],
        "negative": ["3", 0],
        "latent_image": ["4", 0],
        "denoise": 1.0,
    }
    model = ["1", 0]
    if config in ("steadfast", "compiled"):
        wf[OPTIMIZE_NODE] = _common.optimize_node(["1", 0], strict_recompiles=False, compile_cache="default")
        model = [OPTIMIZE_NODE, 0]
    if config in ("eager", "compiled"):
        wf["6"] = {"class_type": "KSampler", "inputs": {"model": model, **common}}
    else:
        wf["6"] = {
            "class_type": "SteadfastSeededSampler",
            "inputs": {"model": model, **common, "batch_seed_mode": "incremental"},
        }
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
    """Per-call cost of the compile cache's activation, this checkout vs the compile cache module at ``against``."""
    import importlib.util
    import subprocess

    _common.import_pack()
    from steadfast.core.compile.warm import cache as current

    mods = [("this checkout", current)]
    if against:
        homes = (  # the module's home at that commit: its relative imports resolve from there
            ("core/compile/warm/cache.py", "steadfast.core.compile.warm"),
            ("core/compile/cache.py", "steadfast.core.compile"),
            ("core/compile_cache.py", "steadfast.core"),
        )
        shown = [
            (
                subprocess.run(
                    ["git", "show", f"{against}:{where}"], cwd=_common.ROOT, capture_output=True, text=True
                ),
                p,
            )
            for where, p in homes
        ]
        found = [(got.stdout, p) for got, p in shown if got.returncode == 0]
        if not found:
            raise SystemExit(f"no compile cache module at {against}")
        src, package = found[0]
        old = Path(tempfile.mkdtemp(prefix="steadfast-then-")) / "compile_cache_then.py"
        old.write_text(src, encoding="utf-8")  # the file at that commit, loaded as a module of the package
        spec = importlib.util.spec_from_file_location(f"{package}._compile_cache_then", old)
        then = importlib.util.module_from_spec(spec)
        then.__package__ = package
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
    return max(records, key=lambda r: r["created"]).get("precompiled") or {}


def split_line(before: dict[str, Any], after: dict[str, Any], prompts: int, steadfast_s: float) -> str:
    """The route's per-phase seconds per Steadfast prompt between two :func:`precompiled_state` readings, in ms and
    as a share of the prompt (``steadfast_s``), with the block calls and hits per prompt."""
    if not after.get("split_seconds"):
        return "no precompiled route counters (route off, or an older pack)"
    parts = []
    for phase, total in after["split_seconds"].items():
        ms = (total - before.get("split_seconds", {}).get(phase, 0.0)) / prompts * 1e3
        parts.append(f"{phase} {ms:.3f} ms ({ms / 1e3 / steadfast_s * 100:.2f}%)")
    calls = (after.get("calls", 0) - before.get("calls", 0)) / prompts
    hits = (after.get("hits", 0) - before.get("hits", 0)) / prompts
    fallbacks = after.get("fallbacks", 0) - before.get("fallbacks", 0)
    return f"{calls:.0f} block calls, {hits:.0f} hits, {fallbacks} fallbacks per run; " + ", ".join(parts)


def paired_ratios(times: dict[tuple[str, str], list[float]], phase: str, config: str) -> list[float]:
    """``config``'s seconds over eager's, per round of ``phase`` (the two ran back to back: the machine's slow
    drift, which moves a median by 5-10 % within a minute on a shared 2-core guest, falls on both)."""
    return [s / e for s, e in zip(times[phase, config], times[phase, "eager"], strict=True)]


def ratio_text(ratios: list[float]) -> str:
    """The median of paired ratios with a 95 % bootstrap interval of that median (2,000 resamples, seeded) and
    the quartiles of the ratios, as ``1.012 (95 % CI 0.995-1.030; IQR 0.981-1.040)``."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.3f} (95 % CI {medians[50]:.3f}-{medians[1949]:.3f}; IQR {q1:.3f}-{q3:.3f})"


def timed_phase(
    server: ComfyServer, phase: str, args: argparse.Namespace, seed: int, times: dict[tuple[str, str], list[float]]
) -> int:
    """``args.repeats`` rounds, each running every config once, in ABBA order (the order reverses every round, so
    that neither config always follows the other), timed by the server's own timestamps
    (:func:`_common.executed_seconds`); prints the medians, the median paired ratio (:func:`paired_ratios`) and the
    route's split."""
    configs = ("eager", "steadfast", "seeded", "compiled") if args.split else ("eager", "steadfast")
    before = precompiled_state(server)
    reran: dict[str, list[bool]] = {}  # per routed config and round: did Optimize Model execute again
    for i in range(args.repeats):
        for config in configs if i % 2 == 0 else configs[::-1]:
            seed += 1
            entry = server.wait(server.queue(workflow(config, seed, args.steps, args.side)), timeout=900)
            times.setdefault((phase, config), []).append(_common.executed_seconds(entry))
            if config in ("steadfast", "compiled"):
                reran.setdefault(config, []).append(OPTIMIZE_NODE not in cached_nodes(entry))
    med = {c: statistics.median(times[phase, c]) for c in configs}
    for config in configs[1:]:
        print(
            f"  {phase}: eager {med['eager']:.4f} s, {config} {med[config]:.4f} s, paired ratio "
            f"{ratio_text(paired_ratios(times, phase, config))}",
            flush=True,
        )
    for config, flags in reran.items():
        ratios = paired_ratios(times, phase, config)
        again = [r for r, f in zip(ratios, flags, strict=True) if f]
        cached = [r for r, f in zip(ratios, flags, strict=True) if not f]
        print(
            f"  {phase}: {config}: Optimize Model ran again in {len(again)}/{len(flags)} prompts; paired ratio "
            + "; ".join(
                f"{what} {ratio_text(r)}" for what, r in (("ran again", again), ("cached", cached)) if len(r) > 1
            ),
            flush=True,
        )
    routed = sum(c in ("steadfast", "compiled") for c in configs)
    print(
        f"  {phase}: route per Steadfast prompt: "
        f"{split_line(before, precompiled_state(server), args.repeats * routed, med['steadfast'])}",
        flush=True,
    )
    return seed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--side", type=int, default=256, help="image side in pixels (latent side / 8)")
    ap.add_argument("--repeats", type=int, default=10, help="timed prompts per config and phase")
    ap.add_argument(
        "--files",
        type=int,
        default=3000,
        help="extra files dropped into the compile cache's folder (0: no such phase)",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="also time Seeded Sampler alone (eager model) and Optimize "
        "Model alone (KSampler), interleaved with the two others: which half the ratio comes from",
    )
    ap.add_argument("--micro", action="store_true", help="no server: the cache's per-call cost alone")
    ap.add_argument("--against", default=None, help="with --micro: also the compile cache module at this revision")
    args = ap.parse_args()
    t_start = time.perf_counter()
    if args.micro:
        _common.print_header(
            "Compile cache: cost of its activation per model call (no compile in the call)",
            {"files": args.files, "against": args.against},
        )
        micro(args.files, args.against)
        _common.print_footer(t_start)
        return 0
    _common.print_header(
        "Per-call overhead on a warm ComfyUI server: regional compile + Seeded Sampler vs eager KSampler",
        {"steps": args.steps, "side": args.side, "repeats": args.repeats, "extra_files": args.files},
    )
    ckpt = tiny_sd15.cached_tiny_sd15(in_subprocess=True)
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_overhead_") as tmp:
        cache_root = Path(tmp) / "steadfast"
        env = {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"), "STEADFAST_COMPILE_CACHE": str(cache_root)}
        with ComfyServer({CKPT: ckpt}, env=env) as server:
            seed = 0
            warm = ("eager", "steadfast", "seeded", "compiled") if args.split else ("eager", "steadfast")
            for config in warm:  # warm-up: loads, compiles (and saves the precompiled blocks)
                for _ in range(2):
                    seed += 1
                    server.run(workflow(config, seed, args.steps, args.side), timeout=900)
            seed = timed_phase(server, "compiling server", args, seed, times)
            server.restart()  # a warm start: the precompiled blocks answer from now on
            for config in warm:
                for _ in range(2):
                    seed += 1
                    server.run(workflow(config, seed, args.steps, args.side), timeout=900)
            seed = timed_phase(server, "warm-started server", args, seed, times)
            if args.files:
                key_dir = add_files(cache_root, args.files)
                print(f"  {sum(1 for _ in key_dir.rglob('*'))} entries in the key folder now", flush=True)
                seed = timed_phase(server, f"warm-started, {args.files} extra files", args, seed, times)
    rows = []
    for (phase, config), values in times.items():
        if config == "eager":
            continue
        rows.append(
            [
                phase,
                config,
                f"{statistics.median(times[phase, 'eager']):.4f}",
                f"{min(times[phase, 'eager']):.4f}",
                f"{statistics.median(values):.4f}",
                f"{min(values):.4f}",
                ratio_text(paired_ratios(times, phase, config)),
            ]
        )
    print()
    print(
        _common.markdown_table(
            [
                "server",
                "config",
                "eager KSampler s (median)",
                "(min)",
                "config s (median)",
                "(min)",
                "paired ratio to eager: median (95 % CI; IQR)",
            ],
            rows,
        )
    )
    print(
        f"\nseconds per prompt by the server's own execution_start -> execution_success timestamps, "
        f"{args.repeats} rounds per phase in ABBA order; steps {args.steps}, {args.side}x{args.side}, euler; "
        "target ratio <= 1.05 (issue 35)"
    )
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
