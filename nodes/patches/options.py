"""What a patched MODEL clone carries for run records and reports: ``model_options["steadfast"]``, one dict per clone.

Every ``add_*`` of :mod:`nodes.patches` writes its entry here (``determinism``, ``attention``, ``qkv_fusion``,
``channels_last``, ``compile``, ``quantize``, ...); the samplers read it back into the run record. ComfyUI's
``ModelPatcher.clone()`` deep-copies ``model_options``, so each clone has its own.
"""
from __future__ import annotations

__all__ = ["OPTIONS_KEY", "steadfast_options"]

OPTIONS_KEY = "steadfast"  # model_options["steadfast"]: what this clone carries, for run records


def steadfast_options(model) -> dict:
    """The ``model_options["steadfast"]`` dict of a ModelPatcher (created on first use).

    Args:
        model: a ComfyUI ``ModelPatcher`` (usually a clone made by a Steadfast node).
    Returns:
        the live dict (writes land on ``model``), empty for a model no Steadfast node has touched.
    """
    return model.model_options.setdefault(OPTIONS_KEY, {})
