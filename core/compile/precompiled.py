"""Precompiled regional blocks: a per-block layer in front of the jit-compiled block that loads torch's
``aot_compile`` artifact from the trusted compile cache when it is what the jit would trace now, else runs the jit.

What decides that an artifact answers a call, all of it checked before each use:

* the key (:func:`call_key`, :func:`key_digest`): the block's classes, submodules and the files defining them
  (:func:`block_fingerprint`); the call's inputs (shapes, dtypes, strides, devices), the structure of
  ``transformer_options`` and the identity of every callable under its code keys; the global torch flags, Dynamo's
  and inductor's config (:func:`core.torch_compat.compile_config_digest`); the compile settings, torch, Python, the
  pack, and the host's versions (:func:`host_versions`: ComfyUI, comfy-kitchen, comfy-aimdo, einops);
* per key, a record of variants (``precompiled/<key>.json``), one per configuration saved: the sha256 of the source
  file of every module whose code the trace inlined (read from Dynamo: :func:`core.torch_compat.traced_modules`)
  and the guards the artifact cannot carry, carried by the pack (:mod:`core.compile.carried_guards`: module
  globals, closures, callables, ``type(...)``, ``weight_function`` lists); a variant answers only when all of them
  read the same now. Its artifact is ``precompiled/<variant>.pt2``;
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
from . import carried_guards
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
KEY_FORMAT = 3  # 3: the global flags are read outside the blocks' compile contexts (torch_compat.while_compiling)
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
_file_digests: dict[str, str] = {}


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


def _file_digest(path: str | None) -> str:
    if not path:
        return "?"
    got = _file_digests.get(path)
    if got is None:
        try:
            with open(path, "rb") as f:
                got = hashlib.sha256(f.read()).hexdigest()[:16]
        except OSError:
            got = "?"
        _file_digests[path] = got
    return got


def block_fingerprint(module: nn.Module) -> dict[str, Any]:
    """What a block's trace depends on besides its inputs, computed once per block: the class qualname, and for
    every submodule its name and class, and the sha256 of the source file of every module defining one of those
    classes (a changed ComfyUI or pack file gives another key).

    Args:
        module: the original (uncompiled) block.
    Returns:
        ``{"class", "modules": [[name, "module.Qualname"], ...], "files": {module name: digest}}``.
    """
    classes = {type(m) for m in module.modules()}
    files = {}
    for cls in sorted(classes, key=lambda c: (c.__module__, c.__qualname__)):
        for base in cls.__mro__:
            if base.__module__.startswith(("torch.", "builtins")) or base is object:
                continue
            mod = sys.modules.get(base.__module__)
            files[base.__module__] = _file_digest(getattr(mod, "__file__", None))
    return {
        "class": f"{type(module).__module__}.{type(module).__qualname__}",
        "modules": [[n, f"{type(m).__module__}.{type(m).__qualname__}"] for n, m in module.named_modules()],
        "files": files,
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
    flags among them), inductor's ``deterministic`` setting and the digest of Dynamo's and inductor's config
    (:func:`core.torch_compat.compile_config_digest`), as canonical JSON. Cost: docs/benchmarks.md section 21."""
    return json.dumps(
        [guarded_flags(), torch_compat.inductor_deterministic(load=True), torch_compat.compile_config_digest()],
        sort_keys=True,
        default=str,
    )


