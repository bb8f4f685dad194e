"""The DIFFUSERS_PIPELINE type and what its nodes share: the type, the check that a value is one, ComfyUI's
progress bar for a run and making room for a pipeline on the device.

A DIFFUSERS_PIPELINE value is a :class:`core.pipelines.handle.PipelineHandle`. ComfyUI caches node outputs
and may give one output to several nodes, so no node changes a handle it receives: Optimize works on a
weight-sharing copy, and a LoRA is only *declared* (Pipeline LoRA) and made active right before the pipeline runs
(Pipeline Sampler / Pipeline Warmup), hot-swapped into a compiled pipeline without recompiling.
"""

from __future__ import annotations

import comfy.model_management
import comfy.utils
from comfy_api.v0_0_2 import io

from ..core.pipelines.handle import PipelineHandle

DiffusersPipeline = io.Custom("DIFFUSERS_PIPELINE")


def as_handle(value, node: str) -> PipelineHandle:
    """``value`` if it is a DIFFUSERS_PIPELINE, else a ``TypeError`` naming ``node`` and what it got."""
    if not isinstance(value, PipelineHandle):
        raise TypeError(
            f"{node}: expected a DIFFUSERS_PIPELINE (from Load Diffusers Pipeline), got {type(value).__name__}"
        )
    return value


def progress(total: int, unique_id: str | None = None):
    """``on_step(done, total)`` for ``core.pipelines.generate``: ComfyUI's progress bar on the node (the
    frontend's bar and the ``progress`` websocket event), and the Cancel button honoured between steps."""
    bar = comfy.utils.ProgressBar(total, node_id=unique_id)

    def on_step(done: int, _total: int) -> None:
        comfy.model_management.throw_exception_if_processing_interrupted()
        bar.update_absolute(done, total)

    return on_step


def make_room(size: int, device) -> None:
    """Ask ComfyUI to free ``size`` bytes (+10 %) on ``device`` before a pipeline moves there
    (``comfy.model_management.free_memory``: it unloads its own models, least recently used first)."""
    comfy.model_management.free_memory(int(size * 1.1), device)
