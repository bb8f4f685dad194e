"""Determinism: everything that decides output bits on one machine.

Owns the policy (:mod:`.policy`: what a policy asks for and what it cannot promise), applying it around a run and
restoring it (:mod:`.apply`), torch's process-global flags (:mod:`.torch_state`), ``CUBLAS_WORKSPACE_CONFIG``
(:mod:`.cublas`), seeds and noise (:mod:`.noise`: ``check_seed``, ``item_seeds``, ``seeded_noise``,
``CPUNoiseSampler``), torch's AVX2 CPU ``randn`` reproduced on every platform (:mod:`.randn`) and its one
process-wide route into code the pack does not own (:mod:`.randn_route`), and portable CPU mode
(:mod:`.portable`).

The face below is lazy (PEP 562): importing this package imports none of its modules (the pack's ``__init__``
imports only :mod:`.cublas` and :mod:`.portable`, at start-up).
"""

from __future__ import annotations

from ..lazy_face import lazy_face

_FACE = {
    "DeterminismPolicy": ".policy",
    "deterministic": ".apply",
    "check_seed": ".noise",
    "item_seeds": ".noise",
    "seeded_noise": ".noise",
}
__all__ = sorted(_FACE)

__getattr__ = lazy_face(__name__, _FACE)
