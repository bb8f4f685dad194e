"""Optimize Model's compile: a keyed ``APPLY_MODEL`` wrapper (as ComfyUI's set_torch_compile_wrapper) that swaps the
compiled blocks in for one apply_model call, the persistent compile cache, and the live compile state of a clone.

Compiled callables live in the registry record of the underlying BaseModel, so re-executing the node or cloning the
model never compiles again. Key ``steadfast.compile`` (``WrappersMP.APPLY_MODEL`` and ``OUTER_SAMPLE``).
"""
from __future__ import annotations

import contextlib
import logging
import weakref

import torch

import comfy.model_management
from comfy.patcher_extension import WrappersMP

from ...core import torch_compat
from ...core.compile import artifact as compile_artifact
from ...core.compile import blocks, registry
from ...core.compile import cache as compile_cache
from ...core.compile import cache_location as compile_cache_location
from ...core.compile import presets as inductor_presets
from ...core.compile.guards import comfy_guard_filter
from ...core.compile.record import CompileRecord
from ...core.compile.swap import compiled_for, swap_in
from ...core.optimize.plan import OptimizeOptions, StepReport
from ..host.startup import cache_root, client_writable_dirs
from .options import steadfast_options

__all__ = ["KEY_COMPILE", "open_compile_cache", "add_compile", "compile_model", "compile_state"]

log = logging.getLogger("steadfast")

KEY_COMPILE = "steadfast.compile"


def open_compile_cache(backend: str, name: str = "", inductor_options: dict | None = None,
                       ) -> tuple[compile_cache.CompileCache | None, str]:
    """The persistent compile cache for ``backend`` and a line for the node report.

    Only inductor writes a cache (None for other backends). ``name`` (node input) picks a cache under the
    operator's root (``$STEADFAST_COMPILE_CACHE``, else ``<ComfyUI user dir>/steadfast/compile_cache``);
    ``""`` = ``default``, ``off`` = inductor's own temporary folder; ``inductor_options`` (a preset's) are part of
    the directory's key (:func:`core.compile.cache.cache_key_fields`). Raises
    :class:`core.compile.cache_location.CacheRefused` for a path instead of a name, or a root/name that overlaps a
    folder HTTP clients can write. The report line never contains an absolute path.
    """
    chosen = compile_cache_location.check_name(name)  # CacheRefused for a path, before anything else
    if backend != "inductor":
        return None, f"compile cache: not used by backend {backend}"
    if chosen is None:
        return None, "compile cache: off (node input); inductor's default directory applies"
    root, source = cache_root()
    if root is None:
        return None, f"compile cache: off ({source}); inductor's default directory applies"
    device = comfy.model_management.get_torch_device()
    cache = compile_cache.open_cache(root, chosen, device=device, inductor_options=inductor_options, source=source,
                                     forbidden=client_writable_dirs())
    if cache is None:
        return None, (f"compile cache {chosen!r} is not usable (see the server log); "
                      "inductor's default directory applies")
    line = f"compile cache: {chosen!r} ({source})"
    if (note := compile_artifact.cache_note(chosen)) is not None:
        line += f"; {note}"
    if cache.messages:
        line += "\n  " + "\n  ".join(cache.messages)
    return cache, line


