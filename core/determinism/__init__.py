"""Determinism: everything that decides output bits on one machine.

Owns the policy (:mod:`.policy`: what a policy asks for and what it cannot promise), applying it around a run and
restoring it (:mod:`.apply`), torch's process-global flags (:mod:`.torch_state`), ``CUBLAS_WORKSPACE_CONFIG``
(:mod:`.cublas`), seeds and noise (:mod:`.noise`: ``check_seed``, ``seeded_noise``,
``CPUNoiseSampler``), torch's AVX2 CPU ``randn`` reproduced on every platform (:mod:`.randn`) and its one
process-wide route into code the pack does not own (:mod:`.randn_route`), and portable CPU mode
(:mod:`.portable`).

The face below is lazy (PEP 562): importing this package imports no torch, because :mod:`.cublas` and
:mod:`.portable` must run before torch starts (the pack's ``__init__``).
"""
from __future__ import annotations

import importlib
from typing import Any

_FACE = {
    "DeterminismPolicy": ".policy",
    "deterministic": ".apply",
    "check_seed": ".noise",
    "seeded_noise": ".noise",
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    if name in _FACE:
        return getattr(importlib.import_module(_FACE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
