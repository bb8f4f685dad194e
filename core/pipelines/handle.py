"""Immutable pipeline values for node graphs: optimize and add LoRAs without changing an upstream value.

A node graph (ComfyUI) caches every node's output and may hand one output to several nodes, so a node
must never change an object it received. A :class:`PipelineHandle` is such a value: a diffusers pipeline
plus what should be active when it runs (a LoRA). The rules:

* the pipeline a loader returns is never modified by Steadfast: :func:`optimized_handle` applies
  :func:`~.optimize.optimize_pipeline` to a weight-sharing copy (:func:`~.share.share_pipeline`), and a
  LoRA is loaded into a copy too (:func:`runtime_pipe`);
* a LoRA handle does not load anything: the LoRA is made active right before the pipeline runs
  (:func:`prepare_run`: load, hot-swap, or disable), so every handle runs with exactly its own LoRA
  whatever ran before on the shared copy;
* the optimized copy is memoised per (source pipeline, options, LoRA max rank): optimizing the same
  pipeline with the same options again (e.g. because an upstream LoRA changed) returns the same,
  already compiled copy, and the new LoRA is hot-swapped into it at run time - no recompile
  (diffusers' ``enable_lora_hotswap`` recipe, see :mod:`.lora`).

Costs: the copy shares every weight; QKV fusion adds the fused projections (diffusers keeps the originals),
channels-last copies the conv weights of the denoiser and VAE (it rewrites them in place). The memo keeps
one optimized copy per source pipeline alive while the source lives. No ComfyUI imports.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compile.use import CacheChoice
from ..optimize.plan import OptimizeOptions, OptimizeReport
from .load import denoiser_of
from .lora import LoraLoadError, load_lora, prepare_lora_hotswap
from .optimize import PipelineStateError, optimize_pipeline
from .run import compile_record
from .share import conv_weights, share_pipeline
from .state import peek_state

__all__ = [
    "ADAPTER_NAME",
    "LoraSpec",
    "PipelineHandle",
    "lora_file_rank",
    "optimized_handle",
    "runtime_pipe",
    "prepare_run",
    "RUN_LOCK",
]

ADAPTER_NAME = "steadfast"
"""Adapter name of the (single) LoRA slot a handle fills."""

RUN_LOCK = threading.RLock()
"""Hold it from :func:`prepare_run` to the end of the pipeline call (the LoRA state is per shared copy)."""


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA file a handle wants active. ``rank``: largest rank in the file; ``max_rank``: the rank a
    compiled pipeline is prepared for (``enable_lora_hotswap(target_rank=max_rank)``); ``size`` /
    ``mtime_ns`` identify the file version (a rewritten file is loaded again)."""

    name: str
    path: str
    rank: int
    max_rank: int
    size: int
    mtime_ns: int

    @property
    def key(self) -> tuple:
        """What identifies these LoRA weights."""
        return (self.path, self.size, self.mtime_ns)

    @classmethod
    def from_file(cls, name: str, path: str | Path, max_rank: int) -> LoraSpec:
        """Spec for ``path`` (a ``.safetensors`` LoRA). Raises :class:`~.lora.LoraLoadError` when the file is
        missing, unreadable, holds no ``lora_A``/``lora_down`` weights, or its rank exceeds ``max_rank``."""
        p = Path(path)
        if not p.is_file():
            raise LoraLoadError(f"LoRA file {str(p)!r} does not exist")
        rank = lora_file_rank(p)
        if max_rank < 1:
            raise LoraLoadError(f"max_rank must be >= 1, got {max_rank}")
        if rank > max_rank:
            raise LoraLoadError(
                f"LoRA {name!r} has rank {rank}, larger than max_rank {max_rank}: raise max_rank "
                f"to at least {rank} (a compiled pipeline is prepared for max_rank)"
            )
        st = p.stat()
        return cls(name, str(p), rank, int(max_rank), st.st_size, st.st_mtime_ns)


