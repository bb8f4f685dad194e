"""LoRA loading, including hot-swapping into a compiled denoiser without recompiling.

diffusers' recipe (``loaders/peft.py``, ``enable_lora_hotswap`` docstring; PEFT ``utils/hotswap.py``):

1. ``pipe.enable_lora_hotswap(target_rank=R)`` before the first adapter is loaded (``R`` = the largest rank
   that will ever be swapped in);
2. load the first adapter normally (PEFT pads it to rank ``R`` and turns the scalings into tensors);
3. compile (``optimize_pipeline(..., compile=...)``) and run;
4. ``load_lora_weights(other, adapter_name=<same name>, hotswap=True)``: the new weights are copied into
   the existing LoRA tensors, so module structure, shapes and Dynamo guards stay the same: no recompile.

:func:`prepare_lora_hotswap` and :func:`load_lora` wrap steps 1, 2 and 4 with checks and a record.
Needs the ``peft`` package.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .load import module_components
from .optimize import PipelineStateError
from .state import get_state

__all__ = ["LoraLoadError", "LoraReport", "prepare_lora_hotswap", "load_lora", "adapter_components"]


class LoraLoadError(ValueError):
    """A LoRA cannot be loaded into this pipeline (missing file, no LoRA support, QKV-fused, bad swap)."""


@dataclass(frozen=True)
class LoraReport:
    """What :func:`load_lora` did.

    ``components``: pipeline components that now carry ``adapter_name``. ``compiled``: the denoiser was
    already compiled when the adapter was loaded. ``note``: e.g. that a non-hotswap load into a compiled
    model makes the next call recompile. ``seconds``: wall time of the load.
    """

    adapter_name: str
    hotswap: bool
    source: str
    components: list[str]
    compiled: bool
    seconds: float
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        return asdict(self)


def adapter_components(pipe: Any, adapter_name: str | None = None) -> list[str]:
    """Names of the components with LoRA adapters (with ``adapter_name``, when given)."""
    out = []
    for name, mod in module_components(pipe).items():
        cfg = getattr(mod, "peft_config", None) or {}
        if cfg and (adapter_name is None or adapter_name in cfg):
            out.append(name)
    return out


def _require_peft() -> None:
    try:
        import peft  # noqa: F401
    except ImportError as e:
        raise LoraLoadError("LoRA loading needs the 'peft' package (pip install peft)") from e


def prepare_lora_hotswap(pipe: Any, target_rank: int) -> None:
    """Call ``pipe.enable_lora_hotswap(target_rank=...)``: needed once, before the first LoRA and before compiling.

    Raises:
        LoraLoadError: the pipeline cannot load LoRAs, ``peft`` is missing or ``target_rank < 1``.
        PipelineStateError: the denoiser is already compiled or already has an adapter.
    """
    _require_peft()
    if target_rank < 1:
        raise LoraLoadError(f"target_rank must be >= 1, got {target_rank}")
    if not hasattr(pipe, "enable_lora_hotswap"):
        raise LoraLoadError(f"{type(pipe).__name__} does not support LoRA hot-swapping")
    state = get_state(pipe)
    if state.record is not None:
        raise PipelineStateError("prepare_lora_hotswap must be called before optimize_pipeline(compile=...)")
    if adapter_components(pipe):
        raise PipelineStateError("prepare_lora_hotswap must be called before the first LoRA is loaded")
    pipe.enable_lora_hotswap(target_rank=int(target_rank))
    state.hotswap_rank = int(target_rank)


def load_lora(
    pipe: Any, source: str | Path | Mapping[str, torch.Tensor], adapter_name: str = "default", *, hotswap: bool = False
) -> LoraReport:
    """Load a LoRA (``.safetensors`` file, folder, or state dict) with ``pipe.load_lora_weights``.

    ``hotswap=True`` replaces the weights of the already loaded adapter ``adapter_name`` in place (see the
    module docstring); with :func:`prepare_lora_hotswap` done before compiling this causes no recompile,
    which the compile record shows after the next call (``len(record.stats.recompiles)`` unchanged).

    Raises:
        LoraLoadError: ``peft`` missing, the pipeline has no ``load_lora_weights``, the file does not exist,
            the denoiser's QKV projections are fused (the fused layers would bypass the LoRA), a hotswap
            names an adapter that is not loaded / a plain load reuses a loaded name, or diffusers/PEFT
            rejects the weights (message included).
    """
    _require_peft()
    if not hasattr(pipe, "load_lora_weights"):
        raise LoraLoadError(f"{type(pipe).__name__} cannot load LoRA weights")
    state = get_state(pipe)
    if state.qkv_fused:
        raise LoraLoadError(
            f"QKV projections of {', '.join(state.qkv_fused)} are fused: diffusers' fused "
            f"to_qkv/to_kv layers would bypass a LoRA on to_q/to_k/to_v"
        )
    loaded = adapter_components(pipe, adapter_name)
    if hotswap and not loaded:
        raise LoraLoadError(
            f"cannot hot-swap: no adapter named {adapter_name!r} is loaded yet (load the first one with hotswap=False)"
        )
    if not hotswap and loaded:
        raise LoraLoadError(f"adapter {adapter_name!r} is already loaded; use hotswap=True or another name")
    if isinstance(source, Mapping):
        arg: Any = dict(source)  # diffusers may pop from the dict it gets
        src_text = f"<state dict: {len(source)} tensors>"
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise LoraLoadError(f"LoRA file {str(path)!r} does not exist")
        arg, src_text = str(path), str(path)
    compiled = state.record is not None
    t0 = time.perf_counter()
    try:
        pipe.load_lora_weights(arg, adapter_name=adapter_name, hotswap=hotswap)
    except (ValueError, RuntimeError, KeyError, OSError) as e:
        raise LoraLoadError(f"loading LoRA {src_text} as {adapter_name!r} failed: {type(e).__name__}: {e}") from e
    seconds = time.perf_counter() - t0
    note = ""
    if compiled and not hotswap:
        note = "adapter added to an already compiled denoiser: new LoRA layers change the graph, expect a recompile"
    elif hotswap and state.hotswap_rank is None and compiled:
        note = "hot-swapped without prepare_lora_hotswap: a recompile is likely if ranks/scalings differ"
    if adapter_name not in state.adapters:
        state.adapters.append(adapter_name)
    report = LoraReport(
        adapter_name, hotswap, src_text, adapter_components(pipe, adapter_name), compiled, seconds, note
    )
    state.lora_events.append(report.as_dict())
    return report
