"""Optimize Model's compile, the ComfyUI side: the blocks to compile, a keyed ``APPLY_MODEL`` wrapper (as ComfyUI's
set_torch_compile_wrapper) that runs each apply_model call through the compiled handle with the compiled blocks
swapped in, and the live compile state of a clone.

The use case itself (the record, the cache, each call tracked and cached) is :func:`core.compile.use.compile_use`;
this module hooks the handle into the ModelPatcher (where ComfyUI keeps compile caches:
:func:`nodes.host.startup.cache_choice`). Compiled callables live in the registry record of the underlying BaseModel,
so re-executing the node or cloning the model never compiles again. Key ``steadfast.compile``
(``WrappersMP.APPLY_MODEL`` and ``OUTER_SAMPLE``).
"""

from __future__ import annotations

import logging
import weakref

import torch

from comfy.patcher_extension import WrappersMP

from ...core.compile import blocks, registry
from ...core.compile import presets as inductor_presets
from ...core.compile.guards import comfy_guard_filter
from ...core.compile.swap import compiled_for, swap_in
from ...core.compile.use import Compiled, compile_use
from ...core.optimize.plan import OptimizeOptions, StepReport
from ..host.startup import cache_choice
from .options import steadfast_options

__all__ = ["KEY_COMPILE", "add_compile", "compile_model", "compile_state"]

log = logging.getLogger("steadfast")

KEY_COMPILE = "steadfast.compile"


def add_compile(
    model, compiled: Compiled, scope: str, strict: bool = False, inductor_preset: str = inductor_presets.NONE
) -> StepReport:
    """Register the compile wrappers of ``compiled`` (:func:`core.compile.use.compile_use`) on ``model`` (a clone),
    compiled at ``scope`` ("regional" or "full", :data:`core.compile.options.COMPILE_SCOPES`; recorded as the compile
    state's ``mode``).

    ``APPLY_MODEL``: the compiled blocks swapped in for one ``apply_model`` call, run through
    :meth:`core.compile.use.Compiled.run` (tracked, the cache active; a compile error falls back to eager for this
    model, visibly: the record is marked ``disabled`` with the reason, shown on Warmup, in run records and
    /steadfast/compile_state, and a warning is logged). A clone copied to another device (multi-GPU) runs its own
    blocks, uncompiled. ``OUTER_SAMPLE``: group the calls of one sampling run. ``strict``: a recompile in a call that
    started warm raises :class:`registry.RecompileError` (for this clone only; other clones of the same model keep
    their own setting). ``inductor_preset`` is recorded (compile state, run records) unless "none".

    Returns:
        a "compile" :class:`StepReport`, applied, on the record's block paths (``details``: scope, record label).
    """
    record = compiled.record
    own_blocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its blocks are the compiled ones

    def apply_model_wrapper(executor, *args, **kwargs):
        if record.stats.disabled:
            return executor(*args, **kwargs)
        root = executor.class_obj
        verdict = own_blocks.get(root)
        if verdict is None:
            verdict = own_blocks[root] = compiled_for(root, record.compiled)
            if not verdict:
                log.warning(
                    "Steadfast: %s was compiled for another copy of this model (a multi-GPU clone): this "
                    "copy runs its own blocks, uncompiled",
                    record.label,
                )
        if not verdict:
            return executor(*args, **kwargs)  # never another copy's blocks (device, weights) in this one
        x = args[0] if args else kwargs.get("x")
        return compiled.run(
            lambda: executor(*args, **kwargs),
            shape=tuple(x.shape) if isinstance(x, torch.Tensor) else None,
            strict=strict,
            around=lambda: swap_in(root, record.compiled),
            eager=lambda: executor(*args, **kwargs),
        )

    def outer_sample_wrapper(executor, *args, **kwargs):
        with registry.REGISTRY.run(record):
            return executor(*args, **kwargs)

    model.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, KEY_COMPILE)
    model.remove_wrappers_with_key(WrappersMP.OUTER_SAMPLE, KEY_COMPILE)
    model.add_wrapper_with_key(WrappersMP.APPLY_MODEL, KEY_COMPILE, apply_model_wrapper)
    model.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, KEY_COMPILE, outer_sample_wrapper)
    model.weight_inplace_update = True  # LoRA patches keep Parameter identity -> no recompiles
    steadfast_options(model).compile = {
        "mode": scope,
        "record_created": record.created,
        **record.summary(),
        **({} if inductor_preset == inductor_presets.NONE else {"inductor_preset": inductor_preset}),
    }
    return StepReport("compile", True, list(record.blocks), {"scope": scope, "record": record.label})


