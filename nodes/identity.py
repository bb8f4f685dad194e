"""What was sampled, for run records: the model's content digest, its file, and the ComfyUI / pack versions.

The digest (:func:`core.model_identity.module_digest`) covers the diffusion model's weights as sampled (LoRA and
other weight patches applied), cached per model and ModelPatcher patch state (``patches_uuid``), so a different
file, dtype, LoRA or strength is a named cause of a mismatch. The file is found by following the workflow's
``model`` links up to its loader (``ckpt_name`` / ``unet_name``), read from the hidden ``PROMPT``.
"""
from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Any

import folder_paths

from ..core import comfy_env, model_identity

LOADER_KEYS = {"ckpt_name": "checkpoints", "unet_name": "diffusion_models"}


def versions() -> dict[str, str]:
    """``{"comfyui": "0.8.0", "steadfast": "0.1.0"}`` ("unknown" where a version cannot be read)."""
    from .. import __version__ as pack
    try:
        import comfyui_version
        comfy = str(comfyui_version.__version__)
    except (ImportError, AttributeError):
        comfy = "unknown"
    return {"comfyui": comfy, "steadfast": str(pack)}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def comfy_environment() -> dict[str, Any]:
    """The running ComfyUI's settings that touch determinism (fields: ``core/comfy_env.py``), for run records
    beside :func:`versions`.

    Read from the server itself: the comfy-aimdo / comfy-kitchen distributions, whether Dynamic VRAM
    is active (``comfy.memory_management.aimdo_enabled``, absent before Dynamic VRAM existed: False), the
    ``--fast`` options and the numeric switches that are set (``comfy.cli_args.args``).
    """
    import comfy.cli_args
    import torch
    args = comfy.cli_args.args
    memory = sys.modules.get("comfy.memory_management")
    fast = getattr(args, "fast", None) or ()
    return {
        "comfy_aimdo": _dist_version("comfy-aimdo"),
        "comfy_kitchen": _dist_version("comfy-kitchen"),
        "dynamic_vram": bool(getattr(memory, "aimdo_enabled", False)),
        "comfy_fast": sorted(str(getattr(f, "value", f)) for f in fast),
        "comfy_numeric_args": {k: getattr(args, k) for k in comfy_env.NUMERIC_ARGS if getattr(args, k, None)},
        "fp16_accumulation": getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", None),
    }


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
    """:func:`core.model_identity.module_digest` of ``patcher``'s diffusion model, keyed by its patch state."""
    module = patcher.model.diffusion_model
    return model_identity.module_digest(module, token=str(getattr(patcher, "patches_uuid", "")))


def server_risks_text() -> str:
    """Determinism Setup's lines on the running server: each setting known to break run-to-run equality
    (:func:`core.comfy_env.run_to_run_risks`), or one line saying none is known."""
    risks = comfy_env.run_to_run_risks(comfy_environment())
    if not risks:
        return "server settings: none known to break run-to-run equality"
    return "\n".join("WARNING, server setting: " + r for r in risks)