def add_compile(model, record: CompileRecord, scope: str,
                cache: compile_cache.CompileCache | None = None, strict: bool = False,
                inductor_preset: str = inductor_presets.NONE) -> StepReport:
    """Register the compile wrappers for ``record`` (created by :func:`registry.REGISTRY.get_or_create`) on ``model``
    (a clone), compiling at ``scope`` ("regional" or "full", :data:`core.compile.options.COMPILE_SCOPES`; recorded
    as the compile state's ``mode``).

    ``APPLY_MODEL``: swap the compiled blocks in for one ``apply_model`` call, tracked by the registry
    (compile seconds, graphs, recompiles with reasons), with the persistent ``cache`` active during
    the call (``TORCHINDUCTOR_CACHE_DIR`` set and restored, :mod:`core.compile.cache`; a compile that
    fails on a corrupt cached file moves the cache aside and retries once). ``OUTER_SAMPLE``: group
    the calls of one sampling run. A compile error falls back to eager for this model, visibly: the
    record is marked ``disabled`` with the reason (shown on Warmup, in run records and
    /steadfast/compile_state) and a warning is logged. ``strict``: a recompile in a call that started
    warm raises :class:`registry.RecompileError` (for this clone only; other clones of the same
    model keep their own setting). ``inductor_preset`` is recorded (compile state, run records) unless "none".

    Returns:
        a "compile" :class:`StepReport`, applied, on the record's block paths (``details``: scope, record label).
    """

    own_blocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its blocks are the compiled ones

    def apply_model_wrapper(executor, *args, **kwargs):
        if record.stats.disabled:
            return executor(*args, **kwargs)
        root = executor.class_obj
        verdict = own_blocks.get(root)
        if verdict is None:
            verdict = own_blocks[root] = compiled_for(root, record.compiled)
            if not verdict:
                log.warning("Steadfast: %s was compiled for another copy of this model (a multi-GPU clone): this "
                            "copy runs its own blocks, uncompiled", record.label)
        if not verdict:
            return executor(*args, **kwargs)  # never another copy's blocks (device, weights) in this one
        x = args[0] if args else kwargs.get("x")
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else None

        def call():
            scope = record.precompiled.call_scope() if record.precompiled is not None else contextlib.nullcontext()
            with registry.REGISTRY.track(record, shape=shape, strict=strict):
                with swap_in(executor.class_obj, record.compiled), scope:
                    out = executor(*args, **kwargs)
            if record.precompiled is not None:  # precompiled artifacts for new keys, outside the tracked call
                record.precompiled.flush()
            return out

        n_messages = len(cache.messages) if cache is not None else 0
        try:
            return compile_cache.run_cached(cache, call, retry_if=torch_compat.is_compile_error)
        except registry.RecompileError:
            raise
        except Exception as e:
            # fullgraph: a graph break is an error
            if not torch_compat.is_compile_error(e) or record.options.get("fullgraph"):
                raise
            # compile failure: fall back to eager, visibly
            registry.REGISTRY.disable(record,
                                      f"{type(e).__name__}: {cache.redact(str(e)) if cache is not None else e}")
            log.warning("Steadfast: compile failed for %s, running it EAGER from now on: %s", record.label, e)
            return executor(*args, **kwargs)
        finally:
            if cache is not None and len(cache.messages) != n_messages:  # the cache was moved aside: say so
                registry.REGISTRY.note_compile_cache(record, cache.as_dict(), cache.messages[n_messages:])

    def outer_sample_wrapper(executor, *args, **kwargs):
        with registry.REGISTRY.run(record):
            return executor(*args, **kwargs)

    model.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, KEY_COMPILE)
    model.remove_wrappers_with_key(WrappersMP.OUTER_SAMPLE, KEY_COMPILE)
    model.add_wrapper_with_key(WrappersMP.APPLY_MODEL, KEY_COMPILE, apply_model_wrapper)
    model.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, KEY_COMPILE, outer_sample_wrapper)
    model.weight_inplace_update = True  # LoRA patches keep Parameter identity -> no recompiles
    if cache is not None:  # with what opening it said (a cache moved aside at open: foreign, or an artifact changed)
        registry.REGISTRY.note_compile_cache(record, cache.as_dict(), cache.messages)
    steadfast_options(model).compile = {"mode": scope, "record_created": record.created, **record.summary(),
                                           **({} if inductor_preset == inductor_presets.NONE
                                              else {"inductor_preset": inductor_preset})}
    return StepReport("compile", True, list(record.blocks), {"scope": scope, "record": record.label})


