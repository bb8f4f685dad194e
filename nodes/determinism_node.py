"""Steadfast Determinism Setup: MODEL -> MODEL carrying a determinism policy applied around sampling."""
from __future__ import annotations

from comfy_api.latest import io, ui

from ..core import determinism
from .model_patches import add_determinism


class SteadfastDeterminismSetup(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastDeterminismSetup",
            is_output_node=True,  # its report is shown again when ComfyUI answers from cache
            display_name="Determinism Setup (Steadfast)",
            category="Steadfast",
            description="Returns a copy of the model that samples under a deterministic torch configuration "
                        "(deterministic algorithms, cuDNN benchmark off, TF32 off, pinned threads). The global "
                        "settings are applied only while this model samples and restored afterwards.",
            inputs=[
                io.Model.Input("model", tooltip="The model to make deterministic. It is cloned, never modified."),
                io.Boolean.Input("strict", default=True,
                                 tooltip="On: torch raises an error when an op has no deterministic implementation. "
                                         "Off: torch only warns (warn_only) and the run may not be reproducible."),
                io.Boolean.Input("allow_tf32", default=False,
                                 tooltip="Allow TF32 matmuls/convolutions on Ampere+ GPUs. Faster, but bits depend on the "
                                         "GPU generation. Off for cross-machine reproducibility."),
                io.Int.Input("num_threads", default=0, min=0, max=1024,
                             tooltip="CPU threads for torch while sampling. fp32 CPU results differ between thread counts, "
                                     "so the count is pinned and recorded. 0 = pin the current count."),
            ],
            outputs=[
                io.Model.Output(display_name="MODEL", tooltip="A clone of the model carrying the policy."),
                io.String.Output(display_name="report", tooltip="What will be set, and what cannot be guaranteed."),
            ],
        )

    @classmethod
    def execute(cls, model, strict: bool, allow_tf32: bool, num_threads: int) -> io.NodeOutput:
        policy = determinism.DeterminismPolicy(strict=strict, allow_tf32=allow_tf32,
                                               num_threads=num_threads or None)
        m = model.clone()
        add_determinism(m, policy)
        report = determinism.describe_policy(policy)
        return io.NodeOutput(m, report, ui=ui.PreviewText(report))