def lora_file_rank(path: str | Path) -> int:
    """Largest LoRA rank in a ``.safetensors`` file (dim 0 of ``lora_A`` / ``lora_down`` weights).

    Reads only the JSON header (no tensor data). Raises :class:`~.lora.LoraLoadError` for a file that is
    not safetensors or has no LoRA down-projection weights.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n <= 0 or n > 100_000_000:
                raise ValueError(f"implausible header size {n}")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise LoraLoadError(f"{str(p)!r} is not a readable .safetensors LoRA: {e}") from e
    if not isinstance(header, dict):
        raise LoraLoadError(
            f"{str(p)!r} is not a .safetensors LoRA: its header is a JSON {type(header).__name__}, not an object"
        )
    bad = sorted(k for k, v in header.items() if k != "__metadata__" and not isinstance(v, dict))
    if bad:
        raise LoraLoadError(
            f"{str(p)!r} is not a valid .safetensors file: header entries {bad[:3]} are not "
            f"tensor descriptions (a dict with dtype/shape/data_offsets)"
        )
    ranks = [
        int(v["shape"][0])
        for k, v in header.items()
        if k != "__metadata__" and ("lora_A" in k or "lora_down" in k) and v.get("shape")
    ]
    if not ranks:
        raise LoraLoadError(f"{str(p)!r} holds no LoRA weights (no lora_A / lora_down tensors)")
    return max(ranks)


@dataclass(frozen=True, eq=False)
class PipelineHandle:
    """A pipeline value: ``pipe`` (diffusers pipeline), where it came from, and the LoRA to run with.

    ``owned``: ``pipe`` is a Steadfast copy (from :func:`optimized_handle`), which LoRAs may be loaded into; a pipeline
    returned by a loader is not owned and is never modified. ``lora``: the LoRA to make active at run time (None:
    none). ``determinism``: a :class:`~..determinism_policy.DeterminismPolicy` applied around each run of this value
    (None: none). ``batch_invariant``: generate image by image (each a batch-1 pipeline call, so image i equals the
    batch-1 run at seed + i). ``notes``: what produced this value, for reports.
    """

    pipe: Any
    source: str
    dtype: str
    owned: bool = False
    lora: LoraSpec | None = None
    determinism: Any = None
    batch_invariant: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def replace(self, **changes: Any) -> PipelineHandle:
        """A new handle with ``changes`` (the pipeline object is shared)."""
        return dataclasses.replace(self, **changes)

    @property
    def optimized(self) -> bool:
        """True when ``pipe`` went through :func:`~.optimize.optimize_pipeline`."""
        state = peek_state(self.pipe)
        return state is not None and state.report is not None

    def describe(self) -> str:
        """One line: class, source, dtype, optimized or not, LoRA."""
        parts = [f"{type(self.pipe).__name__} from {self.source!r} ({self.dtype})"]
        if self.optimized:
            parts.append("optimized copy")
        if self.lora is not None:
            parts.append(f"LoRA {self.lora.name} (rank {self.lora.rank}, max_rank {self.lora.max_rank})")
        return ", ".join(parts)


@dataclass
class _Memo:
    key: tuple
    pipe: Any
    report: OptimizeReport
    seconds: float
    uses: int = 1


_OPTIMIZED: weakref.WeakKeyDictionary[Any, _Memo] = weakref.WeakKeyDictionary()
_LORA_COPIES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_MEMO_LOCK = threading.Lock()


def optimized_handle(
    handle: PipelineHandle,
    options: OptimizeOptions,
    cache: CacheChoice | None = None,
) -> tuple[PipelineHandle, OptimizeReport, bool]:
    """Apply ``options`` to a weight-sharing copy of ``handle.pipe``, its compile with the persistent compile
    ``cache`` (:func:`~..compile.use.compile_use`; None: inductor's default directory); returns
    ``(handle, report, reused)``.

    ``handle.pipe`` is not modified. With the same source pipeline, options, cache and LoRA ``max_rank`` as an
    earlier call the earlier copy is returned (``reused=True``: nothing is copied, optimized or compiled
    again). When ``handle`` carries a LoRA, the copy is prepared for hot-swapping up to its ``max_rank``
    before anything is compiled (:func:`~.lora.prepare_lora_hotswap`). The returned handle keeps
    ``handle.lora``; it is loaded at run time (:func:`prepare_run`).

    Raises:
        PipelineStateError: ``handle`` is already optimized, or QKV fusion is asked for together with a
            LoRA (diffusers' fused projections would bypass the LoRA layers).
        plus what :func:`~.optimize.optimize_pipeline` raises (unsupported attention backend ...).
    """
    if handle.owned or handle.optimized:
        raise PipelineStateError(
            "this pipeline is already optimized (an Optimize node is upstream); optimize the "
            "loader's output once, with all the options you want"
        )
    if options.qkv_fusion and handle.lora is not None:
        raise PipelineStateError(
            f"QKV fusion cannot be combined with the LoRA {handle.lora.name!r}: diffusers' "
            f"fused to_qkv projections would bypass the LoRA layers on to_q/to_k/to_v"
        )
    max_rank = handle.lora.max_rank if handle.lora is not None else None
    key = (options, cache, max_rank)
    base = handle.pipe
    with _MEMO_LOCK:
        memo = _OPTIMIZED.get(base)
        if memo is not None and memo.key == key:
            memo.uses += 1
            return handle.replace(pipe=memo.pipe, owned=True), memo.report, True
        t0 = time.perf_counter()
        den_name, _ = denoiser_of(base)
        filters = {den_name: conv_weights, "vae": conv_weights} if options.channels_last else None
        pipe = share_pipeline(base, filters)
        if max_rank is not None:
            prepare_lora_hotswap(pipe, max_rank)
        report = optimize_pipeline(pipe, options, cache)
        _OPTIMIZED[base] = _Memo(key, pipe, report, time.perf_counter() - t0)
    return handle.replace(pipe=pipe, owned=True), report, False


def runtime_pipe(handle: PipelineHandle) -> Any:
    """The pipeline object that runs for ``handle``: ``handle.pipe``, or for a LoRA on a pipeline Steadfast
    does not own (a loader's output) a weight-sharing copy of it (one per source pipeline, reused)."""
    if handle.owned or handle.lora is None:
        return handle.pipe
    with _MEMO_LOCK:
        pipe = _LORA_COPIES.get(handle.pipe)
        if pipe is None:
            pipe = share_pipeline(handle.pipe)
            _LORA_COPIES[handle.pipe] = pipe
    return pipe


@dataclass
class _Slot:
    loaded: LoraSpec | None = None
    enabled: bool = False


_SLOTS: weakref.WeakKeyDictionary[Any, _Slot] = weakref.WeakKeyDictionary()


def _ensure_lora(pipe: Any, spec: LoraSpec | None) -> list[str]:
    slot = _SLOTS.get(pipe)
    if slot is None:
        slot = _SLOTS[pipe] = _Slot()
    if spec is None:
        if slot.loaded is not None and slot.enabled:
            pipe.disable_lora()
            slot.enabled = False
            return [f"LoRA {slot.loaded.name} disabled (this pipeline value carries no LoRA)"]
        return []
    if slot.loaded is not None and slot.loaded.key == spec.key:
        if not slot.enabled:
            pipe.enable_lora()
            slot.enabled = True
            return [f"LoRA {spec.name} enabled again"]
        return []
    t0 = time.perf_counter()
    if slot.loaded is None:
        load_lora(pipe, spec.path, ADAPTER_NAME)
        what = f"loaded LoRA {spec.name} (rank {spec.rank})"
    else:
        try:
            load_lora(pipe, spec.path, ADAPTER_NAME, hotswap=True)
            what = f"hot-swapped LoRA {slot.loaded.name} -> {spec.name} (rank {spec.rank})"
        except LoraLoadError as e:
            if compile_record(pipe) is not None:
                raise LoraLoadError(
                    f"cannot hot-swap {spec.name!r} into the compiled pipeline: {e}. The LoRAs must "
                    f"target the same layers with rank <= max_rank"
                ) from e
            pipe.delete_adapters(ADAPTER_NAME)
            load_lora(pipe, spec.path, ADAPTER_NAME)
            what = f"replaced LoRA {slot.loaded.name} -> {spec.name} (not hot-swappable: {e})"
    if slot.loaded is not None and not slot.enabled and what.startswith("hot-swapped"):
        pipe.enable_lora()  # a hot-swap keeps the adapter's disabled state; a fresh load is enabled
    slot.loaded = spec
    slot.enabled = True
    return [f"{what} in {time.perf_counter() - t0:.2f} s"]


def prepare_run(handle: PipelineHandle) -> tuple[Any, list[str]]:
    """The pipeline to call for ``handle``, with exactly ``handle.lora`` active; returns ``(pipe, events)``.

    Call with :data:`RUN_LOCK` held until the pipeline call returns. ``events`` says what changed
    (loaded / hot-swapped / disabled). Raises :class:`~.lora.LoraLoadError` when the LoRA cannot be
    loaded or hot-swapped.
    """
    pipe = runtime_pipe(handle)
    return pipe, _ensure_lora(pipe, handle.lora)
