"""Precompiled regional blocks: a per-block layer in front of the jit-compiled block that loads torch's
``aot_compile`` artifact from the trusted compile cache when it is what the jit would trace now, else runs the jit.

What decides that an artifact answers a call, all of it checked before each use:

* the key (:func:`call_key`, :func:`key_digest`): the block's classes and submodules, and the digest of the code of
  ``type(block).forward`` (:func:`block_fingerprint`); the call's inputs (shapes, dtypes, strides, devices), the
  structure of ``transformer_options`` and the identity of every callable under its code keys; the global torch flags,
  Dynamo's and inductor's config (:func:`core.torch_compat.compile_config_digest`), the switches a trace reads that
  torch does not guard (:func:`core.torch_compat.trace_state`: SDPA backends, ``opt_einsum``, ``mkldnn``, functorch's
  config); the compile settings, torch, Python, the pack, and the host's versions (:func:`host_versions`: ComfyUI,
  comfy-kitchen, comfy-aimdo, einops);
* per key, a record of variants (``precompiled/<key>.json``), one per configuration saved: every code object the
  trace ran, by the path through which this process reaches it, with the digest of the function found there
  (:mod:`core.compile.traced_code`; never a file on disk), and the guards the artifact cannot carry, carried by the
  pack (:mod:`core.compile.carried_guards`: module globals, closures, callables, ``type(...)``, ``weight_function``
  lists, and the ``transformer_options`` values the trace specialised on, by value); a variant answers only when
  all of them read the same now, and the code is re-checked by identity on every call. Its artifact is
  ``precompiled/<sha256 of its bytes>.pt2``, written once (content-addressed: two servers saving the same variant
  at once write the same name with their own bytes, and neither overwrites a file another may be reading);
* torch's own ``guard_check`` of the guards the artifact carries (submodule hooks, instance ``forward``s, shapes);
* the block itself has no hooks and no instance ``forward`` (the route calls the class's ``forward``), and no
  process-wide module hooks are set.

Anything else runs the jit path, with the reason recorded once per key (:class:`PrecompiledState`); a call whose
configuration has no artifact yet queues one. No ComfyUI imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .. import torch_compat
from ..failures import passes_through
from . import cache as compile_cache
from . import carried_guards, traced_code
from .carried_guards import NotDescribable as _NotDescribable
from .carried_guards import describe_callable
from .guards import GuardFilterFn
from .options import CompileOptions
from .recompiles import guarded_flags

__all__ = [
    "PRECOMPILED_DIR",
    "PrecompiledState",
    "PrecompiledBlock",
    "call_key",
    "describe_callable",
    "block_fingerprint",
    "host_versions",
    "MAX_VARIANTS",
]

log = logging.getLogger("steadfast.precompiled")

#: Folder under the compile cache's key directory holding the artifacts (recorded like every other file).
PRECOMPILED_DIR = "precompiled"
#: 3: the global flags are read outside the blocks' compile contexts (torch_compat.while_compiling); 4: identity from
#: the traced code (no file digests), the trace state in the flags, content-addressed artifacts
KEY_FORMAT = 4
MAX_VARIANTS = 8  # configurations kept per key (the oldest goes first)
#: Distributions whose code a ComfyUI block's trace can inline (their version is in the key).
HOST_DISTRIBUTIONS = ("comfy-kitchen", "comfy-aimdo", "einops")
#: The host's version module, read when it is loaded (ComfyUI's ``comfyui_version``; never imported here).
HOST_VERSION_MODULES = ("comfyui_version",)
MAX_PENDING = 64  # queued saves (each holds one call's inputs) until PrecompiledState.flush
#: the phases of a block call through the route whose wall seconds :class:`PrecompiledState` sums (where a steady
#: step's per-call cost goes): the hook walk (:func:`hooks_reason`), the call key (:func:`call_key`), the
#: carried guards' re-check, torch's ``guard_check`` of the artifact, and the artifact's own call (its kernels)
SPLIT_PHASES = ("hooks", "key", "carried", "guard_check", "artifact")
#: devices the route has passed its checks on (tests/core/test_precompiled_differential.py, the server cases). On any
#: other (CUDA first) it is opt-in, ``$STEADFAST_PRECOMPILED=1``, until a GPU run has passed.
TRIED_DEVICES = ("cpu",)
_SIMPLE = (str, int, float, bool, type(None))
#: Dynamo guard types that specialise a trace on a value: on a ``transformer_options`` entry the jit's filter drops
#: them (one graph for every step), and the route carries them by value (another process may hold another value)
SPECIALISING_GUARDS = ("CONSTANT_MATCH", "EQUALS_MATCH")


_dtype_text: dict[torch.dtype, str] = {}
_device_text: dict[torch.device, str] = {}


def _describe_tensor(t: torch.Tensor) -> tuple:
    dtype, device = t.dtype, t.device  # their text memoised per object (str() of a device costs microseconds)
    dt = _dtype_text.get(dtype) or _dtype_text.setdefault(dtype, str(dtype))
    dev = _device_text.get(device) or _device_text.setdefault(device, str(device))
    return ("T", type(t).__qualname__, tuple(t.shape), t.stride(), dt, dev, t.requires_grad, t.is_inference())


def _describe(v: Any, code_key: bool) -> Any:
    """Hashable description of one call value. ``code_key``: inside a ``transformer_options`` key whose guards the
    jit keeps (patches, attention override): leaves by value, callables by :func:`describe_callable`; elsewhere
    ints/floats/strings by type and callables by name (the jit guard filter drops their guards there, and so does
    the precompiled one). Dispatches on the exact type first (a block call describes a dozen values, per call)."""
    kind = type(v)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return _describe_tensor(v)
    if kind is bool or v is None:
        return v
    if kind is dict:
        return ("D", tuple((k if isinstance(k, _SIMPLE) else repr(k), _describe(x, code_key)) for k, x in v.items()))
    if kind is list or kind is tuple:
        return (kind.__name__, tuple(_describe(x, code_key) for x in v))
    if kind is str or kind is int or kind is float:
        return v if code_key else kind.__name__
    if isinstance(v, torch.Tensor):
        return _describe_tensor(v)
    if isinstance(v, _SIMPLE):
        return v if code_key else type(v).__name__
    if isinstance(v, dict):
        return ("D", tuple((k if isinstance(k, _SIMPLE) else repr(k), _describe(v[k], code_key)) for k in v))
    if isinstance(v, torch.dtype | torch.device):
        return str(v)
    if callable(v) and code_key:
        return ("F", describe_callable(v))
    if callable(v):  # outside the code keys (ComfyUI's wrappers, callbacks): the jit drops their guards too
        return ("F", getattr(v, "__module__", None), getattr(v, "__qualname__", type(v).__qualname__))
    if not code_key:
        return ("O", type(v).__module__, type(v).__qualname__)
    raise _NotDescribable(f"{type(v).__qualname__} in transformer_options' code keys")


def _transformer_options(v: Mapping[str, Any], code_keys: Sequence[str]) -> Any:
    for k in ("patches", "patches_replace"):
        if _has_leaf(v.get(k)):
            raise _NotDescribable(
                f"transformer_options[{k!r}] is not empty (the jit keeps every guard then: a graph per value)"
            )
    return ("TO", tuple((str(k), _describe(v[k], k in code_keys)) for k in v))


def _has_leaf(value: Any) -> bool:
    if isinstance(value, dict | list | tuple):
        return any(map(_has_leaf, value.values() if isinstance(value, dict) else value))
    return value is not None


def block_fingerprint(module: nn.Module) -> dict[str, Any]:
    """What a block's trace depends on besides its inputs that is known before the trace, computed per block (again
    when ``type(module).forward`` changes): the class, every submodule's name and class, and the digest of the code of
    ``type(module).forward`` (:func:`core.compile.traced_code.root_forward`), so a process whose block class is
    patched never writes into the record of one whose class is not. Module names are portable
    (:func:`core.compile.traced_code.portable_module`): no install folder is in the key.

    Args:
        module: the original (uncompiled) block.
    Returns:
        ``{"class", "modules": [[name, "module.Qualname"], ...], "forward": [path, digest]}``.
    """
    name = traced_code.portable_module
    return {
        "class": f"{name(type(module).__module__)}.{type(module).__qualname__}",
        "modules": [[n, f"{name(type(m).__module__)}.{type(m).__qualname__}"] for n, m in module.named_modules()],
        "forward": list(traced_code.root_forward(module)),
    }


def host_versions() -> dict[str, str | None]:
    """The versions of the host's code a block's trace can inline: :data:`HOST_DISTRIBUTIONS` (None when not
    installed) and ``__version__`` of each loaded :data:`HOST_VERSION_MODULES` (ComfyUI's). Part of the key."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist in HOST_DISTRIBUTIONS:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    for name in HOST_VERSION_MODULES:
        mod = sys.modules.get(name)
        out[name] = None if mod is None else str(getattr(mod, "__version__", None))
    return out


def static_fields(options: CompileOptions, guard_filter_fn: GuardFilterFn | None = None) -> dict[str, Any]:
    """The process-constant part of the key: torch/triton/python fields of the cache key, the compile options (the
    inductor preset is in ``options.options``), the jit's guard filter (its ``repr``: the filters are frozen
    dataclasses) and :func:`host_versions`."""
    env = compile_cache.cache_key_fields("cpu")
    env.pop("device", None)  # the call's devices are in the call description; the cache folder's key has the ISA
    return {
        "format": KEY_FORMAT,
        "env": env,
        "options": options.as_dict(),
        "guard_filter": repr(guard_filter_fn),
        "host": host_versions(),
    }


def flags_text() -> str:
    """The global torch flags compiled code depends on (:func:`core.compile.recompiles.guarded_flags`, the determinism
    flags among them), inductor's ``deterministic`` setting, the digest of Dynamo's and inductor's config
    (:func:`core.torch_compat.compile_config_digest`) and the switches a trace reads unguarded
    (:func:`core.torch_compat.trace_state`), as canonical JSON. Cost: docs/benchmarks.md section 21."""
    return json.dumps(
        [
            guarded_flags(),
            torch_compat.inductor_deterministic(load=True),
            torch_compat.compile_config_digest(),
            torch_compat.trace_state(),
        ],
        sort_keys=True,
        default=str,
    )


def untried_device(args: Sequence[Any]) -> str | None:
    """The device type of a block call's first tensor argument when it is not in :data:`TRIED_DEVICES` (``"cuda"``
    on a GPU), else None (no tensor argument included)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            kind = a.device.type
            return None if kind in TRIED_DEVICES else kind
    return None


def hooks_reason(module: nn.Module) -> str | None:
    """Why the route may not call ``type(module).forward`` for ``module``: a hook on it or on any submodule, an
    instance ``forward`` on it or a submodule, or a process-wide module hook (the jit runs them; an artifact's own
    guards do not catch a submodule's hook). None when there is none. Walks the submodules' dicts (no names
    built). Cost: docs/benchmarks.md section 21."""
    if any(_global_hooks()):
        return "a process-wide module hook is set (register_module_forward_hook...; the jit runs it)"
    stack = [module]
    while stack:
        m = stack.pop()
        d = m.__dict__
        if (
            d["_forward_hooks"]
            or d["_forward_pre_hooks"]
            or d["_backward_hooks"]
            or d["_backward_pre_hooks"]
            or "forward" in d
        ):
            return _hook_text(module, m)
        stack.extend(d["_modules"].values())
    return None


def _hook_text(block: nn.Module, m: nn.Module) -> str:
    what = "an instance forward (an object patch or another node pack)" if "forward" in m.__dict__ else "a hook"
    if m is block:
        return f"the block has {what}: the jit runs it"
    name = next((n for n, sub in block.named_modules() if sub is m), "?")
    return f"submodule {name!r} has {what}: the jit runs it"


@functools.cache
def _global_hooks() -> tuple[dict, ...]:
    return torch_compat.module_hook_dicts()


def call_key(
    fingerprint: Mapping[str, Any],
    static: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    code_keys: Sequence[str] = ("optimized_attention_override",),
    flags: str | None = None,
) -> tuple:
    """The hashable in-memory key of one block call (hash it with :func:`key_digest` for the file name).

    Args:
        fingerprint: :func:`block_fingerprint` of the block.
        static: :func:`static_fields`.
        args, kwargs: the call's arguments (after the contiguous-inputs hook). ``transformer_options`` (a dict
            argument named so, or the last positional dict): its structure, and its code keys by value.
        code_keys: ``transformer_options`` keys described by value (callables by identity).
        flags: :func:`flags_text`, when the caller has it (computed here otherwise).
    Returns:
        a nested tuple; equal keys mean an equal trace.
    Raises:
        _NotDescribable: a value the key cannot describe (patched ``transformer_options``, a callable object...).
    """

    def one(name: Any, v: Any) -> Any:
        if isinstance(v, dict) and (name == "transformer_options" or "optimized_attention_override" in v):
            return _transformer_options(v, code_keys)
        return _describe(v, True)  # an argument of the block: the jit keeps its guards

    desc = (
        tuple(one(i, a) for i, a in enumerate(args)),
        tuple((k, one(k, v)) for k, v in kwargs.items()),
        flags if flags is not None else flags_text(),
    )
    return (id(fingerprint), id(static), desc)


def key_digest(fingerprint: Mapping[str, Any], static: Mapping[str, Any], key: tuple) -> str:
    """sha256 (hex, 32 characters) of the canonical JSON of the block fingerprint, static fields and the call
    description in ``key`` (:func:`call_key`): the artifact's file name."""
    body = json.dumps({"block": fingerprint, "static": static, "call": key[2]}, sort_keys=True, default=repr)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def aot_guard_filter(jit_filter: GuardFilterFn | None, dropped: list[Any] | None = None) -> GuardFilterFn:
    """The artifact's guard filter: what the jit keeps (``jit_filter``) and torch can serialise
    (:func:`core.torch_compat.guard_serialisable`): shape, dtype, stride and constant guards stay.

    Args:
        jit_filter: the jit's guard filter (None keeps every guard).
        dropped: when given, the entries the pack carries are appended to it (:mod:`core.compile.carried_guards`):
            those the jit keeps and the artifact cannot, and the values the trace specialised on that the jit's
            filter drops (:func:`specialised`: a ``transformer_options`` entry the block read, the same in every
            step of one process and not across processes).
    """

    def keep(entries: Sequence[Any]) -> list[bool]:
        jit = [True] * len(entries) if jit_filter is None else list(jit_filter(entries))
        out = []
        for j, e in zip(jit, entries):
            ok = j and torch_compat.guard_serialisable(e)
            if dropped is not None and ((j and not ok) or (not j and specialised(e))):
                dropped.append(e)
            out.append(ok)
        return out

    return keep


def specialised(entry: Any) -> bool:
    """Whether a Dynamo guard entry pins a value the trace specialised on inside ``transformer_options`` (a constant
    or equality guard: an int, str or bool entry the block read and branched on)."""
    return getattr(entry, "guard_type", None) in SPECIALISING_GUARDS and "transformer_options" in str(
        getattr(entry, "name", "")
    )


def checks_tree(matched: carried_guards.Matched, code: traced_code.CodeIdentity, env: dict[str, Any]) -> Any:
    """The pack's per-call checks of an answer (its traced code's identity and its carried guards) built into one
    tree of Dynamo's C++ guards (:class:`core.torch_compat.GuardTree`), evaluated with the call's environment; None
    when torch cannot build one of them, or when the tree does not pass where the Python checks just did (the route
    then keeps the Python checks: :meth:`core.compile.traced_code.CodeIdentity.still`,
    :meth:`core.compile.carried_guards.Matched.still`)."""
    try:
        tree = torch_compat.GuardTree()
        traced_code.build_tree(tree, code)
        carried_guards.build_tree(tree, matched, env)
        return tree if tree.check(env) else None
    except (torch_compat.TorchAPIMissing, _NotDescribable, TypeError, RuntimeError, LookupError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class Answer:
    """A loaded artifact and what must still hold for it to answer a call: ``fn`` (torch's loaded function, its own
    guard check done by the route), ``matched`` (the carried guards, :class:`core.compile.carried_guards.Matched`),
    ``code`` (the traced code, :class:`core.compile.traced_code.CodeIdentity`), ``variant`` (its id, 32 hex),
    ``root`` (the path of the traced root ``forward``), ``manager`` (the artifact's C++ guard tree,
    :func:`core.torch_compat.artifact_guard_manager`; None: torch's ``guard_check``) and ``checks`` (the pack's own
    per-call checks, the traced code and the carried guards, as a tree of C++ guards: :func:`checks_tree`; None:
    their Python checks)."""

    fn: Any
    matched: carried_guards.Matched
    code: traced_code.CodeIdentity
    variant: str
    root: str
    manager: Any = None
    checks: Any = None

    def holds(self, env: Mapping[str, Any]) -> bool:
        """The traced code is still what this process runs and the carried guards still read what they matched
        (``env``: the call's environment, :class:`core.compile.carried_guards.Binder`)."""
        if self.checks is not None:
            return self.checks.check(env)
        if not self.code.still():
            return False
        return not self.matched.guards or self.matched.still(env)

    def guards_pass(self, env: dict[str, Any], module: nn.Module, args: tuple, kwargs: dict) -> tuple[bool, str]:
        """torch's guards of the artifact: its guard tree evaluated with the call's environment (``env``, the
        :class:`core.compile.carried_guards.Binder`'s: the frame's locals by name, no signature binding), or
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


@dataclasses.dataclass(eq=False)
class PrecompiledState:
    """One compile record's precompiled route: on/off with the reason, counts, and per-key fallback reasons.

    ``hits``: calls answered by a loaded artifact; ``loads`` / ``saves``: artifacts read from / written to the
    cache; ``fallbacks``: calls that ran the jit although the route was on; ``reasons``: ``{key digest (12 hex or
    "call"): reason}``, the first reason per key (a refusal's reason names every problem); ``answered``:
    ``{variant id (12 hex): {"root": traced root path, "checks": "guard tree" | "python", "hits": n}}``, which
    variants answered and how their per-call checks ran (:func:`checks_tree`). Thread-safe."""

    enabled: bool
    reason: str
    #: ``$STEADFAST_PRECOMPILED`` turned the route on explicitly: also on devices outside :data:`TRIED_DEVICES`
    explicit: bool = False
    hits: int = 0
    loads: int = 0
    saves: int = 0
    fallbacks: int = 0
    save_seconds: float = 0.0
    load_seconds: float = 0.0
    check_seconds: float = 0.0
    #: wall seconds per phase of the route's block calls, summed (:data:`SPLIT_PHASES`)
    split_seconds: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(SPLIT_PHASES, 0.0))
    calls: int = 0
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    answered: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    pending: list[Callable[[], None]] = dataclasses.field(default_factory=list, repr=False)
    #: (cache path, call key) -> ("aot", [Answer, ...]): the variants loaded for it, the last that answered first |
    #: ("jit", None): fallback | ("saved", None): this process's jit (a save queued) | ("new", None): no artifact
    #: for this configuration yet
    entries: dict[tuple, tuple[str, Any]] = dataclasses.field(default_factory=dict, repr=False)
    #: (cache path, variant) -> the loaded artifact (one load per variant and process)
    loaded: dict[tuple, Any] = dataclasses.field(default_factory=dict, repr=False)
    load_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    interned: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    memo_flags: str | None = dataclasses.field(default=None, repr=False)
    scoped: int = dataclasses.field(default=0, repr=False)

    @classmethod
    def detect(cls) -> PrecompiledState:
        """On when :func:`core.torch_compat.aot_compile_support` says so (``$STEADFAST_PRECOMPILED``)."""
        on, why = torch_compat.aot_compile_support()
        explicit = os.environ.get(torch_compat.PRECOMPILED_ENV, "").strip().lower() in ("1", "true", "yes", "on")
        return cls(on, why, explicit=on and explicit)

    def hit(self, answer: Answer) -> None:
        """One call answered by ``answer``: counted in ``hits`` and under its variant in ``answered``."""
        with self.lock:
            self.hits += 1
            seen = self.answered.get(answer.variant[:12])
            if seen is None and len(self.answered) < 256:
                seen = self.answered[answer.variant[:12]] = {
                    "root": answer.root,
                    "checks": "guard tree" if answer.checks is not None else "python",
                }
                seen["hits"] = 0
            if seen is not None:
                seen["hits"] += 1

    def count(self, what: str, key: str | None = None, reason: str | None = None, seconds: float = 0.0) -> None:
        """Add one to a counter, keep the first ``reason`` per key (at most 64 keys; logged at INFO).

        Args:
            what: "hits", "loads", "saves" or "fallbacks".
            key: the key digest's first 12 hex digits, or None for a call without a key ("call").
            reason: why the jit answered (fallbacks), None otherwise.
            seconds: wall seconds of a load or save (summed in ``load_seconds`` / ``save_seconds``).
        """
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)
            if what == "saves":
                self.save_seconds += seconds
            elif what == "loads":
                self.load_seconds += seconds
            if reason is not None and (key or "call") not in self.reasons and len(self.reasons) < 64:
                self.reasons[key or "call"] = reason
                log.info("Steadfast precompiled block %s: %s", key or "", reason)

    @contextlib.contextmanager
    def call_scope(self) -> Iterator[None]:
        """One model call: the global flags are read once for all its block calls (:func:`flags_text`), not per
        block; the adapter wraps each ``apply_model`` in it. Not re-entrant across threads (one model call at a
        time per record, as ComfyUI runs them)."""
        previous, self.memo_flags = self.memo_flags, None
        self.scoped += 1
        try:
            yield
        finally:
            self.scoped -= 1
            self.memo_flags = previous

    def flags(self) -> str:
        """:func:`flags_text`, memoised inside :meth:`call_scope`."""
        if not self.scoped:
            return flags_text()
        if self.memo_flags is None:
            self.memo_flags = flags_text()
        return self.memo_flags

    def intern(self, value: dict[str, Any]) -> dict[str, Any]:
        """The one object equal to ``value`` (JSON-equal) among those interned so far: blocks with equal
        fingerprints share it, hence their call keys, artifacts and saves."""
        with self.lock:
            return self.interned.setdefault(json.dumps(value, sort_keys=True, default=repr), value)

    def flush(self) -> int:
        """Run the saves queued by the calls so far (after the tracked call: their traces are not counted as the
        record's graphs). Returns how many ran. Call with the compile cache active."""
        with self.lock:
            todo, self.pending = self.pending, []
        for save in todo:
            save()
        return len(todo)

    def as_dict(self) -> dict[str, Any]:
        """JSON view: ``{"enabled", "reason", "hits", "loads", "saves", "fallbacks", "save_seconds", "load_seconds",
        "check_seconds", "calls", "split_seconds", "reasons", "answered"}`` (``check_seconds``: wall seconds of the
        per-call checks of the traced code and the carried guards, summed over every call; ``calls``: block calls
        through the route; ``split_seconds``: their wall seconds per phase, :data:`SPLIT_PHASES`)."""
        with self.lock:
            return {
                "enabled": self.enabled,
                "reason": self.reason,
                "hits": self.hits,
                "loads": self.loads,
                "saves": self.saves,
                "fallbacks": self.fallbacks,
                "save_seconds": round(self.save_seconds, 3),
                "load_seconds": round(self.load_seconds, 3),
                "check_seconds": round(self.check_seconds, 6),
                "calls": self.calls,
                "split_seconds": {k: round(v, 6) for k, v in self.split_seconds.items()},
                "reasons": dict(self.reasons),
                "answered": {k: dict(v) for k, v in self.answered.items()},
            }


class PrecompiledBlock(nn.Module):
    """A jit-compiled block (``jit``: ``torch.compile(module)`` with its hooks and contexts) behind the precompiled
    route. Called like the block. ``_orig_mod`` is the original block (as on ``torch.compile``'s wrapper).

    Route per call: without an active compile cache (:func:`core.compile.cache.active_cache`) or with the route
    off, the jit. Else the key (:func:`call_key`); an artifact in memory or in the cache (``precompiled/<key>.pt2``,
    read only when recorded and its sha256 matches: :meth:`core.compile.cache.CompileCache.read_trusted`) whose
    ``guard_check`` passes answers the call; otherwise the jit answers, and a new key queues a save
    (:meth:`PrecompiledState.flush`). Any failure is recorded and the jit answers."""

    def __init__(
        self,
        module: nn.Module,
        jit: nn.Module,
        options: CompileOptions,
        guard_filter_fn: GuardFilterFn | None,
        state: PrecompiledState,
        contexts: Sequence[Callable[[], Any]] = (),
        prepare: Callable[[tuple, dict], tuple[tuple, dict]] | None = None,
    ) -> None:
        super().__init__()
        self._orig_mod = module
        self.jit = jit
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "_jit_filter", guard_filter_fn)
        object.__setattr__(self, "_contexts", tuple(contexts))
        object.__setattr__(self, "_prepare", prepare)
        object.__setattr__(self, "_fingerprint", None)
        object.__setattr__(self, "_static", None)
        #: (cache, flags, Answer, memo key) of this block's last hit: its checks run first, without the call key
        object.__setattr__(self, "_last", None)
        object.__setattr__(self, "_root", None)  # type(module).forward and its code when the fingerprint was made
        object.__setattr__(self, "_code", None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        state, cache = self._state, compile_cache.active_cache()
        if not state.enabled or cache is None:
            return self.jit(*args, **kwargs)
        if not state.explicit and (device := untried_device(args)) is not None:
            state.count(
                "fallbacks",
                device,
                f"the precompiled route has not passed its checks on {device} yet: "
                f"opt in with ${torch_compat.PRECOMPILED_ENV}=1 (the jit answers)",
            )
            return self.jit(*args, **kwargs)
        t0 = time.perf_counter()
        why = hooks_reason(self._orig_mod)
        state.calls += 1
        state.split_seconds["hooks"] += time.perf_counter() - t0
        if why is not None:
            state.count("fallbacks", "hooks", why)
            return self.jit(*args, **kwargs)
        if self._prepare is not None:
            args, kwargs = self._prepare(args, kwargs)
        return self._route(cache, args, kwargs)  # the jit holds its contexts while it compiles; a save enters them

    def _keys(self) -> tuple[dict, dict]:
        root = traced_code.root_function(self._orig_mod)
        if self._fingerprint is None or root is not self._root or getattr(root, "__code__", None) is not self._code:
            # equal blocks share one fingerprint object, hence keys and artifacts; a patched class forward another
            object.__setattr__(self, "_root", root)
            object.__setattr__(self, "_code", getattr(root, "__code__", None))
            object.__setattr__(self, "_fingerprint", self._state.intern(block_fingerprint(self._orig_mod)))
            object.__setattr__(self, "_static", self._state.intern(static_fields(self._options, self._jit_filter)))
            object.__setattr__(self, "_binder", carried_guards.Binder(type(self._orig_mod).forward))
        return self._fingerprint, self._static

    def _route(self, cache: compile_cache.CompileCache, args: tuple, kwargs: dict) -> Any:
        state, module = self._state, self._orig_mod
        fingerprint, static = self._keys()
        split, flags, last = state.split_seconds, state.flags(), self._last
        if last is not None and last[0] is cache and last[1] == flags:  # the last answer's checks first: no key
            t0 = time.perf_counter()
            env = self._binder(module, args, kwargs)
            held = last[2].holds(env)
            t1 = time.perf_counter()
            state.check_seconds += t1 - t0
            split["carried"] += t1 - t0
            if held:
                ok, _ = last[2].guards_pass(env, module, args, kwargs)
                split["guard_check"] += time.perf_counter() - t1
                if ok:
                    return self._answer(cache, flags, last[2], last[3], args, kwargs)
        object.__setattr__(self, "_last", None)
        t0 = time.perf_counter()
        try:
            key = call_key(fingerprint, static, args, kwargs, flags=flags)
        except _NotDescribable as e:
            state.count("fallbacks", None, f"not describable: {e}")
            return self.jit(*args, **kwargs)
        finally:
            split["key"] += time.perf_counter() - t0
        memo_key = (str(cache.path), key)
        kind, got = state.entries.get(memo_key, (None, None))
        t0 = time.perf_counter()
        env = self._binder(module, args, kwargs)
        answer = next((a for a in got if a.holds(env)), None) if kind == "aot" else None
        elapsed = time.perf_counter() - t0
        state.check_seconds += elapsed
        split["carried"] += elapsed
        if kind is None or (kind == "aot" and answer is None):  # new, or the code or a carried guard moved
            with state.load_lock:
                kind, got = state.entries.get(memo_key, (None, None))
                answer = next((a for a in got if a.holds(env)), None) if kind == "aot" else None
                if kind is None or (kind == "aot" and answer is None):
                    kind, found = self._resolve(cache, fingerprint, static, key, env)
                    if kind == "aot":  # kept beside the variants loaded before (one per specialised value)
                        answer, got = found, [found, *(got if isinstance(got, list) else [])][:MAX_VARIANTS]
                    else:
                        got = found
                    state.entries[memo_key] = (kind, got)
        if kind == "aot":
            t0 = time.perf_counter()
            ok, why = answer.guards_pass(env, module, args, kwargs)
            split["guard_check"] += time.perf_counter() - t0
            if ok:
                return self._answer(cache, flags, answer, memo_key, args, kwargs)
            state.count("fallbacks", key_digest(fingerprint, static, key)[:12], cache.redact(why))
            return self.jit(*args, **kwargs)
        out = self.jit(*args, **kwargs)
        if kind == "new":  # queue a save (it runs after the tracked call); this process keeps its jit for the key
            state.entries[memo_key] = ("saved", None)
            saved_kwargs = {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}
            modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())  # the save traces under the call's
            with state.lock:
                if len(state.pending) < MAX_PENDING:
                    state.pending.append(
                        lambda: self._save(cache, fingerprint, static, key, tuple(args), saved_kwargs, modes)
                    )
        elif kind == "jit":
            state.count("fallbacks")
        return out

    def _answer(
        self, cache: compile_cache.CompileCache, flags: str, answer: Answer, memo_key: tuple, args: tuple, kwargs: dict
    ) -> Any:
        """Call the artifact (its checks passed): a hit, remembered as this block's last answer; a failure makes
        its key run the jit from now on (an interrupt or out-of-memory error reaches ComfyUI unchanged)."""
        state, t0 = self._state, time.perf_counter()
        try:
            out = answer.fn(self._orig_mod, *args, **kwargs)
        except Exception as e:
            if passes_through(e):
                raise
            state.entries[memo_key] = ("jit", None)
            object.__setattr__(self, "_last", None)
            why = f"the precompiled call raised {type(e).__name__}: {cache.redact(str(e))[:200]}"
            state.count("fallbacks", answer.variant[:12], why)
            return self.jit(*args, **kwargs)
        state.split_seconds["artifact"] += time.perf_counter() - t0
        state.hit(answer)
        object.__setattr__(self, "_last", (cache, flags, answer, memo_key))
        return out

    def _resolve(
        self, cache: compile_cache.CompileCache, fingerprint: dict, static: dict, key: tuple, env: Mapping[str, Any]
    ) -> tuple[str, Any]:
        """The entry for a call: ``("aot", Answer)`` for the first variant of the key whose traced code and carried
        guards are what this process has now, ``("new", None)`` when there is none (every variant's reasons
        recorded when the key has variants), ``("jit", None)`` for an untrusted record, a refused configuration or a
        failed load."""
        state, digest = self._state, key_digest(fingerprint, static, key)
        variants, problem = read_variants(cache, digest)
        if problem is not None:
            state.count("fallbacks", digest[:12], problem)
            return "jit", None
        reasons = []
        for variant in variants:
            found, why = match_variant(variant, env)
            if found is None:
                reasons.append(why)
                continue
            if "refused" in variant:
                state.count(
                    "fallbacks", digest[:12], cache.redact(f"not precompiled: {'; '.join(variant['refused'])}")
                )
                return "jit", None
            fn = self._load(cache, variant["artifact"])
            if fn is None:
                return "jit", None
            matched, code = found
            manager = torch_compat.artifact_guard_manager(fn)
            checks = checks_tree(matched, code, env)
            return "aot", Answer(fn, matched, code, variant["id"], fingerprint["forward"][0], manager, checks)
        if reasons:
            state.count(
                "fallbacks",
                digest[:12],
                cache.redact(
                    f"precompiled for another configuration ({' | '.join(reasons)}): the jit answers and this "
                    "configuration is saved too"
                ),
            )
        return "new", None

    def _load(self, cache: compile_cache.CompileCache, artifact: str) -> Any:
        state = self._state
        memo = (str(cache.path), artifact)
        if memo in state.loaded:
            return state.loaded[memo]
        rel = f"{PRECOMPILED_DIR}/{artifact}.pt2"
        t0 = time.perf_counter()
        data, problem = cache.read_trusted(rel)
        if data is None:
            state.count("fallbacks", artifact[:12], problem or f"{rel} is missing")
            return None
        if hashlib.sha256(data).hexdigest()[:32] != artifact:
            state.count("fallbacks", artifact[:12], f"{rel} does not hold the bytes its name is the digest of")
            return None
        try:
            with contextlib.ExitStack() as stack:
                for context in self._contexts:  # the jit's (trusted_cpu_isa: no ISA test builds while loading)
                    stack.enter_context(context())
                stack.enter_context(torch_compat.built_kernel_loads())  # its kernels are built: no header work
                fn = torch.compiler.load_compiled_function(io.BytesIO(data))
            fn = torch_compat.checked_once(fn)  # _route runs guard_check before every call: not twice
        except Exception as e:  # noqa: BLE001 (a load failure is a recorded fallback, never an error)
            state.count("fallbacks", artifact[:12], f"load failed: {type(e).__name__}: {cache.redact(str(e))[:200]}")
            return None
        state.count("loads", seconds=time.perf_counter() - t0)
        state.loaded[memo] = fn
        return fn

    def _save(
        self,
        cache: compile_cache.CompileCache,
        fingerprint: dict,
        static: dict,
        key: tuple,
        args: tuple,
        kwargs: dict,
        modes: tuple[bool, bool] = (False, False),
    ) -> None:
        """Trace and save the artifact of ``key`` under the call's grad and inference modes (``modes``: flush may
        run outside the ``no_grad`` / ``inference_mode`` block of the call that queued it), with its variant: the
        traced code by path and digest (:func:`core.compile.traced_code.identify`) and the carried guards. Code the
        pack cannot identify, or a guard it cannot carry, saves a refusal instead, naming every problem (the jit
        answers that configuration)."""
        digest = key_digest(fingerprint, static, key)
        module, t0, dropped = self._orig_mod, time.perf_counter(), []
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.inference_mode(modes[1]))
                stack.enter_context(torch.set_grad_enabled(modes[0]))
                for context in (*self._contexts, torch_compat.aot_compile_enabled, torch_compat.portable_guard_state):
                    stack.enter_context(context())
                compiled = torch.compile(
                    type(module).forward,
                    **{**self._options.to_kwargs(aot_guard_filter(self._jit_filter, dropped)), "fullgraph": True},
                )
                with torch_compat.traced_code_objects() as codes:
                    aot = compiled.aot_compile(((module, *args), kwargs))
                guards, problems = carried_guards.carry(dropped, self._binder(module, args, kwargs))
                described = json.dumps([key[2], [g.as_list() for g in guards]], default=repr)
                code, unidentified = traced_code.identify(module, codes, described)
                problems = [*unidentified, *problems]
                variant = {"code": code, "guards": [g.as_list() for g in guards]}
                variant["id"] = variant_digest(digest, variant)
                if problems:  # recorded with what it could describe: that configuration runs the jit
                    add_variant(cache, digest, {**variant, "refused": problems})
                    self._state.count(
                        "fallbacks", digest[:12], cache.redact(f"not precompiled: {'; '.join(problems)}")
                    )
                    return
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, "a.pt2")
                    aot.save_compiled_function(path)
                    with open(path, "rb") as f:
                        data = f.read()
            variant["artifact"] = hashlib.sha256(data).hexdigest()[:32]
            cache.write_once(f"{PRECOMPILED_DIR}/{variant['artifact']}.pt2", data)
            add_variant(cache, digest, variant)
        except Exception as e:  # noqa: BLE001 (a save failure is a recorded fallback, never an error)
            why = f"save failed: {type(e).__name__}: {cache.redact(str(e))[:200]}"
            self._state.count("fallbacks", digest[:12], why)
            return
        self._state.count("saves", seconds=time.perf_counter() - t0)


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
    function with the recorded digest (:func:`core.compile.traced_code.resolve`) and every carried guard reads the
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


def wrap(
    module: nn.Module,
    jit: nn.Module,
    options: CompileOptions,
    guard_filter_fn: GuardFilterFn | None,
    state: PrecompiledState,
    contexts: Sequence[Callable[[], Any]] = (),
    prepare: Callable[[tuple, dict], tuple[tuple, dict]] | None = None,
) -> PrecompiledBlock:
    """:class:`PrecompiledBlock` for ``module`` in front of ``jit`` (see there)."""
    return PrecompiledBlock(module, jit, options, guard_filter_fn, state, contexts, prepare)
