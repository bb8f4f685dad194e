"""Dynamo guard filters for ComfyUI's ``transformer_options``: which guards a compiled block keeps.

Passed as ``torch.compile(options={"guard_filter_fn": f})``. ComfyUI hands every block a ``transformer_options``
dict whose entries (sigmas, block indices, uuids) change every step; guarding on them recompiles every step.
Filters are frozen dataclasses: equal settings compare equal, so the registry can reuse compiled blocks."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

#: ``guard_filter_fn(entries) -> [keep?]``, one bool per Dynamo ``GuardFilterEntry`` (``.name``, ``.value``).
GuardFilterFn = Callable[[Sequence[Any]], Sequence[bool]]


@dataclasses.dataclass(frozen=True)
class SkipGuardsOn:
    """Keeps the guards whose name lacks ``substring`` (ComfyUI's ``TorchCompileModel``): a late patch is then silently
    ignored (``tests/comfy/test_architectures.py::test_guard_filter_keeps_per_block_patches_correct``)."""

    substring: str = "transformer_options"

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        return [self.substring not in getattr(e, "name", "") for e in entries]


def _has_leaf(value: Any) -> bool:
    """True when a (nested) dict/list/tuple holds anything that is not an empty container."""
    if isinstance(value, (dict, list, tuple)):
        return any(map(_has_leaf, value.values() if isinstance(value, dict) else value))
    return value is not None


@dataclasses.dataclass(frozen=True)
class TransformerOptionsGuardFilter:
    """Drops the guards under ``substring`` except those that pick code: on the dict itself (a ``patches`` key added
    later recompiles), under a key in ``code_keys``, and ALL guards when the traced dict held a non-empty ``patches``/
    ``patches_replace`` (a patch may read anything, e.g. the block index: a graph per block, not wrong output)."""

    substring: str = "transformer_options"
    code_keys: tuple[str, ...] = ("patches", "patches_replace", "optimized_attention_override")

    def _key(self, name: str) -> str | None:
        """First subscript after ``substring`` in a guard name ("" for the dict itself, None if absent)."""
        m = re.search(re.escape(self.substring) + r"""['"\])]*(?:\[['"]*([^'"\]]*))?""", name)
        return None if m is None else m.group(1) or ""

    def _patched(self, key: str | None, entry: Any) -> bool:
        if key is None or not getattr(entry, "has_value", False):
            return False
        if key == "" and isinstance(entry.value, dict):
            return _has_leaf(entry.value.get("patches")) or _has_leaf(entry.value.get("patches_replace"))
        return key in ("patches", "patches_replace") and _has_leaf(entry.value)

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        keys = [self._key(getattr(e, "name", "")) for e in entries]
        if any(self._patched(k, e) for k, e in zip(keys, entries)):
            return [True] * len(entries)
        return [k is None or k == "" or k in self.code_keys for k in keys]


#: ``comfy_guard_filter()``: the guard filter for ComfyUI models (what the Optimize node uses).
comfy_guard_filter = TransformerOptionsGuardFilter
