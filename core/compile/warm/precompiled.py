"""Precompiled regional blocks: a per-block layer in front of the jit-compiled block that loads torch's
``aot_compile`` artifact from the trusted compile cache when it is what the jit would trace now, else runs the jit.
The route's parts live beside it: the call's key (:mod:`.call_key`), the variants and loaded answers
(:mod:`.variants`), the route's state (:mod:`.route_state`); this module is the block and its face.

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
  (:mod:`core.compile.warm.traced_code`; never a file on disk), and the guards the artifact cannot carry, carried by
  the pack (:mod:`core.compile.warm.carried_guards`: module globals, closures, callables, ``type(...)``,
  ``weight_function`` lists, and the ``transformer_options`` values the trace specialised on, by value); a variant
  answers only when all of them read the same now, and the code is re-checked by identity on every call. Its artifact
  is ``precompiled/<sha256 of its bytes>.pt2``, written once (content-addressed: two servers saving the same variant
  at once write the same name with their own bytes, and neither overwrites a file another may be reading);
* torch's own ``guard_check`` of the guards the artifact carries (submodule hooks, instance ``forward``s, shapes);
* the block itself has no hooks and no instance ``forward`` (the route calls the class's ``forward``), and no
  process-wide module hooks are set.

Anything else runs the jit path, with the reason recorded once per key (:class:`PrecompiledState`); a call whose
configuration has no artifact yet queues one. The saving process reads its own save back at the next call holding
the values it saved (the key's record, the artifact's bytes, its load and checks, as a warm-started process does),
so from then on its artifact answers there too, through the same per-call checks (one tree, no key). No ComfyUI
imports.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ... import torch_compat
from ...failures import passes_through
from ..guards import GuardFilterFn
from ..options import CompileOptions
from . import cache as compile_cache
from . import carried_guards, traced_code
from .call_key import (
    HOST_DISTRIBUTIONS,
    HOST_VERSION_MODULES,
    KEY_FORMAT,
    block_fingerprint,
    call_key,
    flags_text,
    host_versions,
    key_digest,
    static_fields,
)
from .carried_guards import NotDescribable as _NotDescribable
from .carried_guards import describe_callable
from .hooks import hooks_reason
from .route_state import MAX_PENDING, SPLIT_PHASES, Entry, PrecompiledState
from .variants import (
    MAX_VARIANTS,
    PRECOMPILED_DIR,
    Answer,
    add_variant,
    checks_tree,
    has_specialisation,
    match_variant,
    read_variants,
    specialisation,
    variant_digest,
)

__all__ = [
    "PRECOMPILED_DIR",
    "TRIED_DEVICES",
    "PrecompiledState",
    "PrecompiledBlock",
    "Answer",
    "call_key",
    "key_digest",
    "flags_text",
    "static_fields",
    "describe_callable",
    "block_fingerprint",
    "host_versions",
    "hooks_reason",
    "aot_guard_filter",
    "wrap",
    "MAX_VARIANTS",
    "KEY_FORMAT",
    "HOST_DISTRIBUTIONS",
    "HOST_VERSION_MODULES",
    "MAX_PENDING",
    "SPLIT_PHASES",
    "Entry",
    "checks_tree",
    "match_variant",
    "read_variants",
    "add_variant",
    "variant_digest",
]

log = logging.getLogger("steadfast.precompiled")

#: devices the route has passed its checks on (tests/core/test_precompiled_differential.py, the server cases). On any
#: other (CUDA first) it is opt-in, ``$STEADFAST_PRECOMPILED=1``, until a GPU run has passed.
TRIED_DEVICES = ("cpu",)
#: Dynamo guard types that specialise a trace on a value: on a ``transformer_options`` entry the jit's filter drops
#: them (one graph for every step), and the route carries them by value (another process may hold another value)
SPECIALISING_GUARDS = ("CONSTANT_MATCH", "EQUALS_MATCH")


def untried_device(args: Sequence[Any]) -> str | None:
    """The device type of a block call's first tensor argument when it is not in :data:`TRIED_DEVICES` (``"cuda"``
    on a GPU), else None (no tensor argument included)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            kind = a.device.type
            return None if kind in TRIED_DEVICES else kind
    return None