def module_digest(name: str) -> str:
    """sha256 (16 hex) of the source file of the loaded module ``name``, once per process; ``"?"`` when it is not
    loaded or has no readable file."""
    mod = sys.modules.get(name)
    return _file_digest(getattr(mod, "__file__", None)) if mod is not None else "?"


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
        dropped: when given, the entries the jit keeps and the artifact cannot are appended to it (the pack carries
            them: :mod:`core.compile.carried_guards`).
    """

    def keep(entries: Sequence[Any]) -> list[bool]:
        jit = [True] * len(entries) if jit_filter is None else list(jit_filter(entries))
        out = []
        for j, e in zip(jit, entries):
            ok = j and torch_compat.guard_serialisable(e)
            if j and not ok and dropped is not None:
                dropped.append(e)
            out.append(ok)
        return out

    return keep


@dataclasses.dataclass(eq=False)
class PrecompiledState:
    """One compile record's precompiled route: on/off with the reason, counts, and per-key fallback reasons.

    ``hits``: calls answered by a loaded artifact; ``loads`` / ``saves``: artifacts read from / written to the
    cache; ``fallbacks``: calls that ran the jit although the route was on; ``reasons``: ``{key digest (12 hex or
    "call"): reason}``, the first reason per key. Thread-safe."""

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
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    pending: list[Callable[[], None]] = dataclasses.field(default_factory=list, repr=False)
    #: (cache path, call key) -> ("aot", (fn, Matched)) | ("jit", None): fallback | ("saved", None): this
    #: process's jit (a save queued) | ("new", None): no artifact for this configuration yet
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
        """JSON view: ``{"enabled", "reason", "hits", "loads", "saves", "fallbacks", "save_seconds",
        "load_seconds", "check_seconds", "calls", "split_seconds", "reasons"}`` (``check_seconds``: wall seconds of
        the per-call checks of the carried guards, summed over every call; ``calls``: block calls through the route;
        ``split_seconds``: their wall seconds per phase, :data:`SPLIT_PHASES`)."""
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
        if self._fingerprint is None:  # equal blocks share one fingerprint object, hence keys and artifacts
            object.__setattr__(self, "_fingerprint", self._state.intern(block_fingerprint(self._orig_mod)))
            object.__setattr__(self, "_static", self._state.intern(static_fields(self._options, self._jit_filter)))
            object.__setattr__(self, "_binder", carried_guards.Binder(type(self._orig_mod).forward))
        return self._fingerprint, self._static

    def _route(self, cache: compile_cache.CompileCache, args: tuple, kwargs: dict) -> Any:
        state, module = self._state, self._orig_mod
        fingerprint, static = self._keys()
        split, t0 = state.split_seconds, time.perf_counter()
        try:
            key = call_key(fingerprint, static, args, kwargs, flags=state.flags())
        except _NotDescribable as e:
            state.count("fallbacks", None, f"not describable: {e}")
            return self.jit(*args, **kwargs)
        finally:
            split["key"] += time.perf_counter() - t0
        memo_key = (str(cache.path), key)
        kind, got = state.entries.get(memo_key, (None, None))
        env = None
        if kind == "aot" and got[1].guards:
            t0 = time.perf_counter()
            env = self._binder(module, args, kwargs)
            moved = not got[1].still(env)
            elapsed = time.perf_counter() - t0
            state.check_seconds += elapsed
            split["carried"] += elapsed
            if moved:
                kind = None  # a carried guard moved: resolve again
        if kind is None:
            env = env if env is not None else self._binder(module, args, kwargs)
            with state.load_lock:
                kind, got = state.entries.get(memo_key, (None, None))
                if kind is None or (kind == "aot" and not got[1].still(env)):
                    kind, got = self._resolve(cache, fingerprint, static, key, env)
                    state.entries[memo_key] = (kind, got)
        if kind == "aot":
            fn, t0 = got[0], time.perf_counter()
            try:
                ok = fn.guard_check(module, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 (any failure: the jit answers)
                ok, why = False, f"guard_check raised {type(e).__name__}: {cache.redact(str(e))[:200]}"
            else:
                why = (
                    "torch's guard_check failed: an input or a module attribute differs from what the artifact "
                    "was traced for"
                )
            split["guard_check"] += time.perf_counter() - t0
            if ok:
                t0 = time.perf_counter()
                try:
                    out = fn(module, *args, **kwargs)
                    split["artifact"] += time.perf_counter() - t0
                except Exception as e:
                    if passes_through(e):  # an interrupt or out-of-memory reaches ComfyUI unchanged
                        raise
                    state.entries[memo_key] = ("jit", None)  # this key runs the jit from now on
                    why = f"the precompiled call raised {type(e).__name__}: {cache.redact(str(e))[:200]}"
                else:
                    state.count("hits")
                    return out
            state.count("fallbacks", key_digest(fingerprint, static, key)[:12], why)
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

    def _resolve(
        self, cache: compile_cache.CompileCache, fingerprint: dict, static: dict, key: tuple, env: Mapping[str, Any]
    ) -> tuple[str, Any]:
        """The entry for a call: ``("aot", (fn, Matched))`` for the first variant of the key whose traced sources
        and carried guards read the same now, ``("new", None)`` when there is none (the reason recorded when the
        key has variants), ``("jit", None)`` for an untrusted record, a refused configuration or a failed load."""
        state, digest = self._state, key_digest(fingerprint, static, key)
        variants, problem = read_variants(cache, digest)
        if problem is not None:
            state.count("fallbacks", digest[:12], problem)
            return "jit", None
        reasons = []
        for variant in variants:
            matched, why = match_variant(variant, env)
            if matched is None:
                reasons.append(why)
                continue
            if "refused" in variant:
                state.count("fallbacks", digest[:12], f"not precompiled: {variant['refused']}")
                return "jit", None
            fn = self._load(cache, variant["artifact"])
            return ("aot", (fn, matched)) if fn is not None else ("jit", None)
        if reasons:
            state.count(
                "fallbacks",
                digest[:12],
                f"precompiled for another configuration ({reasons[0]}): the jit "
                "answers and this configuration is saved too",
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
        try:
            with torch_compat.built_kernel_loads():  # its kernels are built: no header preprocessing
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
        traced modules' source digests and the carried guards. A guard the pack cannot carry saves a refusal
        instead (the jit answers that configuration, with the reason)."""
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
                aot = compiled.aot_compile(((module, *args), kwargs))
                sources = {m: module_digest(m) for m in sorted(torch_compat.traced_modules(aot))}
                guards, problems = carried_guards.carry(dropped, self._binder(module, args, kwargs))
                if problems:  # recorded with the guards it could carry: that configuration runs the jit
                    add_variant(
                        cache,
                        digest,
                        {"sources": sources, "guards": [g.as_list() for g in guards], "refused": problems[0]},
                    )
                    self._state.count("fallbacks", digest[:12], f"not precompiled: {problems[0]}")
                    return
                variant = {"sources": sources, "guards": [g.as_list() for g in guards]}
                variant["artifact"] = variant_digest(digest, variant)
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, "a.pt2")
                    aot.save_compiled_function(path)
                    with open(path, "rb") as f:
                        data = f.read()
            cache.write_recorded(f"{PRECOMPILED_DIR}/{variant['artifact']}.pt2", data)
            add_variant(cache, digest, variant)
        except Exception as e:  # noqa: BLE001 (a save failure is a recorded fallback, never an error)
            why = f"save failed: {type(e).__name__}: {cache.redact(str(e))[:200]}"
            self._state.count("fallbacks", digest[:12], why)
            return
        self._state.count("saves", seconds=time.perf_counter() - t0)


