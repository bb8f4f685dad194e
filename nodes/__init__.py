"""ComfyUI V3 adapters for Steadfast (thin: ComfyUI types -> core calls -> outputs and UI)."""
from __future__ import annotations

from typing_extensions import override

from comfy_api.v0_0_2 import ComfyExtension, io

from .compare_node import SteadfastCompare
from .determinism_node import SteadfastDeterminismSetup
from .hash_node import SteadfastHash
from .host.public_text import guard_node
from .host.routes import register_routes
from .optimize_node import SteadfastOptimizeModel
from .patches.compile import load_compile_artifacts
from .pipeline_nodes import SteadfastLoadDiffusersPipeline, SteadfastPipelineLoRA
from .pipeline_optimize_node import SteadfastPipelineDeterminismSetup, SteadfastPipelineOptimize
from .pipeline_sampler_node import SteadfastPipelineSampler, SteadfastPipelineWarmup
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


def _preload_compile_stack() -> None:
    """Warm start (:mod:`core.compile.preload`): import Dynamo and inductor while ComfyUI starts when this server
    has compiled before; never in portable CPU mode (it refuses inductor)."""
    import folder_paths

    from ..core.compile import cache_location, preload
    from ..core.determinism import portable

    if portable.is_portable():
        return
    root, _source = cache_location.resolve_root(folder_paths.get_user_directory())
    preload.preload(root)


async def comfy_entrypoint() -> SteadfastExtension:
    register_routes()
    load_compile_artifacts()  # $STEADFAST_COMPILE_ARTIFACT: the fleet's warm state (a refusal is only logged)
    _preload_compile_stack()
    return SteadfastExtension()
