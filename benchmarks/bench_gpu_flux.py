"""Flux-dev architecture on a GPU: eager vs Steadfast-optimized (with and without determinism).

What it runs (the product path, not a re-implementation): ComfyUI's own ``comfy.model_base.Flux``
(``comfy.ldm.flux.model.Flux``) with the Flux.1-dev configuration (hidden 3072, 24 heads, 19 double
+ 38 single blocks, T5 context 4096, guidance embedding; ~11.9 B parameters) in bf16, every
parameter drawn from a generator seeded by its name (no download; random weights, so images are
noise but timings, kernels and bits behave as with the real model). It is wrapped in a
``ModelPatcher`` and sampled with ``comfy.sample.sample`` (euler / simple, cfg 1.0 with guidance
3.5 as Flux-dev is used, 28 steps, 1024x1024 = latent ``[1, 16, 128, 128]``, 512 text tokens),
initial noise from the pack's CPU ``core.determinism.noise.seeded_noise``.

Configurations (clones of one model, so the weights are shared):

=======================  =====================================================================
``eager``                ComfyUI defaults (its PyTorch-SDPA attention on GPU), no Steadfast node
``steadfast``            ``SteadfastOptimizeModel``: SDPA ``auto``, regional ``torch.compile``
                         (inductor, the node's defaults) of DoubleStreamBlock / SingleStreamBlock
``steadfast+det``        ``SteadfastDeterminismSetup`` (strict, TF32 off) -> the same Optimize
``core``                 core ComfyUI's ``TorchCompileModel`` (whole diffusion model; only with ``--configs``)
=======================  =====================================================================

Per configuration: one untimed image (compilation happens here; its seconds are reported as
``first_image_s``), then ``--images`` timed images (``torch.cuda.synchronize`` around each), all with
the same seed. Reported: median seconds per image, speed-up against ``eager``, whether the timed
images are bit-identical run to run (SHA-256 of the output latent), whether each configuration is
bit-equal to ``eager``, achieved TFLOP/s (FLOPs of one denoiser call counted with
``torch.utils.flop_counter.FlopCounterMode`` x steps) and that as a percentage of this device's
measured bf16 matmul rate (best of ``torch.matmul`` on 8192^3 bf16, timed with CUDA events), the
Steadfast compile records (graphs, recompiles with reasons) and peak memory.

Usage::

    python benchmarks/bench_gpu_flux.py                  # GPU, Flux-dev size (needs ~26 GB + activations)
    python benchmarks/bench_gpu_flux.py --images 5 --json out.json
    python benchmarks/bench_gpu_flux.py --smoke          # tiny Flux on CPU, 2 steps: checks the script runs

Notes: the first image of ``steadfast+det`` recompiles (deterministic algorithms are a global flag
Dynamo guards on; the compile record says so). ``--backend eager`` traces with Dynamo only (for
smoke tests: no C++ compiler needed). Needs a ComfyUI checkout (``COMFYUI_PATH``, default
``~/comfy/ComfyUI``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

FLUX_DEV: dict[str, Any] = {
    "image_model": "flux",
    "in_channels": 16,
    "out_channels": 16,
    "patch_size": 2,
    "vec_in_dim": 768,
    "context_in_dim": 4096,
    "hidden_size": 3072,
    "mlp_ratio": 4.0,
    "num_heads": 24,
    "depth": 19,
    "depth_single_blocks": 38,
    "axes_dim": [16, 56, 56],
    "theta": 10000,
    "qkv_bias": True,
    "guidance_embed": True,
    "txt_ids_dims": [],
}
"""Flux.1-dev, as ComfyUI v0.8.0's ``model_detection`` derives it from the checkpoint."""

SMOKE: dict[str, Any] = {
    **FLUX_DEV,
    "vec_in_dim": 32,
    "context_in_dim": 64,
    "hidden_size": 64,
    "num_heads": 2,
    "depth": 1,
    "depth_single_blocks": 2,
    "axes_dim": [8, 12, 12],
}
"""A tiny Flux (same code paths) for ``--smoke`` on CPU."""

