"""What a patched MODEL clone carries for run records and reports: one :class:`SteadfastOptions` per clone, at
``model_options["steadfast"]``.

Every ``add_*`` of :mod:`nodes.patches` sets its field (``determinism``, ``attention``, ``qkv_fusion``,
``channels_last``, ``compile``, ``quantize``, ...); the samplers read them back into the run record. ComfyUI's
``ModelPatcher.clone()`` deep-copies ``model_options``, so each clone has its own.
"""
from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["OPTIONS_KEY", "SteadfastOptions", "steadfast_options"]

OPTIONS_KEY = "steadfast"  # model_options["steadfast"]: what this clone carries, for run records


@dataclasses.dataclass
class SteadfastOptions:
    """What the pack's patches set on one MODEL clone. ``None``: the patch never ran on this clone."""

    #: Determinism Setup's policy (``DeterminismPolicy.as_dict()``), set when the node runs
    determinism: dict[str, Any] | None = None
    #: the policy as the last sampling call entered it (``DeterminismReport.as_dict()``), set inside sampling
    last_determinism: dict[str, Any] | None = None
    #: batch invariance: its rows (a dict) when on, else a line saying why not (Determinism Setup)
    batch_invariant: dict[str, str] | str | None = None
    #: the attention Optimize Model pinned, ``"pytorch_sdpa:<backend>"``
    attention: str | None = None
    #: fused projections (a count), or why not (``NOT_APPLIED_DYNAMIC``); 0 when off
    qkv_fusion: int | str = 0
    #: channels-last applied (True), off (False), or why not (``NOT_APPLIED_DYNAMIC``)
    channels_last: bool | str = False
    #: weight quantization ``{"mode", "layers", "torchao"}``; None when off
    quantize: dict[str, Any] | None = None
    #: the compile this clone carries: scope, its record's creation time and summary (``nodes.patches.compile``)
    compile: dict[str, Any] | None = None


def steadfast_options(model) -> SteadfastOptions:
    """The :class:`SteadfastOptions` of a ModelPatcher (created on first use).

    Args:
        model: a ComfyUI ``ModelPatcher`` (usually a clone made by a Steadfast node).
    Returns:
        the live object (writes land on ``model``), all defaults for a model no Steadfast node has touched.
    Raises:
        TypeError: ``model_options["steadfast"]`` holds something else (another pack's key).
    """
    got = model.model_options.setdefault(OPTIONS_KEY, SteadfastOptions())
    if not isinstance(got, SteadfastOptions):
        raise TypeError(f"model_options[{OPTIONS_KEY!r}] holds a {type(got).__name__}, not Steadfast's options")
    return got
