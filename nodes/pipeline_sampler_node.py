"""Pipeline Sampler: run a DIFFUSERS_PIPELINE (text -> IMAGE) with a run record.

A thin adapter over ``core.pipelines``: ``generate`` with one CPU generator per image (image i: seed + i); the
handle's LoRA is made active right before the run and its determinism policy (Pipeline Determinism Setup) applied
around it. The run record is a :class:`core.record.run_record.RunRecord`, the same schema as Seeded Sampler's, from
the same builder (:func:`core.record.run_record.for_pipeline`).
"""

from __future__ import annotations

import contextlib
import time

import comfy.model_management
import comfy.utils
from comfy_api.v0_0_2 import io

from ..core.determinism import apply as determinism
from ..core.determinism import portable
from ..core.pipelines import compile_record, generate, pipeline_report
from ..core.pipelines.handle import RUN_LOCK, PipelineHandle, prepare_run
from ..core.pipelines.load import on_run_device
from ..core.record import run_record
from .host import identity
from .inputs import size_inputs
from .outputs import with_run_record
from .pipeline_type import DiffusersPipeline, as_handle, make_room, progress

NO_POLICY = "not set (Pipeline Determinism Setup not used)"


def _policy(handle: PipelineHandle):
    """``deterministic(policy)`` for the handle's policy, or a context yielding None when it has none."""
    if handle.determinism is None:
        return contextlib.nullcontext(None)
    return determinism.deterministic(handle.determinism)


class SteadfastPipelineSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastPipelineSampler",
            display_name="Pipeline Sampler (Steadfast)",
            category="Steadfast",
            description="Text to IMAGE with a diffusers pipeline, reproducibly: image i is drawn from its own CPU "
            "generator seeded seed + i (the same on every device). Also returns a run record with "
            "everything that decides the output bits.",
            inputs=[
                DiffusersPipeline.Input(
                    "pipeline",
                    tooltip="The pipeline to run (its LoRA and determinism policy are applied for this run only).",
                ),
                io.String.Input("prompt", default="", multiline=True, tooltip="The text prompt."),
                io.String.Input(
                    "negative_prompt",
                    default="",
                    multiline=True,
                    tooltip="The negative prompt; empty = the pipeline's default.",
                ),
                io.Int.Input(
                    "seed",
                    default=0,
                    min=0,
                    max=0xFFFFFFFFFFFFFFFF,
                    control_after_generate=True,
                    tooltip="Seed of image 0 (image i uses seed + i).",
                ),
                io.Int.Input("steps", default=20, min=1, max=10000, tooltip="num_inference_steps."),
                io.Float.Input(
                    "cfg",
                    default=7.0,
                    min=0.0,
                    max=100.0,
                    step=0.1,
                    round=0.01,
                    tooltip="guidance_scale (classifier-free guidance; for Flux the distilled guidance).",
                ),
                *size_inputs(),
            ],
            not_idempotent=True,  # two identical sampler nodes in one workflow must both run (determinism check)
            outputs=[
                io.Image.Output(display_name="IMAGE", tooltip="The generated images."),
                io.String.Output(
                    display_name="run_record",
                    tooltip="JSON run record: seeds, settings, environment fingerprint, image hash.",
                ),
            ],
        )

    @classmethod
    def execute(
        cls,
        pipeline,
        prompt: str,
        negative_prompt: str,
        seed: int,
        steps: int,
        cfg: float,
        width: int,
        height: int,
        batch_size: int,
    ) -> io.NodeOutput:
        handle = as_handle(pipeline, "Pipeline Sampler")
        portable.check_device(comfy.model_management.get_torch_device(), "the pipeline")
        portable.pin_thread()  # inductor's config is per thread in torch 2.14 (core/determinism/portable.py)
        with RUN_LOCK:
            pipe, events = prepare_run(handle)
            rec = compile_record(pipe)
            recompiles_before = len(rec.stats.recompiles) if rec is not None else 0
            with on_run_device(pipe, make_room), _policy(handle) as det:
                t0 = time.perf_counter()
                mode = "sequential" if handle.batch_invariant else "batched"
                total = steps * (batch_size if mode == "sequential" else 1)
                images = generate(
                    pipe,
                    prompt,
                    negative_prompt,
                    steps=steps,
                    guidance=cfg,
                    width=width,
                    height=height,
                    seed=seed,
                    batch=batch_size,
                    batch_mode=mode,
                    on_step=progress(total),
                )
                seconds = time.perf_counter() - t0
                report = pipeline_report(pipe)  # inside the policy: threads and flags as they were for the run
        record = run_record.for_pipeline(
            seed=seed,
            batch=batch_size,
            steps=steps,
            cfg=cfg,
            scheduler_class=type(getattr(pipe, "scheduler", None)).__name__,
            images=images,
            environment=report["environment"],
            host={**identity.versions(), **identity.comfy_environment()},
            determinism=det.as_dict() if det is not None else NO_POLICY,
            compile=report["compile"],
            recompiles_this_run=(len(rec.stats.recompiles) - recompiles_before) if rec is not None else 0,
            seconds=seconds,
            details={
                "prompt": prompt,
                "negative_prompt": negative_prompt,
                "pipeline": report["pipeline"],
                "cpu_randn": report["cpu_randn"],
                "source": handle.source,
                "dtype": handle.dtype,
                "lora": None
                if handle.lora is None
                else {"name": handle.lora.name, "rank": handle.lora.rank, "max_rank": handle.lora.max_rank},
                "lora_events": events,
                "optimize": report["optimize"],
                "batch_invariant": (
                    "on: image by image, batch-1 pipeline calls"
                    if handle.batch_invariant
                    else "off: one batched pipeline call; the last bits may depend on the batch"
                ),
            },
        )
        return with_run_record(images, record)
