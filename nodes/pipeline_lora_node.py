"""Pipeline LoRA: DIFFUSERS_PIPELINE -> DIFFUSERS_PIPELINE carrying a LoRA, declared here and loaded when the
pipeline runs (into a copy; hot-swapped into a compiled pipeline without recompiling).
"""

from __future__ import annotations

import os

import folder_paths
from comfy_api.v0_0_2 import io, ui

from ..core.pipelines.handle import LoraSpec
from ..core.pipelines.run import compile_record
from ..core.pipelines.state import peek_state
from .pipeline_type import DiffusersPipeline, as_handle


class SteadfastPipelineLoRA(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastPipelineLoRA",
            display_name="Pipeline LoRA (Steadfast)",
            category="Steadfast",
            description="Adds a LoRA to a diffusers pipeline. It is loaded when the pipeline runs, into a copy (the "
            "input is unchanged). Put this node BEFORE Pipeline Optimize: the compiled pipeline is then "
            "prepared for max_rank, and choosing another LoRA hot-swaps its weights without recompiling.",
            inputs=[
                DiffusersPipeline.Input("pipeline", tooltip="The pipeline to add the LoRA to (not modified)."),
                io.Combo.Input(
                    "lora_name",
                    options=folder_paths.get_filename_list("loras"),
                    tooltip="A diffusers/PEFT-format LoRA .safetensors file in models/loras.",
                ),
                io.Int.Input(
                    "max_rank",
                    default=64,
                    min=1,
                    max=4096,
                    tooltip="The largest LoRA rank you will swap in. A compiled pipeline is prepared for "
                    "this rank (smaller LoRAs are zero-padded), so swapping LoRAs never "
                    "recompiles. Changing it makes Pipeline Optimize build and compile a new copy.",
                ),
            ],
            outputs=[
                DiffusersPipeline.Output(display_name="PIPELINE", tooltip="The pipeline carrying the LoRA."),
                io.String.Output(display_name="report", tooltip="The LoRA, its rank, and how it will be applied."),
            ],
        )

    @classmethod
    def fingerprint_inputs(cls, lora_name: str = "", max_rank: int = 64, **_):
        path = folder_paths.get_full_path("loras", lora_name) if lora_name else None
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        return (lora_name, max_rank, None if st is None else (st.st_size, st.st_mtime_ns))

    @classmethod
    def execute(cls, pipeline, lora_name: str, max_rank: int) -> io.NodeOutput:
        handle = as_handle(pipeline, "Pipeline LoRA")
        path = folder_paths.get_full_path_or_raise("loras", lora_name)
        spec = LoraSpec.from_file(lora_name, path, max_rank)
        lines = [f"LoRA {lora_name}: rank {spec.rank} (max_rank {max_rank}); applied when the pipeline runs"]
        if handle.lora is not None:
            lines.append(f"replaces the upstream LoRA {handle.lora.name} (one LoRA per pipeline)")
        state = peek_state(handle.pipe)
        if compile_record(handle.pipe) is not None and (state is None or state.hotswap_rank is None):
            lines.append(
                "WARNING: the pipeline is already compiled without LoRA hot-swap preparation; put this "
                "node before Pipeline Optimize, or a LoRA change may recompile"
            )
        report = "\n".join(lines)
        return io.NodeOutput(handle.replace(lora=spec), report, ui=ui.PreviewText(report))
