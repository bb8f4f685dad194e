"""What the pack does when ComfyUI loads it, and the ComfyUI folders that decide where compiled code may live.

:func:`warm_start_at_server_start` runs once, from the pack's ``comfy_entrypoint``: the fleet's compile artifacts
(``$STEADFAST_COMPILE_ARTIFACT``), then the compile stack's import (:mod:`core.compile.warm.preload`). The folder facts
(:func:`client_writable_dirs`, :func:`cache_root`) are ComfyUI's ``folder_paths``, read here for the compile cache
of both paths too (:func:`cache_choice`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import comfy.model_management

from ...core import switches
from ...core.compile.use import CacheChoice
from ...core.compile.warm import artifact as compile_artifact
from ...core.compile.warm import cache_location as compile_cache_location
from ...core.compile.warm import preload
from ...core.determinism import portable

__all__ = [
    "client_writable_dirs",
    "cache_root",
    "cache_choice",
    "load_compile_artifacts",
    "warm_start_at_server_start",
]

log = logging.getLogger("steadfast")


def client_writable_dirs() -> tuple[str, ...]:
    """Folders that ComfyUI's HTTP API lets clients write (:func:`core.compile.warm.cache_location.client_writable` of
    this ComfyUI's folders). A compile cache may never overlap them."""
    import folder_paths

    return compile_cache_location.client_writable(
        folder_paths.get_input_directory(),
        folder_paths.get_output_directory(),
        folder_paths.get_temp_directory(),
        folder_paths.get_user_directory(),
    )


def load_compile_artifacts(root: Path | None, source: str) -> list[dict]:
    """Import the compile artifacts named in ``$STEADFAST_COMPILE_ARTIFACT`` (pinned by
    ``$STEADFAST_COMPILE_ARTIFACT_SHA256``) into the operator's cache root, keyed for ComfyUI's torch device
    (:func:`core.compile.warm.artifact.load_from_env`). Never raises: a refusal is logged and listed
    (``GET /steadfast/compile_state``'s ``artifacts``), ComfyUI starts regardless.

    Args:
        root, source: the cache root and where it came from (:func:`core.compile.warm.cache_location.resolve_root`).
    Returns:
        one dict per artifact: ``status`` "imported" (with counts) or "refused" (with ``reason``); no paths.
    """
    if not switches.COMPILE_ARTIFACT.text():
        return []
    try:
        device = comfy.model_management.get_torch_device()
        forbidden = client_writable_dirs()
    except Exception as e:  # never stop ComfyUI from starting
        log.warning("Steadfast: compile artifacts not loaded (%s: %s)", type(e).__name__, e)
        return []
    return compile_artifact.load_from_env(root, device=device, forbidden=forbidden, root_note=source)


def cache_root() -> tuple[Path | None, str]:
    """The operator's compile-cache root for this ComfyUI (:func:`core.compile.warm.cache_location.resolve_root` of its
    user folder) and where it came from."""
    import folder_paths

    return compile_cache_location.resolve_root(folder_paths.get_user_directory())


def cache_choice(name: str) -> CacheChoice:
    """The compile cache named ``name`` (a node's ``compile_cache`` input) where this ComfyUI keeps them: the
    operator's root (:func:`cache_root`), ComfyUI's compute device and the folders its HTTP clients can write
    (refused as a cache location), for :func:`core.compile.use.compile_use`."""
    root, source = cache_root()
    return CacheChoice(
        name=name,
        root=root,
        source=source,
        device=comfy.model_management.get_torch_device(),
        forbidden=client_writable_dirs() if root is not None else (),
    )


def warm_start_at_server_start() -> None:
    """What the pack does for a warm start when ComfyUI loads it, once: the fleet's artifacts
    (:func:`load_compile_artifacts`), then the compile stack's import, inductor's CPU ISA pick and the heap's freeze
    (:func:`core.compile.warm.preload.preload`) when this server has compiled before, never in portable CPU mode (it
    refuses inductor). Never raises: ComfyUI starts regardless (what was done: ``GET /steadfast/compile_state``)."""
    try:
        root, source = cache_root()
    except Exception as e:  # never stop ComfyUI from starting
        log.warning("Steadfast: no warm start (%s: %s)", type(e).__name__, e)
        return
    load_compile_artifacts(root, source)
    if portable.is_portable():
        return
    try:
        device, forbidden = comfy.model_management.get_torch_device(), client_writable_dirs()
    except Exception as e:  # noqa: BLE001 - never stop ComfyUI from starting; the pick then runs in no cache
        log.warning("Steadfast: inductor's ISA pick at start outside the compile cache (%s: %s)", type(e).__name__, e)
        preload.preload(root, isa_in_cache=False)
        return
    preload.preload(root, device=device, forbidden=forbidden)
