"""Steadfast Determinism Setup: MODEL -> MODEL carrying a determinism policy applied around sampling."""

from __future__ import annotations

from comfy_api.v0_0_2 import io, ui

from ..core.determinism import policy as determinism_policy
from ..core.determinism import portable
from .host.identity import server_risks_text
from .inputs import policy_inputs
from .patches.attention import plan_attention
from .patches.batch_invariance import add_batch_invariance
from .patches.determinism import add_determinism
from .patches.options import steadfast_options


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
                *policy_inputs("sampling"),
                io.Boolean.Input(
                    "batch_invariant",
                    default=True,
                    optional=True,
                    tooltip="On: every batch item and every conditioning is evaluated alone (batch 1) "
                    "and attention never chunks by free memory, so the bits depend only on the "
                    "workflow: item i of a Seeded Sampler batch (incremental) equals a batch-1 "
                    "run at seed + i, on a busy or a quiet machine, for every sampler (one "
                    "whose step control spans the batch, dpm_adaptive, is sampled item by "
                    "item). Costs speed on large batches. Off: ComfyUI's own batching.",
                ),
            ],
            outputs=[
                io.Model.Output(display_name="MODEL", tooltip="A clone of the model carrying the policy."),
                io.String.Output(display_name="report", tooltip="What will be set, and what cannot be guaranteed."),
            ],
        )

    @classmethod
    def execute(
        cls, model, strict: bool, allow_tf32: bool, num_threads: int, batch_invariant: bool = True
    ) -> io.NodeOutput:
        portable.check_threads(num_threads)
        policy = determinism_policy.DeterminismPolicy(
            strict=strict, allow_tf32=allow_tf32, num_threads=num_threads or None
        )
        m = model.clone()
        add_determinism(m, policy)
        pinned = steadfast_options(m).attention or ""
        if strict and pinned.startswith("pytorch_sdpa:") and pinned != "pytorch_sdpa:auto":
            # Optimize Model ran first: probe its pinned backend again under the strict policy (torch refuses
            # cuDNN attention under strict deterministic algorithms): refused here, not mid-run
            import comfy.model_management

            plan_attention(m, pinned.split(":", 1)[1], comfy.model_management.get_torch_device())
        rows = add_batch_invariance(m, batch_invariant).details["policy"]
        steadfast_options(m).batch_invariant = rows
        report = (
            determinism_policy.describe_policy(policy)
            + "\nbatch-invariant sampling: "
            + ("on (" + "; ".join(rows.values()) + ")" if isinstance(rows, dict) else rows)
            + "\n"
            + server_risks_text()
        )
        return io.NodeOutput(m, report, ui=ui.PreviewText(report))
