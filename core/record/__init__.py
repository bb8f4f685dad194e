"""Records: what a run was, and how two runs compare.

Owns the run record (:mod:`.run_record`: one typed schema for both samplers), the environment fingerprint
(:mod:`.fingerprint`) and the running ComfyUI's determinism-relevant settings (:mod:`.comfy_env`), model identity
(:mod:`.model_identity`), exact digests (:mod:`.hashing`), comparison (:mod:`.compare`: bits, then magnitude), the
field-by-field explanation of a mismatch (:mod:`.explain`) and graded verdicts (:mod:`.verdict`).

The face below is lazy (PEP 562): importing the package imports no submodule.
"""
from __future__ import annotations

import importlib
from typing import Any

_FACE = {
    "RunRecord": ".run_record",
    "tensor_digest": ".hashing",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name in _FACE:
        return getattr(importlib.import_module(_FACE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
