"""Determinism Setup's patch: an ``OUTER_SAMPLE`` wrapper that applies a determinism policy around one sampling call.

Key ``steadfast.determinism`` (``remove_wrappers_with_key`` first: applying it twice replaces, never stacks).
"""

from __future__ import annotations

from comfy.patcher_extension import WrappersMP

from ...core.determinism import apply as determinism
from ...core.determinism.policy import DeterminismPolicy
from ...core.optimize.plan import StepReport
from .options import steadfast_options

__all__ = ["KEY_DET", "add_determinism"]

KEY_DET = "steadfast.determinism"


def add_determinism(model, policy: DeterminismPolicy) -> StepReport:
    """Apply ``policy`` around every sampling call of ``model`` (a clone) and restore after it.

    Args:
        model: a ComfyUI ``ModelPatcher`` clone (changed in place: a keyed wrapper, its ``SteadfastOptions``).
        policy: the determinism policy to enter for each sampling call.
    Returns:
        a "determinism" :class:`StepReport`, applied, with the policy as recorded (``details["policy"]``).
    """

    def wrapper(executor, *args, **kwargs):
        with determinism.deterministic(policy) as report:
            steadfast_options(executor.class_obj.model_patcher).last_determinism = report.as_dict()
            return executor(*args, **kwargs)

    model.remove_wrappers_with_key(WrappersMP.OUTER_SAMPLE, KEY_DET)
    model.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, KEY_DET, wrapper)
    steadfast_options(model).determinism = policy.as_dict()
    return StepReport("determinism", True, ["diffusion_model"], {"policy": policy.as_dict()})
