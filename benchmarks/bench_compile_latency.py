"""Compile latency of full vs regional ``torch.compile`` (inductor, CPU), cold and warm, plus steady state.

Two ComfyUI diffusion models, called directly (no sampler) with seeded inputs and ComfyUI's PyTorch SDPA
attention through ``transformer_options["optimized_attention_override"]`` (the pack's
``nodes.patches.attention.attention_override("auto")``; ComfyUI's CPU default, sub_quad attention, breaks
the graph):

* ``sd15``: the UNet (``UNetModel``) of the cached tiny SD1.5-architecture checkpoint
  (``headless/tiny_sd15.py``), loaded with ``comfy.sd.load_checkpoint_guess_config``; input latent
  ``[2, 4, S, S]`` (batch 2 as with CFG), context ``[2, 77, 768]``.
* ``flux``: ComfyUI's own ``comfy.ldm.flux.model.Flux`` at reduced width (hidden 256, 4 heads, context
  width 256) and, by default, Flux.1's real depth: 19 double + 38 single blocks (~80 M parameters;
  ``--flux-depth`` / ``--flux-single`` change it). ComfyUI's layers skip weight init, so every
  parameter is drawn here from a generator seeded by its name. Input ``[1, 16, 64, 64]`` (1024 image
  tokens after 2x2 patches) + 32 text tokens.

Compilation uses the pack's core code: ``torch.compile`` with ``CompileOptions.to_kwargs`` (whole model) or
``core.compile.swap.compile_blocks`` + ``swap_in`` on the blocks ``core.compile.blocks.choose_blocks`` picks
(regional), with the Optimize node's default options (``nodes.inputs.compile_settings``: inductor,
mode default, dynamic auto, fullgraph off) and its guard filter (``core.compile.guards.comfy_guard_filter``).

Every measurement of a first call runs in a FRESH subprocess:

* cold: an empty ``TORCHINDUCTOR_CACHE_DIR`` (one per model and mode): the first compile ever on a machine;
* primed: a cache dir in which another fresh process first compiled a small unrelated module (a
  ``Linear`` + ``LayerNorm`` + ``GELU`` + ``softmax``; see :func:`prime_inductor`). That compile runs
  inductor's one-time CPU checks: it builds and loads small C++ probes for each vector ISA (AVX512,
  AVX2, AVX512-BF16, VNNI), ~13 s on this 2-core CPU, cached in the directory. A persistent cache
  (the pack's managed one) pays them once per machine, so "primed" is the latency of compiling a
  *new model* there. Both cold and primed are reported; neither hides the other;
* warm: the cold run's cache dir again, in a new process.

First call = wall seconds of the first forward (tracing + inductor + C++ compile + one run), with the
share of the 2 cores that other processes used meanwhile ("others' CPU", from ``/proc/stat`` minus this
process tree's CPU time, so inductor's compile workers are not "others"; other load slows
compilation down). A second call checks run-to-run bit-equality.
Steady-state speed is measured side by side in one more process ("interleaved") that loads eager,
regional and full from a merged warm cache and times them interleaved ``E R F E R F ...``; before each
round it waits (at most ``--wait-quiet`` s) for idle cores, and only rounds in which other processes
used <= ``--max-others`` of the cores count (``--rounds`` clean ones wanted, ``--max-rounds`` at most; with
fewer than 3 clean rounds all are used and the output says so). Two-thread OpenMP runs get up to 10x slower
in bursts when other processes compete for the 2 cores, hence this filter.

Each (mode, cache state) first call is repeated ``--repeats`` times (fresh process and, for cold and
primed, a fresh empty cache dir each time); medians are reported, with each repeat's value beside them.

Parity: each output against the eager output of the interleaved process (bytes + max |d|), every
fresh-process output of a mode against its first cold one, regional vs full.

Usage::

    python benchmarks/bench_compile_latency.py [--models sd15,flux] [--flux-depth 19 --flux-single 38]
        [--repeats 3] [--sd15-side 32] [--rounds 7] [--wait-quiet 60]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

FLUX_PARAMS: dict[str, Any] = {
    "in_channels": 16,
    "out_channels": 16,
    "vec_in_dim": 256,
    "context_in_dim": 256,
    "hidden_size": 256,
    "mlp_ratio": 4.0,
    "num_heads": 4,
    "depth": 19,
    "depth_single_blocks": 38,
    "axes_dim": [16, 24, 24],
    "theta": 10000,
    "patch_size": 2,
    "qkv_bias": True,
    "guidance_embed": False,
    "txt_ids_dims": [],
}
"""Reduced-width Flux.1 architecture (Flux.1-dev: hidden 3072, 24 heads, 19 double + 38 single blocks)."""


# ---------------------------------------------------------------------------------------------
# Child process: build one model, compile it one way, time it.
# ---------------------------------------------------------------------------------------------
def _gen(key: str) -> Any:
    import torch

    digest = hashlib.sha256(f"steadfast-bench|{key}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _randn(shape: tuple[int, ...], key: str) -> Any:
    import torch

    return torch.randn(shape, generator=_gen(key))


def flux_params(depth: int, single: int) -> dict[str, Any]:
    """:data:`FLUX_PARAMS` with ``depth`` double-stream and ``single`` single-stream blocks."""
    return dict(FLUX_PARAMS, depth=depth, depth_single_blocks=single)


def build_flux(params: dict[str, Any] = FLUX_PARAMS) -> Any:
    """ComfyUI's ``Flux`` with ``params`` (default :data:`FLUX_PARAMS`), fp32 CPU, every parameter
    seeded by its name.

    Matrices ~ N(0, 1/fan_in), RMSNorm scales 1, biases ~ N(0, 0.02^2). Raises ``RuntimeError`` if the
    model holds buffers (they would stay uninitialised).
    """
    import torch

    import comfy.ldm.flux.model
    import comfy.ops

    model = comfy.ldm.flux.model.Flux(
        dtype=torch.float32, device="cpu", operations=comfy.ops.disable_weight_init, **params
    )
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        raise RuntimeError(f"Flux has buffers that would stay uninitialised: {buffers[:5]}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(_randn(tuple(p.shape), name) / fan_in**0.5)
            elif name.endswith("scale"):
                p.fill_(1.0)
            else:
                p.copy_(_randn(tuple(p.shape), name) * 0.02)
    return model.eval()


def build_model(name: str, sd15_side: int, flux: dict[str, Any] = FLUX_PARAMS) -> tuple[Any, Callable[[Any], Any]]:
    """``(diffusion_model, call)``; ``call(module)`` runs one forward of ``module`` (the model itself or
    its compiled wrapper) on fixed seeded inputs, with a fresh ``transformer_options`` dict each call
    (as ComfyUI builds one per ``apply_model``)."""
    import torch

    from steadfast.nodes.patches.attention import attention_override

    attn = attention_override("auto")
    if name == "sd15":
        import comfy.model_management
        import comfy.sd

        ckpt = _common.tiny_sd15_module().cached_tiny_sd15()
        patcher, _, _, _ = comfy.sd.load_checkpoint_guess_config(str(ckpt), output_vae=False, output_clip=False)
        comfy.model_management.load_models_gpu([patcher])
        x = _randn((2, 4, sd15_side, sd15_side), "sd15.x")
        t = torch.tensor([500.0, 500.0])
        ctx = _randn((2, 77, 768), "sd15.context")

        def call_unet(m: Any) -> Any:
            return m(x, timesteps=t, context=ctx, transformer_options={"optimized_attention_override": attn})

        call_unet.keep = patcher  # type: ignore[attr-defined]  # keep the ModelPatcher alive
        return patcher.model.diffusion_model, call_unet
    if name == "flux":
        dev = DEVICE[0]
        x = _randn((1, 16, 64, 64), "flux.x").to(dev)
        t = torch.tensor([0.5], device=dev)
        ctx = _randn((1, 32, flux["context_in_dim"]), "flux.context").to(dev)
        y = _randn((1, flux["vec_in_dim"]), "flux.y").to(dev)

        def call_flux(m: Any) -> Any:
            return m(x, t, ctx, y=y, transformer_options={"optimized_attention_override": attn})

        return build_flux(flux).to(dev), call_flux
    raise ValueError(f"unknown model {name!r}")


def node_guard_filter() -> tuple[Any, str]:
    """``(guard_filter_fn, description)``: the filter the Optimize node passes for ComfyUI models.

    ``core.compile.guards.comfy_guard_filter()`` in the current pack; older layouts of the pack are tried after it.
    """
    try:
        from steadfast.core.compile import guards as guard_filters
    except ImportError:  # pragma: no cover - earlier layout (before core/compile/guards.py)
        pass
    else:
        return guard_filters.comfy_guard_filter(), "core.compile.guards.comfy_guard_filter()"
    from steadfast.core.compile import swap as core_compile
    from steadfast.nodes.patches import compile as compile_patch

    if hasattr(core_compile, "comfy_guard_filter"):  # pragma: no cover - earlier layout
        return core_compile.comfy_guard_filter(), "core.compile.swap.comfy_guard_filter()"
    if hasattr(compile_patch, "CompileGuardFilter"):  # pragma: no cover - earlier layout
        return compile_patch.CompileGuardFilter(), "nodes.patches.compile.CompileGuardFilter()"
    return (
        core_compile.skip_guards_on("transformer_options"),
        "core.compile.swap.skip_guards_on('transformer_options')",
    )


def make_runner(dm: Any, call: Callable[[Any], Any], mode: str) -> Callable[[], Any]:
    """A zero-argument forward for ``mode`` in eager / regional / full, via the pack's core compile code.

    Compilation is lazy: it happens in the runner's first call."""
    import torch

    from steadfast.core.compile import blocks
    from steadfast.core.compile.swap import compile_blocks, swap_in
    from steadfast.nodes.inputs import compile_settings

    if mode == "eager":
        return lambda: call(dm)
    # the Optimize node's defaults (backend inductor, mode default, dynamic auto, fullgraph off) and guard filter
    options, guard = compile_settings(BACKEND[0], "default", "auto", False), node_guard_filter()[0]
    if mode == "regional":
        paths = blocks.choose_blocks(dm).paths
        if not paths:
            raise RuntimeError(f"no repeated blocks declared/found in {type(dm).__name__}")
        compiled = compile_blocks(dm, paths, options, guard)

        def run_regional() -> Any:
            with swap_in(dm, compiled):
                return call(dm)

        return run_regional
    if mode == "full":
        full = torch.compile(dm, **options.to_kwargs(guard))
        return lambda: call(full)
    raise ValueError(f"unknown mode {mode!r}")


