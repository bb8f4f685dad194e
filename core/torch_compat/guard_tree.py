"""The pack's own per-call checks as a tree of Dynamo's C++ guards (``torch._C._dynamo.guards.RootGuardManager``).

Part of :mod:`core.torch_compat` (its face re-exports every public name); no ComfyUI imports.

A precompiled block re-checks, on every call, what its artifact cannot carry: the code its trace ran and the
Dynamo guards torch cannot serialise (:mod:`core.compile.warm.traced_code`, :mod:`core.compile.warm.carried_guards`).
Read by a Python plan, 123 of them cost about 90 us per block call quiet and 240 us in a run (docs/benchmarks.md
section 22); as leaves of a C++ guard tree, built once per loaded answer with torch's own accessors
(``dict_getitem_manager``, ``getattr_manager``, ``type_manager``...) and leaves (``add_id_match_guard``,
``add_equals_match_guard``...), the same checks run inside torch's guard evaluator (docs/benchmarks.md section 25).
Only a check with no C++ leaf (a comparison of two sources, ordered keys) stays a Python lambda inside the tree.

:class:`GuardTree` is the builder and the tree; its root's value is the dict of the call's locals by name (the
binder's environment), the same dict the artifact's own tree is evaluated with. Built on an artifact's tree
(``GuardTree(extend=manager)``), it starts from a copy of it (``RootGuardManager.clone_manager``, the copy Dynamo
makes for its own guard filtering): the pack's leaves join torch's, and one ``check`` runs both. A copy, because a
loaded artifact may answer several variants (block positions whose graphs are byte-equal), each with its own carried
values. The pack's checks reach the call's locals through an accessor of their own (:meth:`GuardTree.frame`), not
torch's: torch guards a dict input such as ``transformer_options`` with a ``DictGuardManager``, which takes no
accessor by key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .base import TorchAPIMissing, _api


class GuardTree:
    """A C++ guard tree under construction, then checked. Managers are opaque handles returned by the accessors;
    every leaf names the check in ``parts`` (what :meth:`failure` reports).

    Raises :class:`TorchAPIMissing` from the constructor when Dynamo's C++ guards are gone, and ``TypeError`` /
    ``RuntimeError`` from a builder method torch does not support in this form (the caller then keeps its Python
    checks).
    """

    def __init__(self, extend: Any = None) -> None:
        """Args:
        extend: an artifact's guard tree (a ``GuardManagerWrapper`` or its ``RootGuardManager``) to start from a
            copy of; None starts empty.
        Raises:
            TorchAPIMissing: Dynamo's C++ guards, or ``clone_manager`` with ``extend``, are gone.
            RuntimeError: the copy does not hold every leaf of ``extend`` (torch changed what ``clone_manager``
                copies; the caller keeps the two trees apart).
        """
        guards = _api("torch._C._dynamo", "guards", "precompiled blocks (the per-call checks as C++ guards)")
        kinds = _api("torch._dynamo.guards", "GuardManagerType", "precompiled blocks (C++ guard managers)")
        self._kind = kinds.GUARD_MANAGER
        self._leaves = 0
        self._kept: list[Any] = []
        self._frame: Any = None
        self._holder: dict[str, Any] = {}  # the constants' values, read by C++ accessors (constant)
        self._holder_manager: Any = None
        self._constants: dict[str, tuple[Any, Any]] = {}
        self._extended = extend is not None
        if extend is None:
            self.root = guards.RootGuardManager()
            return
        base = getattr(extend, "root", extend)
        if not callable(getattr(base, "clone_manager", None)):
            raise TorchAPIMissing(
                f"torch {torch.__version__}: RootGuardManager.clone_manager is gone; the precompiled blocks' checks "
                "need it to join an artifact's guard tree (they run as a tree of their own)"
            )
        self.root = base.clone_manager(lambda _manager: True)
        if self.root is None or leaf_count(self.root) != leaf_count(base):
            raise RuntimeError("clone_manager did not copy every guard of the artifact's tree")
        self._leaves = leaf_count(self.root)

    def _leaf(self, add: Callable[..., None], *args: Any, parts: str) -> None:
        try:  # torch 2.11 takes a user stack after the code parts, torch 2.14 may not
            add(*args, [parts], None)
        except TypeError:
            add(*args, [parts])
        self._leaves += 1

    # ------------------------------------------------------------------ accessors (managers)
    def frame(self, example: dict[str, Any]) -> Any:
        """The manager whose value is the call's locals (the dict the tree is checked with): the root of a tree
        built empty; in a copy of an artifact's tree, an accessor of the pack's own under the root (a lambda giving
        the root's value), so that no manager of the pack's is one of torch's (torch's ``DictGuardManager`` of a dict
        input takes no accessor by key)."""
        if self._frame is None:
            if self._extended:
                self._frame = self.root.lambda_manager(_itself, "L (the pack's checks)", example, self._kind)
            else:
                self._frame = self.root
        return self._frame

    def item(self, parent: Any, key: Any, source: str, example: Any) -> Any:
        """The manager of ``parent_value[key]`` (a dict: ``dict_getitem_manager``; else ``getitem_manager``)."""
        if isinstance(example, dict) or parent is self.root or parent is self._frame:
            return parent.dict_getitem_manager(key, source, example, self._kind)
        return parent.getitem_manager(key, source, example, self._kind)

    def attr(self, parent: Any, name: str, source: str, example: Any) -> Any:
        """The manager of ``getattr(parent_value, name)``."""
        return parent.getattr_manager(name, source, example, self._kind)

    def type_of(self, parent: Any, source: str, example: Any) -> Any:
        """The manager of ``type(parent_value)``."""
        return parent.type_manager(source, example, self._kind)

    def constant(self, value: Any, source: str) -> Any:
        """A manager whose value is ``value`` (a module, a class, a dict the pack holds): an entry of a dict the tree
        holds, read in C++ (``globals_dict_manager`` over it, the accessor Dynamo gives a frame's globals, then
        ``dict_getitem_manager``); a Python lambda where torch lacks that accessor. One manager per object."""
        key = f"c{id(value)}"
        if key in self._constants:
            return self._constants[key][1]
        if self._holder_manager is None and callable(getattr(self.root, "globals_dict_manager", None)):
            self._holder_manager = self.root.globals_dict_manager(
                self._holder, "the pack's constants", self._holder, self._kind
            )
        if self._holder_manager is not None:
            self._holder[key] = value
            manager = self._holder_manager.dict_getitem_manager(key, source, value, self._kind)
        else:
            manager = self.root.lambda_manager(lambda _: value, source, value, self._kind)
        self._constants[key] = (value, manager)  # holds value alive with its manager
        return manager

    def class_dict(self, parent: Any, source: str, example: Any) -> Any:
        """The manager of a class's own ``__dict__`` as the dict it is (``type_dict_manager``; ``getattr`` gives a
        read-only proxy, on which torch's dict leaves do not work)."""
        return parent.type_dict_manager(source, example, self._kind)

    def keep(self, obj: Any) -> None:
        """Hold ``obj`` alive as long as the tree (an identity leaf compares its ``id``)."""
        self._kept.append(obj)

    # ------------------------------------------------------------------ leaves
    def is_(self, manager: Any, obj: Any, parts: str) -> None:
        """The value is ``obj`` (identity; the caller keeps ``obj`` alive)."""
        self._leaf(manager.add_id_match_guard, id(obj), parts=parts)

    def type_is(self, manager: Any, cls: type, parts: str) -> None:
        """``type(value) is cls``."""
        self._leaf(manager.add_type_match_guard, id(cls), parts=parts)

    def equals(self, manager: Any, value: Any, parts: str) -> None:
        """``value == value`` (after :meth:`type_is`: equal values of one type)."""
        self._leaf(manager.add_equals_match_guard, value, parts=parts)

    def length(self, manager: Any, n: int, example: Any, parts: str) -> None:
        """``len(value) == n``."""
        if isinstance(example, dict):
            self._leaf(manager.add_dict_length_check_guard, n, parts=parts)
        else:
            self._leaf(manager.add_length_check_guard, n, parts=parts)

    def absent(self, manager: Any, key: Any, parts: str) -> None:
        """``key not in value`` (a dict: ``add_dict_contains_guard``)."""
        self._leaf(manager.add_dict_contains_guard, False, key, parts=parts)

    def contains(self, manager: Any, key: Any, present: bool, parts: str) -> None:
        """``(key in value) == present`` (a dict: ``add_dict_contains_guard``)."""
        self._leaf(manager.add_dict_contains_guard, bool(present), key, parts=parts)

    def holds(self, manager: Any, test: Callable[[Any], bool], parts: str) -> None:
        """``test(value)`` is true: a Python lambda leaf (for a check with no C++ leaf)."""
        self._leaf(manager.add_lambda_guard, test, parts=parts)

    # ------------------------------------------------------------------ use
    @property
    def leaves(self) -> int:
        """How many checks the tree holds."""
        return self._leaves

    def check(self, f_locals: dict[str, Any]) -> bool:
        """Every check passes for the call's locals."""
        return bool(self.root.check(f_locals))

    def failure(self, f_locals: dict[str, Any]) -> str:
        """The failed check's text (its ``parts``), or ``"?"``."""
        try:
            parts = getattr(self.root.check_verbose(f_locals), "verbose_code_parts", None) or []
        except Exception as e:  # noqa: BLE001 (a reason, never an error)
            return f"check_verbose raised {type(e).__name__}"
        return "; ".join(str(p) for p in parts)[:300] or "?"


def _itself(value: Any) -> Any:
    return value


def leaf_count(manager: Any) -> int:
    """How many checks a C++ guard tree holds: the leaves of ``manager`` (a ``RootGuardManager`` or any manager
    under it; a ``GuardManagerWrapper``: its root) and of every manager under it, epilogue leaves included."""
    manager = getattr(manager, "root", manager)
    n = len(manager.get_leaf_guards())
    epilogue = getattr(manager, "get_epilogue_lambda_guards", None)
    if callable(epilogue):
        n += len(epilogue())
    return n + sum(leaf_count(child) for child in manager.get_child_managers())


def guard_tree_support() -> bool:
    """Whether this torch has the C++ guard builders :class:`GuardTree` uses (never raises)."""
    try:
        GuardTree()
    except (TorchAPIMissing, AttributeError, TypeError, RuntimeError):
        return False
    return hasattr(torch, "_C")
