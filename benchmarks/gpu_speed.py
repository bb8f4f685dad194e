"""The GPU speed call (issue 35): Flux-dev and SDXL sizes, eager vs Steadfast vs core, in one device command.

Separate from the correctness protocol (``benchmarks/gpu_protocol.py``) and meant to run first whenever a GPU is
lent. ``python benchmarks/gpu_speed.py --out DIR`` runs, for each model, the rows

==================  ===========================================================================================
``eager``           ComfyUI defaults (its PyTorch-SDPA attention on a GPU), no Steadfast node
``steadfast``       ``SteadfastOptimizeModel``: SDPA ``auto``, regional ``torch.compile`` (inductor), the node's
                    defaults; compile cache ``default`` under a fresh ``$STEADFAST_COMPILE_CACHE`` (cold)
``steadfast+det``   ``SteadfastDeterminismSetup`` (strict, TF32 off) -> the same Optimize Model
``core``            core ComfyUI's ``TorchCompileModel`` (whole diffusion model, inductor; cold inductor cache)
``steadfast+ro``    ``steadfast`` with ``mode=reduce-overhead`` (CUDA graphs on the regional blocks; issue 35 item 4):
                    only when named in ``--rows``; its bits against ``steadfast`` (``bit_equal_to_steadfast``,
                    ``max_abs_diff_vs_steadfast``); inductor only (skipped under the smoke's eager backend)
``warm``            ``steadfast`` again in a SECOND process on the compile cache the first one left, with the
                    precompiled route on (``STEADFAST_PRECOMPILED=1``): a restart of the same install
==================  ===========================================================================================

on the models (random seeded weights, no download; ComfyUI's own model classes, ``comfy.sample.sample`` under
``torch.inference_mode`` as the server runs it, initial noise from the pack's ``seeded_noise``):

* ``flux``: Flux-dev (``benchmarks/bench_gpu_flux.py``: 19 + 38 blocks, width 3072, 11.9 B parameters, bf16),
  1024x1024, batch 1, euler / simple, cfg 1 with guidance 3.5, 512 text tokens;
* ``sdxl-b1`` / ``sdxl-b4``: SDXL's UNet (``benchmarks/sdxl_model.py``: 2.57 B parameters, fp16), 1024x1024,
  batch 1 / 4, euler / normal, cfg 7, 77 context tokens.

Steps: 28 (``--steps``). Without ``--steps``, each model first times an eager two-step call; when the sampling
alone of its in-process rows at 28 steps (calls x steps x the eager step, compiles not counted) is estimated at more
than 40 % of the time its process has, it takes 20 steps and the results say so (``steps_note``).

Per row (one untimed call first: its seconds are ``first_image_s``, the whole first call, compile included; then
``--images`` timed calls, the same seed each time):

* ``s_per_image``: median seconds per sampling call / batch (``s_per_call``: the median itself, ``times_s``: all);
* ``speedup_vs_eager``: eager's ``s_per_image`` / the row's;
* ``run_to_run_equal``: whether the timed calls' outputs are bit-identical (SHA-256 of the latent);
* ``max_abs_diff_vs_eager``: max |output - eager's output| (float32; 0 means bit-equal), ``bit_equal_to_eager``;
* ``tflops`` and ``pct_of_matmul``: FLOPs per image (``torch.utils.flop_counter.FlopCounterMode`` over a one-step
  eager sampling call, x steps / batch) per second, and that as a percentage of the bf16 matmul rate measured in
  the same process (best of ``torch.matmul`` on 8192^3 bf16 operands, CUDA events);
* ``peak_memory_gib``: ``torch.cuda.max_memory_allocated`` over the row (on the CPU: the process's peak RSS so far);
* ``recompiles``: recompiles the Steadfast compile record counted during the row (with reasons), and
  ``dynamo_graphs_first`` / ``dynamo_graphs_timed``: graphs Dynamo compiled in the first / the timed calls (every
  row, core's included; a warm row answered by precompiled blocks compiles none);
* ``precompiled``: the route's hits, loads, saves and fallbacks (Steadfast rows); the warm row's
  ``bit_equal_to_steadfast`` compares it with the cold process's ``steadfast`` row.

Also recorded: the card (``torch.cuda.get_device_name``), compute capability, driver (``nvidia-smi``), CUDA,
cuDNN, torch, ComfyUI, the pack's commit, the measured bf16 matmul rate, each model's parameter count and whether
its random-weight denoiser's output depends on its input (``input_sensitivity``: max |f(x1) - f(x2)| / max |f(x1)|
for two seeded inputs, > 0 when it does).

How it runs: every model runs its in-process rows in one child process and its ``warm`` row in a second one, each
with a time limit: the time left, shared in proportion to :data:`WEIGHTS` among the processes still to run (time a
process does not use goes to the later ones); ``--budget`` (default 540 s) bounds the whole call. A process past
its limit is killed; the rows it finished are kept, the others are recorded as killed or skipped. Every row is
written as soon as it is measured: ``DIR/gpu_speed.json`` (everything) and ``DIR/gpu_speed.md`` (the table), and
its table line is printed, so a call cut short keeps what it measured. ``--smoke`` runs the same rows on the CPU
with tiny models (1 step, 64x64, compile backend ``eager``: no C++ compiler; ``core`` skipped: :data:`SMOKE_SKIPS`),
all models (default ``flux`` and ``sdxl-b1``) in one pair of processes (CI: ``tests/comfy/test_gpu_speed_smoke.py``).

Usage::

    python benchmarks/gpu_speed.py --out $OUT                    # GPU; every model and row, 540 s
    python benchmarks/gpu_speed.py --out $OUT --models flux --steps 20 --budget 300
    python benchmarks/gpu_speed.py --out /tmp/s --smoke          # CPU, tiny (about 30 s on a quiet 2-core machine)

The device call (ComfyUI and the missing wheels carried as for the protocol, ``benchmarks/gpu_protocol_prepare.sh``)
is in docs/benchmarks.md, "GPU speed call (issue 35)". ``COMFYUI_PATH`` names the ComfyUI checkout.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

MODELS: dict[str, str] = {
    "flux": "Flux-dev (bench_gpu_flux.py), bf16, batch 1, cfg 1 (guidance 3.5)",
    "sdxl-b1": "SDXL UNet (sdxl_model.py), fp16, batch 1, cfg 7",
    "sdxl-b4": "SDXL UNet (sdxl_model.py), fp16, batch 4, cfg 7",
}
ROWS = ("eager", "steadfast", "steadfast+det", "steadfast+ro", "core", "warm")
#: the rows of a call without ``--rows``: ``steadfast+ro`` (issue 35 item 4) is asked for by name, so the default
#: call keeps its time
DEFAULT_ROWS = tuple(r for r in ROWS if r != "steadfast+ro")
#: relative share of the time left that each process gets: (model, "cold" | "warm")
WEIGHTS: dict[tuple[str, str], float] = {
    ("flux", "cold"): 40,
    ("flux", "warm"): 12,
    ("sdxl-b1", "cold"): 14,
    ("sdxl-b1", "warm"): 5,
    ("sdxl-b4", "cold"): 21,
    ("sdxl-b4", "warm"): 8,
}
DEFAULT_STEPS, FALLBACK_STEPS, SMOKE_STEPS = 28, 20, 1
FIT_SHARE = 0.4  # 28 steps when sampling alone (compiles not counted) is estimated at most this share of the time
MIN_START_S = 15  # a process with less time than this is not started
#: --smoke's default models: batch 1 covers the SDXL code path at a quarter of batch 4's calls under Determinism Setup
#: (one call per conditioning and item: 2 per step against 8); the GPU call runs both
SMOKE_MODELS = ("flux", "sdxl-b1")
#: --smoke: core's whole-model trace costs about 9 s of CPU on the tiny Flux and 20 s on the tiny UNet (their graph
#: breaks), a third of the smoke; the protocol's smoke already traces core on the tiny Flux (its steady_flux section,
#: through the same bench_gpu_flux.make_configs), so the speed call's smoke records core as skipped
SMOKE_SKIPS: dict[tuple[str, str], str] = {
    (m, "core"): "skipped: smoke (core's whole-model trace is smoke-tested by gpu_protocol.py --smoke)" for m in MODELS
}
#: rows that need the inductor backend (``torch.compile`` takes a mode with inductor only, and the guard filter
#: rides in ``options``): skipped, with this reason, under another backend (the smoke's eager)
INDUCTOR_ROWS = {"steadfast+ro": "skipped: mode=reduce-overhead needs the inductor backend"}
JSON_NAME, MD_NAME = "gpu_speed.json", "gpu_speed.md"


# ------------------------------------------------------------------------------------------------ results file
def load(out: Path) -> dict[str, Any]:
    """The results so far (``DIR/gpu_speed.json``); raises ``FileNotFoundError`` before the parent wrote it."""
    return json.loads((out / JSON_NAME).read_text())


def save(out: Path, results: dict[str, Any]) -> None:
    """Write ``gpu_speed.json`` and ``gpu_speed.md`` atomically (a kill mid-write leaves the previous files)."""
    for name, text in ((JSON_NAME, json.dumps(results, indent=1, default=str)), (MD_NAME, render(results))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, out / name)


def update(out: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Load, apply ``change`` in place, save; returns the results. One process writes at a time (the parent waits
    while a child runs)."""
    results = load(out)
    change(results)
    save(out, results)
    return results