def compile_model(model, options: OptimizeOptions) -> StepReport:
    """Optimize Model's compile step: the blocks to compile at ``options.scope`` (regional: the blocks
    :func:`core.compile.blocks.choose_blocks` finds; full: the whole ``diffusion_model``), compiled through
    :func:`core.compile.use.compile_use` (the registry record, reused when this model compiled them before with the
    same options, and the compile cache), then the wrappers (:func:`add_compile`).

    Args:
        model: a ComfyUI ``ModelPatcher`` clone (its other steps applied: compiling comes last).
        options: the plan; reads ``scope``, ``compile`` (held whole), ``compile_cache``, ``strict_recompiles``,
            ``inductor_preset`` and ``attention`` (a warning for ComfyUI's own).
    Returns:
        the "compile" :class:`StepReport` of :func:`add_compile`, with the node's report lines.
    Raises:
        ValueError: regional compile of a model without blocks to compile (use full).
        core.compile.warm.cache_location.CacheRefused: a compile cache name that is a path or overlaps client folders.
    """
    lines: list[str] = []
    copts = options.compile
    diffusion_model = model.get_model_object("diffusion_model")
    if options.scope == "regional":
        choice = blocks.choose_blocks(diffusion_model)
        if not choice.paths:
            raise ValueError(
                f"regional compile for {type(diffusion_model).__name__}: {choice.as_text()}; "
                "use compile=full for this model"
            )
        keys = [f"diffusion_model.{p}" for p in choice.paths]
        lines.append("compile: regional, " + choice.as_text())
    else:
        keys = ["diffusion_model"]
        lines.append("compile: full diffusion_model")
    where = cache_choice(options.compile_cache)  # ComfyUI's side of the cache: its root, device, client folders
    compiled = compile_use(
        model.model,
        copts,
        keys,
        label=f"{type(diffusion_model).__name__} ({options.scope})",
        cache=where,
        guard_filter_fn=comfy_guard_filter(),
        strict=options.strict_recompiles,
    )
    step = add_compile(
        model, compiled, options.scope, strict=options.strict_recompiles, inductor_preset=options.inductor_preset
    )
    lines += compiled.lines
    if options.attention == "comfy":
        lines.append(
            "WARNING: compiling with ComfyUI's own attention (sub_quad on CPU) graph-breaks and "
            "recompiles often (measured: 15 graphs, 9 recompiles in 4 steps); pick an SDPA backend"
        )
    lines.append(f"  {copts.as_text()}")
    lines.append(
        f"  {'new' if compiled.created else 'reused'} compile record ({compiled.record.stats.status}); "
        "compiles lazily on the first run or in Warmup"
    )
    if options.inductor_preset != "none":
        lines.append(
            f"inductor_preset: {options.inductor_preset} (options above"
            + ("; a compile cache directory of its own)" if compiled.cache is not None else ")")
        )
    if options.strict_recompiles:
        lines.append("strict_recompiles: a recompile after warm-up fails the run, with its reason")
    if not compiled.created:  # what this model has compiled so far (recompiles with reasons, warnings)
        lines.append(compiled.record.as_text())
    step.details["record_created"] = compiled.created
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
