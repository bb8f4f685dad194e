"""Compile state per model: what was compiled, how long it took, graphs, recompiles and why.

One :class:`CompileRecord` per underlying model object, held weakly (the record disappears with the
model). Compiled callables live on the record, so re-registering the same model with equal settings
returns the same record and compiles nothing again.

Numbers come from torch's own reporting, not guesses:

* recompile reasons: Dynamo's ``recompiles`` log artifact, and recompile-limit fallbacks (Dynamo
  silently runs that frame eagerly): the warning Dynamo logs, both captured by the log tap
  (:func:`core.torch_compat.install_recompile_log_tap`, quiet on stderr);
* graphs, graph breaks and cache hits: deltas of Dynamo's counters (:func:`core.torch_compat.dynamo_counters`).

Events are attributed to the record made active by ``with REGISTRY.track(record, shape=...)``
around each compiled call (per thread). The first tracked call installs the log tap; :meth:`CompileRegistry.close`
removes it (torch's logging state as it was before). Sources: ``/work/shared/research/torch_probe.md`` section 6.
Caveat: counters are process-global, so compiles running concurrently in another thread during a
tracked call would be attributed to it. This module imports nothing from ComfyUI.
"""
from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import torch_compat
from .compile import CompileOptions, GuardFilterFn, compile_blocks
from .recompile_watch import (ParamIdentity, code_of, describe_flag_changes, dynamo_global_state_names,
                              explain_global_state, explain_guard, guarded_flags)

log = logging.getLogger("steadfast.registry")

_MAX_UNATTRIBUTED = 50
_MAX_RUN_LOG = 50
_MAX_FLAG_STATES = 32
_REASON_LINE = re.compile(r"^\s*-\s*(?:\d+/\d+:\s*)?(.*)$")

__all__ = ["RecompileError", "CompileRecord", "CompileRegistry", "REGISTRY"]


class RecompileError(RuntimeError):
    """A strict record recompiled after warm-up; the message names the guard that failed."""


def _delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    # max(0, .) protects against counters.clear() / dynamo.reset() in the middle of a call
    return {k: max(0, v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0) > 0}


def _normalise_shape(shape: Any) -> tuple | None:
    """Tensor / torch.Size / (nested) sequence of ints -> hashable (nested) tuple."""
    if shape is None:
        return None
    if isinstance(shape, torch.Tensor):
        return tuple(int(s) for s in shape.shape)
    if isinstance(shape, (int,)):
        return (int(shape),)
    return tuple(_normalise_shape(s) if not isinstance(s, int) else int(s) for s in shape)


def _sorted_shapes(shapes: set) -> list:
    try:
        return sorted(shapes)
    except TypeError:  # mixed nesting: fall back to a stable textual order
        return sorted(shapes, key=repr)


def _parse_recompile(message: str) -> dict[str, Any]:
    """Split Dynamo's 'Recompiling function F in FILE:LINE ... - 0/1: reason' message."""
    lines = message.splitlines()
    head = lines[0] if lines else message
    function = head.removeprefix("Recompiling function ").strip() if head.startswith("Recompiling") else ""
    reasons = [m.group(1).strip() for line in lines[1:] if (m := _REASON_LINE.match(line))]
    reasons = [r for r in reasons if r]
    return {"function": function, "reason": reasons[0] if reasons else message.strip(), "reasons": reasons}