def _simple_options(env: Mapping[str, Any]) -> tuple:
    """The str, int, float, bool and None entries of the call's ``transformer_options`` (tuples and lists of them
    too), by value: what tells block positions apart before their key's first save says which entries its trace
    read (ComfyUI's ``block``, ``block_index``)."""
    options = env.get("transformer_options")
    if not isinstance(options, dict):
        return ()
    out = []
    for k, v in options.items():
        if isinstance(v, list | tuple) and all(isinstance(x, str | int | float | bool | type(None)) for x in v):
            out.append((str(k), tuple(v)))
        elif isinstance(v, str | int | float | bool | type(None)):
            out.append((str(k), v))
    return tuple(out)


def _values_of(done: list[tuple], env: Mapping[str, Any]) -> tuple | None:
    """The call's values of the ``transformer_options`` sources the key's saves specialised on (``done``: their
    :func:`.variants.specialisation` s; all of one key read the same sources): what a queued save will specialise on,
    before it is done. None when a source does not read here."""
    sources = sorted({src for spec in done for src, _ in spec})
    try:
        return tuple((src, carried_guards.describe_value(carried_guards.read_source(src, env))) for src in sources)
    except Exception:  # noqa: BLE001 (a source that does not read: another configuration)
        return None


def _done(saved: list[tuple[str, Any]]) -> list[tuple]:
    """The specialised values of a key's done saves (:attr:`PrecompiledState.saved`: recorded or failed)."""
    return [v for kind, v in saved if kind in ("values", "failed")]


def _own_save(saved: list[tuple[str, Any]], env: Mapping[str, Any]) -> tuple[str, tuple] | None:
    """The first done save of a key (``(kind, values)``: ``"values"`` recorded, ``"failed"``) whose specialised
    ``transformer_options`` values the call holds (:func:`.variants.has_specialisation`; ``()`` holds for every
    call), else None."""
    for kind, values in saved:
        if kind in ("values", "failed") and has_specialisation([values], env):
            return kind, values
    return None