def compile_model(model, options: OptimizeOptions) -> StepReport:
    """Optimize Model's compile step: the blocks to compile at ``options.scope`` (regional: the blocks
    :func:`core.compile.blocks.choose_blocks` finds; full: the whole ``diffusion_model``), their record in the
    registry (reused when this model compiled them before with the same options), the compile cache, and the
    wrappers (:func:`add_compile`).

    Args:
        model: a ComfyUI ``ModelPatcher`` clone (its other steps applied: compiling comes last).
        options: the plan; reads ``scope``, ``compile`` (held whole), ``compile_cache``, ``strict_recompiles``,
            ``inductor_preset`` and ``attention`` (a warning for ComfyUI's own).
    Returns:
        the "compile" :class:`StepReport` of :func:`add_compile`, with the node's report lines.
    Raises:
        ValueError: regional compile of a model without blocks to compile (use full).
        core.compile.cache_location.CacheRefused: a compile cache name that is a path or overlaps client folders.
    """
    lines: list[str] = []
    copts = options.compile
    diffusion_model = model.get_model_object("diffusion_model")
    if options.scope == "regional":
        choice = blocks.choose_blocks(diffusion_model)
        if not choice.paths:
            raise ValueError(f"regional compile for {type(diffusion_model).__name__}: {choice.as_text()}; "
                             "use compile=full for this model")
        keys = [f"diffusion_model.{p}" for p in choice.paths]
        lines.append("compile: regional, " + choice.as_text())
    else:
        keys = ["diffusion_model"]
        lines.append("compile: full diffusion_model")
    record, created = registry.REGISTRY.get_or_create(
        model.model, copts, keys, label=f"{type(diffusion_model).__name__} ({options.scope})",
        guard_filter_fn=comfy_guard_filter(), strict=options.strict_recompiles)
    cache, cache_line = open_compile_cache(copts.backend, options.compile_cache, dict(copts.options or {}))
    step = add_compile(model, record, options.scope, cache, strict=options.strict_recompiles,
                       inductor_preset=options.inductor_preset)
    lines.append(cache_line)
    if cache is not None and record.precompiled is not None:
        pre = record.precompiled
        lines.append(f"  precompiled blocks: {'on' if pre.enabled else 'off'}, {pre.reason} (loaded from and saved to "
                     "this cache; any difference from what a block was precompiled for runs the jit, with the reason "
                     "in the compile state)")
    if options.attention == "comfy":
        lines.append("WARNING: compiling with ComfyUI's own attention (sub_quad on CPU) graph-breaks and "
                     "recompiles often (measured: 15 graphs, 9 recompiles in 4 steps); pick an SDPA backend")
    lines.append(f"  {copts.as_text()}")
    lines.append(f"  {'new' if created else 'reused'} compile record ({record.stats.status}); compiles "
                 "lazily on the first run or in Warmup")
    if options.inductor_preset != "none":
        lines.append(f"inductor_preset: {options.inductor_preset} (options above"
                     + ("; a compile cache directory of its own)" if cache is not None else ")"))
    if options.strict_recompiles:
        lines.append("strict_recompiles: a recompile after warm-up fails the run, with its reason")
    if not created:  # what this model has compiled so far (recompiles with reasons, warnings)
        lines.append(record.as_text())
    step.details["record_created"] = created
    step.lines = lines
    return step


def compile_state(model) -> dict | str:
    """Live compile summary of this clone ("off" when it carries no Steadfast compile)."""
    snap = steadfast_options(model).compile
    if not snap:
        return "off"
    rec = registry.REGISTRY.get(model.model)
    if rec is not None and rec.created == snap.get("record_created"):
        state = {"mode": snap["mode"], **rec.summary(), "weight_inplace_update": bool(model.weight_inplace_update)}
        if "inductor_preset" in snap:  # only when one is set: records made without one keep their fields
            state["inductor_preset"] = snap["inductor_preset"]
        if rec.stats.compile_cache is not None:
            state["compile_cache"] = rec.stats.compile_cache["name"]
            state["cache_state"] = dict(rec.stats.cache_state)
        if rec.stats.fallbacks:
            state["fallbacks"] = [f.get("reason", "") for f in rec.stats.fallbacks[-3:]]
        return state
    return snap