@dataclass(eq=False)
class CompileRecord:
    """Compile state of one model (mutable; read it through :meth:`as_dict` / :meth:`as_text`).

    ``status`` is "cold" until the first tracked call finishes without error, then "warm".
    ``first_call_seconds``: wall seconds of that call (compile + run). ``graphs``: Dynamo graphs
    compiled inside tracked calls (recompiles included). ``recompiles``: ``{reason, reasons,
    function, time (unix s), run, call}`` per recompile. ``fallbacks``: frames Dynamo gave up on
    (recompile limit -> runs eagerly) and adapter-level fallbacks (:meth:`fail`). ``errors``:
    exceptions raised inside tracked calls. ``cache_state``: fx-graph / autograd cache hit & miss
    counts seen in tracked calls. ``compile_flags``: the global-flag fingerprint
    (:func:`core.recompile_watch.guarded_flags`) at the first call, i.e. when the blocks compiled;
    ``flag_states``: every fingerprint under which this record compiled graphs. ``last_run`` /
    ``run_log``: per run (one sampling call) ``{run, calls, graphs, recompiles, reasons,
    params_replaced}``. ``compile_cache``: the persistent cache used (set by adapters, see
    :mod:`core.compile_cache`).
    """

    label: str
    blocks: list[str]
    options: dict[str, Any]
    compiled: dict[str, Callable[..., Any]] = field(repr=False)
    strict: bool = False
    status: str = "cold"
    first_call_seconds: float | None = None
    graphs: int = 0
    calls_captured: int = 0
    recompiles: list[dict[str, Any]] = field(default_factory=list)
    shapes_seen: set = field(default_factory=set)
    calls: int = 0
    runs: int = 0
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    graph_breaks: dict[str, int] = field(default_factory=dict)
    cache_state: dict[str, int] = field(default_factory=dict)
    disabled: bool = False
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    # identity of what was compiled (not serialised)
    _options_obj: CompileOptions | None = field(default=None, repr=False)
    _guard_filter: Any = field(default=None, repr=False)
    _model_ref: Any = field(default=None, repr=False)
    warm_targets: set = field(default_factory=set)
    _per_function: dict[str, int] = field(default_factory=dict, repr=False)
    _warned_functions: set = field(default_factory=set, repr=False)
    compile_flags: dict[str, Any] | None = None
    flag_states: list[dict[str, Any]] = field(default_factory=list, repr=False)
    last_run: dict[str, Any] | None = None
    run_log: list[dict[str, Any]] = field(default_factory=list)
    compile_cache: dict[str, Any] | None = None
    params_replaced: int = 0
    _params: ParamIdentity | None = field(default=None, repr=False)

    def block_modules(self) -> dict[str, torch.nn.Module]:
        """``{path: original module}`` of the compiled blocks (the modules Dynamo traces)."""
        return {p: getattr(c, "_orig_mod", c) for p, c in self.compiled.items()
                if isinstance(getattr(c, "_orig_mod", c), torch.nn.Module)}

    def cache_entries(self) -> dict[str, int]:
        """``{"Class.forward": Dynamo cache entries}`` of each distinct compiled ``forward`` in this
        process (all records and backends share them; the recompile limit applies to this number)."""
        out: dict[str, int] = {}
        for mod in self.block_modules().values():
            code = code_of(mod)
            if code is not None:
                out[f"{type(mod).__name__}.{code.co_name}"] = torch_compat.cache_entry_count(code)
        return out

    def matches(self, model: Any, options: CompileOptions, blocks: Sequence[str],
                guard_filter_fn: Any) -> bool:
        """True when this record compiled exactly ``blocks`` of this very ``model`` with these settings."""
        alive = self._model_ref() if self._model_ref is not None else None
        return (alive is model and self._options_obj == options and self.blocks == list(blocks)
                and self._guard_filter == guard_filter_fn)

    def mark_warm(self, target: tuple) -> None:
        """Record that a warmup at ``target`` (e.g. the latent shape) finished on this record."""
        self.warm_targets.add(tuple(target))
        self.updated = time.time()

    def is_warm_for(self, target: tuple) -> bool:
        """True when this record is warm and was warmed up at ``target`` (and is not disabled)."""
        return self.status == "warm" and not self.disabled and tuple(target) in self.warm_targets

    def fail(self, message: str) -> None:
        """Adapter fallback: stop using the compiled blocks (``disabled``) and record why."""
        self.disabled = True
        self.fallbacks.append({"kind": "disabled", "reason": message, "time": time.time(), "run": self.runs})
        self.updated = time.time()

    def summary(self) -> dict[str, Any]:
        """Short JSON-serialisable summary (for run records / UI badges)."""
        last = self.recompiles[-1]["reason"] if self.recompiles else None
        run = self.last_run or {}
        return {"label": self.label, "status": self.status, "blocks": len(self.blocks),
                "backend": self.options.get("backend"), "first_call_seconds": self.first_call_seconds,
                "graphs": self.graphs, "recompiles": len(self.recompiles), "last_recompile": last,
                "disabled": self.disabled, "strict": self.strict, "run": run.get("run"),
                "graphs_this_run": run.get("graphs"), "recompiles_this_run": run.get("recompiles"),
                "recompile_reasons_this_run": list(run.get("reasons", [])),
                "params_replaced_this_run": run.get("params_replaced"),
                "warnings": list(self.warnings[-3:])}

    def as_dict(self) -> dict[str, Any]:
        """Everything, JSON-serialisable (shapes as sorted lists, times as unix seconds)."""
        def listify(s: Any) -> Any:
            return [listify(x) for x in s] if isinstance(s, tuple) else s

        return {
            "label": self.label, "status": self.status, "strict": self.strict, "disabled": self.disabled,
            "blocks": list(self.blocks), "block_count": len(self.blocks), "options": dict(self.options),
            "first_call_seconds": self.first_call_seconds, "graphs": self.graphs,
            "calls_captured": self.calls_captured,
            "recompiles": [dict(r) for r in self.recompiles],
            "shapes_seen": [listify(s) for s in _sorted_shapes(self.shapes_seen)],
            "calls": self.calls, "runs": self.runs,
            "fallbacks": [dict(f) for f in self.fallbacks], "errors": [dict(e) for e in self.errors],
            "warnings": list(self.warnings), "graph_breaks": dict(self.graph_breaks),
            "cache_state": dict(self.cache_state), "created": self.created, "updated": self.updated,
            "warm_targets": [list(t) for t in sorted(self.warm_targets)],
            "compile_flags": self.compile_flags, "last_run": self.last_run, "run_log": list(self.run_log),
            "compile_cache": self.compile_cache, "params_replaced": self.params_replaced,
            "cache_entries": self.cache_entries(), "recompile_limit": torch_compat.recompile_limit(),
        }

    def as_text(self) -> str:
        """One-line human summary: blocks, compile seconds, graphs, recompiles (+ last reason), status."""
        parts = [f"{self.label}: {len(self.blocks)} block(s) compiled ({self.options.get('backend')})",
                 self.status]
        if self.first_call_seconds is not None:
            parts.append(f"first call {self.first_call_seconds:.1f} s")
        parts.append(f"{self.graphs} graph(s)")
        rec = f"{len(self.recompiles)} recompile(s)"
        if self.recompiles:
            reason = self.recompiles[-1]["reason"]
            rec += f" (last: {reason[:117] + '...' if len(reason) > 120 else reason})"
        parts.append(rec)
        if self.last_run is not None:
            parts.append(f"run {self.last_run['run']}: {self.last_run['recompiles']} recompile(s), "
                         f"{self.last_run['graphs']} graph(s)")
        if self.strict:
            parts.append("strict (a recompile after warm-up is an error)")
        if self.graph_breaks:
            parts.append(f"{sum(self.graph_breaks.values())} graph break(s)")
        if self.fallbacks:
            parts.append(f"{len(self.fallbacks)} fallback(s) to eager")
        if self.disabled:
            parts.append("DISABLED (running eager)")
        text = "; ".join(parts)
        if self.warnings:
            text += "\nWARNING: " + self.warnings[-1]
        return text


