"""Pipeline Warmup: a throw-away run of a DIFFUSERS_PIPELINE per size, so that the compile happens before the first
real image.
"""

from __future__ import annotations

import contextlib

from comfy_api.v0_0_2 import io, ui

from ..core.compile.registry import REGISTRY
from ..core.pipelines import compile_record
from ..core.pipelines import warmup as core_warmup
from ..core.pipelines.handle import RUN_LOCK, prepare_run
from ..core.pipelines.load import on_run_device
from ..core.sizes import check_sizes, warm_targets
from .inputs import size_inputs
from .pipeline_type import DiffusersPipeline, as_handle, make_room, progress

WARMUP_STEPS = 2  # denoising steps of each throw-away warm-up generation (compiling needs one call per shape)


class SteadfastPipelineWarmup(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastPipelineWarmup",
            is_output_node=True,  # its report is shown again when ComfyUI answers from cache
            display_name="Pipeline Warmup (Steadfast)",
            category="Steadfast",
            description="Runs one short throw-away generation per target size (with the pipeline's LoRA and "
            "determinism policy active) so a compiled pipeline compiles here. Sizes it is already warm "
            "for are skipped. Shows compile seconds, graphs and recompiles.",
            inputs=[
                DiffusersPipeline.Input("pipeline", tooltip="The (optimized) pipeline to warm up."),
                *size_inputs(),
                io.Float.Input(
                    "cfg",
                    default=7.0,
                    min=0.0,
                    max=100.0,
                    step=0.1,
                    tooltip="Use the cfg of the real run: guidance on/off changes the batch the denoiser sees.",
                ),
                io.String.Input(
                    "sizes",
                    default="",
                    optional=True,
                    tooltip="More target sizes to warm up, e.g. '512x512, 768x512' (pixels, width x height).",
                ),
            ],
            outputs=[
                DiffusersPipeline.Output(display_name="PIPELINE", tooltip="The same pipeline, now warm."),
                io.String.Output(display_name="report", tooltip="Compile seconds, graphs, recompiles."),
            ],
        )

    @classmethod
    def validate_inputs(cls, sizes: str = "") -> bool | str:
        # sizes only (ComfyUI marks every argument of validate_inputs as at fault when it fails)
        return check_sizes(sizes)

    @classmethod
    def execute(cls, pipeline, width: int, height: int, batch_size: int, cfg: float, sizes: str = "") -> io.NodeOutput:
        handle = as_handle(pipeline, "Pipeline Warmup")
        targets = warm_targets(width, height, sizes)
        lines: list[str] = []
        with RUN_LOCK:
            pipe, events = prepare_run(handle)
            rec = compile_record(pipe)
            # compiling is what a warm-up is for: strict mode applies to the runs after it
            strict = REGISTRY.set_strict(rec, False) if rec is not None else False
            todo = [(w, h) for w, h in targets if rec is None or not rec.is_warm_for((batch_size, h, w))]
            on_step = progress(WARMUP_STEPS * len(todo)) if todo else None
            offset = [0]

            def step(done: int, _total: int) -> None:
                on_step(offset[0] + done, WARMUP_STEPS * len(todo))

            try:
                with on_run_device(pipe, make_room) if todo else contextlib.nullcontext():
                    for w, h in targets:
                        target = (batch_size, h, w)
                        if (w, h) not in todo:
                            lines.append(f"already warm for {list(target)} (batch, height, width): nothing to do")
                            continue
                        res = core_warmup(
                            pipe,
                            w,
                            h,
                            batch_size,
                            steps=WARMUP_STEPS,
                            guidance=cfg,
                            policy=handle.determinism,
                            on_step=step,
                        )
                        offset[0] += WARMUP_STEPS
                        lines.append(
                            f"warm-up generation at {list(target)} (batch, height, width): {res.seconds:.2f} s"
                        )
            finally:
                if rec is not None:
                    REGISTRY.set_strict(rec, strict)
            lines.append(rec.as_text() if rec is not None else "(pipeline is not compiled by Steadfast)")
        report = "\n".join(lines + events)
        return io.NodeOutput(handle, report, ui=ui.PreviewText(report))
