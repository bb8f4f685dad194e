"""Records: what a run was, and how two runs compare.

Owns the run record (:mod:`.run_record`: one typed schema for both samplers), the environment
(:mod:`.environment`: the fingerprint, and the running ComfyUI's settings known to break run-to-run equality), model
identity (:mod:`.model_identity`), exact digests (:mod:`.hashing`), comparison (:mod:`.compare`: bits, then magnitude),
the field-by-field explanation of a mismatch (:mod:`.explain`) and graded verdicts (:mod:`.verdict`).

The face below is lazy (PEP 562): importing the package imports no submodule.
"""

from __future__ import annotations

from ..lazy_face import lazy_face

_FACE = {
    "RunRecord": ".run_record",
    "tensor_digest": ".hashing",
}
__all__ = sorted(_FACE)

__getattr__ = lazy_face(__name__, _FACE)
