"""Optimize Model's ``channels_last``: conv weights in channels-last for the duration of a run only (the nn.Module is
shared with other clones).

Key ``steadfast.layout`` (``CallbacksMP.ON_PRE_RUN`` converts, ``ON_CLEANUP`` restores).
"""

from __future__ import annotations

from comfy.patcher_extension import CallbacksMP

from ...core.optimize import layout
from ...core.optimize.plan import StepReport
from .dynamic_vram import NOT_APPLIED_DYNAMIC, is_dynamic
from .options import steadfast_options

__all__ = ["KEY_LAYOUT", "add_channels_last"]

KEY_LAYOUT = "steadfast.layout"


def add_channels_last(model) -> StepReport:
    """Convert conv weights to channels-last before each run of ``model`` (a clone) and back after it.

    Under Dynamic VRAM nothing is registered (weights reach the GPU as gathered contiguous copies: the memory-mapped
    ones are left alone) and the clone's ``SteadfastOptions.channels_last`` says so.

    Args:
        model: a ComfyUI ``ModelPatcher`` clone.
    Returns:
        a "channels_last" :class:`StepReport` (not applied under Dynamic VRAM), one report line.
    """
    if is_dynamic(model):  # weights reach the GPU as gathered contiguous copies: leave the mapped ones
        steadfast_options(model).channels_last = NOT_APPLIED_DYNAMIC
        return StepReport(
            "channels_last",
            False,
            note=NOT_APPLIED_DYNAMIC,
            lines=[f"channels_last: {NOT_APPLIED_DYNAMIC} (the memory-mapped weights are left alone)"],
        )

    def to_cl(patcher):
        layout.to_channels_last_(patcher.get_model_object("diffusion_model"))

    def back(patcher):
        layout.to_contiguous_(patcher.get_model_object("diffusion_model"))

    model.remove_callbacks_with_key(CallbacksMP.ON_PRE_RUN, KEY_LAYOUT)
    model.remove_callbacks_with_key(CallbacksMP.ON_CLEANUP, KEY_LAYOUT)
    model.add_callback_with_key(CallbacksMP.ON_PRE_RUN, KEY_LAYOUT, to_cl)
    model.add_callback_with_key(CallbacksMP.ON_CLEANUP, KEY_LAYOUT, back)
    steadfast_options(model).channels_last = True
    return StepReport(
        "channels_last",
        True,
        ["diffusion_model"],
        lines=["channels_last: conv weights converted during sampling, restored after"],
    )
