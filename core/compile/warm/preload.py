"""Warm start at server start: the compile stack imported when the pack loads, where a compile is likely.

A warm first prompt (inductor's cache filled by an earlier run, :mod:`core.compile.warm.cache`) spends much of its
compile overhead importing Dynamo and inductor (docs/benchmarks.md section 13). A server that has compiled before (a
managed compile cache with compiled files under its root) imports them while ComfyUI starts, before any prompt waits,
makes inductor's CPU vector-ISA pick then too (:func:`core.torch_compat.pick_cpu_isa`: inductor's ISA probes, once per
process), and then freezes the heap it holds (:func:`freeze_heap`) so that the garbage collector's full collections
stop walking it. ``$STEADFAST_PRELOAD_COMPILE``: ``1`` always, ``0`` never, unset/``auto`` when the cache root holds a
compiled file; ``$STEADFAST_GC_FREEZE=0`` leaves the heap unfrozen. No ComfyUI imports.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from ... import switches, torch_compat
from .cache import FILES, CompileCache, cache_key, cache_key_fields, existing_cache
from .cache_location import DEFAULT_NAME, CacheRefused

log = logging.getLogger("steadfast.compile_cache")

PRELOAD_ENV = switches.PRELOAD_COMPILE.name
GC_FREEZE_ENV = switches.GC_FREEZE.name
_state: dict[str, Any] = {
    "compile_stack_preloaded": False,
    "seconds": None,
    "reason": "not decided yet",
    "cpu_isa": None,
    "cpu_isa_cache": None,
    "cpu_isa_seconds": None,
    "gc_frozen": None,
}
_lock = threading.Lock()


def has_compiled_files(root: Path | None) -> bool:
    """Whether a managed cache under ``root`` (``<root>/<name>/<key>/steadfast_files.json``) records any file.

    Args:
        root: the operator's cache root (:func:`core.compile.warm.cache_location.resolve_root`), or None (disabled).
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
    value = switches.PRELOAD_COMPILE.text().lower()
    if switches.PRELOAD_COMPILE.off():
        return False, f"${PRELOAD_ENV}={value}"
    if switches.PRELOAD_COMPILE.on():
        return True, f"${PRELOAD_ENV}={value}"
    if has_compiled_files(root):
        return True, "the compile cache holds compiled files (an earlier compile on this server)"
    return False, "no compiled files in the compile cache yet (nothing to warm-start from)"


def freeze_heap() -> int | None:
    """``gc.freeze()`` unless ``$STEADFAST_GC_FREEZE`` is 0: every object the garbage collector tracks now (torch,
    ComfyUI, the compile stack just imported) moves to CPython's permanent generation, which its collections skip.

    Why: a full collection walks every tracked object, and loading the precompiled blocks triggers one during a
    warm first prompt (measurements: docs/benchmarks.md section 15). The cost: a reference cycle among the frozen
    objects that becomes garbage later is never collected (reference counting still frees everything else).
    Source: Python's documentation of ``gc.freeze``. A full collection runs first, so that garbage left by the
    imports is freed instead of frozen. Returns the number of objects frozen (``gc.get_freeze_count()``), or None
    when switched off.
    """
    if switches.GC_FREEZE.off():
        return None
    gc.collect()  # the garbage of the imports so far is freed, not kept for the server's life
    gc.freeze()
    return gc.get_freeze_count()


def isa_cache(
    root: Path | None, device: Any = None, forbidden: tuple[str | os.PathLike[str], ...] = ()
) -> CompileCache | None:
    """The managed compile cache inductor's ISA pick at start runs in: the first cache name under ``root``
    (``default`` first, then by name) whose folder for this machine's key (no inductor preset) checks out
    (:func:`core.compile.warm.cache.existing_cache`: read only; a bad one is left for the first compile to move aside,
    with its message in the run record). Inductor keeps its ISA test programs in its cache folder: the ones the
    first compile built there (or an artifact brought) are found instead of built again.

    Args:
        root: the operator's cache root, or None.
        device: what the kernels are for (:func:`core.compile.warm.cache.cache_key_fields`; None: CUDA when available).
        forbidden: folders HTTP clients can write (a root overlapping one: None).
    Returns:
        the cache, or None when there is none that checks out.
    """
    if root is None or not root.is_dir():
        return None
    key = cache_key(cache_key_fields(device))
    try:
        names = sorted((d.name for d in root.iterdir() if (d / key).is_dir()), key=lambda n: (n != DEFAULT_NAME, n))
        for name in names:
            if (cache := existing_cache(root, name, device=device, forbidden=forbidden)) is not None:
                return cache
    except (OSError, CacheRefused) as e:
        log.info("Steadfast: inductor's ISA pick at start runs outside the compile cache (%s)", e)
    return None


def preload(
    root: Path | None,
    *,
    device: Any = None,
    forbidden: tuple[str | os.PathLike[str], ...] = (),
    isa_in_cache: bool = True,
) -> dict[str, Any]:
    """Import the compile stack now when :func:`decide` says so (once per process), then pick inductor's CPU ISA
    inside :func:`isa_cache` (``device``, ``forbidden``: as there; ``isa_in_cache`` False: in inductor's own folder)
    and freeze the heap; returns :func:`state`.
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
            except Exception as e:  # noqa: BLE001 - a start-up nicety must never stop ComfyUI from starting
                _state["seconds"], _state["reason"] = 0.0, f"{why}; import failed: {type(e).__name__}: {e}"
                log.warning("Steadfast: compile stack preload failed: %s", e)
                return dict(_state)
            t0 = time.perf_counter()
            try:
                cache = isa_cache(root, device, forbidden) if isa_in_cache else None
                _state["cpu_isa_cache"] = cache.name if cache is not None else None
                with cache.activate(trust_writes=True) if cache is not None else contextlib.nullcontext():
                    _state["cpu_isa"] = torch_compat.pick_cpu_isa()
            except Exception as e:  # noqa: BLE001 - inductor then picks at its first kernel, as without the pack
                _state["cpu_isa"] = f"not picked at start: {type(e).__name__}: {e}"
            _state["cpu_isa_seconds"] = round(time.perf_counter() - t0, 3)
            _state["gc_frozen"] = freeze_heap()
            log.info(
                "Steadfast: compile stack imported at start in %.2f s, CPU ISA %r picked in %.2f s, %s objects "
                "frozen (%s; $%s=0 turns this off)",
                _state["seconds"],
                _state["cpu_isa"],
                _state["cpu_isa_seconds"],
                _state["gc_frozen"],
                why,
                PRELOAD_ENV,
            )
        else:
            _state["seconds"] = 0.0
        return dict(_state)


def state() -> dict[str, Any]:
    """``{"compile_stack_preloaded": bool, "seconds": float | None, "reason": str, "cpu_isa": str | None,
    "cpu_isa_cache": str | None, "cpu_isa_seconds": float | None, "gc_frozen": int | None}`` (a copy;
    ``seconds``: the import's, ``cpu_isa``: inductor's pick, made after the import, in the compile cache named
    ``cpu_isa_cache`` (:func:`isa_cache`), ``gc_frozen``: :func:`freeze_heap`'s count, last)."""
    with _lock:
        return dict(_state)