def _model_entry(results: dict[str, Any], model: str) -> dict[str, Any]:
    return results["models"].setdefault(model, {"meta": {}, "rows": {}})


HEADERS = (
    "model",
    "row",
    "s/image",
    "first call s",
    "x eager",
    "run-to-run equal",
    "max abs d vs eager",
    "TFLOP/s",
    "% bf16 matmul",
    "peak GiB",
    "recompiles",
    "graphs first/timed",
    "precompiled hits/fallbacks",
    "status",
)


def table_row(model: str, row: str, r: dict[str, Any]) -> list[str]:
    """One markdown table line's cells for row ``row`` of ``model`` (``r``: its results or its status only)."""
    if "s_per_image" not in r:
        return [model, row] + ["-"] * (len(HEADERS) - 3) + [str(r.get("status", "not run"))[:160].replace("|", "/")]

    def num(key: str, fmt: str) -> str:
        v = r.get(key)
        return "-" if v is None else format(v, fmt)

    d = r.get("max_abs_diff_vs_eager")
    pre = (r.get("compile") or {}).get("precompiled") or {}
    return [
        model,
        row,
        f"{r['s_per_image']:.3f} (n={len(r.get('times_s', []))})",
        num("first_image_s", ".2f"),
        num("speedup_vs_eager", ".2f"),
        str(r.get("run_to_run_equal")),
        "-" if d is None else ("0" if d == 0 else f"{d:.2e}"),
        num("tflops", ".1f"),
        num("pct_of_matmul", ".1f"),
        num("peak_memory_gib", ".2f"),
        str(r.get("recompiles", "-")),
        f"{r.get('dynamo_graphs_first', '-')}/{r.get('dynamo_graphs_timed', '-')}",
        f"{pre['hits']}/{pre['fallbacks']}" if pre else "-",
        str(r.get("status", "ok"))
        + (
            "" if "bit_equal_to_steadfast" not in r else f"; = the steadfast row's bits: {r['bit_equal_to_steadfast']}"
        ),
    ]