CONFIGS = ("eager", "steadfast", "steadfast+det", "core")
DEFAULT_CONFIGS = CONFIGS[:3]  # "core" (ComfyUI's TorchCompileModel, whole model) on request


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny Flux, CPU, 64x64, 2 steps, 2 images")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--width", type=int, default=None, help="pixels (default 1024; smoke 64)")
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="default 28; smoke 2")
    p.add_argument("--images", type=int, default=None, help="timed images per configuration (default 3; smoke 2)")
    p.add_argument("--text-tokens", type=int, default=None, help="T5 tokens (default 512; smoke 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="inductor", help="torch.compile backend for the Steadfast configs")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="subset of " + ", ".join(CONFIGS))
    p.add_argument("--json", default=None, help="also write the results to this file")
    ns = p.parse_args(argv)
    smoke = ns.smoke
    ns.width = ns.width or (64 if smoke else 1024)
    ns.height = ns.height or (64 if smoke else 1024)
    ns.steps = ns.steps or (2 if smoke else 28)
    ns.images = ns.images or 2 if smoke else ns.images or 3
    ns.text_tokens = ns.text_tokens or (8 if smoke else 512)
    ns.configs = [c.strip() for c in ns.configs.split(",") if c.strip()]
    unknown = [c for c in ns.configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configs {unknown}; choose from {CONFIGS}")
    return ns


# ---------------------------------------------------------------------------------------------
# Imports: ComfyUI (GPU or CPU) and the pack as package ``steadfast``
# ---------------------------------------------------------------------------------------------
def import_comfy_and_pack(cpu: bool) -> Any:
    """Put ComfyUI on ``sys.path`` (``args.cpu`` set only for CPU runs), then load the repo as ``steadfast``.

    The pack is imported before any CUDA work so its ``CUBLAS_WORKSPACE_CONFIG`` is in effect.
    Raises ``FileNotFoundError`` without a ComfyUI checkout (:func:`_common.import_pack`).
    """
    return _common.import_pack(cpu=cpu)


# ---------------------------------------------------------------------------------------------
# Model, inputs, measurements
# ---------------------------------------------------------------------------------------------
def _generator(device: Any, seed: int, key: str) -> Any:
    return _common.seeded_generator("steadfast-flux-bench", device, seed, key)


def build_flux(config: dict[str, Any], device: Any, dtype: Any, seed: int) -> Any:
    """A ``ModelPatcher`` around ComfyUI's ``model_base.Flux`` built from ``config`` on ``device``.

    Parameters are filled in place from generators seeded by ``seed`` and the parameter name: matrices
    ~ N(0, 1/fan_in), norm scales 1, biases ~ N(0, 0.02^2). Raises ``RuntimeError`` if the model holds
    buffers (they would stay uninitialised).
    """
    return _common.seeded_comfy_model("Flux", config, device, dtype, seed, "steadfast-flux-bench", "scale")


def conditioning(config: dict[str, Any], tokens: int, seed: int) -> list:
    """Flux CONDITIONING: seeded T5-like context ``[1, tokens, context_in_dim]``, pooled CLIP ``[1, vec_in_dim]``,
    guidance 3.5 (what FluxGuidance sets for Flux-dev)."""
    import torch

    ctx = torch.randn(1, tokens, config["context_in_dim"], generator=_generator("cpu", seed, "context"))
    pooled = torch.randn(1, config["vec_in_dim"], generator=_generator("cpu", seed, "pooled"))
    return [[ctx, {"pooled_output": pooled, "guidance": 3.5}]]


def sync(device: Any) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def matmul_rate(device: Any, smoke: bool) -> float:
    """Best measured bf16 matmul rate on ``device`` in FLOP/s (``2 n^3`` per ``n x n`` product)."""
    import torch

    n = 512 if smoke else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    reps = 2 if smoke else 20
    best = float("inf")
    for _ in range(3):
        torch.matmul(a, b)
        sync(device)
        if str(device).startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                torch.matmul(a, b)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000.0
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.matmul(a, b)
            seconds = time.perf_counter() - t0
        best = min(best, seconds / reps)
    return 2.0 * n**3 / best


def denoiser_flops(
    patcher: Any, config: dict[str, Any], latent_shape: tuple[int, ...], tokens: int, device: Any, dtype: Any
) -> int:
    """FLOPs of one eager call of the diffusion model at ``latent_shape`` (FlopCounterMode: matmuls,
    convolutions, attention)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    import comfy.model_management

    comfy.model_management.load_models_gpu([patcher])
    dm = patcher.model.diffusion_model
    x = torch.zeros(latent_shape, device=device, dtype=dtype)
    ctx = torch.zeros(1, tokens, config["context_in_dim"], device=device, dtype=dtype)
    y = torch.zeros(1, config["vec_in_dim"], device=device, dtype=dtype)
    t = torch.tensor([0.5], device=device, dtype=dtype)
    guidance = torch.tensor([3.5], device=device, dtype=dtype)
    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        dm(x, t, ctx, y=y, guidance=guidance)
    return int(counter.get_total_flops())


def make_configs(base: Any, names: list[str], backend: str) -> dict[str, tuple[Any, str]]:
    """``{name: (ModelPatcher clone, node report)}`` made by the pack's own nodes: ``eager`` (ComfyUI's defaults),
    ``core`` (core's TorchCompileModel), ``steadfast`` (Optimize Model, regional, SDPA auto), ``steadfast+det``
    (Determinism Setup, strict, then the same) and ``steadfast+ro`` (the same with ``mode=reduce-overhead``)."""
    from steadfast.nodes.determinism_node import SteadfastDeterminismSetup
    from steadfast.nodes.optimize_node import SteadfastOptimizeModel

    out: dict[str, tuple[Any, str]] = {}
    for name in names:
        if name == "eager":
            out[name] = (base.clone(), "ComfyUI defaults")
            continue
        if name == "core":  # core ComfyUI's TorchCompileModel node (torch.compile of the whole diffusion model)
            from comfy_extras.nodes_torch_compile import TorchCompileModel

            res = TorchCompileModel.execute(base, backend)
            out[name] = ((res.result if hasattr(res, "result") else res)[0], f"core TorchCompileModel ({backend})")
            continue
        model, reports = base, []
        if name == "steadfast+det":
            det = SteadfastDeterminismSetup.execute(model, True, False, 0)
            model, reports = det.result[0], [det.result[1]]
        mode = "reduce-overhead" if name == "steadfast+ro" else "default"  # +ro: CUDA graphs on the blocks
        opt = SteadfastOptimizeModel.execute(model, False, False, "auto", "regional", backend, mode, "auto", False)
        out[name] = (opt.result[0], "\n".join(reports + [opt.result[1]]))
    return out


def run_config(
    name: str, model: Any, sample: Callable[[Any], Any], images: int, device: Any, keep: list | None = None
) -> dict[str, Any]:
    """One untimed image (compiles), then ``images`` timed ones; returns timings, hashes and compile state.

    The compile record is read for the Steadfast configurations only (``name`` starting with "steadfast": core's
    clone shares the model object a Steadfast record is keyed on). ``dynamo_graphs_first`` / ``dynamo_graphs_timed``:
    graphs Dynamo compiled during the first image / the timed ones (``torch._dynamo.utils.counters``; a timed image
    that compiles is a recompile). ``keep``: when given, the first image's output tensor is appended to it.
    """
    import torch

    from steadfast.core.compile.registry import REGISTRY
    from steadfast.core.record import hashing

    def graphs() -> int:
        try:
            from torch._dynamo.utils import counters
        except ImportError:
            return 0
        return int(counters["stats"]["unique_graphs"])

    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    g0 = graphs()
    t0 = time.perf_counter()
    first = sample(model)
    sync(device)
    first_s = time.perf_counter() - t0
    g1 = graphs()
    if keep is not None:
        keep.append(first)
    times, digests = [], []
    for _ in range(images):
        sync(device)
        t0 = time.perf_counter()
        out = sample(model)
        sync(device)
        times.append(time.perf_counter() - t0)
        digests.append(hashing.tensor_digest(out))
    record = REGISTRY.get(model.model) if name.startswith("steadfast") else None
    result: dict[str, Any] = {
        "first_image_s": first_s,
        "s_per_image": statistics.median(times),
        "times_s": times,
        "dynamo_graphs_first": g1 - g0,
        "dynamo_graphs_timed": graphs() - g1,
        "hashes": digests,
        "first_image_hash": hashing.tensor_digest(first),
        "run_to_run_equal": len(set(digests)) == 1,
        "finite": bool(torch.isfinite(first.float()).all()),
    }
    if record is not None:
        s = record.summary()
        result["compile"] = {
            k: s[k]
            for k in ("status", "blocks", "graphs", "recompiles", "last_recompile", "disabled", "first_call_seconds")
        }
        result["compile"]["recompile_reasons"] = [r["reason"] for r in record.stats.recompiles]
        if "precompiled" in s:  # the precompiled route (hits, loads, saves, fallbacks with reasons)
            result["compile"]["precompiled"] = s["precompiled"]
    if str(device).startswith("cuda"):
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    import torch

    device_name = ns.device or ("cpu" if ns.smoke or not torch.cuda.is_available() else "cuda")
    import_comfy_and_pack(cpu=device_name == "cpu")
    import comfy.sample

    from steadfast.core.determinism import noise as sf_noise

    device = torch.device(device_name)
    config = SMOKE if ns.smoke else FLUX_DEV
    dtype = torch.bfloat16
    print(
        f"## Flux {'smoke (tiny)' if ns.smoke else 'dev architecture'}: {ns.width}x{ns.height}, {ns.steps} steps, "
        f"{ns.images} timed image(s)/config, device {device}"
        f"{' (' + torch.cuda.get_device_name() + ')' if device.type == 'cuda' else ''}, torch {torch.__version__}",
        flush=True,
    )
    t0 = time.perf_counter()
    base = build_flux(config, device, dtype, ns.seed)
    params = sum(p.numel() for p in base.model.diffusion_model.parameters())
    print(f"built {params / 1e6:,.1f} M parameters in {time.perf_counter() - t0:.1f} s", flush=True)

    latent_shape = (1, config["in_channels"], ns.height // 8, ns.width // 8)
    cond = conditioning(config, ns.text_tokens, ns.seed)
    x0 = sf_noise.seeded_noise(latent_shape, ns.seed)
    latent = torch.zeros(latent_shape)

    def sample(model: Any) -> Any:
        return comfy.sample.sample(
            model,
            x0,
            ns.steps,
            1.0,
            "euler",
            "simple",
            cond,
            cond,
            latent,
            denoise=1.0,
            disable_pbar=True,
            seed=ns.seed,
        )

    peak = matmul_rate(device, ns.smoke)
    flops_step = denoiser_flops(base, config, latent_shape, ns.text_tokens, device, dtype)
    flops_image = flops_step * ns.steps  # cfg 1.0: one denoiser call per step
    print(f"bf16 matmul rate {peak / 1e12:.2f} TFLOP/s; {flops_step / 1e12:.3f} TFLOP per denoiser call", flush=True)

    configs = make_configs(base, ns.configs, ns.backend)
    results: dict[str, Any] = {}
    for name, (model, report) in configs.items():
        print(f"[{name}] " + report.replace("\n", "; "), flush=True)
        results[name] = run_config(name, model, sample, ns.images, device)
        r = results[name]
        r["tflops"] = flops_image / r["s_per_image"] / 1e12
        r["pct_of_matmul_peak"] = 100.0 * flops_image / r["s_per_image"] / peak
        print(
            f"[{name}] first image {r['first_image_s']:.2f} s, {r['s_per_image']:.3f} s/image, "
            f"run-to-run equal {r['run_to_run_equal']}",
            flush=True,
        )
        for reason in r.get("compile", {}).get("recompile_reasons", []):
            print(f"[{name}]   recompiled: {reason[:200]}", flush=True)

    base_name = "eager" if "eager" in results else next(iter(results))
    for _name, r in results.items():
        r["speedup_vs_" + base_name] = results[base_name]["s_per_image"] / r["s_per_image"]
        r["bit_equal_to_" + base_name] = r["hashes"][0] == results[base_name]["hashes"][0]

    print()
    print(
        "| config | first image s | s/image | speed-up | run-to-run equal | = eager bits | TFLOP/s "
        "| % of bf16 matmul | recompiles |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        rec = r.get("compile", {}).get("recompiles", "-")
        print(
            f"| {name} | {r['first_image_s']:.2f} | {r['s_per_image']:.3f} | {r['speedup_vs_' + base_name]:.2f}x | "
            f"{r['run_to_run_equal']} | {r['bit_equal_to_' + base_name]} | {r['tflops']:.1f} | "
            f"{r['pct_of_matmul_peak']:.1f}% | {rec} |"
        )
    summary = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "smoke": ns.smoke,
        "width": ns.width,
        "height": ns.height,
        "steps": ns.steps,
        "images": ns.images,
        "text_tokens": ns.text_tokens,
        "parameters": params,
        "bf16_matmul_flops": peak,
        "flops_per_image": flops_image,
        "configs": results,
    }
    if ns.json:
        Path(ns.json).write_text(json.dumps(summary, indent=1, default=str))
    print("\nJSON: " + json.dumps(summary, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
