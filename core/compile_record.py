"""One model's compile record: what was compiled (immutable) and what happened since (statistics kept by the registry).

A :class:`CompileRecord` is a frozen dataclass: its identity (label, block paths, options, the lazy compiled
callables, a weak reference to the model) never changes after :meth:`core.registry.CompileRegistry.get_or_create`
made it; re-registering with other settings makes a new record. Everything that changes while the model runs
lives in ``record.stats`` (:class:`CompileStats`), which only :class:`core.registry.CompileRegistry` methods write
(``tests/core/test_registry.py`` greps the tree for writes elsewhere). Readers use ``record.stats.<field>`` or the
JSON / text views here. This module imports nothing from ComfyUI and changes no global state.
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import torch_compat
from .compile import CompileOptions
from .recompile_watch import ParamIdentity, code_of

__all__ = ["CompileStats", "CompileRecord", "normalise_shape"]


def normalise_shape(shape: Any) -> tuple | None:
    """Tensor / torch.Size / (nested) sequence of ints -> hashable (nested) tuple of ints; None stays None."""
    if shape is None:
        return None
    if isinstance(shape, torch.Tensor):
        return tuple(int(s) for s in shape.shape)
    if isinstance(shape, int):
        return (int(shape),)
    return tuple(normalise_shape(s) if not isinstance(s, int) else int(s) for s in shape)


def _sorted_shapes(shapes: set) -> list:
    try:
        return sorted(shapes)
    except TypeError:  # mixed nesting: a stable textual order instead
        return sorted(shapes, key=repr)


@dataclass(eq=False)
class CompileStats:
    """What happened to one record since it was made. Written only by :class:`core.registry.CompileRegistry`.

    ``strict``: a recompile in a call that started warm raises (updated on reuse). ``status``: "cold" until the
    first tracked call finishes without error, then "warm". ``first_call_seconds``: wall seconds of that call
    (compile + run). ``graphs``: Dynamo graphs compiled inside tracked calls (recompiles included).
    ``recompiles``: ``{reason, reasons, function, time (unix s), run, call}`` per recompile (plus ``cause``,
    ``guard``, ``flag_changes`` when explained). ``fallbacks``: frames Dynamo gave up on (recompile limit -> runs
    eagerly) and adapter fallbacks (``kind="disabled"``). ``errors``: exceptions raised inside tracked calls.
    ``cache_state``: fx-graph / autograd cache hit & miss counts. ``compile_flags``: the global-flag fingerprint
    (:func:`core.recompile_watch.guarded_flags`) at the first call; ``flag_states``: every fingerprint under
    which this record compiled graphs. ``last_run`` / ``run_log``: per run ``{run, calls, graphs, recompiles,
    reasons, params_replaced, time}``. ``compile_cache``: the persistent cache's client view
    (:meth:`core.compile_cache.CompileCache.as_dict`). ``disabled``: the adapter runs the model eagerly.
    """

    strict: bool = False
    status: str = "cold"
    disabled: bool = False
    first_call_seconds: float | None = None
    graphs: int = 0
    calls_captured: int = 0
    calls: int = 0
    runs: int = 0
    recompiles: list[dict[str, Any]] = field(default_factory=list)
    shapes_seen: set = field(default_factory=set)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    graph_breaks: dict[str, int] = field(default_factory=dict)
    cache_state: dict[str, int] = field(default_factory=dict)
    updated: float = field(default_factory=time.time)
    warm_targets: set = field(default_factory=set)
    compile_flags: dict[str, Any] | None = None
    flag_states: list[dict[str, Any]] = field(default_factory=list, repr=False)
    last_run: dict[str, Any] | None = None
    run_log: list[dict[str, Any]] = field(default_factory=list)
    compile_cache: dict[str, Any] | None = None
    params_replaced: int = 0
    params: ParamIdentity | None = field(default=None, repr=False)  # parameter objects at the first call
    per_function: dict[str, int] = field(default_factory=dict, repr=False)  # recompiles per function name
    warned_functions: set = field(default_factory=set, repr=False)  # limit warnings already given


@dataclass(frozen=True, eq=False)
class CompileRecord:
    """What was compiled for one model (immutable), plus its :class:`CompileStats` (``stats``).

    ``label``: human name. ``blocks``: dotted block paths compiled (``in_place``: compiled by the model itself,
    e.g. diffusers' ``compile_repeated_blocks``; ``compiled`` is then empty and ``blocks`` are for reports).
    ``options``: JSON view of the :class:`core.compile.CompileOptions` (plus ``guard_filter``).
    ``compiled``: ``{path: lazy torch.compile wrapper}`` for :func:`core.compile.swap_in`. ``created``: unix s.
    Equality is identity (records are keys of per-thread run bookkeeping).
    """

    label: str
    blocks: tuple[str, ...]
    options: dict[str, Any]
    compiled: Mapping[str, Callable[..., Any]] = field(repr=False)
    compile_options: CompileOptions | None = field(default=None, repr=False)
    guard_filter: Any = field(default=None, repr=False)
    model_ref: weakref.ref | None = field(default=None, repr=False)
    in_place: bool = False
    created: float = field(default_factory=time.time)
    stats: CompileStats = field(default_factory=CompileStats)

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

    def matches(self, model: Any, options: CompileOptions, blocks: Sequence[str], guard_filter_fn: Any,
                in_place: bool = False) -> bool:
        """True when this record compiled exactly ``blocks`` of this very ``model`` with these settings."""
        alive = self.model_ref() if self.model_ref is not None else None
        return (alive is model and self.compile_options == options and self.blocks == tuple(blocks)
                and self.guard_filter == guard_filter_fn and self.in_place == in_place)

    def is_warm_for(self, target: tuple) -> bool:
        """True when this record is warm, not disabled, and was warmed up at ``target`` (e.g. a latent shape)."""
        s = self.stats
        return s.status == "warm" and not s.disabled and tuple(target) in s.warm_targets

    def summary(self) -> dict[str, Any]:
        """Short JSON-serialisable summary (for run records / UI badges)."""
        s = self.stats
        run = s.last_run or {}
        return {"label": self.label, "status": s.status, "blocks": len(self.blocks),
                "backend": self.options.get("backend"), "first_call_seconds": s.first_call_seconds,
                "graphs": s.graphs, "recompiles": len(s.recompiles),
                "last_recompile": s.recompiles[-1]["reason"] if s.recompiles else None,
                "disabled": s.disabled, "strict": s.strict, "run": run.get("run"),
                "graphs_this_run": run.get("graphs"), "recompiles_this_run": run.get("recompiles"),
                "recompile_reasons_this_run": list(run.get("reasons", [])),
                "params_replaced_this_run": run.get("params_replaced"), "warnings": list(s.warnings[-3:])}

    def as_dict(self) -> dict[str, Any]:
        """Everything, JSON-serialisable (shapes as sorted lists, times as unix seconds)."""
        def listify(v: Any) -> Any:
            return [listify(x) for x in v] if isinstance(v, tuple) else v

        s = self.stats
        return {
            "label": self.label, "status": s.status, "strict": s.strict, "disabled": s.disabled,
            "blocks": list(self.blocks), "block_count": len(self.blocks), "in_place": self.in_place,
            "options": dict(self.options), "first_call_seconds": s.first_call_seconds, "graphs": s.graphs,
            "calls_captured": s.calls_captured, "recompiles": [dict(r) for r in s.recompiles],
            "shapes_seen": [listify(x) for x in _sorted_shapes(s.shapes_seen)], "calls": s.calls, "runs": s.runs,
            "fallbacks": [dict(f) for f in s.fallbacks], "errors": [dict(e) for e in s.errors],
            "warnings": list(s.warnings), "graph_breaks": dict(s.graph_breaks), "cache_state": dict(s.cache_state),
            "created": self.created, "updated": s.updated, "warm_targets": [list(t) for t in sorted(s.warm_targets)],
            "compile_flags": s.compile_flags, "last_run": s.last_run, "run_log": list(s.run_log),
            "compile_cache": s.compile_cache, "params_replaced": s.params_replaced,
            "cache_entries": self.cache_entries(), "recompile_limit": torch_compat.recompile_limit(),
        }

    def as_text(self) -> str:
        """One-line human summary: blocks, compile seconds, graphs, recompiles (+ last reason), status."""
        s = self.stats
        parts = [f"{self.label}: {len(self.blocks)} block(s) compiled ({self.options.get('backend')})", s.status]
        if s.first_call_seconds is not None:
            parts.append(f"first call {s.first_call_seconds:.1f} s")
        parts.append(f"{s.graphs} graph(s)")
        rec = f"{len(s.recompiles)} recompile(s)"
        if s.recompiles:
            reason = s.recompiles[-1]["reason"]
            rec += f" (last: {reason[:117] + '...' if len(reason) > 120 else reason})"
        parts.append(rec)
        if s.last_run is not None:
            parts.append(f"run {s.last_run['run']}: {s.last_run['recompiles']} recompile(s), "
                         f"{s.last_run['graphs']} graph(s)")
        if s.strict:
            parts.append("strict (a recompile after warm-up is an error)")
        if s.graph_breaks:
            parts.append(f"{sum(s.graph_breaks.values())} graph break(s)")
        if s.fallbacks:
            parts.append(f"{len(s.fallbacks)} fallback(s) to eager")
        if s.disabled:
            parts.append("DISABLED (running eager)")
        text = "; ".join(parts)
        if s.warnings:
            text += "\nWARNING: " + s.warnings[-1]
        return text
