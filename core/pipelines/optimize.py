"""Apply :class:`~..optimize.plan.OptimizeOptions` to a diffusers pipeline in a safe order, and report what happened.

Order (structural changes first, compilation last, because Dynamo guards on module structure, processor
objects and weight strides): QKV fusion -> channels_last -> attention backend -> VAE slicing/tiling ->
``torch.compile``. Sources: diffusers ``fuse_qkv_projections`` / ``compile_repeated_blocks`` /
``set_attention_backend`` (0.42). How each step changes output bits: ``docs/measurements.md``.

Everything here changes the pipeline in place and is not undone: load a fresh pipeline for a baseline.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import torch_compat
from ..compile.blocks import repeated_block_paths
from ..compile.swap import contiguous_inputs_hook
from ..compile.use import CacheChoice, compile_use
from ..optimize.layout import to_channels_last_
from ..optimize.plan import OptimizeOptions, OptimizeReport, Step, StepReport, run_steps
from .attention import resolve_attention, set_model_attention_backend
from .load import count_params, denoiser_of, module_components, run_device
from .state import get_state

__all__ = ["PipelineStateError", "optimize_pipeline"]


class PipelineStateError(RuntimeError):
    """The pipeline is in a state where the operation cannot be done (e.g. optimized twice)."""


def _param_dtype(module: torch.nn.Module) -> torch.dtype:
    p = next(module.parameters(), None)
    return p.dtype if p is not None else torch.float32


def _has_adapters(module: torch.nn.Module) -> bool:
    return bool(getattr(module, "peft_config", None))


def _qkv_step(pipe: Any, comps: dict[str, torch.nn.Module], den_name: str, opts: OptimizeOptions) -> StepReport:
    step = StepReport("qkv_fusion", False)
    targets = [den_name] + (["vae"] if opts.qkv_fusion_vae and "vae" in comps else [])
    notes = []
    details: dict[str, Any] = {"components": {}}
    for name in targets:
        mod = comps[name]
        if not hasattr(mod, "fuse_qkv_projections"):
            notes.append(f"{name} ({type(mod).__name__}) has no fuse_qkv_projections")
            continue
        before = count_params(mod)
        try:
            mod.fuse_qkv_projections()
        except ValueError as e:  # e.g. models with added KV projections
            notes.append(f"{name}: {e}")
            continue
        after = count_params(mod)
        details["components"][name] = {
            "params_before": before,
            "params_after": after,
            "growth_pct": 100.0 * (after - before) / before if before else 0.0,
            "note": "diffusers keeps the original to_q/to_k/to_v layers next to the fused ones",
        }
        step.modules.append(name)
        get_state(pipe).qkv_fused.append(name)
    step.applied = bool(step.modules)
    step.details = details
    step.note = "; ".join(notes)
    return step


def _channels_last_step(comps: dict[str, torch.nn.Module], den_name: str) -> StepReport:
    step = StepReport("channels_last", False, details={"converted": {}})
    notes = []
    for name in (den_name, "vae"):
        if name not in comps:
            continue
        n = to_channels_last_(comps[name])
        step.details["converted"][name] = n
        if n:
            step.modules.append(name)
        else:
            notes.append(f"{name} has no 4-D (conv) weights to convert")
    step.applied = bool(step.modules)
    step.note = "; ".join(notes)
    return step


def _attention_step(pipe: Any, den: torch.nn.Module, den_name: str, opts: OptimizeOptions) -> StepReport:
    dev, dt = run_device(pipe), _param_dtype(den)
    diffusers_name, sdpa_name = resolve_attention(opts.attention, den, dev, dt)
    details: dict[str, Any] = {
        "requested": opts.attention,
        "diffusers_backend": None,
        "dispatch_modules": 0,
        "sdpa_context": None,
    }
    modules = []
    if diffusers_name is not None:
        details["diffusers_backend"] = diffusers_name
        details["dispatch_modules"] = set_model_attention_backend(den, diffusers_name)
        modules.append(den_name)
    note = ""
    if sdpa_name != "auto":
        get_state(pipe).sdpa_backend = sdpa_name
        details["sdpa_context"] = sdpa_name
        modules.append("pipeline call")
        note = (
            "torch SDPA backend pinned around every pipeline call: it also covers the text encoders and "
            "the VAE, and processors that call SDPA directly"
        )
    return StepReport("attention", True, modules, details, note)


def _vae_step(comps: dict[str, torch.nn.Module], kind: str) -> StepReport:
    vae = comps.get("vae")
    method = "enable_slicing" if kind == "vae_slicing" else "enable_tiling"
    if vae is None or not hasattr(vae, method):
        return StepReport(kind, False, note=f"no VAE with {method}()")
    try:
        getattr(vae, method)()
    except NotImplementedError as e:
        return StepReport(kind, False, note=str(e))
    details: dict[str, Any] = {}
    if kind == "vae_tiling":
        details = {
            k: getattr(vae, k)
            for k in ("tile_sample_min_size", "tile_latent_min_size", "tile_overlap_factor")
            if hasattr(vae, k)
        }
    return StepReport(kind, True, ["vae"], details)


def contiguous_compiled_inputs(module: torch.nn.Module) -> bool:
    """Make the inputs of ``module``'s in-place compiled call dense row-major before they reach Dynamo.

    ``Module.compile()`` (what diffusers' ``compile_repeated_blocks`` calls) compiles ``_call_impl``, hooks
    included, so a forward pre-hook would run inside the graph and Dynamo would still guard on the caller's
    strides. SD1.5's transformer blocks get ``hidden_states`` as a permuted view whose size-1 dimension has
    another stride at the lowest resolution: a "stride mismatch" recompile during the warm-up. The wrapper
    put on the module's compiled call (:func:`core.torch_compat.set_compiled_call`) applies
    :func:`core.compile.swap.contiguous_inputs_hook` outside the graph (same bits: contiguous clones).

    Args:
        module: a module after ``module.compile()``.
    Returns:
        False (nothing changed) when ``module`` has no compiled call (not compiled, or a torch without
        ``Module._compiled_call_impl``).
    """
    compiled = torch_compat.compiled_call(module)
    if compiled is None or getattr(compiled, "_steadfast_contiguous", False):
        return compiled is not None

    def call(*args: Any, **kwargs: Any) -> Any:
        changed = contiguous_inputs_hook(module, args, kwargs)
        if changed is not None:
            args, kwargs = changed
        return compiled(*args, **kwargs)

    call._steadfast_contiguous = True  # type: ignore[attr-defined]
    torch_compat.set_compiled_call(module, call)
    return True


def _compile_step(
    pipe: Any, den: torch.nn.Module, den_name: str, opts: OptimizeOptions, cache: CacheChoice | None
) -> StepReport:
    copts = opts.compile
    kwargs = copts.to_kwargs()
    paths = repeated_block_paths(den) if opts.scope == "regional" else []
    note = ""
    if opts.scope == "regional" and paths:
        kind = "regional"
        den.compile_repeated_blocks(**kwargs)
    else:
        if opts.scope == "regional":
            note = (
                f"{type(den).__name__} declares no _repeated_blocks, so the whole model was compiled "
                f"(torch.compile) instead"
            )
        kind = "full"
        den.compile(**kwargs)
    if copts.contiguous_inputs:
        wrapped = (
            [contiguous_compiled_inputs(den.get_submodule(p)) for p in paths]
            if paths
            else [contiguous_compiled_inputs(den)]
        )
        if not all(wrapped):
            note = (note + "; " if note else "") + (
                "strided inputs not made contiguous (this torch has no "
                "Module._compiled_call_impl): expect stride recompiles"
            )
    classes: dict[str, int] = {}
    for p in paths:
        cls = type(den.get_submodule(p)).__name__
        classes[cls] = classes.get(cls, 0) + 1
    label = f"{type(pipe).__name__}.{den_name} ({kind}"
    label += f": {', '.join(f'{n} x {c}' for c, n in classes.items())})" if classes else ")"
    # diffusers compiles in place (Module.compile): the record holds no swap-in callables, its blocks are for reports
    compiled = compile_use(den, copts, paths, label=label, cache=cache, in_place=True)
    get_state(pipe).compiled = compiled
    details = {
        "kind": kind,
        "component": den_name,
        "n_blocks": len(paths) if paths else 1,
        "block_classes": classes,
        "blocks": list(paths),
        **copts.as_dict(),
        "via": "diffusers compile_repeated_blocks" if kind == "regional" else "nn.Module.compile",
    }
    return StepReport("compile", True, [den_name], details, note)


def optimize_pipeline(pipe: Any, options: OptimizeOptions, cache: CacheChoice | None = None) -> OptimizeReport:
    """Apply ``options`` to ``pipe`` in place and return what was applied to which components.

    Order: QKV fusion (denoiser, then VAE) -> channels_last (denoiser, VAE) -> attention backend -> VAE slicing -> VAE
    tiling -> compile (denoiser only: diffusers' VAEs declare no ``_repeated_blocks``). Compilation is lazy: it happens
    at the first :func:`~.run.generate` (use :func:`~.run.warmup`), which also records compile time and recompiles in
    :data:`~..registry.REGISTRY`, with ``cache`` (:class:`~..compile.use.CacheChoice`; None: inductor's default
    directory) active around each call (:meth:`~..compile.use.Compiled.run`).

    Raises (all before anything is changed, except errors from diffusers/torch inside a step, after which
    the pipeline counts as optimized with the steps done so far):
        PipelineStateError: ``pipe`` was already optimized (load a fresh one), or QKV fusion was requested
            for a component with LoRA adapters (the fused projections would bypass them).
        UnsupportedAttentionError: the attention backend cannot run here.
        ValueError: the pipeline has no denoiser, or ``options`` asks for a MODEL-only step (``precision``,
            ``quantize``).
    """
    state = get_state(pipe)
    if state.report is not None:
        raise PipelineStateError(
            f"{type(pipe).__name__} was already optimized "
            f"({', '.join(state.report.applied) or 'baseline'}); load a fresh pipeline"
        )
    comps = module_components(pipe)
    den_name, den = denoiser_of(pipe)
    report = OptimizeReport(
        options=options,
        pipeline=type(pipe).__name__,
        denoiser=den_name,
        params_before={k: count_params(m) for k, m in comps.items()},
    )
    # validate first, so a refused request leaves the pipeline untouched
    model_only = [
        f"{n}={getattr(options, n)}"
        for n, off in (("precision", "model"), ("quantize", "off"))
        if getattr(options, n) != off
    ]
    if model_only:
        raise ValueError(
            f"{', '.join(model_only)}: Optimize Model (MODEL path) only; diffusers pipelines have no such step"
        )
    if options.attention != "auto":
        resolve_attention(options.attention, den, run_device(pipe), _param_dtype(den))
    if options.qkv_fusion:
        for name in [den_name] + (["vae"] if options.qkv_fusion_vae and "vae" in comps else []):
            if _has_adapters(comps[name]):
                raise PipelineStateError(
                    f"{name} has LoRA adapters loaded: diffusers' fused to_qkv/to_kv projections would bypass "
                    f"the LoRA layers on to_q/to_k/to_v, so QKV fusion and LoRA cannot be combined"
                )
    plan = [
        Step("qkv_fusion", options.qkv_fusion, lambda: _qkv_step(pipe, comps, den_name, options)),
        Step("channels_last", options.channels_last, lambda: _channels_last_step(comps, den_name)),
        Step("attention", options.attention != "auto", lambda: _attention_step(pipe, den, den_name, options)),
        Step("vae_slicing", options.vae_slicing, lambda: _vae_step(comps, "vae_slicing")),
        Step("vae_tiling", options.vae_tiling, lambda: _vae_step(comps, "vae_tiling")),
        Step("compile", options.scope != "off", lambda: _compile_step(pipe, den, den_name, options, cache)),
    ]
    try:
        run_steps(plan, into=report.steps)
    finally:  # also after a failing step: what was done stays recorded, and a second call is refused
        report.params_after = {k: count_params(m) for k, m in module_components(pipe).items()}
        state.report = report
    return report
