"""Compile state per model: what was compiled, how long it took, graphs, recompiles and why.

One :class:`~core.compile.record.CompileRecord` per model object, held weakly; only this module writes
``record.stats``. When a model is released (ComfyUI frees it: ``POST /free``, a new checkpoint), a JSON view of its
record stays, marked ``"released"`` (the last :data:`RELEASED_KEPT`), with its compile seconds, recompiles and
reasons, and whether the next run will be warm (:meth:`CompileRegistry.as_json`).
Recompile reasons and limit fallbacks come from Dynamo's log messages (a log tap), graphs, graph
breaks and cache hits from Dynamo's counters, to the innermost ``with REGISTRY.track(record)`` of the thread.
Caveat: the counters are process-global (a compile in another thread meanwhile counts too). No ComfyUI imports.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import torch_compat
from ..failures import is_interrupt, passes_through
from .guards import GuardFilterFn
from .options import CompileOptions
from .recompiles import (
    FullgraphBreakError,
    ParamIdentity,
    explain_recompile,
    graph_break_message,
    guarded_flags,
    parse_limit_hit,
    parse_recompile,
)
from .record import CompileRecord, CompileStats, normalise_shape
from .swap import compile_blocks
from .warm.precompiled import PrecompiledState

log = logging.getLogger("steadfast.registry")

#: How many records of released models :meth:`CompileRegistry.as_json` keeps (the most recent ones).
RELEASED_KEPT = 32


class RecompileError(RuntimeError):
    """A strict record recompiled after warm-up; the message names the guard that failed."""


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.stack: list[_Frame] = []  # tracked calls in progress
        self.runs: dict[int, int] = {}  # id(record) -> run number in progress


@dataclass
class _Frame:
    record: CompileRecord
    before: dict[str, int]
    recompiles: list[dict[str, Any]] = field(default_factory=list)

    def finish(self, parent: _Frame | None) -> dict[str, int]:
        """This call's own counter increases; they are not ``parent``'s own (its baseline moves up by them)."""
        delta = {
            k: v - self.before.get(k, 0)
            for k, v in torch_compat.dynamo_counters().items()
            if v > self.before.get(k, 0)
        }  # increases only: counters.clear() inside must not go negative
        if parent is not None:
            for k, v in delta.items():
                parent.before[k] = parent.before.get(k, 0) + v
        return delta


class CompileRegistry:
    """Weak map model -> :class:`CompileRecord`, attribution of Dynamo events, every write to record statistics.
    Thread-safe for reading (:meth:`as_json` from an HTTP handler) while a worker thread runs tracked calls."""

    def __init__(self) -> None:
        self._records: weakref.WeakKeyDictionary[Any, CompileRecord] = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()
        self._local = _PerThread()
        self._tap: torch_compat.RecompileLogTap | None = None
        self._flag_states: list[dict[str, Any]] = []  # flag fingerprints compiled code exists for
        self._released: collections.deque[dict[str, Any]] = collections.deque(maxlen=RELEASED_KEPT)
        self._finalizers: dict[int, weakref.finalize] = {}  # id(record) -> called when its key is collected

    def get_or_create(
        self,
        model: torch.nn.Module,
        options: CompileOptions,
        blocks: Sequence[str],
        *,
        key: Any = None,
        label: str | None = None,
        guard_filter_fn: GuardFilterFn | None = None,
        strict: bool = False,
        in_place: bool = False,
    ) -> tuple[CompileRecord, bool]:
        """``(record, created)`` for ``key`` (weak-referenceable, default ``model``), compiling ``blocks`` of
        ``model`` if needed: reused (nothing compiled, ``strict`` updated) when made for this ``model`` object with
        equal ``options``, ``blocks``, guard filter and ``in_place`` (the model compiled itself, e.g. diffusers'
        ``compile_repeated_blocks``; ``blocks`` then only for reports), else replaced. ``ValueError``: unknown
        paths."""
        k = model if key is None else key
        with self._lock:
            rec = previous = self._records.get(k)
            same = rec and (rec.model_ref() is model, rec.compile_options, rec.blocks, rec.guard_filter, rec.in_place)
            if same == (True, options, tuple(blocks), guard_filter_fn, in_place):
                rec.stats.strict = strict
                return rec, False
            pre = None if in_place or options.backend != "inductor" else PrecompiledState.detect()
            compiled = {} if in_place else compile_blocks(model, blocks, options, guard_filter_fn, pre)
            opts = {**options.as_dict(), "guard_filter": None if guard_filter_fn is None else repr(guard_filter_fn)}
            rec = CompileRecord(
                label=label or type(model).__name__,
                blocks=tuple(blocks),
                options=opts,
                compiled=compiled,
                compile_options=options,
                guard_filter=guard_filter_fn,
                model_ref=weakref.ref(model),
                in_place=in_place,
                stats=CompileStats(strict=strict),
                precompiled=pre,
            )
            if previous is not None and (old := self._finalizers.pop(id(previous), None)) is not None:
                old.detach()  # replaced while its model lives: not a release
            self._records[k] = rec
            self._finalizers[id(rec)] = weakref.finalize(k, self._release, rec)
            return rec, True

    def get(self, key: Any) -> CompileRecord | None:
        with self._lock:
            return self._records.get(key)

    def _release(self, record: CompileRecord) -> None:
        """The key of ``record`` was collected: keep its JSON view, marked ``released`` (weakref finalizer)."""
        try:
            view = released_view(record)
        except Exception as e:  # noqa: BLE001 - a finalizer must not raise; keep what is known
            view = {
                "label": record.label,
                "created": record.created,
                "status": "released",
                "released": time.time(),
                "error": f"the record could not be read at release: {type(e).__name__}: {e}"[:500],
            }
        with self._lock:
            self._finalizers.pop(id(record), None)
            self._released.append(view)

    def released(self) -> list[dict[str, Any]]:
        """JSON views of the records of released models (the last :data:`RELEASED_KEPT`), oldest release first."""
        with self._lock:
            return list(self._released)

    def records(self) -> list[CompileRecord]:
        """Live records, oldest first."""
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.created)

    def __len__(self) -> int:
        return len(self._records)

    def set_strict(self, record: CompileRecord, strict: bool) -> bool:
        """Set ``stats.strict``; returns the previous setting."""
        with self._lock:
            previous, record.stats.strict = record.stats.strict, bool(strict)
        return previous

    def disable(self, record: CompileRecord, reason: str) -> None:
        """Adapter fallback to eager: ``stats.disabled`` and a ``kind="disabled"`` fallback with ``reason``."""
        with self._lock:
            record.stats.fallbacks.append(
                {"kind": "disabled", "reason": reason, "time": time.time(), "run": record.stats.runs}
            )
            record.stats.disabled = True

    def mark_warm(self, record: CompileRecord, target: tuple) -> None:
        """A warm-up at ``target`` (e.g. the latent shape) finished on ``record``."""
        with self._lock:
            record.stats.warm_targets = record.stats.warm_targets | {tuple(target)}

    def note_compile_cache(
        self, record: CompileRecord, cache_view: Mapping[str, Any], messages: Sequence[str] = ()
    ) -> None:
        """The compile cache used (its client view) and ``messages`` about it (as warnings)."""
        with self._lock:
            record.stats.warnings.extend(messages)
            record.stats.compile_cache = dict(cache_view)

    @contextlib.contextmanager
    def run(self, record: CompileRecord) -> Iterator[int]:
        """One run (e.g. one sampling call) of ``record``; tracked calls inside belong to it. Yields the 1-based run
        number. At the end ``stats.last_run`` (and ``run_log``) holds its calls, graphs, recompiles with reasons and
        how many compiled-block parameters were replaced by new tensor objects (``params_replaced``)."""
        with self._lock:
            record.stats.runs += 1
            number, before = record.stats.runs, (record.stats.calls, record.stats.graphs)
        outer, self._local.runs = self._local.runs, {**self._local.runs, id(record): number}
        try:
            yield number
        finally:
            self._local.runs = outer
            s = record.stats
            replaced = s.params.replaced(record.block_modules()) if s.params is not None else []
            text = (
                (
                    f"{record.label}: {len(replaced)} parameter(s) of the compiled blocks were replaced by new tensor "
                    f"objects in run {number} (e.g. {replaced[0]}); weight patches without in-place update "
                    f"(ModelPatcher.weight_inplace_update) can recompile"
                )
                if replaced
                else None
            )
            with self._lock:
                if replaced:  # count each replacement once
                    s.params = ParamIdentity.capture(record.block_modules())
                    s.params_replaced += len(replaced)
                    s.warnings.append(text)
                events = [r for r in s.recompiles if r.get("run") == number]
                s.last_run = {
                    "run": number,
                    "calls": s.calls - before[0],
                    "graphs": s.graphs - before[1],
                    "recompiles": len(events),
                    "reasons": [r["reason"] for r in events],
                    "params_replaced": len(replaced),
                    "time": time.time(),
                }
                s.run_log = [*s.run_log, s.last_run][-50:]
            if text:
                log.warning(text)

    @contextlib.contextmanager
    def track(self, record: CompileRecord, shape: Any = None, strict: bool | None = None) -> Iterator[CompileRecord]:
        """Attribute the compiles, recompiles and graph breaks inside one call of the compiled model to ``record``
        (``shape``: Tensor or nested ints, kept in ``stats.shapes_seen``; outside :meth:`run`, a run of its own). The
        first call that finishes turns it "warm" (``first_call_seconds``); an exception is kept in ``stats.errors``
        and re-raised (Dynamo's graph break under ``fullgraph`` as :class:`FullgraphBreakError`, naming the cause,
        where and the switch); an interrupt (:func:`core.failures.is_interrupt`) and an out-of-memory error are
        re-raised unchanged, and an interrupt is not recorded as an error; nested tracking of the same record passes
        through. :class:`RecompileError` on exit when ``strict`` (default ``stats.strict``) and a warm call
        recompiled."""
        stack, s = self._local.stack, record.stats
        if any(f.record is record for f in stack):
            yield record
            return
        if id(record) not in self._local.runs:
            with self.run(record), self.track(record, shape, strict):
                yield record
            return
        with self._lock:
            if self._tap is None:
                self._tap = torch_compat.install_recompile_log_tap(self._on_recompile, self._on_limit_hit)
            s.calls += 1
            if (shp := normalise_shape(shape)) is not None:
                s.shapes_seen.add(shp)
            started_warm = s.status == "warm"
            if not started_warm and s.compile_flags is None:
                s.compile_flags = guarded_flags()  # what the blocks are about to be compiled under
                self._remember_flags(record, s.compile_flags)
            if s.params is None:
                s.params = ParamIdentity.capture(record.block_modules())
        frame = _Frame(record, torch_compat.dynamo_counters())
        stack.append(frame)
        t0, failed = time.perf_counter(), False
        try:
            yield record
        except BaseException as e:
            failed = True
            if not is_interrupt(e):  # the user's Cancel or Ctrl-C is not a failure of the compiled model
                with self._lock:
                    s.errors.append(
                        {
                            "error": f"{type(e).__name__}: {e}"[:2000],
                            "time": time.time(),
                            "run": self._local.runs[id(record)],
                            "call": s.calls,
                        }
                    )
            if (
                getattr(record.compile_options, "fullgraph", False)
                and not passes_through(e)
                and torch_compat.is_graph_break(e)
            ):
                raise FullgraphBreakError(graph_break_message(e, record.label)) from e
            raise
        finally:
            stack.pop()
            self._apply(
                record,
                frame.finish(stack[-1] if stack else None),
                time.perf_counter() - t0,
                not started_warm and not failed,
            )
        if (s.strict if strict is None else strict) and started_warm and frame.recompiles:
            r = frame.recompiles[0]
            raise RecompileError(
                f"{record.label}: recompiled after warm-up ({len(frame.recompiles)}x) in "
                f"{r['function'] or 'a compiled block'}: {r['reason']}"
            )

    def _apply(self, record: CompileRecord, own: dict[str, int], seconds: float, first: bool) -> None:
        s, graphs = record.stats, own.get("unique_graphs", 0)
        with self._lock:
            s.graphs += graphs
            for k, v in own.items():
                if k.startswith("graph_break:"):
                    s.graph_breaks[k[12:]] = s.graph_breaks.get(k[12:], 0) + v
                elif "cache_" in k:
                    s.cache_state[k] = s.cache_state.get(k, 0) + v
            if first and s.status == "cold":
                s.status, s.first_call_seconds = "warm", seconds
            if graphs:
                self._remember_flags(record, guarded_flags())
        if graphs:
            last = s.recompiles[-1]["reason"] if s.recompiles else "n/a"
            for name, n in record.cache_entries().items():
                self._near_limit(record, name, n, f"has {n} compiled variant(s) in this process", last)

    def _remember_flags(self, record: CompileRecord, flags: dict[str, Any]) -> None:  # lock held
        if flags not in record.stats.flag_states:
            record.stats.flag_states.append(flags)
        if flags not in self._flag_states:
            self._flag_states = [*self._flag_states, flags][-32:]

    def _near_limit(self, record: CompileRecord, name: str, n: int, what: str, last_reason: str) -> None:
        """Warn once per record and code object when ``n`` variants of ``name`` near Dynamo's recompile limit."""
        limit = torch_compat.recompile_limit()
        with self._lock:
            if n < limit - 2 or name in record.stats.warned_functions:
                return
            text = (
                f"{record.label}: {name} {what}, {torch_compat.RECOMPILE_LIMIT_SETTING}={limit}; "
                f"{max(0, limit - n)} more and Dynamo runs it EAGERLY (different numerics) or fails with "
                f"fullgraph. Last reason: {last_reason}"
            )
            record.stats.warned_functions.add(name)
            record.stats.warnings.append(text)
        log.warning(text)

    def _on_recompile(self, message: str) -> None:  # from the log tap
        if not self._local.stack:
            return  # outside a tracked call: not ours to count
        frame = self._local.stack[-1]
        rec, s = frame.record, frame.record.stats
        with self._lock:
            known = s.flag_states + self._flag_states
        event = explain_recompile(parse_recompile(message), known)
        with self._lock:
            event.update(time=time.time(), run=self._local.runs[id(rec)], call=s.calls)
            s.recompiles.append(event)
            frame.recompiles.append(event)
        if not rec.cache_entries():  # compiled in place (no code objects to count): count messages instead
            fn = event["function"] or "?"
            n = sum(1 for r in s.recompiles if (r["function"] or "?") == fn)
            self._near_limit(rec, fn, n, f"recompiled {n} time(s)", event["reason"])

    def _on_limit_hit(self, message: str) -> None:
        if self._local.stack:
            rec = self._local.stack[-1].record
            with self._lock:
                event = {**parse_limit_hit(message), "time": time.time(), "run": self._local.runs[id(rec)]}
                rec.stats.fallbacks.append(event)

    def close(self) -> None:
        """Remove the log tap (torch's logging state as it was before); records are kept."""
        with self._lock:
            tap, self._tap = self._tap, None
            if tap is not None:
                torch_compat.remove_recompile_log_tap(tap)

    def as_json(self) -> dict[str, Any]:
        """JSON-serialisable state: torch version, recompile limit, log tap state, records.

        Returns:
            ``records``: every live record (:meth:`CompileRecord.as_dict`, ``status`` "cold" or "warm") and the
            records of released models (:func:`released_view`, ``status`` "released", the last
            :data:`RELEASED_KEPT`), oldest first (by ``created``); ``released_kept``: that bound.
        """
        with self._lock:
            note = self._tap.note if self._tap else "not installed (installed by the first tracked call)"
            records = sorted([*(r.as_dict() for r in self.records()), *self._released], key=lambda r: r["created"])
            return {
                "torch": torch.version.__version__,
                "recompile_limit": torch_compat.recompile_limit(),
                "recompile_logging": note,
                "released_kept": RELEASED_KEPT,
                "records": records,
            }