def _counters() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    return {
        "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "fxgraph_cache_hit": int(counters["inductor"].get("fxgraph_cache_hit", 0)),
        "fxgraph_cache_miss": int(counters["inductor"].get("fxgraph_cache_miss", 0)),
    }


BACKEND = ["inductor"]  # the child's torch.compile backend (spec "backend"; the protocol's CPU smoke uses "eager")
DEVICE = ["cpu"]  # the child's device (spec "device", default cpu; the GPU protocol passes "cuda")


def _sync() -> None:
    if DEVICE[0].startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t0


PRIME_PROBES = ("__avx_chk_kernel", "__avx512_bf16_chk_kernel", "__avx512_vnni_chk_kernel")
"""Function names of inductor's CPU ISA probe sources (``torch._inductor.cpu_vec_isa``)."""


def inductor_probes(cache_dir: Path) -> list[str]:
    """Names of the ISA probe ``.cpp`` files inductor compiled into ``cache_dir`` (one per ISA/flag set)."""
    found = []
    for cpp in sorted(cache_dir.rglob("*.cpp")):
        text = cpp.read_text(errors="replace")
        found += [f"{name}:{cpp.stem[:8]}" for name in PRIME_PROBES if name in text]
    return found


def prime_inductor() -> dict[str, Any]:
    """Compile and run a small module unrelated to the benchmarked models (fp32 CPU, inductor, default
    options) so that inductor's one-time CPU ISA probes land in the current ``TORCHINDUCTOR_CACHE_DIR``.

    Returns ``{"prime_s": seconds}``."""
    import torch

    net = torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.LayerNorm(64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 32),
        torch.nn.Softmax(dim=-1),
    )
    with torch.inference_mode():
        t0 = time.perf_counter()
        torch.compile(net)(_randn((4, 32), "prime.x"))
        return {"prime_s": time.perf_counter() - t0}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement described by ``spec`` (see :func:`run_child`); returns a JSON-able result."""
    t_proc = time.perf_counter()
    if spec["kind"] == "prime":
        return dict(prime_inductor(), spec=spec)
    DEVICE[0], BACKEND[0] = spec.get("device", "cpu"), spec.get("backend", "inductor")
    _common.import_pack(cpu=DEVICE[0] == "cpu")
    import torch

    from steadfast.core.record.compare import compare_outputs

    result: dict[str, Any] = {"spec": spec}
    with torch.inference_mode():
        dm, call = build_model(spec["model"], spec["sd15_side"], flux_params(*spec["flux_depth"]))
        result["params_m"] = round(sum(p.numel() for p in dm.parameters()) / 1e6, 2)
        result["setup_s"] = time.perf_counter() - t_proc
        out_dir = Path(spec["out_dir"])
        if spec["kind"] == "first":
            run = make_runner(dm, call, spec["mode"])
            with _common.OthersMeter() as meter:
                out, result["first_s"] = _timed(run)
            result["first_others"] = meter.share
            result["counters_after_first"] = _counters()
            again = run()
            result["rerun_bit_equal"] = compare_outputs(out, again).bit_equal
            if spec.get("steady_calls"):  # seconds per call once compiled (the GPU protocol)
                result["steady_s"] = statistics.median(_timed(run)[1] for _ in range(spec["steady_calls"]))
            result["sha256"] = hashlib.sha256(out.detach().float().cpu().numpy().tobytes()).hexdigest()
            out = out.cpu()
            result["out_std"] = float(out.float().std())
            result["finite"] = bool(torch.isfinite(out).all())
            path = out_dir / f"{spec['model']}_{spec['mode']}_{spec['temp']}.pt"
            torch.save(out.clone(), path)
            result["out_path"] = str(path)
        else:  # interleaved steady state: eager, regional, full in one process (warm cache)
            runs = {m: make_runner(dm, call, m) for m in ("eager", "regional", "full")}
            result["first_s"] = {}
            outs = {}
            for m, run in runs.items():
                outs[m], result["first_s"][m] = _timed(run)
                run()
            rounds: list[dict[str, Any]] = []
            n_clean = 0
            while n_clean < spec["rounds"] and len(rounds) < spec["max_rounds"]:
                _common.wait_for_quiet(spec["wait_quiet"])
                with _common.OthersMeter() as meter:
                    times = {m: _timed(run)[1] for m, run in runs.items()}
                clean = meter.share is None or meter.share <= spec["max_others"]
                n_clean += clean
                rounds.append({"times": times, "others": meter.share, "clean": clean})
            result["rounds"] = rounds
            result["out_paths"] = {}
            for m, out in outs.items():
                path = out_dir / f"{spec['model']}_{m}_interleaved.pt"
                torch.save(out.clone(), path)
                result["out_paths"][m] = str(path)
            result["counters"] = _counters()
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["process_s"] = time.perf_counter() - t_proc
    return result


# ---------------------------------------------------------------------------------------------
# Parent: orchestrate fresh processes, print the tables.
# ---------------------------------------------------------------------------------------------
def run_child(spec: dict[str, Any], cache_dir: Path, timeout: float) -> dict[str, Any]:
    """Run :func:`child` in a fresh interpreter with ``TORCHINDUCTOR_CACHE_DIR=cache_dir``."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir))
    note = _common.wait_for_quiet(spec.get("wait_quiet", 0.0))
    if note:
        print(f"  {note}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"child {spec} failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    res = json.loads(lines[-1][len("RESULT ") :])
    res["wall_s"] = wall
    return res


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


def _load(path: str) -> Any:
    import torch

    return torch.load(path, weights_only=True)


def bench_model(name: str, args: argparse.Namespace, work: Path) -> tuple[list[list[Any]], list[list[Any]], list[str]]:
    """All processes for one model; returns (latency rows, steady-state rows, notes)."""
    from steadfast.core.record.compare import compare_outputs

    base = {
        "model": name,
        "sd15_side": args.sd15_side,
        "flux_depth": [args.flux_depth, args.flux_single],
        "rounds": args.rounds,
        "max_rounds": args.max_rounds,
        "max_others": args.max_others,
        "out_dir": str(work),
        "wait_quiet": args.wait_quiet,
    }
    modes, temps = ("regional", "full"), ("cold", "primed", "warm")
    res: dict[tuple[str, str], list[dict[str, Any]]] = {(m, t): [] for m in modes for t in temps}
    notes = []
    for rep in range(args.repeats):
        for temp in temps:
            for mode in modes:
                # warm reuses this repeat's cold dir; cold and primed start from an empty one
                cache = work / f"inductor_{name}_{mode}_{'cold' if temp == 'warm' else temp}{rep}"
                if temp != "warm":
                    cache.mkdir()
                    assert not any(cache.iterdir()), "cold cache dir must be empty"
                if temp == "primed":
                    p = run_child(dict(base, kind="prime", mode=mode, temp=temp), cache, args.timeout)
                    probes = inductor_probes(cache)
                    notes.append(
                        f"{name} {mode} primed #{rep + 1}: priming compile {p['prime_s']:.1f} s left "
                        f"{len(probes)} ISA probes: {', '.join(probes)}"
                    )
                spec = dict(base, kind="first", mode=mode, temp=f"{temp}{rep}")
                before = set(inductor_probes(cache))
                r = run_child(spec, cache, args.timeout)
                r["new_probes"] = sorted(set(inductor_probes(cache)) - before)
                res[(mode, temp)].append(r)
                print(
                    f"  {name} {mode} {temp} #{rep + 1}: first call {r['first_s']:.1f} s "
                    f"(others' CPU {_pct(r['first_others'])}), process {r['wall_s']:.0f} s, "
                    f"ISA probes compiled: {len(r['new_probes'])}",
                    flush=True,
                )
    merged = work / f"inductor_{name}_merged"
    for mode in modes:
        shutil.copytree(work / f"inductor_{name}_{mode}_cold0", merged, dirs_exist_ok=True)
    inter = run_child(dict(base, kind="interleaved", mode="all", temp="warm"), merged, args.timeout)
    print(
        f"  {name} interleaved: process {inter['wall_s']:.0f} s; others' CPU per round: "
        + ", ".join(_pct(r["others"]) for r in inter["rounds"]),
        flush=True,
    )

    def med(mode: str, temp: str) -> float:
        return statistics.median(r["first_s"] for r in res[(mode, temp)])

    eager_out = _load(inter["out_paths"]["eager"])
    rows = []
    for mode in modes:
        for temp in temps:
            runs = res[(mode, temp)]
            r = runs[0]
            pars = [compare_outputs(eager_out, _load(x["out_path"])) for x in runs]
            c = r["counters_after_first"]
            each = ", ".join(f"{x['first_s']:.1f}" for x in runs)
            rows.append(
                [
                    name,
                    mode,
                    temp,
                    f"{med(mode, temp):.1f}" + (f" ({each})" if len(runs) > 1 else ""),
                    ", ".join(_pct(x["first_others"]) for x in runs),
                    c["unique_graphs"],
                    c["graph_breaks"],
                    f"{c['fxgraph_cache_hit']}/{c['fxgraph_cache_miss']}",
                    "yes" if all(p.bit_equal for p in pars) else "no",
                    _common.fmt_d(max(p.max_abs for p in pars)),
                    "yes" if all(x["rerun_bit_equal"] for x in runs) else "NO",
                    ", ".join(str(len(x["new_probes"])) for x in runs),
                    f"{r['peak_rss_mb']:.0f}",
                ]
            )
    outs = {(m, t): [_load(x["out_path"]) for x in res[(m, t)]] for m in modes for t in temps}
    for mode in modes:
        ref = outs[(mode, "cold")][0]
        others = [o for t in temps for o in outs[(mode, t)]][1:]
        same = [compare_outputs(ref, o) for o in others]
        worst = max((x.max_abs for x in same), default=0.0)
        notes.append(
            f"{name} {mode}: all {len(others) + 1} fresh-process outputs (cold, primed, warm) bit-equal: "
            + ("yes" if all(x.bit_equal for x in same) else f"NO (max |d| {_common.fmt_d(worst)})")
        )
    rf = compare_outputs(outs[("regional", "cold")][0], outs[("full", "cold")][0])
    notes.append(
        f"{name}: regional vs full output bit-equal: {'yes' if rf.bit_equal else 'no'}"
        + ("" if rf.bit_equal else f" (max |d| {_common.fmt_d(rf.max_abs)})")
    )
    first = res[("regional", "cold")][0]
    notes.append(f"{name}: {first['params_m']} M parameters; out std {first['out_std']:.3f}, finite {first['finite']}")
    rc, fc, rp, fp = med("regional", "cold"), med("full", "cold"), med("regional", "primed"), med("full", "primed")
    rw, fw = med("regional", "warm"), med("full", "warm")
    pairs = {
        t: ", ".join(f"{a['first_s'] / b['first_s']:.2f}" for a, b in zip(res[("regional", t)], res[("full", t)]))
        for t in temps
    }
    notes.append(
        f"{name}: first-call ratio regional/full (medians of {args.repeats}) cold {rc / fc:.2f} "
        f"(full/regional {fc / rc:.2f}x; per repeat {pairs['cold']}); primed {rp / fp:.2f} "
        f"(full/regional {fp / rp:.2f}x; per repeat {pairs['primed']}); warm {rw / fw:.2f}"
    )
    notes.append(
        f"{name}: warm/cold regional {rw / rc:.2f} (1/{rc / rw:.1f}), full {fw / fc:.2f} (1/{fc / fw:.1f}); "
        f"warm/primed regional {rw / rp:.2f} (1/{rp / rw:.1f}), full {fw / fp:.2f} (1/{fp / fw:.1f})"
    )

    used = [r for r in inter["rounds"] if r["clean"]]
    if len(used) < min(3, args.rounds):
        used = inter["rounds"]
        how = f"ALL {len(used)} rounds (timings CONTENDED)"
    else:
        how = f"{len(used)} clean rounds of {len(inter['rounds'])}"
    times = {m: [r["times"][m] for r in used] for m in ("eager", "regional", "full")}
    emin, emed = _common.summarize(times["eager"])
    steady = []
    for mode in ("eager", "regional", "full"):
        tmin, tmed = _common.summarize(times[mode])
        par = compare_outputs(eager_out, _load(inter["out_paths"][mode]))
        steady.append(
            [
                name,
                mode,
                f"{inter['first_s'][mode]:.1f}",
                _common.fmt_s(tmin),
                _common.fmt_s(tmed),
                f"{emin / tmin:.2f}x",
                f"{emed / tmed:.2f}x",
                "yes" if par.bit_equal else "no",
                _common.fmt_d(par.max_abs),
            ]
        )
    (rmin, rmed), (fmin, fmed) = _common.summarize(times["regional"]), _common.summarize(times["full"])
    notes.append(
        f"{name}: steady-state time regional/full (interleaved, warm process, {how}): "
        f"min {rmin / fmin:.2f}, median {rmed / fmed:.2f}"
    )
    return rows, steady, notes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="sd15,flux", help="comma-separated: sd15, flux")
    p.add_argument("--sd15-side", type=int, default=32, help="latent side for the SD1.5 UNet (32 = 256x256 px)")
    p.add_argument(
        "--flux-depth", type=int, default=FLUX_PARAMS["depth"], help="Flux double-stream blocks (Flux.1: 19)"
    )
    p.add_argument(
        "--flux-single",
        type=int,
        default=FLUX_PARAMS["depth_single_blocks"],
        help="Flux single-stream blocks (Flux.1: 38)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="fresh-process first calls per model, mode and cache state (medians are reported)",
    )
    p.add_argument("--rounds", type=int, default=7, help="clean interleaved rounds wanted in the steady-state process")
    p.add_argument("--max-rounds", type=int, default=20, help="at most this many rounds there")
    p.add_argument(
        "--max-others",
        type=float,
        default=0.10,
        help="a round is clean when other processes used at most this share of the cores during it",
    )
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=60.0,
        help="before each child process and each interleaved round, wait up to this many seconds "
        "until other processes use < 5%% of the cores (0: never)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per child process")
    p.add_argument("--keep", action="store_true", help="keep the work dir (cache dirs, outputs)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        os._exit(0)  # torch 2.11 may die at exit after compiled code ran (docs/compatibility.md, torch 2.11 exit row)
    t_start = time.perf_counter()
    _common.import_pack()  # for the header and parity (this process never compiles)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    _common.print_header(
        "bench_compile_latency",
        {
            "compile": "inductor; the Optimize node's defaults (mode default, dynamic auto, fullgraph off) and "
            f"guard filter {node_guard_filter()[1]}",
            "attention": "ComfyUI attention_pytorch (SDPA auto) via optimized_attention_override",
            "sd15 input": f"latent [2, 4, {args.sd15_side}, {args.sd15_side}], context [2, 77, 768], fp32",
            "flux model": "comfy.ldm.flux.model.Flux " + json.dumps(flux_params(args.flux_depth, args.flux_single)),
            "flux input": "latent [1, 16, 64, 64] (1024 tokens), context [1, 32, 256], y [1, 256], fp32",
            "processes": f"one fresh process per first call, {args.repeats} per model, mode and cache state; "
            "steady state side by side in one extra warm process: "
            f"{args.rounds} clean interleaved rounds wanted (at most {args.max_rounds}; clean = other "
            f"processes used <= {args.max_others:.0%} of the cores)",
        },
    )
    work = Path(tempfile.mkdtemp(prefix="steadfast_bench_compile_"))
    lat_rows: list[list[Any]] = []
    steady_rows: list[list[Any]] = []
    notes: list[str] = []
    try:
        for name in models:
            r, s, n = bench_model(name, args, work)
            lat_rows += r
            steady_rows += s
            notes += n
    finally:
        if args.keep:
            print(f"work dir kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("\n### First call (compile latency), one fresh process each\n")
    print(
        _common.markdown_table(
            [
                "model",
                "compile",
                "cache",
                "first call s",
                "others' CPU during it",
                "graphs",
                "graph breaks",
                "fxgraph hit/miss",
                "bit-equal to eager",
                "max abs diff vs eager",
                "rerun bit-equal",
                "ISA probes compiled",
                "peak RSS MB",
            ],
            lat_rows,
        )
    )
    print("\n### Steady state, interleaved in one warm process\n")
    print(
        _common.markdown_table(
            [
                "model",
                "mode",
                "first call in this process s",
                "min s",
                "median s",
                "speedup (min)",
                "speedup (median)",
                "bit-equal to eager",
                "max abs diff vs eager",
            ],
            steady_rows,
        )
    )
    print()
    for n in notes:
        print(f"- {n}")
    print(
        "\nspeedup = eager time / compiled time (> 1 is faster). others' CPU = share of the 2 cores used by "
        "other processes meanwhile (the benchmark's own process tree, inductor's compile workers and compilers "
        "included, does not count; 0% = the benchmark had the machine to itself). "
        "fxgraph hit/miss: inductor FX-graph cache counters after the first call."
    )
    _common.print_footer(t_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
