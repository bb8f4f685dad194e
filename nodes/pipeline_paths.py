"""The DIFFUSERS_PIPELINE path of Optimize Model, Seeded Sampler and Warmup (they dispatch here on a pipeline).

Thin adapters over ``core.pipelines``: ``optimize_pipeline`` on a weight-sharing copy (the input pipeline
stays as it was, see ``core/pipelines/handle.py``), ``generate`` with one CPU generator per image, ``warmup``.
"""
from __future__ import annotations

import json
import time

from comfy_api.latest import io, ui
from comfy_execution.graph_utils import ExecutionBlocker

from ..core.hashing import hash_image
from ..core.pipelines import PipelineOptions, compile_record, generate, pipeline_report
from ..core.pipelines import warmup as core_warmup
from ..core.pipelines.handle import RUN_LOCK, PipelineHandle, optimized_handle, prepare_run

DYNAMIC = {"auto": None, "true": True, "false": False}


def is_pipeline(value) -> bool:
    """True for a DIFFUSERS_PIPELINE value (Optimize / Sampler / Warmup dispatch on it)."""
    return isinstance(value, PipelineHandle)


def pipeline_options(qkv_fusion: bool, channels_last: bool, attention: str, compile: str, backend: str, mode: str,
                     dynamic: str, fullgraph: bool, vae_slicing: bool, vae_tiling: bool) -> PipelineOptions:
    """Optimize Model's widget values as :class:`PipelineOptions`; ``ValueError`` for attention "comfy"."""
    if attention == "comfy":
        raise ValueError("attention 'comfy' keeps ComfyUI's own attention, which only MODELs have; for a diffusers "
                         "pipeline choose auto, math, flash, efficient or cudnn")
    return PipelineOptions(qkv_fusion=qkv_fusion, channels_last=channels_last, attention=attention,
                           vae_slicing=vae_slicing, vae_tiling=vae_tiling, compile=compile, backend=backend,
                           mode=None if mode == "default" else mode, dynamic=DYNAMIC[dynamic], fullgraph=fullgraph)


def optimize(handle: PipelineHandle, *, strict_recompiles: bool = False, compile_cache: str = "",
             **widgets) -> io.NodeOutput:
    """Optimize Model on a pipeline: returns ``(pipeline, report)``; the input handle is not modified.

    ``strict_recompiles`` makes the compile record strict (a recompile after warm-up raises, naming its
    reason). ``compile_cache`` is not applied to pipelines (reported when set)."""
    opts = pipeline_options(**widgets)
    if opts.is_baseline():
        report = f"{handle.describe()}: nothing switched on, returned unchanged"
        return io.NodeOutput(handle, report, ui=ui.PreviewText(report))
    new, rep, reused = optimized_handle(handle, opts)
    lines = [handle.describe(),
             "reused the copy optimized earlier from this pipeline with these options (nothing recompiled)" if reused
             else "optimized a copy sharing the weights (the input pipeline is unchanged)"]
    lines += [s.as_text() for s in rep.steps]
    if handle.lora is not None:
        lines.append(f"prepared for LoRA hot-swap up to rank {handle.lora.max_rank}; the LoRA is loaded at run time")
    if opts.compile != "off":
        rec = compile_record(new.pipe)
        if rec is not None:
            rec.strict = strict_recompiles
        lines.append(f"compiles lazily on the first run or in Warmup; record: {rec.as_text() if rec else 'none'}")
        if strict_recompiles:
            lines.append("strict_recompiles: a recompile after warm-up fails the run, with its reason")
        if compile_cache.strip():
            lines.append("compile_cache: not applied to diffusers pipelines (inductor's default cache directory)")
    report = "\n".join(lines)
    return io.NodeOutput(new, report, ui=ui.PreviewText(report))


def _check_run_inputs(denoise: float, batch_seed_mode: str) -> None:
    if denoise != 1.0:
        raise ValueError(f"denoise {denoise} applies to MODEL sampling; a diffusers text-to-image pipeline starts "
                         f"from pure noise: set denoise to 1.0")
    if batch_seed_mode != "incremental":
        raise ValueError(f"batch_seed_mode {batch_seed_mode!r} applies to MODEL sampling; a pipeline draws image i "
                         f"from its own CPU generator seeded seed + i (use 'incremental')")