@dataclass
class _Frame:
    record: CompileRecord
    before: dict[str, int]
    children: dict[str, int] = field(default_factory=dict)
    recompiles: list[dict[str, Any]] = field(default_factory=list)


class CompileRegistry:
    """Weak map model -> :class:`CompileRecord`, plus attribution of Dynamo events to records.

    Thread-safe for reading (:meth:`as_json` from an HTTP handler) while a worker thread runs tracked
    calls. The first :meth:`track` installs the recompile log tap (recorded; undone by :meth:`close`).
    """

    def __init__(self) -> None:
        self._records: weakref.WeakKeyDictionary[Any, CompileRecord] = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()
        self._local = threading.local()
        self._unattributed: list[dict[str, Any]] = []
        self._tap: torch_compat.RecompileLogTap | None = None
        self._tap_note = "not installed (installed by the first tracked call)"
        self._flag_states: list[dict[str, Any]] = []  # flag fingerprints compiled code exists for

    # ---- records ----------------------------------------------------------------------------
    def get_or_create(self, model: torch.nn.Module, options: CompileOptions, blocks: Sequence[str], *,
                      key: Any = None, label: str | None = None,
                      guard_filter_fn: GuardFilterFn | None = None,
                      strict: bool = False) -> tuple[CompileRecord, bool]:
        """The record for ``key`` (default: ``model``), compiling ``blocks`` of ``model`` if needed.

        Returns ``(record, created)``. An existing record is reused (``created=False``, same compiled
        callables, nothing recompiled) when it was made for this same ``model`` object with equal
        ``options``, ``blocks`` and guard filter; otherwise a new record replaces it. ``strict`` is
        updated on reuse. ``key`` must be weak-referenceable; the record lives as long as the key.
        The compiled callables must not reference ``key`` (they reference the blocks only).
        Raises ``ValueError`` for unknown block paths (see :func:`compile_blocks`).
        """
        k = model if key is None else key
        with self._lock:
            rec = self._records.get(k)
            if rec is not None and rec.matches(model, options, blocks, guard_filter_fn):
                rec.strict = strict
                return rec, False
            compiled = compile_blocks(model, blocks, options, guard_filter_fn)
            opts = options.as_dict()
            opts["guard_filter"] = None if guard_filter_fn is None else repr(guard_filter_fn)
            rec = CompileRecord(label=label or type(model).__name__, blocks=list(blocks), options=opts,
                                compiled=compiled, strict=strict, _options_obj=options,
                                _guard_filter=guard_filter_fn, _model_ref=weakref.ref(model))
            self._records[k] = rec
            return rec, True

    def get(self, key: Any) -> CompileRecord | None:
        """The record for ``key`` (a model or explicit key), or None."""
        with self._lock:
            return self._records.get(key)

    def forget(self, key: Any) -> bool:
        """Drop the record of ``key``; returns whether there was one."""
        with self._lock:
            return self._records.pop(key, None) is not None

    def records(self) -> list[CompileRecord]:
        """Live records, oldest first."""
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.created)

    def __len__(self) -> int:
        return len(self._records)

    # ---- tracking ---------------------------------------------------------------------------
    def _stack(self) -> list[_Frame]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
            self._local.runs = {}
        return self._local.stack

    @contextlib.contextmanager
    def run(self, record: CompileRecord) -> Iterator[int]:
        """Mark one run (e.g. one sampling call) of ``record``; tracked calls inside belong to it.

        Yields the run number (1-based). A :meth:`track` outside any run counts as a run of its own.
        When the run ends, ``record.last_run`` (also appended to ``record.run_log``) holds its calls,
        graphs, recompiles with reasons, and how many compiled-block parameters were replaced by new
        tensor objects during it (``params_replaced``; 0 means in-place weight updates only).
        """
        self._stack()
        with self._lock:
            record.runs += 1
            number = record.runs
            before = (record.calls, record.graphs)
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
        replaced: list[str] = []
        if record._params is not None:
            blocks = record.block_modules()
            replaced = record._params.replaced(blocks)
            if replaced:  # count each replacement once: compare later runs with the new objects
                record._params = ParamIdentity.capture(blocks)
        with self._lock:
            events = [r for r in record.recompiles if r.get("run") == number]
            stats = {"run": number, "calls": record.calls - before[0], "graphs": record.graphs - before[1],
                     "recompiles": len(events), "reasons": [r["reason"] for r in events],
                     "params_replaced": len(replaced), "time": time.time()}
            record.last_run = stats
            record.run_log.append(stats)
            del record.run_log[:-_MAX_RUN_LOG]
            if replaced:
                record.params_replaced += len(replaced)
                text = (f"{record.label}: {len(replaced)} parameter(s) of the compiled blocks were replaced by new "
                        f"tensor objects in run {number} (e.g. {replaced[0]}); weight patches without in-place "
                        f"update (ModelPatcher.weight_inplace_update) can recompile")
                record.warnings.append(text)
        if replaced:
            log.warning(text)

    @contextlib.contextmanager
    def track(self, record: CompileRecord, shape: Any = None, strict: bool | None = None) -> Iterator[CompileRecord]:
        """Attribute the compiles, recompiles and graph breaks happening inside to ``record``.

        Wrap each call of the compiled model (``shape``: the input's shape, a Tensor, or nested
        sequences of ints; recorded in ``shapes_seen``). The first call that finishes turns the record
        "warm" and sets ``first_call_seconds``. An exception inside is recorded in ``errors`` and
        re-raised. Nested tracking of the same record is a pass-through. Raises
        :class:`RecompileError` on exit when ``strict`` (default: ``record.strict``; adapters pass the
        setting of the model clone making the call) and a recompile happened in a call that started warm.
        """
        self._install_tap()
        stack = self._stack()
        if any(f.record is record for f in stack):
            yield record
            return
        own_run = id(record) not in self._local.runs
        with self._lock:
            before_run = (record.calls, record.graphs)
            record.calls += 1
            if own_run:
                record.runs += 1
            if (s := _normalise_shape(shape)) is not None:
                record.shapes_seen.add(s)
        started_warm = record.status == "warm"
        if not started_warm and record.compile_flags is None:
            flags = guarded_flags()  # what the blocks are about to be compiled under
            with self._lock:
                record.compile_flags = flags
                self._remember_flags(record, flags)
        if record._params is None:
            record._params = ParamIdentity.capture(record.block_modules())
        frame = _Frame(record, torch_compat.dynamo_counters())
        stack.append(frame)
        t0 = time.perf_counter()
        failed = False
        try:
            yield record
        except BaseException as e:
            failed = True
            with self._lock:
                record.errors.append({"error": f"{type(e).__name__}: {e}"[:2000], "time": time.time(),
                                      "run": self._current_run(record), "call": record.calls})
            raise
        finally:
            seconds = time.perf_counter() - t0
            stack.pop()
            delta = _delta(torch_compat.dynamo_counters(), frame.before)
            own = {k: max(0, v - frame.children.get(k, 0)) for k, v in delta.items()}
            if stack:  # the enclosing frame must not count these again
                parent = stack[-1].children
                for k, v in delta.items():
                    parent[k] = parent.get(k, 0) + v
            self._apply(record, own, seconds, first=not started_warm and not failed)
            if own.get("unique_graphs", 0):
                with self._lock:
                    self._remember_flags(record, guarded_flags())
                self._check_limit(record)
            if own_run:
                self._finish_run(record, record.runs, before_run)
        if (record.strict if strict is None else strict) and started_warm and frame.recompiles:
            r = frame.recompiles[0]
            raise RecompileError(f"{record.label}: recompiled after warm-up ({len(frame.recompiles)}x) in "
                                 f"{r['function'] or 'a compiled block'}: {r['reason']}")

    def _remember_flags(self, record: CompileRecord, flags: dict[str, Any]) -> None:
        """Note that compiled code exists for ``flags`` (per record and process-wide). Lock held."""
        if flags not in record.flag_states:
            record.flag_states.append(flags)
        if flags not in self._flag_states:
            self._flag_states.append(flags)
            del self._flag_states[:-_MAX_FLAG_STATES]

    def _check_limit(self, record: CompileRecord) -> None:
        """Warn once per record and code object when Dynamo's cache entries near ``recompile_limit``."""
        limit = torch_compat.recompile_limit()
        texts = []
        with self._lock:
            for name, n in record.cache_entries().items():
                if n >= limit - 2 and name not in record._warned_functions:
                    record._warned_functions.add(name)
                    last = record.recompiles[-1]["reason"] if record.recompiles else "n/a"
                    text = (f"{record.label}: {name} has {n} compiled variant(s) in this process, "
                            f"{torch_compat.RECOMPILE_LIMIT_SETTING}={limit}; {max(0, limit - n)} more and Dynamo "
                            f"runs it EAGERLY (different numerics) or fails with fullgraph. Last reason: {last}")
                    record.warnings.append(text)
                    texts.append(text)
        for text in texts:
            log.warning(text)

    def _current_run(self, record: CompileRecord) -> int:
        return getattr(self._local, "runs", {}).get(id(record), record.runs)

    def _apply(self, record: CompileRecord, own: dict[str, int], seconds: float, first: bool) -> None:
        with self._lock:
            record.graphs += own.get("unique_graphs", 0)
            record.calls_captured += own.get("calls_captured", 0)
            for k, v in own.items():
                if k.startswith("graph_break:"):
                    reason = k.split(":", 1)[1]
                    record.graph_breaks[reason] = record.graph_breaks.get(reason, 0) + v
                elif "cache_" in k:
                    record.cache_state[k] = record.cache_state.get(k, 0) + v
            if first and record.status == "cold":
                record.status = "warm"
                record.first_call_seconds = seconds
            record.updated = time.time()

    # ---- log events -------------------------------------------------------------------------
    def _active(self) -> _Frame | None:
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else None

    def _on_recompile(self, message: str) -> None:
        event = _parse_recompile(message)
        event["time"] = time.time()
        frame = self._active()
        warn_text = None
        names = [n for r in event["reasons"] for n in dynamo_global_state_names(r)]
        if names:  # explain Dynamo's "GLOBAL_STATE changed: <name>" with the values
            with self._lock:
                known = list(frame.record.flag_states if frame is not None else []) + list(self._flag_states)
            changes = explain_global_state(known, guarded_flags(), names)
            event["cause"] = "global_flag"
            event["guard"] = event["reason"]
            event["flag_changes"] = [c.as_text() for c in changes]
            event["reason"] = (describe_flag_changes(changes) if changes else
                               "global flag changed since compile: " + ", ".join(dict.fromkeys(names)))
        elif (hint := explain_guard(event["reason"])) is not None:
            event["cause"], event["guard"], event["reason"] = hint[0], event["reason"], hint[1]
        with self._lock:
            if frame is None:
                self._unattributed.append(event)
                del self._unattributed[:-_MAX_UNATTRIBUTED]
                return
            rec = frame.record
            event["run"] = self._current_run(rec)
            event["call"] = rec.calls
            rec.recompiles.append(event)
            frame.recompiles.append(event)
            rec.updated = event["time"]
            fn = event["function"] or "?"
            rec._per_function[fn] = count = rec._per_function.get(fn, 0) + 1
            limit = torch_compat.recompile_limit()
            entries_known = bool(rec.cache_entries())
            if not entries_known and count >= limit - 2 and fn not in rec._warned_functions:
                rec._warned_functions.add(fn)
                warn_text = (f"{rec.label}: {count} recompiles of {fn} seen, close to "
                             f"{torch_compat.RECOMPILE_LIMIT_SETTING}={limit}; past it Dynamo runs that block "
                             f"EAGERLY (different numerics) or fails with fullgraph. "
                             f"Last reason: {event['reason']}")
                rec.warnings.append(warn_text)
        if warn_text is not None:
            log.warning(warn_text)

    def _on_limit_hit(self, message: str) -> None:
        frame = self._active()
        lines = [ln.strip() for ln in message.splitlines()]
        function = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("function:")), "")
        reason = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("last reason:")), "")
        event = {"kind": "recompile_limit", "limit": lines[0] if lines else message, "function": function,
                 "reason": _REASON_LINE.sub(r"\1", "- " + reason) if reason else message, "time": time.time()}
        with self._lock:
            if frame is None:
                self._unattributed.append(event)
                del self._unattributed[:-_MAX_UNATTRIBUTED]
                return
            event["run"] = self._current_run(frame.record)
            frame.record.fallbacks.append(event)
            frame.record.updated = event["time"]

    # ---- logging tap --------------------------------------------------------------------------
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