def next_run(record: CompileRecord) -> tuple[bool, bool, str]:
    """Whether a model compiled again like ``record``'s (same blocks and options) starts warm, and why.

    Args:
        record: the record of a model being released.
    Returns:
        ``(warm_in_this_process, warm_from_compile_cache, text)``: Dynamo's compiled code of the blocks stays in
        this process (cache entries on the blocks' ``forward``), so a reloaded model compiles nothing while its
        guards hold; after a restart only inductor's kernels come back, from the persistent compile cache.
    """
    s, backend = record.stats, record.options.get("backend")
    if s.disabled:
        return (
            False,
            False,
            (
                "cold: the compile failed and the model ran eager; a reloaded model with the same "
                "options compiles again from the start"
            ),
        )
    if not s.graphs and s.status != "warm":
        return False, False, "cold: nothing was compiled before the model was released"
    entries = sum(record.cache_entries().values())
    here = entries > 0 or record.in_place
    text = (
        f"in this process: warm, Dynamo's compiled code of the blocks stays ({entries} cache entr"
        f"{'y' if entries == 1 else 'ies'}): a reloaded model with the same options compiles nothing unless a "
        "guard differs (then the recompile and its reason are recorded)"
        if here
        else "in this process: cold (no compiled code of the blocks is left)"
    )
    if backend != "inductor":
        return here, False, text + f"; after a restart: cold (backend {backend!r} keeps no compiled code on disk)"
    if s.compile_cache is not None:
        return (
            here,
            True,
            text
            + (
                f"; after a restart: warm from the compile cache {s.compile_cache.get('name')!r} "
                "(Dynamo traces again, inductor's kernels are read from the cache, no C++ "
                "compile)"
            ),
        )
    return (
        here,
        False,
        text
        + (
            "; after a restart: no Steadfast compile cache was used (compile_cache off), so "
            "only inductor's own temporary directory may still hold the kernels"
        ),
    )


def released_view(record: CompileRecord) -> dict[str, Any]:
    """The JSON view kept for ``record`` once its model is released.

    Args:
        record: the record whose key (the model) is being collected.
    Returns:
        :meth:`CompileRecord.as_dict` with ``status`` ``"released"`` (``status_at_release``: "cold"/"warm"),
        ``released`` (unix s), ``compile_seconds`` (the first call's wall seconds, compile included),
        ``recompile_count``, ``recompile_reasons``, ``warm_in_this_process``, ``warm_from_compile_cache`` and
        ``next_run`` (:func:`next_run`).
    """
    view = record.as_dict()
    here, cached, text = next_run(record)
    view.update(
        status="released",
        status_at_release=record.stats.status,
        released=time.time(),
        compile_seconds=record.stats.first_call_seconds,
        recompile_count=len(record.stats.recompiles),
        recompile_reasons=[r.get("reason") for r in record.stats.recompiles],
        warm_in_this_process=here,
        warm_from_compile_cache=cached,
        next_run=text,
    )
    return view


REGISTRY = CompileRegistry()
