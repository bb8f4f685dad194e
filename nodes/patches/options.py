"""What a patched MODEL clone carries for run records and reports: :class:`SteadfastOptions`, a typed view of
``model_options["steadfast"]``.

Every ``add_*`` of :mod:`nodes.patches` sets its field (``determinism``, ``attention``, ``qkv_fusion``,
``channels_last``, ``compile``, ``quantize``, ...); the samplers read them back into the run record. The values live
in a plain dict because ComfyUI's ``ModelPatcher.clone()`` copies ``model_options`` by its nested dicts
(``comfy.patcher_extension.copy_nested_dicts``): each clone gets its own dict, while any other object would be
shared between the clones (a patch on one would show on all).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

__all__ = ["OPTIONS_KEY", "SteadfastOptions", "steadfast_options"]

OPTIONS_KEY = "steadfast"  # model_options["steadfast"]: what this clone carries, for run records
T = TypeVar("T")


class _Field(Generic[T]):
    """One option: read from the clone's dict (``default`` when never set), written to it."""

    def __init__(self, default: T) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: SteadfastOptions | None, owner: type) -> Any:
        if obj is None:
            return self
        return obj.store.get(self.name, self.default)

    def __set__(self, obj: SteadfastOptions, value: T) -> None:
        obj.store[self.name] = value


class SteadfastOptions:
    """What the pack's patches set on one MODEL clone, by attribute. ``None``: that patch never ran on this clone.

    Args:
        store: the clone's ``model_options["steadfast"]`` dict (read and written in place).
    """

    __slots__ = ("store",)
    #: Determinism Setup's policy (``DeterminismPolicy.as_dict()``), set when the node runs
    determinism: _Field[dict[str, Any] | None] = _Field(None)
    #: the policy as the last sampling call entered it (``DeterminismReport.as_dict()``), set inside sampling
    last_determinism: _Field[dict[str, Any] | None] = _Field(None)
    #: batch invariance: its rows (a dict) when on, else a line saying why not (Determinism Setup)
    batch_invariant: _Field[dict[str, str] | str | None] = _Field(None)
    #: the attention Optimize Model pinned, ``"pytorch_sdpa:<backend>"``
    attention: _Field[str | None] = _Field(None)
    #: fused projections (a count), or why not (``NOT_APPLIED_DYNAMIC``); 0 when off
    qkv_fusion: _Field[int | str] = _Field(0)
    #: channels-last applied (True), off (False), or why not (``NOT_APPLIED_DYNAMIC``)
    channels_last: _Field[bool | str] = _Field(False)
    #: weight quantization ``{"mode", "layers", "torchao"}``; None when off
    quantize: _Field[dict[str, Any] | None] = _Field(None)
    #: the compile this clone carries: scope, its record's creation time and summary (``nodes.patches.compile``)
    compile: _Field[dict[str, Any] | None] = _Field(None)

    def __init__(self, store: dict[str, Any]) -> None:
        self.store = store


def steadfast_options(model) -> SteadfastOptions:
    """The :class:`SteadfastOptions` of a ModelPatcher (its dict created on first use).

    Args:
        model: a ComfyUI ``ModelPatcher`` (usually a clone made by a Steadfast node).
    Returns:
        the live view (writes land on ``model`` only, not on its clones or the model it was cloned from); all
        defaults for a model no Steadfast node has touched.
    Raises:
        TypeError: ``model_options["steadfast"]`` holds something other than a dict (another pack's key).
    """
    store = model.model_options.setdefault(OPTIONS_KEY, {})
    if not isinstance(store, dict):
        raise TypeError(f"model_options[{OPTIONS_KEY!r}] holds a {type(store).__name__}, not Steadfast's options")
    return SteadfastOptions(store)
