"""Regional and full ``torch.compile``, tracked: one model's compile from the options to its state.

Owns the options (:mod:`.options`: ``CompileOptions``, ``COMPILE_SCOPES``), inductor presets (:mod:`.presets`), the one block finder
(:mod:`.blocks`: the architecture table, the swap-safety check, discovery), compiling blocks and swapping them in for
one call (:mod:`.swap`), Dynamo guard filters (:mod:`.guards`), the per-model registry and its records
(:mod:`.registry`, :mod:`.record`), why a block recompiled (:mod:`.recompiles`) and the persistent compile cache
(:mod:`.cache`, :mod:`.cache_location`).

The face below is lazy (PEP 562): importing the package compiles nothing and imports no submodule.
"""
from __future__ import annotations

import importlib
from typing import Any

_FACE = {
    "CompileOptions": ".options",
    "COMPILE_SCOPES": ".options",
    "choose_blocks": ".blocks",
    "REGISTRY": ".registry",
    "CompileRecord": ".record",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name in _FACE:
        return getattr(importlib.import_module(_FACE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