def variant_digest(digest: str, variant: Mapping[str, Any]) -> str:
    """The artifact name (32 hex) of a variant of key ``digest``: sha256 of the key and the variant's sources and
    carried guards."""
    body = json.dumps({"key": digest, "sources": variant["sources"], "guards": variant["guards"]}, sort_keys=True)
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
            if isinstance(v.get("sources"), dict)
            and isinstance(v.get("guards"), list)
            and ("artifact" in v or "refused" in v)
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return [], f"unreadable variant record ({type(e).__name__})"
    return variants, None


def add_variant(cache: compile_cache.CompileCache, digest: str, variant: dict) -> None:
    """Put ``variant`` first in key ``digest``'s record (replacing one with the same sources and guards; at most
    :data:`MAX_VARIANTS`), under the cache's cross-process lock. Raises ``OSError``."""
    rel = f"{PRECOMPILED_DIR}/{digest}.json"
    with cache.locked():
        variants, _ = read_variants(cache, digest)
        same = [v for v in variants if v["sources"] == variant["sources"] and v["guards"] == variant["guards"]]
        kept = [variant, *(v for v in variants if all(v is not s for s in same))][:MAX_VARIANTS]
        cache.write_recorded(rel, json.dumps({"format": KEY_FORMAT, "variants": kept}, sort_keys=True).encode())


def match_variant(
    variant: Mapping[str, Any], env: Mapping[str, Any]
) -> tuple[carried_guards.Matched | None, str | None]:
    """Whether a variant is what the jit would trace now: every traced module's source has the recorded digest
    and every carried guard reads the recorded value. Returns ``(Matched, None)`` or ``(None, reason)``."""
    for name, want in variant["sources"].items():
        if (now := module_digest(name)) != want:
            return None, f"the source of {name} changed ({want} -> {now})"
    try:
        guards = [carried_guards.CarriedGuard.from_list(g) for g in variant["guards"]]
    except TypeError:
        return None, "unreadable carried guards"
    return carried_guards.match(guards, env)


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
