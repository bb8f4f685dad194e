"""One model's compile record: what was compiled (frozen) and what happened since (statistics).

Other settings make a new record; ``record.stats`` is written only by :class:`core.compile.registry.CompileRegistry`
(``tests/core/test_registry.py`` greps for writes elsewhere). No ComfyUI imports; no global state.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import torch_compat
from .options import CompileOptions
from .recompiles import ParamIdentity, code_of
from .warm.precompiled import PrecompiledState


def normalise_shape(shape: Any) -> tuple | None:
    """Tensor / torch.Size / (nested) sequence of ints -> hashable (nested) tuple of ints; None stays None."""
    shape = shape.shape if isinstance(shape, torch.Tensor) else (shape,) if isinstance(shape, int) else shape
    return None if shape is None else tuple(int(s) if isinstance(s, int) else normalise_shape(s) for s in shape)


@dataclass(eq=False)
class CompileStats:
    """What happened to one record since it was made. ``status``: "cold" until a tracked call finishes without
    error, then "warm" (``first_call_seconds``: wall seconds of that call, compile included). ``recompiles``:
    ``{reason, reasons, function, time (unix s), run, call}`` (+ ``cause``, ``guard``, ``flag_changes`` when
    explained). ``fallbacks``: frames Dynamo runs eagerly (recompile limit), adapter fallbacks (``kind="disabled"``).
    ``compile_flags``: :func:`core.compile.recompiles.guarded_flags` at the first call (``flag_states``: all compiled
    under). ``last_run`` / ``run_log``: ``{run, calls, graphs, recompiles, reasons, params_replaced, time}``."""

    strict: bool = False
    status: str = "cold"
    disabled: bool = False
    first_call_seconds: float | None = None
    graphs: int = 0
    calls: int = 0
    runs: int = 0
    recompiles: list[dict[str, Any]] = field(default_factory=list)
    shapes_seen: set = field(default_factory=set)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    graph_breaks: dict[str, int] = field(default_factory=dict)
    cache_state: dict[str, int] = field(default_factory=dict)
    warm_targets: set = field(default_factory=set)
    compile_flags: dict[str, Any] | None = None
    flag_states: list[dict[str, Any]] = field(default_factory=list, repr=False)
    last_run: dict[str, Any] | None = None
    run_log: list[dict[str, Any]] = field(default_factory=list)
    compile_cache: dict[str, Any] | None = None
    params_replaced: int = 0
    params: ParamIdentity | None = field(default=None, repr=False)
    warned_functions: set = field(default_factory=set, repr=False)


@dataclass(frozen=True, eq=False)
class CompileRecord:
    """What was compiled for one model, plus its :class:`CompileStats`; equality is identity. ``compiled``: ``{path:
    lazy torch.compile wrapper}`` for :func:`core.compile.swap.swap_in` (empty when ``in_place``: the model compiled
    itself). ``options``: JSON view of the ``compile_options`` plus ``guard_filter``. ``created``: unix s.
    ``precompiled``: the precompiled route of the blocks (:class:`core.compile.warm.precompiled.PrecompiledState`),
    None when the blocks are not behind it."""

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
    precompiled: PrecompiledState | None = field(default=None, repr=False)

    def block_modules(self) -> dict[str, torch.nn.Module]:
        """``{path: original module}`` of the compiled blocks (what Dynamo traces)."""
        mods = {p: torch_compat.orig_module(c) for p, c in self.compiled.items()}
        return {p: m for p, m in mods.items() if isinstance(m, torch.nn.Module)}

    def cache_entries(self) -> dict[str, int]:
        """``{"Class.forward": Dynamo cache entries}`` per distinct compiled ``forward``, process-wide (all records
        and backends share them; the recompile limit applies to this number)."""
        return {
            f"{type(m).__name__}.{code.co_name}": torch_compat.cache_entry_count(code)
            for m in self.block_modules().values()
            if (code := code_of(m)) is not None
        }

    def is_warm_for(self, target: tuple) -> bool:
        """Warm, not disabled, and warmed up at ``target`` (e.g. a latent shape)."""
        s = self.stats
        return s.status == "warm" and not s.disabled and tuple(target) in s.warm_targets

    def summary(self) -> dict[str, Any]:
        """Short JSON view for run records and node badges (this run's graphs and recompiles included)."""
        s, run = self.stats, self.stats.last_run or {}
        return {
            "label": self.label,
            "status": s.status,
            "blocks": len(self.blocks),
            "backend": self.options.get("backend"),
            "first_call_seconds": s.first_call_seconds,
            "graphs": s.graphs,
            "recompiles": len(s.recompiles),
            "last_recompile": s.recompiles[-1]["reason"] if s.recompiles else None,
            "disabled": s.disabled,
            "strict": s.strict,
            "run": run.get("run"),
            "graphs_this_run": run.get("graphs"),
            "recompiles_this_run": run.get("recompiles"),
            "recompile_reasons_this_run": list(run.get("reasons", [])),
            "params_replaced_this_run": run.get("params_replaced"),
            "warnings": s.warnings[-3:],
            **({} if self.precompiled is None else {"precompiled": self.precompiled.as_dict()}),
        }

    def as_dict(self) -> dict[str, Any]:
        """Everything, JSON-serialisable (a copy; shapes as sorted lists, times as unix seconds)."""
        out = {k: v for k, v in vars(self.stats).items() if k not in ("params", "warned_functions", "flag_states")}
        for k in ("shapes_seen", "warm_targets"):
            try:
                out[k] = sorted(out[k])
            except TypeError:  # mixed nesting: a stable textual order instead
                out[k] = sorted(out[k], key=repr)
        if self.precompiled is not None:
            out["precompiled"] = self.precompiled.as_dict()
        out.update(
            label=self.label,
            blocks=self.blocks,
            block_count=len(self.blocks),
            in_place=self.in_place,
            options=self.options,
            created=self.created,
            cache_entries=self.cache_entries(),
            recompile_limit=torch_compat.recompile_limit(),
        )
        return json.loads(json.dumps(out))

    def as_text(self) -> str:
        """One-line human summary: blocks, first call, graphs, recompiles (+ last reason), status."""
        s, run = self.stats, self.stats.last_run or {}
        reason = s.recompiles[-1]["reason"] if s.recompiles else ""
        parts = [
            (True, f"{self.label}: {len(self.blocks)} block(s) compiled ({self.options.get('backend')})"),
            (True, s.status),
            (s.first_call_seconds is not None, f"first call {s.first_call_seconds or 0:.1f} s"),
            (True, f"{s.graphs} graph(s)"),
            (
                True,
                f"{len(s.recompiles)} recompile(s)"
                + (f" (last: {reason[:117] + '...' if len(reason) > 120 else reason})" if s.recompiles else ""),
            ),
            (run, f"run {run.get('run')}: {run.get('recompiles')} recompile(s), {run.get('graphs')} graph(s)"),
            (s.strict, "strict (a recompile after warm-up is an error)"),
            (s.graph_breaks, f"{sum(s.graph_breaks.values())} graph break(s)"),
            (s.fallbacks, f"{len(s.fallbacks)} fallback(s) to eager"),
            (s.disabled, "DISABLED (running eager)"),
        ]
        text = "; ".join(t for on, t in parts if on)
        return text + ("\nWARNING: " + s.warnings[-1] if s.warnings else "")
