"""What was sampled, for run records: the model's content digest, its file, and the ComfyUI / pack versions.

The digest (:func:`core.record.model_identity.combined_digest`) is the diffusion model's base weights (hashed once
per model, patched Parameters read from the ModelPatcher's backups) plus its weight patches (LoRA keys, strengths,
tensors), so a different file, dtype, LoRA or strength is a named cause of a mismatch, and the digest does not
depend on how ComfyUI loaded the weights (Dynamic VRAM never patches Parameters; legacy lowvram patches only what
fits). The file is found by following the workflow's ``model`` links up to its loader (``ckpt_name`` /
``unet_name``), read from the hidden ``PROMPT``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
from typing import Any

import comfy.model_management
import folder_paths

from ...core.record import environment, model_identity

LOADER_KEYS = {"ckpt_name": "checkpoints", "unet_name": "diffusion_models"}


def versions() -> dict[str, str]:
    """``{"comfyui": "0.8.0", "steadfast": "0.1.0"}`` ("unknown" where a version cannot be read)."""
    from ...core.version import __version__ as pack

    try:
        import comfyui_version

        comfy = str(comfyui_version.__version__)
    except (ImportError, AttributeError):
        comfy = "unknown"
    return {"comfyui": comfy, "steadfast": str(pack)}


@functools.cache
def _dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None: not installed), read once per process: the code a
    running server has imported does not change when a package is reinstalled under it."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def comfy_environment() -> dict[str, Any]:
    """The running ComfyUI's settings that touch determinism (fields: ``core/record/environment.py``), for run records
    beside :func:`versions`.

    Read from the server itself: the comfy-aimdo / comfy-kitchen distributions, whether Dynamic VRAM
    is active (``comfy.memory_management.aimdo_enabled``, absent before Dynamic VRAM existed: False), the
    ``--fast`` options and the numeric switches that are set (``comfy.cli_args.args``), ``--fast-disk``
    (``fast_disk``: disk-backed loading, reported to change outputs, ComfyUI issue 15528), the CUDA-graph switch
    (``cuda_graphs``: ComfyUI's block prefetcher captures CUDA graphs under Dynamic VRAM unless
    ``--disable-cuda-graphs``) and the Comfy Compiler (``comfy_compiler``: ``absent`` / ``on`` / ``off`` /
    ``disabled``, :func:`comfy_compiler_state`). ``None``: the switch is not in this
    ComfyUI.
    """
    import torch

    import comfy.cli_args

    args = comfy.cli_args.args
    memory = sys.modules.get("comfy.memory_management")
    fast = getattr(args, "fast", None) or ()
    return {
        "comfy_aimdo": _dist_version("comfy-aimdo"),
        "comfy_kitchen": _dist_version("comfy-kitchen"),
        "dynamic_vram": bool(getattr(memory, "aimdo_enabled", False)),
        "comfy_fast": sorted(str(getattr(f, "value", f)) for f in fast),
        "comfy_numeric_args": {k: getattr(args, k) for k in environment.NUMERIC_ARGS if getattr(args, k, None)},
        "fp16_accumulation": getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", None),
        # ComfyUI 0.33 switches that change how weights are loaded and run (None: not in this ComfyUI)
        "fast_disk": getattr(args, "fast_disk", None),
        "cuda_graphs": None
        if not hasattr(args, "disable_cuda_graphs")
        else ("disabled (--disable-cuda-graphs)" if args.disable_cuda_graphs else "allowed"),
        "comfy_compiler": comfy_compiler_state(),
    }


def comfy_compiler_state() -> str:
    """The Comfy Compiler (ComfyUI's memory compiler + CUDA graphs, on wherever Dynamic VRAM is, switched off with
    ``--disable-comfy-compiler``): ``"absent"`` in a ComfyUI without that switch (0.33.0 and 0.8.0 have none),
    ``"disabled"`` when the switch is given, ``"on"`` when present and Dynamic VRAM is active, else ``"off"``."""
    args = comfy.model_management.args
    if not hasattr(args, "disable_comfy_compiler"):
        return "absent"
    if args.disable_comfy_compiler:
        return "disabled"
    memory = sys.modules.get("comfy.memory_management")
    return "on" if getattr(memory, "aimdo_enabled", False) else "off"


def model_file(prompt: dict[str, Any] | None, node_id: str | None) -> dict[str, Any]:
    """``{"file": name, "file_size": bytes}`` of the loader upstream of ``node_id``'s ``model`` input; ``{}`` when
    the workflow (hidden PROMPT) is not available or no known loader is found."""
    if not prompt or node_id is None:
        return {}
    seen, todo = set(), [str(node_id)]
    while todo:
        node = prompt.get(todo.pop(0)) or {}
        inputs = node.get("inputs", {})
        for key, folder in LOADER_KEYS.items():
            name = inputs.get(key)
            if isinstance(name, str):
                path = folder_paths.get_full_path(folder, name)
                return {"file": name, "file_size": os.path.getsize(path) if path else None}
        link = inputs.get("model")
        if isinstance(link, list) and len(link) == 2 and str(link[0]) not in seen:
            seen.add(str(link[0]))
            todo.append(str(link[0]))
    return {}


def model_identity_of(patcher: Any) -> dict[str, Any]:
    """The model digest of ``patcher`` (a ModelPatcher): base weights of its diffusion model + its weight patches.

    Base: :func:`core.record.model_identity.module_digest` (cached per module, so a LoRA or strength change does not
    hash the model again) over every parameter and buffer, a patched one read from ``patcher.backup`` (the original
    ComfyUI keeps to unpatch). Patches: :func:`core.record.model_identity.patches_digest` of ``patcher.patches``
    under ``diffusion_model.``. Call it outside the sampling loop (it reads the whole model the first time)."""
    module = patcher.model.diffusion_model
    backup = getattr(patcher, "backup", None) or {}

    def base_tensors():
        for name, t in [
            *module.named_parameters(remove_duplicate=False),
            *module.named_buffers(remove_duplicate=False),
        ]:
            saved = backup.get(f"diffusion_model.{name}")
            yield name, (saved.weight if saved is not None else t)

    base = model_identity.module_digest(module, token="base weights", named=base_tensors)
    patches = model_identity.patches_digest(
        {k: v for k, v in (getattr(patcher, "patches", None) or {}).items() if k.startswith("diffusion_model.")}
    )
    return {**model_identity.combined_digest(base, patches), "cached": base["cached"]}


def server_risks_text() -> str:
    """Determinism Setup's lines on the running server: each setting known to break run-to-run equality
    (:func:`core.record.environment.run_to_run_risks`), or one line saying none is known."""
    risks = environment.run_to_run_risks(comfy_environment())
    if not risks:
        return "server settings: none known to break run-to-run equality"
    return "\n".join("WARNING, server setting: " + r for r in risks)
