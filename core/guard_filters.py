"""Dynamo guard filters for ComfyUI's ``transformer_options``: which guards a compiled block keeps.

``torch.compile(options={"guard_filter_fn": f})`` lets a filter drop guards
(:func:`core.torch_compat.supports_guard_filter_fn`). ComfyUI hands every block a ``transformer_options`` dict whose entries (sigmas, block indices, uuids) change every
step; guarding on them recompiles every step. :class:`SkipGuardsOn` drops all of them (ComfyUI's own
``TorchCompileModel`` behaviour); :class:`TransformerOptionsGuardFilter` (:func:`comfy_guard_filter`, what the
Optimize node uses) keeps the ones that pick code (patches, attention override). Filters are frozen dataclasses,
so equal settings compare equal (the registry reuses compiled blocks only for equal filters). No ComfyUI imports.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["GuardFilterFn", "SkipGuardsOn", "TransformerOptionsGuardFilter", "comfy_guard_filter"]

#: ``guard_filter_fn(entries) -> [keep?]`` with one bool per Dynamo ``GuardFilterEntry``.
GuardFilterFn = Callable[[Sequence[Any]], Sequence[bool]]


@dataclasses.dataclass(frozen=True)
class SkipGuardsOn:
    """Guard filter keeping every Dynamo guard whose name does NOT contain ``substring``.

    Callable as ``guard_filter_fn(entries) -> list[bool]`` (``entries`` are Dynamo
    ``GuardFilterEntry`` objects with a ``.name``). A dataclass rather than a closure so two filters
    for the same substring compare equal (the registry reuses compiled blocks only for equal
    settings). Source: ComfyUI's ``TorchCompileModel`` drops guards on ``transformer_options``,
    whose entries (sigmas, block indices...) change every step and would otherwise recompile.

    Dropping a guard is only safe for values that do not change the traced computation.
    """

    substring: str = "transformer_options"

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        return [self.substring not in getattr(e, "name", "") for e in entries]


def _has_leaf(value: Any) -> bool:
    """True when a (nested) dict/list/tuple holds anything that is not an empty container."""
    if isinstance(value, dict):
        return any(_has_leaf(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_leaf(v) for v in value)
    return value is not None


@dataclasses.dataclass(frozen=True)
class TransformerOptionsGuardFilter:
    """Guard filter for ComfyUI's ``transformer_options``: drops the volatile guards, keeps the ones that pick code.

    :class:`SkipGuardsOn` (what ComfyUI's own ``TorchCompileModel`` does) drops *every* guard under
    ``transformer_options``. Measured: on ComfyUI's own SD1.5 UNet (small, seeded), an ``attn2``
    replace patch on one block added after warm-up was silently ignored (compiled vs eager-with-patch
    max |d| 0.013, zero recompiles); on a synthetic block looking patches up by block index, the
    graph traced for block 0 was reused for block 3. This filter keeps, for each traced frame:

    * guards on the ``transformer_options`` dict itself (its key set: a ``patches`` /
      ``patches_replace`` key appearing later forces a recompile instead of being ignored);
    * every guard under a key in ``code_keys`` (``patches``, ``patches_replace``,
      ``optimized_attention_override``: changing the attention function or a patch recompiles);
    * ALL guards, when the traced ``transformer_options`` held any patch (non-empty ``patches`` /
      ``patches_replace``): patches may read block indices, ``cond_or_uncond`` ..., so nothing is
      assumed. Per-block patches then cost one graph per block (past ``recompile_limit`` Dynamo runs
      the rest eagerly, which the registry reports) instead of wrong output.

    Everything else under ``transformer_options`` (block indices, sigmas, cond_or_uncond, uuids,
    shapes ...) is dropped, as before. A frozen dataclass: equal settings compare equal (the registry
    reuses compiled blocks only for equal filters). Callable as ``guard_filter_fn(entries)``.
    """

    substring: str = "transformer_options"
    code_keys: tuple[str, ...] = ("patches", "patches_replace", "optimized_attention_override")

    def _key(self, name: str) -> str | None:
        """First subscript after ``substring`` in a guard name ("" for the dict itself, None if absent)."""
        i = name.find(self.substring)
        if i < 0:
            return None
        rest = name[i + len(self.substring):].lstrip("']\")")
        if not rest.startswith("["):
            return ""
        rest = rest[1:].lstrip("'\"")
        return rest.split("'", 1)[0].split('"', 1)[0].split("]", 1)[0]

    def _patched(self, entry: Any) -> bool:
        key = self._key(getattr(entry, "name", ""))
        if key is None or not getattr(entry, "has_value", False):
            return False
        value = entry.value
        if key == "" and isinstance(value, dict):
            return _has_leaf(value.get("patches")) or _has_leaf(value.get("patches_replace"))
        return key in ("patches", "patches_replace") and _has_leaf(value)

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        if any(self._patched(e) for e in entries):
            return [True] * len(entries)
        keep = []
        for e in entries:
            key = self._key(getattr(e, "name", ""))
            keep.append(key is None or key == "" or key in self.code_keys)
        return keep


def comfy_guard_filter() -> TransformerOptionsGuardFilter:
    """The guard filter to use with ComfyUI models (see :class:`TransformerOptionsGuardFilter`)."""
    return TransformerOptionsGuardFilter()
