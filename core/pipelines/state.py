"""Per-pipeline bookkeeping: what was applied, what must happen around each call, the compile record.

Kept in a module-level ``WeakKeyDictionary`` keyed by the pipeline object (nothing is written onto the
pipeline); an entry disappears with its pipeline.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

from ..compile.record import CompileRecord
from ..compile.use import Compiled
from ..optimize.plan import OptimizeReport

__all__ = ["PipelineState", "get_state", "peek_state"]


@dataclass
class PipelineState:
    """Steadfast's view of one pipeline.

    ``report``: the :class:`OptimizeReport` once optimized (None before). ``sdpa_backend``: torch SDPA
    backend entered around each call ("auto" = no context). ``compiled``: the compiled denoiser
    (:func:`core.compile.use.compile_use`: its record and compile cache; ``record`` reads its record).
    ``hotswap_rank``: target rank given to ``enable_lora_hotswap`` (None when not prepared).
    ``adapters``: LoRA adapter names loaded through :func:`~.lora.load_lora`, in order.
    ``qkv_fused``: component names whose attention projections diffusers fused.
    """

    report: OptimizeReport | None = None
    sdpa_backend: str = "auto"
    compiled: Compiled | None = None
    hotswap_rank: int | None = None
    adapters: list[str] = field(default_factory=list)
    lora_events: list[dict[str, Any]] = field(default_factory=list)
    qkv_fused: list[str] = field(default_factory=list)
    warm_targets: set = field(default_factory=set)

    @property
    def record(self) -> CompileRecord | None:
        """The compile record of the denoiser (None: not compiled)."""
        return self.compiled.record if self.compiled is not None else None


_STATES: weakref.WeakKeyDictionary[Any, PipelineState] = weakref.WeakKeyDictionary()


def get_state(pipe: Any) -> PipelineState:
    """The state of ``pipe``, created empty on first use."""
    state = _STATES.get(pipe)
    if state is None:
        state = PipelineState()
        _STATES[pipe] = state
    return state


def peek_state(pipe: Any) -> PipelineState | None:
    """The state of ``pipe`` or None, without creating one."""
    return _STATES.get(pipe)