def aot_guard_filter(jit_filter: GuardFilterFn | None, dropped: list[Any] | None = None) -> GuardFilterFn:
    """The artifact's guard filter: what the jit keeps (``jit_filter``) and torch can serialise
    (:func:`core.torch_compat.guard_serialisable`): shape, dtype, stride and constant guards stay.

    Args:
        jit_filter: the jit's guard filter (None keeps every guard).
        dropped: when given, the entries the pack carries are appended to it (:mod:`core.compile.warm.carried_guards`):
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


class PrecompiledBlock(nn.Module):
    """A jit-compiled block (``jit``: ``torch.compile(module)`` with its hooks and contexts) behind the precompiled
    route. Called like the block. ``_orig_mod`` is the original block (as on ``torch.compile``'s wrapper).

    Route per call: without an active compile cache (:func:`core.compile.warm.cache.active_cache`) or with the route
    off, the jit. Else the key (:func:`call_key`); an artifact in memory or in the cache (``precompiled/<key>.pt2``,
    read only when recorded and its sha256 matches: :meth:`core.compile.warm.cache.CompileCache.read_trusted`) whose
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
        state.calls += 1
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
            t1 = time.perf_counter()
            split["carried"] += t1 - t0
            if last[2].combined is not None:  # torch's guards and the pack's checks: one tree, one check
                held = last[2].combined.check(env)
                t2 = time.perf_counter()
                state.check_seconds += t2 - t0
                split["guard_check"] += t2 - t1
                if held:
                    return self._answer(cache, flags, last[2], last[3], args, kwargs)
                last = None
        if last is not None and last[0] is cache and last[1] == flags:  # separate trees, or Python checks
            t0 = time.perf_counter()
            env = self._binder(module, args, kwargs)
            held = last[2].holds(env)  # its tree holds the hook checks too
            t1 = time.perf_counter()
            state.check_seconds += t1 - t0
            split["carried"] += t1 - t0
            if held and last[2].checks is None:  # Python checks: the hooks walked here
                held = hooks_reason(module) is None
                split["hooks"] += time.perf_counter() - t1
                t1 = time.perf_counter()
            if held:
                ok, _ = last[2].guards_pass(env, module, args, kwargs)
                split["guard_check"] += time.perf_counter() - t1
                if ok:
                    return self._answer(cache, flags, last[2], last[3], args, kwargs)
        object.__setattr__(self, "_last", None)
        t0 = time.perf_counter()
        why = hooks_reason(module)
        split["hooks"] += time.perf_counter() - t0
        if why is not None:
            state.count("fallbacks", "hooks", why)
            return self.jit(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            key = call_key(fingerprint, static, args, kwargs, flags=flags)
        except _NotDescribable as e:
            state.count("fallbacks", None, f"not describable: {e}")
            return self.jit(*args, **kwargs)
        finally:
            split["key"] += time.perf_counter() - t0
        memo_key = (str(cache.path), key)
        t0 = time.perf_counter()
        env = self._binder(module, args, kwargs)
        kind, answer = self._known(memo_key, env)
        elapsed = time.perf_counter() - t0
        state.check_seconds += elapsed
        split["carried"] += elapsed
        if kind is None:  # nothing loaded holds, and nothing this process saved was read back: read the variants
            with state.load_lock:
                kind, answer = self._known(memo_key, env)
                if kind is None:
                    own = _own_save(state.saved.get(memo_key) or [], env)
                    kind, found = self._resolve(cache, fingerprint, static, key, env)
                    if own is not None:  # read back once; its own save not answering here: the jit, no new save
                        state.read_back.add((memo_key, own[1]))
                        kind = Entry.SAVED if kind == Entry.NEW else kind
                    if kind == Entry.ANSWERS:  # kept beside the answers loaded before (one per specialised value)
                        kept, _ = state.entries.get(memo_key, (None, None))
                        before = state.entries[memo_key][1] if kept == Entry.ANSWERS else []
                        state.entries[memo_key] = (Entry.ANSWERS, [found, *before][:MAX_VARIANTS])
                        answer = found
                    elif kind == Entry.JIT:
                        state.entries[memo_key] = (Entry.JIT, None)
        if kind == Entry.PASSED:
            return self._answer(cache, flags, answer, memo_key, args, kwargs)
        if kind == Entry.ANSWERS:
            t0 = time.perf_counter()
            ok, why = answer.guards_pass(env, module, args, kwargs)
            split["guard_check"] += time.perf_counter() - t0
            if ok:
                return self._answer(cache, flags, answer, memo_key, args, kwargs)
            state.count("fallbacks", key_digest(fingerprint, static, key)[:12], cache.redact(why))
            return self.jit(*args, **kwargs)
        out = self.jit(*args, **kwargs)
        if kind == Entry.NEW:  # queue a save (it runs after the tracked call); read back by the next call (_known)
            with state.lock:  # the values it specialises on are known once the key's first save is done
                saved = state.saved.setdefault(memo_key, [])
                done = _done(saved)
                saved.append(("queued", _values_of(done, env) if done else None))
                if len(state.pending) < MAX_PENDING:
                    saved_kwargs = {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}
                    modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())  # the call's, for the save
                    state.pending.append(
                        lambda: self._save(cache, fingerprint, static, key, tuple(args), saved_kwargs, modes, memo_key)
                    )
        elif kind == Entry.SAVED and self._waits_for_first_save(memo_key):
            self._defer(cache, fingerprint, static, key, memo_key, args, kwargs)
        elif kind == Entry.JIT:
            state.count("fallbacks")
        return out

    def _waits_for_first_save(self, memo_key: tuple) -> bool:
        saved = self._state.saved.get(memo_key) or []
        return any(kind == "queued" and values is None for kind, values in saved)

    def _defer(
        self,
        cache: compile_cache.CompileCache,
        fingerprint: dict,
        static: dict,
        key: tuple,
        memo_key: tuple,
        args: tuple,
        kwargs: dict,
    ) -> None:
        """A call of a key whose first save is still queued, holding other simple ``transformer_options`` values than
        the calls deferred before it (another block position): kept until that save is done, when the values it
        specialised on are known; then :meth:`PrecompiledState.flush` saves this call's variant too when those values
        differ (no save for values the trace does not read)."""
        state = self._state
        options = kwargs.get("transformer_options")
        if not isinstance(options, dict):
            return
        desc = _simple_options({"transformer_options": options})
        saved_kwargs = {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        seen = {"transformer_options": saved_kwargs["transformer_options"]}

        def maybe_save() -> None:
            with state.lock:
                saved = state.saved.setdefault(memo_key, [])
                done = _done(saved)
                values = _values_of(done, seen) if done else None
                queued = [v for kind, v in saved if kind == "queued"]
                if values is None or has_specialisation(done, seen) or values in queued:
                    return  # the first save failed, or these values are saved or queued already
                saved.append(("queued", values))
            self._save(cache, fingerprint, static, key, tuple(args), saved_kwargs, modes, memo_key)

        with state.lock:
            deferred = state.deferred.setdefault(memo_key, {})
            if desc not in deferred and len(deferred) < MAX_VARIANTS:
                deferred[desc] = maybe_save

    def _known(self, memo_key: tuple, env: dict[str, Any]) -> tuple[Entry | None, Answer | None]:
        """What this process already knows for a call: ``(Entry.PASSED, answer)`` for a loaded answer whose one tree
        passes, ``(Entry.ANSWERS, answer)`` for one whose checks hold, ``(Entry.JIT, None)`` for a key that runs the
        jit, ``(Entry.SAVED, None)`` when this process is saving this configuration (its ``transformer_options``
        values), failed to save or refused it, or saved it and read it back without an answer, ``(None, None)``
        otherwise: nothing known, or this process saved it and has not read it back (the route then reads the key's
        record as any process would, and its own artifact answers from then on)."""
        state = self._state
        kind, got = state.entries.get(memo_key, (None, None))
        if kind == Entry.JIT:
            return Entry.JIT, None
        if kind == Entry.ANSWERS:
            answer = next((a for a in got if a.passes(env)), None)  # one answering entirely: no second check
            if answer is not None:
                return Entry.PASSED, answer
            answer = next((a for a in got if a.holds(env)), None)
            if answer is not None:
                return Entry.ANSWERS, answer
        saved = state.saved.get(memo_key)
        if saved is not None:
            queued = [v for kind, v in saved if kind == "queued"]
            if None in queued:
                return Entry.SAVED, None  # the key's first save is still queued
            own = _own_save(saved, env)
            if own is not None and own[0] == "values" and (memo_key, own[1]) not in state.read_back:
                return None, None  # saved for these values and not read back yet: read the record
            if own is not None:  # read back (no answer held), or a failed save: the jit
                return Entry.SAVED, None
            if queued and _values_of(_done(saved), env) in queued:
                return Entry.SAVED, None
        return None, None

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
            state.entries[memo_key] = (Entry.JIT, None)
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
    ) -> tuple[Entry, Any]:
        """The entry for a call: ``(Entry.ANSWERS, Answer)`` for the first variant of the key whose traced code and
        carried guards are what this process has now, ``(Entry.NEW, None)`` when there is none (every variant's reasons
        recorded when the key has variants), ``(Entry.JIT, None)`` for an untrusted record, a refused configuration or
        a failed load."""
        state, digest = self._state, key_digest(fingerprint, static, key)
        variants, problem = read_variants(cache, digest)
        if problem is not None:
            state.count("fallbacks", digest[:12], problem)
            return Entry.JIT, None
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
                return Entry.JIT, None
            modules = variant.get("modules")
            fn = self._load(cache, variant["artifact"], modules if isinstance(modules, dict) else {})
            if fn is None:
                return Entry.JIT, None
            matched, code = found
            manager = torch_compat.artifact_guard_manager(fn)
            checks = checks_tree(matched, code, env, self._orig_mod)
            combined = checks_tree(matched, code, env, self._orig_mod, manager) if manager is not None else None
            root = fingerprint["forward"][0]
            return Entry.ANSWERS, Answer(fn, matched, code, variant["id"], root, manager, checks, combined)
        if reasons:
            state.count(
                "fallbacks",
                digest[:12],
                cache.redact(
                    f"precompiled for another configuration ({' | '.join(reasons)}): the jit answers and this "
                    "configuration is saved too"
                ),
            )
        return Entry.NEW, None

    def _load(self, cache: compile_cache.CompileCache, artifact: str, modules: Mapping[str, str] = {}) -> Any:  # noqa: B006 (read only)
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
                stack.enter_context(traced_code.module_aliases(modules))  # the saver's names of the pack's modules
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
        memo_key: tuple | None = None,
    ) -> None:
        """Trace and save the artifact of ``key`` under the call's grad and inference modes (``modes``: flush may
        run outside the ``no_grad`` / ``inference_mode`` block of the call that queued it), with its variant: the
        traced code by path and digest (:func:`core.compile.warm.traced_code.identify`) and the carried guards. Code
        the pack cannot identify, or a guard it cannot carry, saves a refusal instead, naming every problem (the jit
        answers that configuration). The saved ``transformer_options`` values (:func:`.variants.specialisation`)
        replace the pending mark of ``memo_key``'s entry: a later call of that key with other values saves again."""
        digest = key_digest(fingerprint, static, key)
        module, t0, dropped = self._orig_mod, time.perf_counter(), []
        values: tuple = ()  # a failed save: no more saves for this key in this process
        outcome = "failed"
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
                values = specialisation(guards)
                described = json.dumps([key[2], [g.as_list() for g in guards]], default=repr)
                code, unidentified = traced_code.identify(module, codes, described)
                problems = [*unidentified, *problems]
                variant = {"code": code, "guards": [g.as_list() for g in guards]}
                variant["id"] = variant_digest(digest, variant)
                if problems:  # recorded with what it could describe: that configuration runs the jit
                    outcome = "failed"
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
            variant["modules"] = traced_code.folder_named_modules()  # torch's pickles name them as imported here
            cache.write_once(f"{PRECOMPILED_DIR}/{variant['artifact']}.pt2", data)
            add_variant(cache, digest, variant)
            outcome = "values"
        except Exception as e:  # noqa: BLE001 (a save failure is a recorded fallback, never an error)
            why = f"save failed: {type(e).__name__}: {cache.redact(str(e))[:200]}"
            self._state.count("fallbacks", digest[:12], why)
            return
        finally:
            self._saved_values(memo_key, values, outcome)
        self._state.count("saves", seconds=time.perf_counter() - t0)

    def _saved_values(self, memo_key: tuple | None, values: tuple, outcome: str) -> None:
        """Put a save's outcome in place of the first queued mark of its key: ``("values", the values it specialised
        on)`` for an artifact recorded (read back by the next call holding them: :meth:`_known`), ``("failed",
        values)`` for a refusal or a failed save (the jit answers; ``()`` after an error: every call of the key)."""
        state = self._state
        with state.lock:
            saved = state.saved.get(memo_key) or []
            at = next((i for i, (kind, _) in enumerate(saved) if kind == "queued"), None)
            if at is not None:
                saved[at] = (outcome, values)


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
