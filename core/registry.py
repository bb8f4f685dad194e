"""Compile state per model: what was compiled, how long it took, graphs, recompiles and why.

One :class:`~core.compile_record.CompileRecord` per underlying model object, held weakly (it disappears with the
model); re-registering the same model with equal settings returns the same record and compiles nothing again.
A record's identity is frozen; its statistics (``record.stats``) are written here and nowhere else. Numbers come
from torch's own reporting: recompile reasons and recompile-limit fallbacks from Dynamo's log messages (the log
tap, :func:`core.torch_compat.install_recompile_log_tap`, quiet on stderr), graphs, graph breaks and cache hits
from deltas of Dynamo's counters (:func:`core.torch_compat.dynamo_counters`).

Events go to the record made active by ``with REGISTRY.track(record, shape=...)`` around each compiled call (per
thread). The first tracked call installs the log tap; :meth:`CompileRegistry.close` removes it. Sources:
``/work/shared/research/torch_probe.md`` section 6. Caveat: counters are process-global, so compiles running
concurrently in another thread during a tracked call would be attributed to it. No ComfyUI imports.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import torch_compat
from .compile import CompileOptions, compile_blocks
from .compile_record import CompileRecord, CompileStats, normalise_shape
from .guard_filters import GuardFilterFn
from .recompile_watch import ParamIdentity, explain_recompile, guarded_flags, parse_limit_hit, parse_recompile

log = logging.getLogger("steadfast.registry")

_MAX_UNATTRIBUTED = 50
_MAX_RUN_LOG = 50
_MAX_FLAG_STATES = 32

__all__ = ["RecompileError", "CompileRegistry", "REGISTRY"]


class RecompileError(RuntimeError):
    """A strict record recompiled after warm-up; the message names the guard that failed."""


class _PerThread(threading.local):
    """Per thread: the stack of tracked calls and ``{id(record): run number}`` of the runs in progress."""

    def __init__(self) -> None:
        self.stack: list[_Frame] = []
        self.runs: dict[int, int] = {}


@dataclass
class _Frame:
    record: CompileRecord
    before: dict[str, int]
    children: dict[str, int] = field(default_factory=dict)
    recompiles: list[dict[str, Any]] = field(default_factory=list)

    def finish(self, parent: _Frame | None) -> dict[str, int]:
        """This call's own counter increases (nested tracked calls excluded); all of them go to ``parent``."""
        before = self.before  # only increases count: counters.clear() inside a call must not go negative
        delta = {k: v - before.get(k, 0) for k, v in torch_compat.dynamo_counters().items() if v > before.get(k, 0)}
        if parent is not None:  # the enclosing frame must not count these again
            for k, v in delta.items():
                parent.children[k] = parent.children.get(k, 0) + v
        return {k: max(0, v - self.children.get(k, 0)) for k, v in delta.items()}


