"""Pipeline Determinism Setup: DIFFUSERS_PIPELINE -> DIFFUSERS_PIPELINE carrying a determinism policy, applied
around each run (``generate(policy=...)``).
"""

from __future__ import annotations

from comfy_api.v0_0_2 import io, ui

from ..core.determinism import policy as determinism_policy
from ..core.determinism import portable
from .host.identity import server_risks_text
from .inputs import policy_inputs
from .pipeline_type import DiffusersPipeline, as_handle


class SteadfastPipelineDeterminismSetup(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastPipelineDeterminismSetup",
            is_output_node=True,  # its report is shown again when ComfyUI answers from cache
            display_name="Pipeline Determinism Setup (Steadfast)",
            category="Steadfast",
            description="Returns the pipeline carrying a deterministic torch configuration (deterministic "
            "algorithms, cuDNN benchmark off, TF32 off, pinned threads), applied only while it runs in "
            "Pipeline Sampler / Pipeline Warmup and restored afterwards. The input is not modified.",
            inputs=[
                DiffusersPipeline.Input("pipeline", tooltip="The pipeline to run deterministically (not modified)."),
                *policy_inputs("the pipeline runs"),
                io.Boolean.Input(
                    "batch_invariant",
                    default=True,
                    optional=True,
                    tooltip="On: Pipeline Sampler generates image by image (one batch-1 pipeline call "
                    "each), so image i equals a batch-1 run at seed + i. Off: one batched call "
                    "(faster; CPU kernels then see another batch and the last bits can differ).",
                ),
            ],
            outputs=[
                DiffusersPipeline.Output(display_name="PIPELINE", tooltip="The pipeline carrying the policy."),
                io.String.Output(display_name="report", tooltip="What will be set, and what cannot be guaranteed."),
            ],
        )

    @classmethod
    def execute(
        cls, pipeline, strict: bool, allow_tf32: bool, num_threads: int, batch_invariant: bool = True
    ) -> io.NodeOutput:
        portable.check_threads(num_threads)
        handle = as_handle(pipeline, "Pipeline Determinism Setup")
        policy = determinism_policy.DeterminismPolicy(
            strict=strict, allow_tf32=allow_tf32, num_threads=num_threads or None
        )
        report = (
            determinism_policy.describe_policy(policy)
            + "\nbatch-invariant sampling: "
            + ("on (image by image, batch-1 pipeline calls)" if batch_invariant else "off (one batched pipeline call)")
            + "\n"
            + server_risks_text()
        )
        return io.NodeOutput(
            handle.replace(determinism=policy, batch_invariant=batch_invariant), report, ui=ui.PreviewText(report)
        )
