"""Per key, the recorded variants of a precompiled block and the answers loaded from them.

A variant (``precompiled/<key digest>.json``, newest first, at most :data:`MAX_VARIANTS`) is one configuration
saved: the code its trace ran, by path and digest (:mod:`.traced_code`), the guards the pack carries
(:mod:`.carried_guards`), and its artifact (``precompiled/<sha256 of its bytes>.pt2``) or the reasons it was
refused. :func:`match_variant` says whether one is what the jit would trace in this process now; an :class:`Answer`
is a loaded artifact with the checks that must still hold on each call (:func:`checks_tree`). No ComfyUI imports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ... import torch_compat
from . import cache as compile_cache
from . import carried_guards, traced_code
from .call_key import KEY_FORMAT
from .carried_guards import NotDescribable as _NotDescribable
from .hooks import build_hook_checks

__all__ = [
    "specialisation",
    "has_specialisation",
    "PRECOMPILED_DIR",
    "MAX_VARIANTS",
    "Answer",
    "checks_tree",
    "variant_digest",
    "read_variants",
    "add_variant",
    "match_variant",
]

#: Folder under the compile cache's key directory holding the artifacts (recorded like every other file).
PRECOMPILED_DIR = "precompiled"


MAX_VARIANTS = 64  # configurations kept per key, the oldest goes first (one per block position a trace reads)


def checks_tree(
    matched: carried_guards.Matched,
    code: traced_code.CodeIdentity,
    env: dict[str, Any],
    module: nn.Module,
    extend: Any = None,
) -> Any:
    """The pack's per-call checks of an answer built into a tree of Dynamo's C++ guards
    (:class:`core.torch_compat.GuardTree`), evaluated with the call's environment: the traced code's identity
    (:func:`core.compile.warm.traced_code.build_tree`), the carried guards
    (:func:`core.compile.warm.carried_guards.build_tree`) and the hooks the route cannot run
    (:func:`core.compile.warm.hooks.build_hook_checks`, on ``module``, the block, for the call's grad mode: built
    with grad off, the tree checks that grad is still off instead of the backward hooks).

    Args:
        matched, code: what the variant matched in this process (:func:`match_variant`).
        env: the call's environment (:class:`core.compile.warm.carried_guards.Binder`).
        module: the block.
        extend: the artifact's guard tree (:func:`core.torch_compat.artifact_guard_manager`): the checks join a copy
            of it, and one ``check`` runs torch's guards and the pack's; None builds the pack's alone.
    Returns:
        the tree, or None when torch cannot build a part of it or the tree does not pass where the checks it is
        built from just did (the route then keeps the Python checks:
        :meth:`core.compile.warm.traced_code.CodeIdentity.still`,
        :meth:`core.compile.warm.carried_guards.Matched.still`, :func:`core.compile.warm.hooks.hooks_reason`, and
        the artifact's own tree).
    """
    try:
        tree = torch_compat.GuardTree(extend)
        traced_code.build_tree(tree, code)
        carried_guards.build_tree(tree, matched, env, code.module_functions())  # the code leaves pin those
        build_hook_checks(tree, module, torch.is_grad_enabled())  # the call's grad mode (hooks.py)
        return tree if tree.check(env) else None
    except (torch_compat.TorchAPIMissing, _NotDescribable, TypeError, RuntimeError, LookupError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class Answer:
    """A loaded artifact and what must still hold for it to answer a call: ``fn`` (torch's loaded function, its own
    guard check done by the route), ``matched`` (the carried guards,
    :class:`core.compile.warm.carried_guards.Matched`), ``code`` (the traced code,
    :class:`core.compile.warm.traced_code.CodeIdentity`), ``variant`` (its id, 32 hex), ``root`` (the path of the
    traced root ``forward``), ``manager`` (the artifact's C++ guard tree,
    :func:`core.torch_compat.artifact_guard_manager`; None: torch's ``guard_check``) and ``checks`` (the pack's own
    per-call checks, the traced code and the carried guards, as a tree of C++ guards: :func:`checks_tree`; None:
    their Python checks) and ``combined`` (torch's guards of the artifact and the pack's checks in one tree, a copy of
    the artifact's with the pack's leaves added: :func:`checks_tree` with ``extend``; what the route evaluates per
    call when it exists, :meth:`passes`)."""

    fn: Any
    matched: carried_guards.Matched
    code: traced_code.CodeIdentity
    variant: str
    root: str
    manager: Any = None
    checks: Any = None
    combined: Any = None

    def passes(self, env: Mapping[str, Any]) -> bool:
        """Every check of the answer at once, torch's and the pack's, in the one tree :attr:`combined` (False without
        it: the caller then runs :meth:`holds` and :meth:`guards_pass`)."""
        return self.combined is not None and self.combined.check(env)

    def holds(self, env: Mapping[str, Any]) -> bool:
        """The traced code is still what this process runs and the carried guards still read what they matched
        (``env``: the call's environment, :class:`core.compile.warm.carried_guards.Binder`); with :attr:`checks`,
        also that no hook the route cannot run is set (without, the route walks the hooks itself)."""
        if self.checks is not None:
            return self.checks.check(env)
        if not self.code.still():
            return False
        return not self.matched.guards or self.matched.still(env)

    def guards_pass(self, env: dict[str, Any], module: nn.Module, args: tuple, kwargs: dict) -> tuple[bool, str]:
        """torch's guards of the artifact: its guard tree evaluated with the call's environment (``env``, the
        :class:`core.compile.warm.carried_guards.Binder`'s: the frame's locals by name, no signature binding), or
        ``guard_check`` without a tree. Returns ``(passed, why not)``, the failed guard named."""
        try:
            if self.manager is not None:
                if self.manager.check(env):
                    return True, ""
                return False, f"torch's guard_check failed: {torch_compat.guard_failure(self.manager, env)}"
            if self.fn.guard_check(module, *args, **kwargs):
                return True, ""
        except Exception as e:  # noqa: BLE001 (any failure: the jit answers)
            return False, f"guard_check raised {type(e).__name__}: {str(e)[:200]}"
        return False, (
            "torch's guard_check failed: an input or a module attribute differs from what the artifact was traced for"
        )


def variant_digest(digest: str, variant: Mapping[str, Any]) -> str:
    """The id (32 hex) of a variant of key ``digest``: sha256 of the key, the variant's traced code and carried
    guards (its artifact is named by the sha256 of its own bytes)."""
    body = json.dumps({"key": digest, "code": variant["code"], "guards": variant["guards"]}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def read_variants(cache: compile_cache.CompileCache, digest: str) -> tuple[list[dict], str | None]:
    """The variants recorded for key ``digest`` (``precompiled/<digest>.json``, read only when recorded with its
    sha256), newest first: ``([], None)`` without a record, ``([], reason)`` for an untrusted or unreadable one."""
    data, problem = cache.read_trusted(f"{PRECOMPILED_DIR}/{digest}.json")
    if problem is not None or data is None:
        return [], problem
    try:
        body = json.loads(data)
        variants = [
            v
            for v in body["variants"]
            if isinstance(v.get("code"), dict)
            and isinstance(v.get("guards"), list)
            and isinstance(v.get("id"), str)
            and (isinstance(v.get("artifact"), str) or isinstance(v.get("refused"), list))
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return [], f"unreadable variant record ({type(e).__name__})"
    return variants, None


def add_variant(cache: compile_cache.CompileCache, digest: str, variant: dict) -> None:
    """Put ``variant`` first in key ``digest``'s record (replacing one with the same id; at most
    :data:`MAX_VARIANTS`), under the cache's cross-process lock. Raises ``OSError``."""
    rel = f"{PRECOMPILED_DIR}/{digest}.json"
    with cache.locked():
        variants, _ = read_variants(cache, digest)
        kept = [variant, *(v for v in variants if v["id"] != variant["id"])][:MAX_VARIANTS]
        cache.write_recorded(rel, json.dumps({"format": KEY_FORMAT, "variants": kept}, sort_keys=True).encode())


def match_variant(
    variant: Mapping[str, Any], env: Mapping[str, Any]
) -> tuple[tuple[carried_guards.Matched, traced_code.CodeIdentity] | None, str | None]:
    """Whether a variant is what the jit would trace now: every traced code path resolves in this process to a
    function with the recorded digest (:func:`core.compile.warm.traced_code.resolve`) and every carried guard reads the
    recorded value. Returns ``((Matched, CodeIdentity), None)`` or ``(None, reason)``, the reason naming every path
    that differs."""
    code, problems = traced_code.resolve(variant["code"])
    if code is None:
        return None, "; ".join(problems)
    try:
        guards = [carried_guards.CarriedGuard.from_list(g) for g in variant["guards"]]
    except TypeError:
        return None, "unreadable carried guards"
    matched, why = carried_guards.match(guards, env)
    if matched is None:
        return None, why
    return (matched, code), None


def specialisation(guards: list[carried_guards.CarriedGuard]) -> tuple[tuple[str, str], ...]:
    """The ``transformer_options`` values a variant's trace specialised on: ``((source, value text), ...)`` of its
    carried equality guards on ``transformer_options`` (ComfyUI's ``block``, ``block_index``... when a block reads
    them): blocks that share a key but hold other values need other variants."""
    return tuple((g.source, g.value) for g in guards if g.kind == "eq" and "transformer_options" in g.source)


def has_specialisation(specialisations: list[tuple[tuple[str, str], ...]], env: Mapping[str, Any]) -> bool:
    """Whether the call's environment holds the values of one of ``specialisations`` (:func:`specialisation`; an
    empty one holds for every call). A source that does not read counts as another value."""
    for spec in specialisations:
        try:
            if all(carried_guards.describe_value(carried_guards.read_source(src, env)) == v for src, v in spec):
                return True
        except Exception:  # noqa: BLE001 (not readable here: another configuration)
            continue
    return False