class CompileRegistry:
    """Weak map model -> :class:`CompileRecord`, attribution of Dynamo events to records, and every write to
    a record's statistics.

    Thread-safe for reading (:meth:`as_json` from an HTTP handler) while a worker thread runs tracked
    calls. The first :meth:`track` installs the recompile log tap; :meth:`close` removes it.
    """

    def __init__(self) -> None:
        self._records: weakref.WeakKeyDictionary[Any, CompileRecord] = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()
        self._local = _PerThread()
        self._unattributed: list[dict[str, Any]] = []
        self._tap: torch_compat.RecompileLogTap | None = None
        self._tap_note = "not installed (installed by the first tracked call)"
        self._flag_states: list[dict[str, Any]] = []  # flag fingerprints compiled code exists for

    # ---- records ----------------------------------------------------------------------------
    def get_or_create(self, model: torch.nn.Module, options: CompileOptions, blocks: Sequence[str], *,
                      key: Any = None, label: str | None = None, guard_filter_fn: GuardFilterFn | None = None,
                      strict: bool = False, in_place: bool = False) -> tuple[CompileRecord, bool]:
        """``(record, created)``: the record for ``key`` (default: ``model``), compiling ``blocks`` of ``model`` if needed.

        Reused (``created=False``, same compiled callables) when made for this same ``model`` object with equal
        ``options``, ``blocks``, guard filter and ``in_place``, else replaced; ``strict`` is updated on reuse.
        ``in_place``: the model compiled itself (diffusers' ``compile_repeated_blocks``): nothing is compiled here,
        ``blocks`` are for reports. ``key`` must be weak-referenceable (the record lives as long as it) and not
        referenced by the compiled callables. Raises ``ValueError`` for unknown block paths (:func:`compile_blocks`).
        """
        k = model if key is None else key
        with self._lock:
            rec = self._records.get(k)
            if rec is not None and rec.matches(model, options, blocks, guard_filter_fn, in_place):
                rec.stats.strict = strict
                return rec, False
            compiled = {} if in_place else compile_blocks(model, blocks, options, guard_filter_fn)
            opts = options.as_dict()
            opts["guard_filter"] = None if guard_filter_fn is None else repr(guard_filter_fn)
            rec = CompileRecord(label=label or type(model).__name__, blocks=tuple(blocks), options=opts,
                                compiled=compiled, compile_options=options, guard_filter=guard_filter_fn,
                                model_ref=weakref.ref(model), in_place=in_place, stats=CompileStats(strict=strict))
            self._records[k] = rec
            return rec, True

    def get(self, key: Any) -> CompileRecord | None:
        """The record for ``key`` (a model or explicit key), or None."""
        with self._lock:
            return self._records.get(key)

    def records(self) -> list[CompileRecord]:
        """Live records, oldest first."""
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.created)

    def __len__(self) -> int:
        return len(self._records)

    # ---- what adapters report ---------------------------------------------------------------
    def set_strict(self, record: CompileRecord, strict: bool) -> bool:
        """Set ``stats.strict`` (used by calls tracked without ``strict``); returns the previous setting."""
        with self._lock:
            previous, record.stats.strict, record.stats.updated = record.stats.strict, bool(strict), time.time()
            return previous

    def disable(self, record: CompileRecord, reason: str) -> None:
        """Adapter fallback to eager: ``stats.disabled``, and ``reason`` as a ``kind="disabled"`` fallback."""
        with self._lock:
            record.stats.disabled = True
            record.stats.fallbacks.append({"kind": "disabled", "reason": reason, "time": time.time(),
                                           "run": record.stats.runs})
            record.stats.updated = time.time()

    def mark_warm(self, record: CompileRecord, target: tuple) -> None:
        """Record that a warm-up at ``target`` (e.g. the latent shape) finished on ``record``."""
        with self._lock:
            record.stats.warm_targets.add(tuple(target))
            record.stats.updated = time.time()

    def note_compile_cache(self, record: CompileRecord, cache_view: Mapping[str, Any], messages: Sequence[str] = ()) -> None:
        """Record the compile cache used (its client view) and ``messages`` about it (as warnings)."""
        with self._lock:
            record.stats.compile_cache = dict(cache_view)
            record.stats.warnings.extend(messages)
            record.stats.updated = time.time()

    # ---- tracking ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def run(self, record: CompileRecord) -> Iterator[int]:
        """Mark one run (e.g. one sampling call) of ``record``; tracked calls inside belong to it. Yields the run
        number (1-based); a :meth:`track` outside any run is a run of its own. At the end ``stats.last_run`` (and
        ``run_log``) holds its calls, graphs, recompiles with reasons, and how many compiled-block parameters were
        replaced by new tensor objects (``params_replaced``; 0 means in-place weight updates only)."""
        with self._lock:
            record.stats.runs += 1
            number = record.stats.runs
            before = (record.stats.calls, record.stats.graphs)
        previous = self._local.runs.get(id(record))
        self._local.runs[id(record)] = number
        try:
            yield number
        finally:
            if previous is None:
                self._local.runs.pop(id(record), None)
            else:
                self._local.runs[id(record)] = previous
            self._finish_run(record, number, before)

    def _finish_run(self, record: CompileRecord, number: int, before: tuple[int, int]) -> None:
        """Store the per-run statistics of run ``number`` and check parameter identity."""
        s = record.stats
        replaced: list[str] = []
        if s.params is not None:
            blocks = record.block_modules()
            replaced = s.params.replaced(blocks)
            if replaced:  # count each replacement once: compare later runs with the new objects
                s.params = ParamIdentity.capture(blocks)
        with self._lock:
            events = [r for r in s.recompiles if r.get("run") == number]
            stats = {"run": number, "calls": s.calls - before[0], "graphs": s.graphs - before[1],
                     "recompiles": len(events), "reasons": [r["reason"] for r in events],
                     "params_replaced": len(replaced), "time": time.time()}
            s.last_run = stats
            s.run_log.append(stats)
            del s.run_log[:-_MAX_RUN_LOG]
            if replaced:
                s.params_replaced += len(replaced)
                text = (f"{record.label}: {len(replaced)} parameter(s) of the compiled blocks were replaced by new "
                        f"tensor objects in run {number} (e.g. {replaced[0]}); weight patches without in-place "
                        f"update (ModelPatcher.weight_inplace_update) can recompile")
                s.warnings.append(text)
        if replaced:
            log.warning(text)

    @contextlib.contextmanager
    def track(self, record: CompileRecord, shape: Any = None, strict: bool | None = None) -> Iterator[CompileRecord]:
        """Attribute the compiles, recompiles and graph breaks happening inside to ``record``.

        Wrap each call of the compiled model (``shape``: input shape, Tensor or nested ints, kept in
        ``stats.shapes_seen``). The first call that finishes turns the record "warm" and sets
        ``stats.first_call_seconds``; an exception inside is recorded in ``stats.errors`` and re-raised; nested
        tracking of the same record is a pass-through. Raises :class:`RecompileError` on exit when ``strict``
        (default ``stats.strict``; adapters pass their clone's setting) and a call that started warm recompiled.
        """
        self._install_tap()
        stack = self._local.stack
        if any(f.record is record for f in stack):
            yield record
            return
        s = record.stats
        own_run = id(record) not in self._local.runs
        with self._lock:
            before_run = (s.calls, s.graphs)
            s.calls += 1
            if own_run:
                s.runs += 1
            if (shp := normalise_shape(shape)) is not None:
                s.shapes_seen.add(shp)
        started_warm = s.status == "warm"
        if not started_warm and s.compile_flags is None:
            flags = guarded_flags()  # what the blocks are about to be compiled under
            with self._lock:
                s.compile_flags = flags
                self._remember_flags(record, flags)
        if s.params is None:
            s.params = ParamIdentity.capture(record.block_modules())
        frame = _Frame(record, torch_compat.dynamo_counters())
        stack.append(frame)
        t0 = time.perf_counter()
        failed = False
        try:
            yield record
        except BaseException as e:
            failed = True
            with self._lock:
                s.errors.append({"error": f"{type(e).__name__}: {e}"[:2000], "time": time.time(),
                                 "run": self._current_run(record), "call": s.calls})
            raise
        finally:
            seconds = time.perf_counter() - t0
            stack.pop()
            own = frame.finish(stack[-1] if stack else None)
            self._apply(record, own, seconds, first=not started_warm and not failed)
            if own.get("unique_graphs", 0):
                with self._lock:
                    self._remember_flags(record, guarded_flags())
                self._check_limit(record)
            if own_run:
                self._finish_run(record, s.runs, before_run)
        if (s.strict if strict is None else strict) and started_warm and frame.recompiles:
            r = frame.recompiles[0]
            raise RecompileError(f"{record.label}: recompiled after warm-up ({len(frame.recompiles)}x) in "
                                 f"{r['function'] or 'a compiled block'}: {r['reason']}")

    def _remember_flags(self, record: CompileRecord, flags: dict[str, Any]) -> None:
        """Note that compiled code exists for ``flags`` (per record and process-wide). Lock held."""
        if flags not in record.stats.flag_states:
            record.stats.flag_states.append(flags)
        if flags not in self._flag_states:
            self._flag_states.append(flags)
            del self._flag_states[:-_MAX_FLAG_STATES]

    def _limit_warning(self, record: CompileRecord, name: str, text: str) -> str | None:  # lock held
        """``text``, added to the record's warnings, the first time for ``name`` (a code object); else None."""
        if name in record.stats.warned_functions:
            return None
        record.stats.warned_functions.add(name)
        record.stats.warnings.append(text)
        return text

    def _check_limit(self, record: CompileRecord) -> None:
        """Warn once per record and code object when Dynamo's cache entries near ``recompile_limit``."""
        limit, texts = torch_compat.recompile_limit(), []
        with self._lock:
            for name, n in record.cache_entries().items():
                if n >= limit - 2:
                    last = record.stats.recompiles[-1]["reason"] if record.stats.recompiles else "n/a"
                    texts.append(self._limit_warning(record, name, (
                        f"{record.label}: {name} has {n} compiled variant(s) in this process, "
                        f"{torch_compat.RECOMPILE_LIMIT_SETTING}={limit}; {max(0, limit - n)} more and Dynamo "
                        f"runs it EAGERLY (different numerics) or fails with fullgraph. Last reason: {last}")))
        for text in filter(None, texts):
            log.warning(text)

    def _current_run(self, record: CompileRecord) -> int:
        return self._local.runs.get(id(record), record.stats.runs)

    def _apply(self, record: CompileRecord, own: dict[str, int], seconds: float, first: bool) -> None:
        with self._lock:
            s = record.stats
            s.graphs += own.get("unique_graphs", 0)
            s.calls_captured += own.get("calls_captured", 0)
            for k, v in own.items():
                if k.startswith("graph_break:"):
                    s.graph_breaks[k[12:]] = s.graph_breaks.get(k[12:], 0) + v
                elif "cache_" in k:
                    s.cache_state[k] = s.cache_state.get(k, 0) + v
            if first and s.status == "cold":
                s.status = "warm"
                s.first_call_seconds = seconds
            s.updated = time.time()

    # ---- log events -------------------------------------------------------------------------
    def _active(self) -> _Frame | None:
        return self._local.stack[-1] if self._local.stack else None

    def _unattributed_event(self, event: dict[str, Any]) -> None:
        """Keep an event no tracked call was active for (the last ``_MAX_UNATTRIBUTED``); lock held."""
        self._unattributed.append(event)
        del self._unattributed[:-_MAX_UNATTRIBUTED]

    def _on_recompile(self, message: str) -> None:
        frame = self._active()
        with self._lock:
            known = list(frame.record.stats.flag_states if frame is not None else []) + list(self._flag_states)
        event = explain_recompile(parse_recompile(message), known)
        event["time"] = time.time()
        warn_text = None
        with self._lock:
            if frame is None:
                return self._unattributed_event(event)
            rec, s = frame.record, frame.record.stats
            event["run"] = self._current_run(rec)
            event["call"] = s.calls
            s.recompiles.append(event)
            frame.recompiles.append(event)
            s.updated = event["time"]
            fn = event["function"] or "?"
            s.per_function[fn] = count = s.per_function.get(fn, 0) + 1
            limit = torch_compat.recompile_limit()
            if not rec.cache_entries() and count >= limit - 2:  # no cache-entry count: count messages instead
                warn_text = self._limit_warning(rec, fn, (
                    f"{rec.label}: {count} recompiles of {fn} seen, close to "
                    f"{torch_compat.RECOMPILE_LIMIT_SETTING}={limit}; past it Dynamo runs that block "
                    f"EAGERLY (different numerics) or fails with fullgraph. Last reason: {event['reason']}"))
        if warn_text is not None:
            log.warning(warn_text)

    def _on_limit_hit(self, message: str) -> None:
        frame = self._active()
        event = parse_limit_hit(message)
        event["time"] = time.time()
        with self._lock:
            if frame is None:
                return self._unattributed_event(event)
            event["run"] = self._current_run(frame.record)
            frame.record.stats.fallbacks.append(event)
            frame.record.stats.updated = event["time"]

    # ---- log tap ------------------------------------------------------------------------------
    def _install_tap(self) -> None:
        with self._lock:
            if self._tap is None:
                self._tap = torch_compat.install_recompile_log_tap(self._on_recompile, self._on_limit_hit)
                self._tap_note = self._tap.note

    def close(self) -> None:
        """Remove the log tap (:func:`core.torch_compat.remove_recompile_log_tap`: torch's logging state as it
        was before). Records are kept. A later :meth:`track` installs the tap again."""
        with self._lock:
            tap, self._tap = self._tap, None
            self._tap_note = "closed"
            if tap is not None:
                torch_compat.remove_recompile_log_tap(tap)

    @property
    def recompile_logging(self) -> str:
        """Human-readable state of the recompile log tap."""
        return self._tap_note

    def clear(self) -> None:
        """Forget all records and unattributed events (the log tap stays)."""
        with self._lock:
            self._records = weakref.WeakKeyDictionary()
            self._unattributed.clear()

    def as_json(self) -> dict[str, Any]:
        """JSON-serialisable state: torch version, limits, tap state, records, unattributed events."""
        with self._lock:
            return {
                "torch": torch.version.__version__,
                "recompile_limit": torch_compat.recompile_limit(),
                "recompile_logging": self._tap_note,
                "records": [r.as_dict() for r in self.records()],
                "unattributed": [dict(e) for e in self._unattributed],
            }


REGISTRY = CompileRegistry()
