"""A package's face without import cost: names resolved from their modules on first access (PEP 562).

No package of ``core`` should import all of its modules to hand on a few names: the pack's ``__init__`` imports
``core.determinism.cublas`` and ``.portable`` at start-up, and nothing else of that package should load with them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that returns ``names[name]``'s attribute ``name``.

    Args:
        package: the package's ``__name__`` (relative module names are resolved against it).
        names: ``{public name: relative module}``, e.g. ``{"seeded_noise": ".noise"}``.

    Returns:
        ``__getattr__(name)``: imports the module on first use and returns its attribute.

    Raises:
        AttributeError: (from the returned function) for a name not in ``names``, as a module would.
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
