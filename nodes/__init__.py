"""ComfyUI V3 adapters for Steadfast (thin: ComfyUI types -> core calls -> outputs and UI)."""

from __future__ import annotations

from typing_extensions import override

from comfy_api.v0_0_2 import ComfyExtension, io

from .compare_node import SteadfastCompare
from .determinism_node import SteadfastDeterminismSetup
from .hash_node import SteadfastHash
from .host.public_text import guard_node
from .host.routes import register_routes
from .host.startup import warm_start_at_server_start
from .optimize_node import SteadfastOptimizeModel
from .pipeline_determinism_node import SteadfastPipelineDeterminismSetup
from .pipeline_load_node import SteadfastLoadDiffusersPipeline
from .pipeline_lora_node import SteadfastPipelineLoRA
from .pipeline_optimize_node import SteadfastPipelineOptimize
from .pipeline_sampler_node import SteadfastPipelineSampler
from .pipeline_warmup_node import SteadfastPipelineWarmup
from .sampler_node import SteadfastSeededSampler
from .vae_decode_node import SteadfastVAEDecode
from .warmup_node import SteadfastWarmup

NODES: list[type[io.ComfyNode]] = [
    SteadfastDeterminismSetup,
    SteadfastOptimizeModel,
    SteadfastSeededSampler,
    SteadfastWarmup,
    SteadfastHash,
    SteadfastCompare,
    SteadfastVAEDecode,
    SteadfastLoadDiffusersPipeline,
    SteadfastPipelineLoRA,
    SteadfastPipelineDeterminismSetup,
    SteadfastPipelineOptimize,
    SteadfastPipelineSampler,
    SteadfastPipelineWarmup,
]
for _node in NODES:  # errors raised while a node runs reach the client without absolute paths
    guard_node(_node)


class SteadfastExtension(ComfyExtension):
    @override
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return NODES


async def comfy_entrypoint() -> SteadfastExtension:
    register_routes()
    warm_start_at_server_start()  # $STEADFAST_COMPILE_ARTIFACT, the compile stack's import (refusals only logged)
    return SteadfastExtension()
