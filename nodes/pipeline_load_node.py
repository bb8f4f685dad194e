"""Load Diffusers Pipeline: a diffusers pipeline folder of ComfyUI's models/diffusers -> DIFFUSERS_PIPELINE."""

from __future__ import annotations

import os

import comfy.model_management
import folder_paths
from comfy_api.v0_0_2 import io, ui

from ..core.pipelines import DTYPES, PipelineLoadError, count_params, denoiser_of, load_pipeline, module_components
from ..core.pipelines.handle import PipelineHandle
from .host.public_text import public
from .pipeline_type import DiffusersPipeline

FOLDER = "diffusers"  # ComfyUI's models/diffusers (folder_paths)


WHAT_TO_PUT = (
    f"What to do: put a diffusers pipeline folder (model_index.json plus one sub-folder per component, as "
    f"DiffusionPipeline.save_pretrained writes) in ComfyUI/models/{FOLDER}/, e.g. `huggingface-cli download "
    f"stable-diffusion-v1-5/stable-diffusion-v1-5 --local-dir models/{FOLDER}/stable-diffusion-v1-5`; or, to try "
    f"the workflow in seconds, write the pack's tiny random-weight pipeline: `python custom_nodes/ComfyUI-Steadfast/"
    f"scripts/steadfast.py tiny-pipeline models/{FOLDER}/steadfast-tiny-sd` (run in the ComfyUI folder; its "
    f"images are noise). Then refresh (R) and choose it in pipeline_name."
)


def pipeline_folders() -> list[str]:
    """Folder names under ComfyUI's ``models/diffusers`` paths: every folder holding a ``model_index.json``
    (relative path, nested ones too), plus top-level folders without one (listed so that choosing one
    explains what is wrong instead of the folder silently missing)."""
    names: list[str] = []
    for root in folder_paths.get_folder_paths(FOLDER):
        if not os.path.isdir(root):
            continue
        found: set[str] = set()
        for cur, dirs, files in os.walk(root, followlinks=True):
            if "model_index.json" in files:
                found.add(os.path.relpath(cur, root))
                dirs[:] = []  # a pipeline's component folders are not pipelines
        for entry in os.scandir(root):
            if entry.is_dir() and not any(f == entry.name or f.startswith(entry.name + os.sep) for f in found):
                found.add(entry.name)
        names += sorted(found)
    return list(dict.fromkeys(names))


def resolve_folder(name: str) -> str:
    """Absolute path of ``name`` under the ``models/diffusers`` paths; :class:`PipelineLoadError` when absent."""
    if not name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        raise PipelineLoadError(f"pipeline name must be a folder inside models/{FOLDER}, got {name!r}")
    roots = folder_paths.get_folder_paths(FOLDER)
    for root in roots:
        path = os.path.join(root, name)
        if os.path.isdir(path):
            return path
    searched = ", ".join(public(r) for r in roots)
    raise PipelineLoadError(
        f"pipeline folder {name!r} not found in models/{FOLDER} (searched: {searched}); "
        f"available: {', '.join(pipeline_folders()) or 'none'}. {WHAT_TO_PUT}"
    )


def _folder_signature(path: str) -> tuple:
    out = []
    for cur, _dirs, files in os.walk(path, followlinks=True):
        for f in sorted(files):
            try:
                st = os.stat(os.path.join(cur, f))
            except OSError:
                continue
            out.append((os.path.relpath(os.path.join(cur, f), path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


class SteadfastLoadDiffusersPipeline(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastLoadDiffusersPipeline",
            display_name="Load Diffusers Pipeline (Steadfast)",
            category="Steadfast",
            description="Loads a diffusers pipeline folder (save_pretrained layout) from models/diffusers, from "
            "disk only. The Pipeline nodes (Optimize, Determinism Setup, Warmup, Sampler) take the result "
            "and never modify it.",
            inputs=[
                io.Combo.Input(
                    "pipeline_name",
                    options=pipeline_folders(),
                    tooltip="A folder in models/diffusers holding model_index.json and one sub-folder "
                    "per component (what DiffusionPipeline.save_pretrained writes). None yet? "
                    "`python custom_nodes/ComfyUI-Steadfast/scripts/steadfast.py tiny-pipeline "
                    "models/diffusers/steadfast-tiny-sd` writes a tiny one (noise images), or "
                    "download one, e.g. stable-diffusion-v1-5 in diffusers format.",
                ),
                io.Combo.Input(
                    "dtype",
                    options=list(DTYPES),
                    default="fp32",
                    tooltip="Weight dtype of every model component. fp32 is the reproducible reference; "
                    "bf16/fp16 halve memory and change the output bits.",
                ),
            ],
            outputs=[
                DiffusersPipeline.Output(
                    display_name="PIPELINE", tooltip="The loaded pipeline (on ComfyUI's torch device)."
                ),
                io.String.Output(display_name="report", tooltip="Pipeline class, components, dtype, device."),
            ],
        )

    @classmethod
    def validate_inputs(cls, pipeline_name: str) -> bool | str:
        # pipeline_name only: ComfyUI marks every argument of validate_inputs as at fault when it fails, and
        # checks the dtype combo itself (value_not_in_list, on dtype alone)
        try:
            resolve_folder(pipeline_name)
        except PipelineLoadError as e:
            return public(str(e))
        return True

    @classmethod
    def fingerprint_inputs(cls, pipeline_name: str, dtype: str):
        try:
            return (dtype, _folder_signature(resolve_folder(pipeline_name)))
        except PipelineLoadError:
            return (dtype, None)

    @classmethod
    def execute(cls, pipeline_name: str, dtype: str) -> io.NodeOutput:
        path = resolve_folder(pipeline_name)
        device = comfy.model_management.get_torch_device()
        # on a GPU the components stay on the CPU: the sampler nodes move them there for each call after
        # comfy.model_management.free_memory, and back after it (a cached pipe.to(cuda) would sit outside
        # ComfyUI's memory management and push its own models into lowvram or out of memory)
        on_gpu = device.type != "cpu"
        pipe = load_pipeline(path, dtype=dtype, device=device, keep_on_cpu=on_gpu)
        handle = PipelineHandle(pipe, source=pipeline_name, dtype=dtype)
        den = denoiser_of(pipe)[0]
        comps = ", ".join(
            f"{k} {type(m).__name__} ({count_params(m) / 1e6:.2f} M)" for k, m in module_components(pipe).items()
        )
        where = (
            f"runs on {device}: kept on the CPU, moved to {device} for each call after ComfyUI frees room, "
            "and back after it"
            if on_gpu
            else f"{device}"
        )
        report = (
            f"{type(pipe).__name__} from models/{FOLDER}/{pipeline_name} ({dtype}, {where}); denoiser: {den}\n{comps}"
        )
        return io.NodeOutput(handle, report, ui=ui.PreviewText(report))
