"""Regional and full ``torch.compile``, tracked: one model's compile from the options to its state.

Owns the options (:mod:`.options`: ``CompileOptions``, ``COMPILE_SCOPES``), inductor presets (:mod:`.presets`), the one
block finder (:mod:`.blocks`: the architecture table, the swap-safety check, discovery), compiling blocks and swapping
them in for one call (:mod:`.swap`), Dynamo guard filters (:mod:`.guards`), the per-model registry and its records
(:mod:`.registry`, :mod:`.record`), why a block recompiled (:mod:`.recompiles`), the persistent compile cache
(:mod:`.cache`, :mod:`.cache_location`) and the use case that composes them for both paths (:mod:`.use`:
``compile_use``, ``Compiled.run``).

The face below is lazy (PEP 562): importing the package compiles nothing and imports no submodule.
"""

from __future__ import annotations

from ..lazy_face import lazy_face

_FACE = {
    "CompileOptions": ".options",
    "COMPILE_SCOPES": ".options",
    "choose_blocks": ".blocks",
    "REGISTRY": ".registry",
    "CompileRecord": ".record",
    "compile_use": ".use",
    "CacheChoice": ".use",
}
__all__ = sorted(_FACE)

__getattr__ = lazy_face(__name__, _FACE)