def sample(handle: PipelineHandle, *, seed: int, steps: int, cfg: float, sampler_name: str, scheduler: str,
           denoise: float, batch_seed_mode: str, prompt: str, negative_prompt: str, width: int, height: int,
           batch_size: int) -> io.NodeOutput:
    """Seeded Sampler on a pipeline: ``(LATENT blocked, run_record, IMAGE)``."""
    _check_run_inputs(denoise, batch_seed_mode)
    with RUN_LOCK:
        pipe, events = prepare_run(handle)
        rec = compile_record(pipe)
        recompiles_before = len(rec.recompiles) if rec is not None else 0
        t0 = time.perf_counter()
        images = generate(pipe, prompt, negative_prompt, steps=steps, guidance=cfg, width=width, height=height,
                          seed=seed, batch=batch_size)
        seconds = time.perf_counter() - t0
        report = pipeline_report(pipe)
    record = {
        "kind": "diffusers_pipeline",
        "seeds": [seed + i for i in range(batch_size)],
        "batch_seed_mode": "incremental (one CPU generator per image)",
        "prompt": prompt, "negative_prompt": negative_prompt,
        "steps": steps, "guidance": cfg, "width": width, "height": height, "batch_size": batch_size,
        "pipeline": report["pipeline"], "source": handle.source, "dtype": handle.dtype,
        "scheduler": type(getattr(pipe, "scheduler", None)).__name__,
        "not_used": {"sampler_name": sampler_name, "scheduler": scheduler,
                     "why": "a diffusers pipeline samples with its own scheduler (see 'scheduler')"},
        "lora": None if handle.lora is None else {"name": handle.lora.name, "rank": handle.lora.rank,
                                                  "max_rank": handle.lora.max_rank},
        "lora_events": events,
        "image_shape": list(images.shape),
        "image_sha256": hash_image(images),
        "seconds": round(seconds, 4),
        "optimize": report["optimize"],
        "compile": report["compile"],
        "recompiles_this_run": (len(rec.recompiles) - recompiles_before) if rec is not None else 0,
        "fingerprint": report["environment"],
        "fingerprint_digest": report["fingerprint_digest"],
    }
    text = json.dumps(record, indent=1, default=str)
    blocked = ExecutionBlocker(LATENT_FOR_PIPELINE)
    return io.NodeOutput(blocked, text, images, ui={"text": [summary_text(record)],
                                                    "steadfast_run_record": [json.loads(text)]})


def summary_text(record: dict) -> str:
    """A few lines for the node: image hash, seeds, pipeline, compile state."""
    seeds = record["seeds"]
    lines = [f"image sha256 {record['image_sha256'][:16]}…  seeds {seeds[:4]}{' …' if len(seeds) > 4 else ''}",
             f"{record['pipeline']} ({record['dtype']}), scheduler {record['scheduler']}, "
             f"threads {record['fingerprint']['num_threads']}, {record['seconds']:.2f} s"]
    if record["lora"]:
        lines.append(f"LoRA {record['lora']['name']}" + (f": {'; '.join(record['lora_events'])}"
                                                         if record["lora_events"] else ""))
    comp = record["compile"]
    if comp:
        lines.append(f"compile {comp['label']}: {comp['status']}, {comp['graphs']} graph(s), "
                     f"{len(comp['recompiles'])} recompile(s), {record['recompiles_this_run']} in this run")
    return "\n".join(lines)


def refuse_used_output(prompt, unique_id, slot: int, message: str) -> None:
    """Raise ``ValueError(message)`` when any node of ``prompt`` (API format) takes output ``slot`` of node
    ``unique_id``. An ExecutionBlocker alone only skips those nodes (headless, a Hash check would silently
    not run), so Seeded Sampler fails loudly instead, before sampling."""
    if not isinstance(prompt, dict) or unique_id is None:
        return
    users = sorted({str(nid) for nid, node in prompt.items() for v in (node.get("inputs") or {}).values()
                    if isinstance(v, list) and len(v) == 2 and str(v[0]) == str(unique_id) and v[1] == slot})
    if users:
        raise ValueError(f"{message} (output {slot} is connected to node {', '.join(users)})")


LATENT_FOR_PIPELINE = ("Seeded Sampler: a DIFFUSERS_PIPELINE produces pixels, use the IMAGE output "
                       "(LATENT is only produced when sampling a MODEL)")
IMAGE_FOR_MODEL = ("Seeded Sampler: IMAGE is only produced for a DIFFUSERS_PIPELINE; decode the LATENT output "
                   "with VAE Decode")


def blocked_image() -> ExecutionBlocker:
    """What Seeded Sampler's IMAGE output carries when it sampled a MODEL."""
    return ExecutionBlocker(IMAGE_FOR_MODEL)


def warmup(handle: PipelineHandle, *, width: int, height: int, batch_size: int, cfg: float,
           sizes: list[tuple[int, int]] = ()) -> io.NodeOutput:
    """Warmup on a pipeline: one short generation per target size (``(width, height)`` then ``sizes``),
    with the handle's LoRA active; sizes the compiled pipeline is already warm for are skipped."""
    lines: list[str] = []
    with RUN_LOCK:
        pipe, events = prepare_run(handle)
        rec = compile_record(pipe)
        strict = rec.strict if rec is not None else False
        try:  # compiling is what a warm-up is for: strict mode applies to the runs after it
            if rec is not None:
                rec.strict = False
            for w, h in dict.fromkeys([(width, height), *sizes]):
                target = (batch_size, h, w)
                if rec is not None and rec.is_warm_for(target):
                    lines.append(f"already warm for {list(target)} (batch, height, width): nothing to do")
                    continue
                res = core_warmup(pipe, w, h, batch_size, guidance=cfg)
                lines.append(f"warm-up generation at {list(target)} (batch, height, width): {res.seconds:.2f} s")
        finally:
            if rec is not None:
                rec.strict = strict
        lines.append(rec.as_text() if rec is not None else "(pipeline is not compiled by Steadfast)")
    report = "\n".join(lines + events)
    return io.NodeOutput(handle, report, ui=ui.PreviewText(report))


__all__ = ["is_pipeline", "pipeline_options", "optimize", "sample", "warmup", "summary_text", "blocked_image",
           "refuse_used_output", "LATENT_FOR_PIPELINE", "IMAGE_FOR_MODEL"]