def render(results: dict[str, Any]) -> str:
    """The results as markdown: the machine, each model's configuration, one table with every row."""
    env = results.get("env", {})
    lines = [
        f"# GPU speed call ({'smoke, CPU' if results.get('smoke') else 'GPU'})",
        "",
        f"- started {results.get('started_utc')}; {results.get('total_s', 0):.0f} s of a "
        f"{results.get('budget_s')} s budget",
        "- card: "
        + ", ".join(
            f"{k} {env[k]}"
            for k in (
                "device_name",
                "capability",
                "memory_gib",
                "driver",
                "cuda",
                "cudnn",
                "torch",
                "comfyui",
                "pack_commit",
            )
            if k in env
        ),
    ]
    if env.get("bf16_matmul_tflops"):
        lines.append(f"- measured bf16 matmul rate: {env['bf16_matmul_tflops']} TFLOP/s (per process)")
    for model, entry in results.get("models", {}).items():
        m = entry.get("meta", {})
        if m:
            lines.append(
                f"- {model}: {m.get('description')}; {m.get('parameters', 0) / 1e9:.2f} B parameters, "
                f"{m.get('width')}x{m.get('height')}, {m.get('steps')} steps"
                f"{' (' + m['steps_note'] + ')' if m.get('steps_note') else ''}, "
                f"{m.get('flops_per_image', 0) / 1e12:.2f} TFLOP/image, input sensitivity "
                f"{m.get('input_sensitivity', {}).get('relative', '-')}"
            )
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for model, entry in results.get("models", {}).items():
        for row in ROWS:
            if row in entry.get("rows", {}):
                lines.append("| " + " | ".join(table_row(model, row, entry["rows"][row])) + " |")
    for c in results.get("children", []):
        if c.get("status") != "ok":
            lines.append(f"\n- process {c['name']}: {c['status']}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ the models
@dataclasses.dataclass
class Bench:
    """One model at its benchmark size: the base ``ModelPatcher`` and how to sample with it."""

    key: str
    base: Any
    batch: int
    width: int
    height: int
    parameters: int
    dtype: str
    #: ``(model, steps) -> output latent`` (CPU tensor ``[batch, C, height / 8, width / 8]``)
    sample: Callable[[Any, int], Any]
    #: ``() -> {"relative", "max_abs_diff", "finite"}``: two seeded direct calls of the eager denoiser
    sensitivity: Callable[[], dict[str, Any]]


def _sensitivity(call: Callable[[dict[str, Any]], Any], a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    import torch

    with torch.inference_mode():
        ya, yb = call(a).float(), call(b).float()
    diff = float((ya - yb).abs().max())
    scale = float(ya.abs().max())
    return {
        "max_abs_diff": diff,
        "relative": diff / scale if scale > 0 else float("nan"),
        "finite": bool(torch.isfinite(ya).all() and torch.isfinite(yb).all()),
    }


def flux_bench(smoke: bool, device: Any, seed: int) -> Bench:
    """Flux-dev (:data:`bench_gpu_flux.FLUX_DEV`, bf16, 1024^2, 512 tokens; smoke: its tiny Flux, 64^2, 8 tokens)."""
    import bench_gpu_flux as bgf
    import torch

    import comfy.model_management
    import comfy.sample

    from steadfast.core.determinism import noise as sf_noise

    config = bgf.SMOKE if smoke else bgf.FLUX_DEV
    side, tokens = (64, 8) if smoke else (1024, 512)
    base = bgf.build_flux(config, device, torch.bfloat16, seed)
    shape = (1, config["in_channels"], side // 8, side // 8)
    cond = bgf.conditioning(config, tokens, seed)
    x0, latent = sf_noise.seeded_noise(shape, seed), torch.zeros(shape)

    def sample(model: Any, steps: int) -> Any:
        with torch.inference_mode():
            return comfy.sample.sample(
                model, x0, steps, 1.0, "euler", "simple", cond, cond, latent, denoise=1.0, disable_pbar=True, seed=seed
            )

    def sensitivity() -> dict[str, Any]:
        comfy.model_management.load_models_gpu([base])
        dm, dt = base.model.diffusion_model, torch.bfloat16

        def inputs(k: int) -> dict[str, Any]:
            g = torch.Generator().manual_seed(seed * 1000 + k)
            return {
                "x": torch.randn(shape, generator=g).to(device, dt),
                "timestep": torch.tensor([0.5], device=device, dtype=dt),
                "context": torch.randn(1, tokens, config["context_in_dim"], generator=g).to(device, dt),
                "y": torch.randn(1, config["vec_in_dim"], generator=g).to(device, dt),
                "guidance": torch.tensor([3.5], device=device, dtype=dt),
            }

        a, b = inputs(1), inputs(2)
        b = {**a, "x": b["x"]}  # only the latent differs
        return _sensitivity(lambda k: dm(k["x"], k["timestep"], k["context"], y=k["y"], guidance=k["guidance"]), a, b)

    params = sum(p.numel() for p in base.model.diffusion_model.parameters())
    return Bench("flux", base, 1, side, side, params, "bf16", sample, sensitivity)


def sdxl_bench(smoke: bool, device: Any, seed: int, batch: int) -> Bench:
    """SDXL's UNet (:data:`sdxl_model.SDXL`, fp16, 1024^2, 77 tokens, cfg 7; smoke: its tiny UNet, 64^2, 8
    tokens) at ``batch``."""
    import sdxl_model as sdxl
    import torch

    import comfy.model_management
    import comfy.sample

    from steadfast.core.determinism import noise as sf_noise

    config = sdxl.SMOKE if smoke else sdxl.SDXL
    side, tokens = (64, 8) if smoke else (1024, 77)
    base = sdxl.build_sdxl(config, device, torch.float16, seed)
    shape = (batch, config["in_channels"], side // 8, side // 8)
    positive, negative = sdxl.conditioning(config, tokens, seed, side, side)
    x0, latent = sf_noise.seeded_noise(shape, seed), torch.zeros(shape)

    def sample(model: Any, steps: int) -> Any:
        with torch.inference_mode():
            return comfy.sample.sample(
                model,
                x0,
                steps,
                sdxl.CFG,
                "euler",
                "normal",
                positive,
                negative,
                latent,
                denoise=1.0,
                disable_pbar=True,
                seed=seed,
            )

    def sensitivity() -> dict[str, Any]:
        comfy.model_management.load_models_gpu([base])
        dm = base.model.diffusion_model
        a = sdxl.denoiser_inputs(config, shape, tokens, device, torch.float16, seed)
        b = {**a, "x": sdxl.denoiser_inputs(config, shape, tokens, device, torch.float16, seed + 1)["x"]}
        return _sensitivity(lambda k: dm(k["x"], k["timesteps"], k["context"], y=k["y"]), a, b)

    params = sum(p.numel() for p in base.model.diffusion_model.parameters())
    return Bench(f"sdxl-b{batch}", base, batch, side, side, params, "fp16", sample, sensitivity)


def make_bench(model: str, smoke: bool, device: Any, seed: int) -> Bench:
    """The :class:`Bench` for a key of :data:`MODELS`; ``KeyError`` for another."""
    if model == "flux":
        return flux_bench(smoke, device, seed)
    if model in ("sdxl-b1", "sdxl-b4"):
        return sdxl_bench(smoke, device, seed, int(model[-1]))
    raise KeyError(model)


# ------------------------------------------------------------------------------------------------ child processes
def _sync(device: Any) -> None:
    import bench_gpu_flux as bgf

    bgf.sync(device)


def _env(device: Any) -> dict[str, Any]:
    import _common
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "comfyui": _common.comfyui_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        env["cudnn"] = torch.backends.cudnn.version()
    else:
        env["device_name"] = f"cpu ({_common.cpu_model()})"
    return env


def _peak_gib(device: Any) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _flops_per_call(bench: Bench) -> float:
    """FLOPs of a one-step eager sampling call (every denoiser call of one step: cond and uncond included)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        bench.sample(bench.base, 1)
    return float(counter.get_total_flops())


def _finish_row(
    row: str,
    r: dict[str, Any],
    bench: Bench,
    meta: dict[str, Any],
    output: Any,
    ref: Any,
    eager: dict[str, Any] | None,
    rate: float,
    recompiles_before: int,
) -> dict[str, Any]:
    """Add the per-image numbers, the comparison with eager and the row's own recompiles to ``r`` (in place)."""
    import torch

    r["s_per_call"] = r["s_per_image"]
    r["s_per_image"] = r["s_per_call"] / bench.batch
    r["tflops"] = meta["flops_per_image"] / r["s_per_image"] / 1e12
    r["pct_of_matmul"] = 100.0 * meta["flops_per_image"] / r["s_per_image"] / rate
    r["matmul_tflops"] = rate / 1e12
    if ref is not None:
        d = float((output.float() - ref.float()).abs().max())
        r["max_abs_diff_vs_eager"] = d if d == d else float("inf")  # NaN -> inf: never "equal"
        r["bit_equal_to_eager"] = bool(torch.equal(output, ref))
    if eager is not None and "s_per_image" in eager:
        r["speedup_vs_eager"] = eager["s_per_image"] / r["s_per_image"]
    comp = r.get("compile")
    if comp is not None:
        reasons = comp.get("recompile_reasons", [])
        r["recompiles"] = comp["recompiles"] - recompiles_before
        r["recompile_reasons"] = reasons[recompiles_before:]
    elif row in ("eager", "core"):
        r["recompiles"] = r.get("dynamo_graphs_timed", 0) if row == "core" else 0
    r["status"] = "ok"
    return r


def _record_row(out: Path, model: str, row: str, r: dict[str, Any]) -> None:
    update(out, lambda res: _model_entry(res, model)["rows"].__setitem__(row, r))
    print("| " + " | ".join(table_row(model, row, r)) + " |", flush=True)


def _row_error(out: Path, model: str, row: str, e: BaseException, device: Any) -> None:
    """Record ``e`` as row ``row``'s status (type and message) and print its traceback; frees cached GPU memory."""
    import traceback

    import torch

    traceback.print_exc()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    _mark(out, model, row, f"error: {type(e).__name__}: {str(e)[:300]}")


def _mark(out: Path, model: str, row: str, status: str) -> None:
    def change(res: dict[str, Any]) -> None:
        rows = _model_entry(res, model)["rows"]
        if "s_per_image" not in rows.get(row, {}):
            rows[row] = {"status": status}

    update(out, change)
    print(f"[{model}] {row}: {status}", flush=True)


def child(part: str, models: list[str], rows: list[str], ns: argparse.Namespace, deadline: float) -> int:
    """One child process: ``part`` "cold" runs ``rows`` (all but warm) of each model; "warm" runs the warm row.

    ``deadline``: ``time.time()`` by which the parent kills this process; a row is skipped when the time left is
    below what its images alone need at the eager rate. Writes every row to ``ns.out`` as it finishes.
    """
    import _common
    import bench_gpu_flux as bgf
    import torch

    device = torch.device(ns.device or ("cpu" if ns.smoke or not torch.cuda.is_available() else "cuda"))
    _common.import_pack(cpu=device.type == "cpu")
    out, work = Path(ns.out), Path(ns.work)
    rate = bgf.matmul_rate(device, ns.smoke)  # cuBLAS initialised here, in every process alike
    env = _env(device)

    def note_env(res: dict[str, Any]) -> None:
        res["env"].update(env)
        res["env"].setdefault("bf16_matmul_tflops", []).append(float(f"{rate / 1e12:.3g}"))  # CPU w/o bf16: ~0.001

    update(out, note_env)
    for model in models:
        if time.time() > deadline - 5:
            for row in rows:
                _mark(out, model, row, "skipped: out of time")
            continue
        try:
            if part == "cold":
                _cold(model, rows, ns, device, rate, out, work, deadline)
            else:
                _warm(model, ns, device, rate, out, work, deadline)
        except Exception as e:  # noqa: BLE001 - the model could not be built or measured: its rows say why
            for row in rows:
                _row_error(out, model, row, e, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


def _cold(
    model: str,
    rows: list[str],
    ns: argparse.Namespace,
    device: Any,
    rate: float,
    out: Path,
    work: Path,
    deadline: float,
) -> None:
    import bench_gpu_flux as bgf
    import torch

    t0 = time.perf_counter()
    bench = make_bench(model, ns.smoke, device, ns.seed)
    build_s = time.perf_counter() - t0
    sens = bench.sensitivity()
    flops_call = _flops_per_call(bench)  # the first eager call: warms up the model's kernels too
    steps, note, step_s = ns.steps or (SMOKE_STEPS if ns.smoke else None), "", None
    if steps is None:  # time an eager step: do 28 steps fit?
        _sync(device)
        t1 = time.perf_counter()
        bench.sample(bench.base, 2)
        _sync(device)
        step_s = (time.perf_counter() - t1) / 2
        steps = DEFAULT_STEPS
        est = len(rows) * (1 + ns.images) * steps * step_s
        left = deadline - time.time()
        if est > FIT_SHARE * left:
            note = (
                f"{FALLBACK_STEPS} steps, not {DEFAULT_STEPS}: {len(rows)} rows x {1 + ns.images} calls at "
                f"{DEFAULT_STEPS} steps estimated {est:.0f} s (eager {step_s:.3f} s/step), over "
                f"{FIT_SHARE:.0%} of the {left:.0f} s this process had"
            )
            steps = FALLBACK_STEPS
    meta = {
        "description": MODELS[model],
        "parameters": bench.parameters,
        "dtype": bench.dtype,
        "width": bench.width,
        "height": bench.height,
        "batch": bench.batch,
        "steps": steps,
        "steps_note": note,
        "images": ns.images,
        "build_s": build_s,
        "eager_step_s": step_s,
        "flops_per_call_step": flops_call,
        "flops_per_image": flops_call * steps / bench.batch,
        "input_sensitivity": sens,
        "backend": ns.backend,
    }
    update(out, lambda res: _model_entry(res, model)["meta"].update(meta))
    print(
        f"[{model}] {bench.parameters / 1e9:.3f} B parameters built in {build_s:.1f} s; {steps} steps"
        f"{' (' + note + ')' if note else ''}; input sensitivity {sens}",
        flush=True,
    )

    ref, eager, sf_out = None, None, None
    for row in rows:
        if ns.smoke and (model, row) in SMOKE_SKIPS:
            _mark(out, model, row, SMOKE_SKIPS[(model, row)])
            continue
        if row in INDUCTOR_ROWS and ns.backend != "inductor":
            _mark(out, model, row, INDUCTOR_ROWS[row])
            continue
        left = deadline - time.time()
        need = (1 + ns.images) * steps * (step_s if step_s is not None else _eager_step_s(eager, steps))
        if left < need:
            _mark(out, model, row, f"skipped: out of time ({left:.0f} s left, its calls alone need ~{need:.0f} s)")
            continue
        try:
            configs = bgf.make_configs(bench.base, [row], ns.backend)
            m, report = configs[row]
            print(f"[{model}] {row}: " + report.replace("\n", "; ")[:600], flush=True)
            rec = _record(m, row)
            before = len(rec.stats.recompiles) if rec is not None else 0
            keep: list = []
            r = bgf.run_config(row, m, lambda mm: bench.sample(mm, steps), ns.images, device, keep=keep)
            r["peak_memory_gib"] = _peak_gib(device)
            if row == "eager":  # the reference of every later row (and of the warm process: saved)
                ref, eager = keep[0], r
                torch.save(ref, work / f"ref_{model}.pt")
            _finish_row(row, r, bench, meta, keep[0], ref, eager, rate, before)
            if row == "steadfast":
                sf_out = keep[0]
            elif row == "steadfast+ro" and sf_out is not None:  # the bits CUDA graphs change, if any
                d = float((keep[0].float() - sf_out.float()).abs().max())
                r["max_abs_diff_vs_steadfast"] = d if d == d else float("inf")
                r["bit_equal_to_steadfast"] = bool(torch.equal(keep[0], sf_out))
            _record_row(out, model, row, r)
            del m, configs, keep
        except Exception as e:  # noqa: BLE001 - one row's failure (an OOM, a compile error) is its result
            _row_error(out, model, row, e, device)


def _eager_step_s(eager: dict[str, Any] | None, steps: int) -> float:
    """Seconds per eager step from the eager row (0 before it ran: nothing known, nothing skipped)."""
    return 0.0 if eager is None else eager["s_per_call"] / steps


def _record(model: Any, row: str) -> Any:
    if not row.startswith("steadfast"):
        return None
    from steadfast.core.compile.registry import REGISTRY

    return REGISTRY.get(model.model)


def _warm(
    model: str, ns: argparse.Namespace, device: Any, rate: float, out: Path, work: Path, deadline: float
) -> None:
    import bench_gpu_flux as bgf
    import torch

    entry = load(out)["models"].get(model, {})
    meta, cold = entry.get("meta", {}), entry.get("rows", {})
    if "s_per_image" not in cold.get("steadfast", {}):
        _mark(out, model, "warm", "skipped: the steadfast row (which fills the compile cache) did not run")
        return
    bench = make_bench(model, ns.smoke, device, ns.seed)
    m, report = bgf.make_configs(bench.base, ["steadfast"], ns.backend)["steadfast"]
    print(f"[{model}] warm: " + report.replace("\n", "; ")[:600], flush=True)
    keep: list = []
    ref_path = work / f"ref_{model}.pt"
    ref = torch.load(ref_path) if ref_path.exists() else None
    r = bgf.run_config("steadfast", m, lambda mm: bench.sample(mm, meta["steps"]), ns.images, device, keep=keep)
    r["peak_memory_gib"] = _peak_gib(device)
    _finish_row("warm", r, bench, meta, keep[0], ref, cold.get("eager"), rate, 0)
    r["bit_equal_to_steadfast"] = r["hashes"][0] == cold["steadfast"]["hashes"][0]
    _record_row(out, model, "warm", r)


# ------------------------------------------------------------------------------------------------ the parent
def _nvidia_smi() -> str:
    try:
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return p.stdout.strip() or p.stderr.strip()[:200]
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({type(e).__name__})"


def _git_commit() -> str:
    try:
        p = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
        return p.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def plan(models: list[str], rows: list[str], group: bool) -> list[tuple[str, list[str], list[str]]]:
    """The child processes in order: ``(part, models, rows)``; part "cold" (the in-process rows) or "warm".
    ``group``: all models in one cold and one warm process (the smoke run), else one pair per model."""
    cold_rows = [r for r in ROWS if r in rows and r != "warm"]
    groups = [models] if group else [[m] for m in models]
    out: list[tuple[str, list[str], list[str]]] = []
    for ms in groups:
        if cold_rows:
            out.append(("cold", ms, cold_rows))
        if "warm" in rows:
            out.append(("warm", ms, ["warm"]))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for gpu_speed.json / gpu_speed.md (e.g. $OUT)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models, 1 step, compile backend eager (CI)")
    p.add_argument("--budget", type=float, default=None, help="seconds for everything (default 540; smoke 600)")
    p.add_argument(
        "--models", default=None, help=f"subset of {', '.join(MODELS)} (default: all; smoke: {','.join(SMOKE_MODELS)})"
    )
    p.add_argument(
        "--rows", default=",".join(DEFAULT_ROWS), help=f"subset of {', '.join(ROWS)} (default: all but steadfast+ro)"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"sampling steps (default {DEFAULT_STEPS}, or {FALLBACK_STEPS} when 28 are estimated not "
        f"to fit, recorded; smoke {SMOKE_STEPS})",
    )
    p.add_argument("--images", type=int, default=3, help="timed calls per row, at least 3 (default 3)")
    p.add_argument("--backend", default=None, help="torch.compile backend (default inductor; smoke eager)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=None, help="scratch folder: compile caches, eager outputs (default: temporary)")
    p.add_argument("--child", default=None, choices=("cold", "warm"), help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    ns.models = [
        m.strip() for m in (ns.models or ",".join(SMOKE_MODELS if ns.smoke else MODELS)).split(",") if m.strip()
    ]
    ns.rows = [r.strip() for r in ns.rows.split(",") if r.strip()]
    bad = [m for m in ns.models if m not in MODELS] + [r for r in ns.rows if r not in ROWS]
    if bad:
        p.error(f"unknown models/rows {bad}; models: {list(MODELS)}, rows: {list(ROWS)}")
    if ns.images < 3:
        p.error("--images: at least 3 (the median of at least 3 calls)")
    ns.backend = ns.backend or ("eager" if ns.smoke else "inductor")
    ns.budget = ns.budget or (600.0 if ns.smoke else 540.0)
    return ns


def _child_argv(ns: argparse.Namespace, part: str, models: list[str], rows: list[str], deadline: float) -> list[str]:
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        part,
        "--out",
        ns.out,
        "--work",
        ns.work,
        "--models",
        ",".join(models),
        "--rows",
        ",".join(rows),
        "--images",
        str(ns.images),
        "--backend",
        ns.backend,
        "--seed",
        str(ns.seed),
        "--deadline",
        repr(deadline),
    ]
    argv += ["--smoke"] if ns.smoke else []
    argv += ["--steps", str(ns.steps)] if ns.steps is not None else []
    argv += ["--device", ns.device] if ns.device else []
    return argv


def main(argv: list[str] | None = None) -> int:
    """Run the speed call (or, with the hidden ``--child``, one of its processes). Returns 0; a process that fails
    or is killed is recorded in the results, never raised."""
    ns = parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    ns.work = ns.work or tempfile.mkdtemp(prefix="gpu_speed_")
    Path(ns.work).mkdir(parents=True, exist_ok=True)
    if ns.child:
        return child(ns.child, ns.models, ns.rows, ns, ns.deadline or time.time() + ns.budget)

    t_start = time.monotonic()
    deadline = t_start + ns.budget
    smi = _nvidia_smi()
    results: dict[str, Any] = {
        "smoke": ns.smoke,
        "budget_s": ns.budget,
        "models": {m: {"meta": {}, "rows": {}} for m in ns.models},
        "started_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "options": {k: getattr(ns, k) for k in ("models", "rows", "steps", "images", "backend", "seed")},
        "env": {
            "nvidia_smi": smi,
            "driver": smi.split(",")[-1].strip() if "," in smi else "n/a",
            "pack_commit": _git_commit(),
        },
        "children": [],
    }
    save(out, results)
    print("| " + " | ".join(HEADERS) + " |\n|" + "---|" * len(HEADERS), flush=True)
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        STEADFAST_PRECOMPILED="1",
        TORCHINDUCTOR_CACHE_DIR=str(Path(ns.work) / "inductor_core"),
    )  # core's inductor cache: cold
    todo = plan(ns.models, ns.rows, group=ns.smoke)
    for i, (part, models, rows) in enumerate(todo):
        name = f"{part} {','.join(models)}"
        left = deadline - time.monotonic()
        weights = [WEIGHTS.get((ms[0], p), 10.0) for p, ms, _ in todo[i:]]
        limit = left if ns.smoke else left * weights[0] / sum(weights)
        if left < MIN_START_S:
            status = "skipped: out of time"
        else:
            # one compile cache per model, shared by its cold and warm processes (the warm one loads from it)
            env["STEADFAST_COMPILE_CACHE"] = str(Path(ns.work) / ("cache_" + "_".join(models)))
            t0 = time.monotonic()
            proc = subprocess.Popen(
                _child_argv(ns, part, models, rows, time.time() + limit), env=env, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=limit)
                status = "ok" if rc == 0 else f"error: exit code {rc}"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the child and its compile workers
                proc.wait()
                status = f"killed at its {limit:.0f} s limit"
            print(f"== {name}: {status} in {time.monotonic() - t0:.0f} s", flush=True)

        def finish(res: dict[str, Any], name=name, status=status, limit=limit, models=models, rows=rows) -> None:
            res["children"].append({"name": name, "status": status, "limit_s": round(limit, 1)})
            for m in models:
                done = _model_entry(res, m)["rows"]
                for r in rows:
                    if "s_per_image" not in done.get(r, {}) and "status" not in done.get(r, {}):
                        done[r] = {"status": "not run: " + status if status != "ok" else "not run"}
            res["total_s"] = time.monotonic() - t_start

        results = update(out, finish)
    print("\n" + render(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
