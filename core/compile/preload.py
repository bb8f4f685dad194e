"""Warm start at server start: the compile stack imported when the pack loads, where a compile is likely.

A warm first prompt (inductor's cache filled by an earlier run, :mod:`core.compile.cache`) spent about a third of
its compile overhead importing Dynamo and inductor (docs/benchmarks.md section 13: 0.85 s of 2.6 s for the tiny
SD1.5 checkpoint on ComfyUI 0.8.0). A server that has compiled before (a managed compile cache with compiled files
under its root) imports them while ComfyUI starts, before any prompt waits. ``$STEADFAST_PRELOAD_COMPILE``:
``1`` always, ``0`` never, unset/``auto`` when the cache root holds a compiled file. No ComfyUI imports.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from .. import torch_compat
from .cache import FILES

log = logging.getLogger("steadfast.compile_cache")

PRELOAD_ENV = "STEADFAST_PRELOAD_COMPILE"
_state: dict[str, Any] = {"compile_stack_preloaded": False, "seconds": None, "reason": "not decided yet"}
_lock = threading.Lock()


def has_compiled_files(root: Path | None) -> bool:
    """Whether a managed cache under ``root`` (``<root>/<name>/<key>/steadfast_files.json``) records any file.

    Args:
        root: the operator's cache root (:func:`core.compile.cache_location.resolve_root`), or None (disabled).
    Returns:
        True when at least one key folder's file record is not empty; False for None, a missing or unreadable root.
    """
    if root is None:
        return False
    try:
        for record in root.glob(f"*/*/{FILES}"):
            if record.is_file() and record.stat().st_size > 2:  # "{}" is an empty record
                return True
    except OSError:
        return False
    return False


def decide(root: Path | None) -> tuple[bool, str]:
    """``(preload?, why)`` from ``$STEADFAST_PRELOAD_COMPILE`` and ``root`` (see the module docstring)."""
    value = os.environ.get(PRELOAD_ENV, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return False, f"${PRELOAD_ENV}={value}"
    if value in ("1", "on", "true", "yes"):
        return True, f"${PRELOAD_ENV}={value}"
    if has_compiled_files(root):
        return True, "the compile cache holds compiled files (an earlier compile on this server)"
    return False, "no compiled files in the compile cache yet (nothing to warm-start from)"


def preload(root: Path | None) -> dict[str, Any]:
    """Import the compile stack now when :func:`decide` says so (once per process); returns :func:`state`.
    Never raises: a failed import is logged and kept in the state (the first compile then imports it itself)."""
    with _lock:
        if _state["seconds"] is not None:
            return dict(_state)
        yes, why = decide(root)
        _state["reason"] = why
        if yes:
            try:
                _state["seconds"] = round(torch_compat.import_compile_stack(), 3)
                _state["compile_stack_preloaded"] = True
                log.info("Steadfast: compile stack imported at start in %.2f s (%s; $%s=0 turns this off)",
                         _state["seconds"], why, PRELOAD_ENV)
            except Exception as e:  # noqa: BLE001 - a start-up nicety must never stop ComfyUI from starting
                _state["seconds"], _state["reason"] = 0.0, f"{why}; import failed: {type(e).__name__}: {e}"
                log.warning("Steadfast: compile stack preload failed: %s", e)
        else:
            _state["seconds"] = 0.0
        return dict(_state)


def state() -> dict[str, Any]:
    """``{"compile_stack_preloaded": bool, "seconds": float | None, "reason": str}`` (a copy)."""
    with _lock:
        return dict(_state)
