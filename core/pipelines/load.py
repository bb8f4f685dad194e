"""Load a diffusers pipeline folder with clear errors, find its parts (denoiser, VAE), and keep it inside the host's
memory management: loaded with ``keep_on_cpu`` a pipeline stays on the CPU and :func:`on_run_device` moves it to its
GPU for each call, after the host made room (ComfyUI: ``comfy.model_management.free_memory``), and back after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..failures import passes_through

__all__ = [
    "DTYPES",
    "PipelineLoadError",
    "load_pipeline",
    "module_components",
    "denoiser_of",
    "count_params",
    "RUN_DEVICE_ATTR",
    "run_device",
    "pipeline_bytes",
    "on_run_device",
]

log = logging.getLogger("steadfast.pipelines")

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""Accepted ``dtype`` names of :func:`load_pipeline`."""

_DENOISERS = ("transformer", "unet", "prior", "decoder")
# model_index.json entries that are not components
_META_KEYS = {"_class_name", "_diffusers_version", "_name_or_path"}


class PipelineLoadError(ValueError):
    """A pipeline folder cannot be loaded; the message names the folder and, if known, the component."""


def _check_folder(path: Path) -> dict[str, Any]:
    """Validate the folder layout before diffusers touches it; returns the parsed ``model_index.json``."""
    if not path.exists():
        raise PipelineLoadError(f"pipeline folder {str(path)!r} does not exist")
    if not path.is_dir():
        hint = (
            (
                " (a single-file checkpoint: convert it to a diffusers folder first, e.g. with "
                "`Pipeline.from_single_file(...).save_pretrained(DIR)`)"
            )
            if path.suffix in (".safetensors", ".ckpt", ".pt", ".bin")
            else ""
        )
        raise PipelineLoadError(f"{str(path)!r} is a file, not a diffusers pipeline folder{hint}")
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise PipelineLoadError(
            f"{str(path)!r} has no model_index.json, so it is not a diffusers pipeline folder "
            f"(found: {', '.join(sorted(p.name for p in path.iterdir())[:10]) or 'nothing'})"
        )
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PipelineLoadError(f"{str(index_file)!r} is not valid JSON: {e}") from e
    if not isinstance(index, dict) or "_class_name" not in index:
        raise PipelineLoadError(f"{str(index_file)!r} has no _class_name entry")
    for name, spec in index.items():
        if name in _META_KEYS or name.startswith("_"):
            continue
        if not isinstance(spec, (list, tuple)) or len(spec) != 2 or spec[0] is None or spec[1] is None:
            continue  # optional component left empty ([null, null]) or a plain config value
        sub = path / name
        if not sub.is_dir() or not any(sub.iterdir()):
            raise PipelineLoadError(
                f"component {name!r} ({spec[0]}.{spec[1]}) is listed in model_index.json but its folder "
                f"{str(sub)!r} is missing or empty"
            )
    return index


def _dtype_kwarg() -> str:
    """``"dtype"`` where diffusers has renamed ``torch_dtype`` (diffusers 0.42 warns on the old name), else
    ``"torch_dtype"``."""
    try:
        from diffusers.utils.deprecation_utils import _resolve_dtype  # noqa: F401
    except ImportError:
        return "torch_dtype"
    return "dtype"


#: Attribute a pipeline kept on the CPU carries: the device its calls run on (:func:`on_run_device`). Plain
#: attribute, so the weight-sharing copies (``copy.copy`` in :func:`~.share.share_pipeline`) carry it too.
RUN_DEVICE_ATTR = "_steadfast_run_device"


def run_device(pipe: Any) -> torch.device:
    """The device ``pipe``'s calls run on: the one it was loaded for (:data:`RUN_DEVICE_ATTR`), else where its first
    module parameter is (CPU when it has none)."""
    dev = getattr(pipe, RUN_DEVICE_ATTR, None)
    if dev is not None:
        return torch.device(dev)
    for mod in module_components(pipe).values():
        p = next(mod.parameters(), None)
        if p is not None:
            return p.device
    return torch.device("cpu")


def pipeline_bytes(pipe: Any) -> int:
    """Bytes of every parameter and buffer of ``pipe``'s module components (what moving it to a GPU needs)."""
    return sum(
        t.numel() * t.element_size()
        for mod in module_components(pipe).values()
        for t in [*mod.parameters(), *mod.buffers()]
    )


@contextlib.contextmanager
def on_run_device(
    pipe: Any, make_room: Callable[[int, torch.device], None] | None = None, offload: str | torch.device = "cpu"
) -> Iterator[Any]:
    """Context: ``pipe`` (loaded with ``keep_on_cpu``) on its run device for the block, back on ``offload`` after.

    Before moving, ``make_room(bytes, device)`` is called (ComfyUI: ``comfy.model_management.free_memory``, so
    ComfyUI unloads its own models to make room instead of being pushed into lowvram or out of memory). A
    pipeline without :data:`RUN_DEVICE_ATTR`, or whose run device is the CPU, is left where it is.
    """
    dev = getattr(pipe, RUN_DEVICE_ATTR, None)
    if dev is None or torch.device(dev).type == "cpu":
        yield pipe
        return
    if make_room is not None:
        make_room(pipeline_bytes(pipe), torch.device(dev))
    pipe.to(dev)
    try:
        yield pipe
    finally:
        pipe.to(offload)


def load_pipeline(
    path: str | Path,
    dtype: str = "fp32",
    device: str | torch.device = "cpu",
    *,
    progress_bar: bool = False,
    keep_on_cpu: bool = False,
) -> Any:
    """Load a diffusers pipeline folder (``save_pretrained`` layout) from disk only (no download).

    Args:
        path: folder with ``model_index.json`` and one sub-folder per component.
        dtype: "fp32" | "bf16" | "fp16": ``torch_dtype`` for every model component.
        device: where the pipeline runs: it is moved there (``pipe.to(device)``), unless ``keep_on_cpu``.
        progress_bar: keep diffusers' per-step progress bar (off by default; it is per pipeline).
        keep_on_cpu: leave the components on the CPU and record ``device`` (:data:`RUN_DEVICE_ATTR`):
            :func:`on_run_device` moves them there for each call (ComfyUI keeps its memory management).
    Returns:
        the ``DiffusionPipeline`` subclass named in ``model_index.json``.
    Raises:
        PipelineLoadError: missing folder, a file instead of a folder, no/invalid ``model_index.json``,
            a listed component folder missing/empty, or diffusers failing to load a component
            (its exception is chained and its message included).
        ValueError: unknown ``dtype``.
        torch.OutOfMemoryError, KeyboardInterrupt, ComfyUI's InterruptProcessingException: unchanged, never
            wrapped (:func:`core.failures.passes_through`).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    folder = Path(path).expanduser()
    index = _check_folder(folder)
    from diffusers import DiffusionPipeline

    try:
        pipe = DiffusionPipeline.from_pretrained(str(folder), **{_dtype_kwarg(): DTYPES[dtype]}, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the folder and class named
        if passes_through(e):  # an interrupt or out of memory: ComfyUI acts on the type (core/failures.py)
            raise
        raise PipelineLoadError(
            f"diffusers could not load {index.get('_class_name')} from {str(folder)!r}: {type(e).__name__}: {e}"
        ) from e
    if keep_on_cpu:
        setattr(pipe, RUN_DEVICE_ATTR, str(device))
    else:
        try:
            pipe.to(device)
        except Exception as e:  # noqa: BLE001
            if passes_through(e):  # CUDA OOM stays torch.OutOfMemoryError: ComfyUI unloads models and shows its tip
                raise
            raise PipelineLoadError(f"cannot move the pipeline to {device!r}: {type(e).__name__}: {e}") from e
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=not progress_bar)
    return pipe


def module_components(pipe: Any) -> dict[str, torch.nn.Module]:
    """``{name: module}`` for every ``nn.Module`` component of ``pipe`` (text encoders, denoiser, VAE ...)."""
    comps = getattr(pipe, "components", None) or {}
    return {k: v for k, v in comps.items() if isinstance(v, torch.nn.Module)}


def denoiser_of(pipe: Any) -> tuple[str, torch.nn.Module]:
    """``(component name, module)`` of the pipeline's denoiser: "transformer", else "unet" (...).

    Raises:
        ValueError: the pipeline has none of the known denoiser components.
    """
    comps = module_components(pipe)
    for name in _DENOISERS:
        if name in comps:
            return name, comps[name]
    raise ValueError(
        f"{type(pipe).__name__} has no denoiser component (looked for {', '.join(_DENOISERS)}; "
        f"it has {', '.join(comps) or 'no modules'})"
    )


def count_params(module: torch.nn.Module) -> int:
    """Number of parameter elements (each Parameter counted once, shared ones too)."""
    return sum(p.numel() for p in module.parameters())
