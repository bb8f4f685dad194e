"""ComfyUI glue for Steadfast's optimizations, built on ModelPatcher's official extension points.

Everything here works on a ``model.clone()`` and touches the shared ``nn.Module`` only through
ModelPatcher mechanisms that are undone by ComfyUI (object patches) or by our own keyed callbacks
(channels-last is restored in ``ON_CLEANUP``). Nothing monkeypatches ComfyUI or torch.

Keys used (``remove_*_with_key`` makes re-application idempotent):

=========================  ==========================================  ===============================
key                        extension point                             job
=========================  ==========================================  ===============================
``steadfast.determinism``  ``WrappersMP.OUTER_SAMPLE``                 apply + restore the policy
``steadfast.compile``      ``WrappersMP.APPLY_MODEL``                  swap compiled blocks in/out
``steadfast.qkv``          object patches + ``CallbacksMP.ON_PRE_RUN``  fused q/k/v projections
``steadfast.layout``       ``ON_PRE_RUN`` / ``ON_CLEANUP``             channels-last for the run only
``steadfast.quantize``     object patches + ``ON_PRE_RUN`` / ``ON_DETACH``  quantized Linears (:mod:`.quantize_patch`)
=========================  ==========================================  ===============================
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable

import torch

import comfy.ldm.modules.attention as comfy_attention
import comfy.model_management
from comfy.patcher_extension import CallbacksMP, WrappersMP

from ..core.compile import cache as compile_cache, cache_location as compile_cache_location, presets as inductor_presets, registry
from ..core.determinism import apply as determinism
from ..core import torch_compat
from ..core.compile.swap import CompileOptions, swap_in
from ..core.compile.record import CompileRecord
from ..core.determinism.policy import DeterminismPolicy
from ..core.optimize import attention as sdpa
from ..core.optimize import layout, precision, qkv, qkv_project

log = logging.getLogger("steadfast")

KEY_DET = "steadfast.determinism"
KEY_COMPILE = "steadfast.compile"
KEY_QKV = "steadfast.qkv"
KEY_LAYOUT = "steadfast.layout"
OPTIONS_KEY = "steadfast"  # model_options["steadfast"]: what this clone carries, for run records


def steadfast_options(model) -> dict:
    """The ``model_options["steadfast"]`` dict of a ModelPatcher (created on first use)."""
    return model.model_options.setdefault(OPTIONS_KEY, {})


# --------------------------------------------------------------------------------------------
# Dynamic VRAM (ComfyUI >= 0.1x, comfy-aimdo; on by default on NVIDIA in 0.33): ModelPatcherDynamic never patches
# the stored Parameters. Every comfy op gets ``comfy_cast_weights=True`` and a LoRA is applied by a function at cast
# time (comfy/model_patcher.py ModelPatcherDynamic.load: ``<param>_lowvram_function``); a module without
# ``comfy_cast_weights`` takes a plain ``weight.to(device)`` with no patch.
# --------------------------------------------------------------------------------------------
NOT_APPLIED_DYNAMIC = "not applied: Dynamic VRAM"


def is_dynamic(model) -> bool:
    """Whether ``model`` (a ModelPatcher) is ComfyUI's ``ModelPatcherDynamic`` (False before ComfyUI had it)."""
    check = getattr(model, "is_dynamic", None)
    return bool(check()) if callable(check) else False


def compile_clone(model):
    """The clone Optimize Model compiles: ``model.clone(disable_dynamic=True)`` for a Dynamic VRAM model, as core's
    ``TorchCompileModel.execute`` does (ComfyUI 0.33 ``comfy_extras/nodes_torch_compile.py``; ComfyUI PR 12612: the
    dynamic patcher gave many graph breaks and guard failures), a plain ``clone()`` otherwise (and on ComfyUI
    versions without Dynamic VRAM, whose ``clone`` has no ``disable_dynamic``). The non-dynamic copy loads its
    weights again (``cached_patcher_init``), as core's node does."""
    return model.clone(disable_dynamic=True) if is_dynamic(model) else model.clone()


def comfy_compiler_state() -> str:
    """The Comfy Compiler (ComfyUI's memory compiler + CUDA graphs, on wherever Dynamic VRAM is, switched off with
    ``--disable-comfy-compiler``): ``"absent"`` in a ComfyUI without that switch (0.33.0 and 0.8.0 have none),
    ``"disabled"`` when the switch is given, ``"on"`` when present and Dynamic VRAM is active, else ``"off"``."""
    import sys
    args = comfy.model_management.args
    if not hasattr(args, "disable_comfy_compiler"):
        return "absent"
    if args.disable_comfy_compiler:
        return "disabled"
    memory = sys.modules.get("comfy.memory_management")
    return "on" if getattr(memory, "aimdo_enabled", False) else "off"


def check_comfy_compiler(what: str) -> None:
    """Refuse ``what`` (an optimization that replaces the model's forwards) while the Comfy Compiler is on: it fails
    on packs that patch forwards ("aimdo memory compile error", ComfyUI issues 16342, 16223) and this pack has no
    supported way to pause it around its own forwards. Raises ``ValueError`` naming ``--disable-comfy-compiler``."""
    if comfy_compiler_state() == "on":
        raise ValueError(f"{what} replaces the model's forward functions, which the Comfy Compiler (on with Dynamic "
                         "VRAM) does not support (ComfyUI issues 16342, 16223). Start ComfyUI with "
                         "--disable-comfy-compiler to use it, or turn it off in Optimize Model.")


# --------------------------------------------------------------------------------------------
# Determinism: an OUTER_SAMPLE wrapper that applies the policy around one sampling call.
# --------------------------------------------------------------------------------------------
def add_determinism(model, policy: DeterminismPolicy) -> None:
    """Apply ``policy`` around every sampling call of ``model`` (a clone) and restore after it."""

    def wrapper(executor, *args, **kwargs):
        with determinism.deterministic(policy) as report:
            steadfast_options(executor.class_obj.model_patcher)["last_determinism"] = report.as_dict()
            return executor(*args, **kwargs)

    model.remove_wrappers_with_key(WrappersMP.OUTER_SAMPLE, KEY_DET)
    model.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, KEY_DET, wrapper)
    steadfast_options(model)["determinism"] = policy.as_dict()


# --------------------------------------------------------------------------------------------
# Attention: transformer_options["optimized_attention_override"] -> ComfyUI's SDPA path under
# torch.nn.attention.sdpa_kernel. One plain function per backend: ModelPatcher.clone() deep-copies
# model_options, which keeps functions (atomic for copy.deepcopy) but would rebuild a partial.
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def attention_override(backend: str) -> Callable:
    """The ``optimized_attention_override`` callable that runs PyTorch SDPA on ``backend``.

    Same object for the same backend (stable compile guards, survives ``model.clone()``). It takes
    ComfyUI's arguments ``(func, q, k, v, heads, ...)``, ignores ``func`` and calls
    ``attention_pytorch`` inside :func:`core.optimize.attention.sdpa_context`; a call for which torch has no kernel
    under the pin (e.g. CUDA flash with a mask or in fp32) falls back to torch's own choice, counted
    (:func:`core.optimize.attention.run_pinned`; the run record lists the fallbacks of the run).
    """
    sdpa.sdpa_context(backend)  # ValueError for an unknown name, before anything is registered

    def steadfast_sdpa(func: Callable, *args, **kwargs):
        q = args[0] if args else kwargs.get("q")
        mask = args[4] if len(args) > 4 else kwargs.get("mask")
        why = f"{getattr(q, 'dtype', '?')}" + (" with an attention mask" if mask is not None else "")
        return sdpa.run_pinned(backend, comfy_attention.attention_pytorch, *args, why=why, **kwargs)

    steadfast_sdpa.__name__ = steadfast_sdpa.__qualname__ = f"steadfast_sdpa_{backend}"
    return steadfast_sdpa


def comfy_attention_passthrough(func: Callable, *args, **kwargs):
    """``optimized_attention_override`` that calls ComfyUI's own choice (``func``) unchanged.

    Installed for compiled models with ``attention=comfy``, so every compiled call of ours carries an
    override that Dynamo guards on (:func:`core.compile.guards.comfy_guard_filter` keeps those guards): a
    graph traced with an SDPA override is never reused for ComfyUI's attention, or the other way round.
    """
    return func(*args, **kwargs)


def compute_dtype(model) -> torch.dtype:
    """The dtype ``model``'s (a ModelPatcher's) diffusion model computes in: ``manual_cast_dtype`` as this clone sees
    it (object patches included: ComfyUI's ``set_model_compute_dtype``), else the weight dtype. For fp8 weights
    (``--fp8_e4m3fn-unet``, fp8 checkpoints) this is the cast dtype (bf16/fp16/fp32), never fp8."""
    cast = model.get_model_object("manual_cast_dtype")
    return cast if isinstance(cast, torch.dtype) else model.model.get_dtype()


def policy_is_strict(model) -> bool:
    """Whether ``model`` carries a Determinism Setup policy with ``strict`` on (torch then refuses cuDNN attention)."""
    policy = steadfast_options(model).get("determinism")
    return bool(isinstance(policy, dict) and policy.get("strict"))


def plan_attention(model, backend: str, device) -> sdpa.BackendPlan:
    """Probe SDPA ``backend`` for ``model`` on ``device``: in its compute dtype (:func:`compute_dtype`), with and
    without a mask, in fp32, under strict determinism when the model carries a strict policy. Raises
    :class:`core.optimize.attention.UnsupportedBackendError` when the backend cannot run the main case (refused up
    front: e.g. cuDNN under a strict policy); other failing cases fall back per call, counted."""
    return sdpa.plan_sdpa_backend(backend, device, compute_dtype(model), deterministic=policy_is_strict(model))


def set_attention(model, backend: str) -> None:
    """Route the model's attention through PyTorch SDPA with a pinned backend ("auto" = torch's choice)."""
    to = model.model_options.setdefault("transformer_options", {})
    to["optimized_attention_override"] = attention_override(backend)
    steadfast_options(model)["attention"] = f"pytorch_sdpa:{backend}"


def keep_comfy_attention(model) -> None:
    """Pin ComfyUI's own attention choice with an explicit pass-through override (for compiled models)."""
    to = model.model_options.setdefault("transformer_options", {})
    to.setdefault("optimized_attention_override", comfy_attention_passthrough)


# --------------------------------------------------------------------------------------------
# QKV fusion: object patches that swap each CrossAttention for a module using fused projections.
# --------------------------------------------------------------------------------------------
class FusedQKVCrossAttention(torch.nn.Module):
    """Drop-in for ComfyUI's ``CrossAttention`` that projects q/k/v with one fused matmul.

    It shares the original's ``to_q/to_k/to_v/to_out`` submodules (so state-dict keys, LoRA key
    paths and ModelPatcher weight patches are unchanged) and reads the fused weight that
    :func:`core.optimize.qkv.fuse_qkv_` keeps on the original (the q/k/v weights are views into it,
    so no memory is added). Input/output: ``x`` [B, N, C] -> [B, N, C], same as the original.
    """

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.to_q, self.to_k, self.to_v, self.to_out = inner.to_q, inner.to_k, inner.to_v, inner.to_out
        self.heads = inner.heads
        self.attn_precision = getattr(inner, "attn_precision", None)
        object.__setattr__(self, "inner", inner)  # not a registered child: no duplicate parameters

    def forward(self, x, context=None, value=None, mask=None, transformer_options={}):
        q, k, v = qkv_project.fused_project(self.inner, x, context, value)
        if mask is None:
            out = comfy_attention.optimized_attention(q, k, v, self.heads, attn_precision=self.attn_precision,
                                                      transformer_options=transformer_options)
        else:
            out = comfy_attention.optimized_attention_masked(q, k, v, self.heads, mask, attn_precision=self.attn_precision,
                                                             transformer_options=transformer_options)
        return self.to_out(out)


def fused_attention_modules(model) -> list[torch.nn.Module]:
    """The attention modules that ``model``'s (a clone's) QKV-fusion object patches route through fusion."""
    return [p.inner for p in model.object_patches.values() if isinstance(p, FusedQKVCrossAttention)]


def qkv_counters(model) -> dict[str, Any]:
    """Fusion state of ``model``: modules patched, how many are live-fused now, and the cumulative
    projection-path counters of :func:`core.optimize.qkv.qkv_stats` (``qkv`` / ``kv`` / ``separate`` calls;
    calls inside a torch.compile region are not counted). ``{"modules": 0, ...}`` without fusion."""
    mods = fused_attention_modules(model)
    stats = [qkv.qkv_stats(m) for m in mods]
    reasons = sorted({s.last_reason for s in stats if s.last_path == "separate" and s.last_reason})
    return {"modules": len(mods), "live": sum(qkv.is_fused(m) for m in mods),
            "qkv": sum(s.fused_calls for s in stats), "kv": sum(s.kv_fused_calls for s in stats),
            "separate": sum(s.unfused_calls for s in stats), "separate_reasons": reasons}


def _original_attention(model, name: str) -> torch.nn.Module:
    """The ComfyUI ``CrossAttention`` at ``diffusion_model.<name>``, seen through object patches.

    While another clone of the same model is loaded, its object patches (our fused wrappers) sit in
    the shared module tree; ``get_model_object`` returns the original from the shared backup, and a
    wrapper carried by this clone itself (Optimize applied twice) is unwrapped.
    """
    mod = model.get_model_object(f"diffusion_model.{name}")
    return mod.inner if isinstance(mod, FusedQKVCrossAttention) else mod


def _fusable_paths(model) -> list[tuple[str, torch.nn.Module]]:
    root = model.get_model_object("diffusion_model")
    names = [name for name, mod in root.named_modules()
             if type(mod).__name__ in ("CrossAttention", FusedQKVCrossAttention.__name__)]
    found = []
    for name in names:
        mod = _original_attention(model, name)
        if type(mod).__name__ == "CrossAttention" and qkv.find_fusable_attention(mod)[:1] == [("", mod)]:
            found.append((name, mod))
    return found


def add_qkv_fusion(model) -> int:
    """Fuse q/k/v projections of every ComfyUI ``CrossAttention`` of ``model`` (a clone).

    Returns the number of attention modules patched (0 means the architecture has none, e.g. Flux,
    whose attention already uses a fused ``qkv`` Linear). Fusion happens at ``ON_PRE_RUN``, after
    LoRA/weight patches are applied, and is re-done if weights were replaced since.
    """
    found = _fusable_paths(model)
    for name, mod in found:
        model.add_object_patch(f"diffusion_model.{name}", FusedQKVCrossAttention(mod))
    modules = [m for _, m in found]

    def fuse_before_run(patcher):
        for m in modules:
            qkv.fuse_qkv_(m)

    model.remove_callbacks_with_key(CallbacksMP.ON_PRE_RUN, KEY_QKV)
    model.add_callback_with_key(CallbacksMP.ON_PRE_RUN, KEY_QKV, fuse_before_run)
    # in-place weight updates keep the q/k/v views (and compiled graphs' parameters) alive under LoRA
    model.weight_inplace_update = True
    steadfast_options(model)["qkv_fusion"] = len(found)
    return len(found)


# --------------------------------------------------------------------------------------------
# channels-last: for the duration of a run only (the nn.Module is shared with other clones).
# --------------------------------------------------------------------------------------------
def add_channels_last(model) -> None:
    """Convert conv weights to channels-last before each run of ``model`` and back after it."""

    def to_cl(patcher):
        layout.to_channels_last_(patcher.get_model_object("diffusion_model"))

    def back(patcher):
        layout.to_contiguous_(patcher.get_model_object("diffusion_model"))

    model.remove_callbacks_with_key(CallbacksMP.ON_PRE_RUN, KEY_LAYOUT)
    model.remove_callbacks_with_key(CallbacksMP.ON_CLEANUP, KEY_LAYOUT)
    model.add_callback_with_key(CallbacksMP.ON_PRE_RUN, KEY_LAYOUT, to_cl)
    model.add_callback_with_key(CallbacksMP.ON_CLEANUP, KEY_LAYOUT, back)
    steadfast_options(model)["channels_last"] = True


# --------------------------------------------------------------------------------------------
# Compile: a keyed APPLY_MODEL wrapper (as ComfyUI's set_torch_compile_wrapper) that swaps the
# compiled blocks in for one apply_model call. Compiled callables live in the registry record of
# the underlying BaseModel, so re-executing the node or cloning the model never compiles again.
# --------------------------------------------------------------------------------------------
def client_writable_dirs() -> tuple[str, ...]:
    """Folders that ComfyUI's HTTP API lets clients write: input (``/upload/*``), output, temp, and the
    per-user folders under the user directory (``/userdata``). A compile cache may never overlap them."""
    import folder_paths
    user_dir = folder_paths.get_user_directory()
    dirs = [folder_paths.get_input_directory(), folder_paths.get_output_directory(),
            folder_paths.get_temp_directory(), os.path.join(user_dir, "default")]
    if os.path.isdir(user_dir):
        dirs += [e.path for e in os.scandir(user_dir) if e.is_dir() and e.name != "steadfast"]
    return tuple(dirs)


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
    import folder_paths
    root, source = compile_cache_location.resolve_root(folder_paths.get_user_directory())
    if root is None:
        return None, f"compile cache: off ({source}); inductor's default directory applies"
    device = comfy.model_management.get_torch_device()
    cache = compile_cache.open_cache(root, chosen, device=device, inductor_options=inductor_options, source=source,
                                     forbidden=client_writable_dirs())
    if cache is None:
        return None, f"compile cache {chosen!r} is not usable (see the server log); inductor's default directory applies"
    line = f"compile cache: {chosen!r} ({source})"
    if cache.messages:
        line += "\n  " + "\n  ".join(cache.messages)
    return cache, line


def add_compile(model, record: CompileRecord, mode: str,
                cache: compile_cache.CompileCache | None = None, strict: bool = False,
                inductor_preset: str = inductor_presets.NONE) -> None:
    """Register the compile wrappers for ``record`` (created by :func:`registry.REGISTRY.get_or_create`).

    ``APPLY_MODEL``: swap the compiled blocks in for one ``apply_model`` call, tracked by the registry
    (compile seconds, graphs, recompiles with reasons), with the persistent ``cache`` active during
    the call (``TORCHINDUCTOR_CACHE_DIR`` set and restored, :mod:`core.compile.cache`; a compile that
    fails on a corrupt cached file moves the cache aside and retries once). ``OUTER_SAMPLE``: group
    the calls of one sampling run. A compile error falls back to eager for this model, visibly: the
    record is marked ``disabled`` with the reason (shown on Warmup, in run records and
    /steadfast/compile_state) and a warning is logged. ``strict``: a recompile in a call that started
    warm raises :class:`registry.RecompileError` (for this clone only; other clones of the same
    model keep their own setting). ``inductor_preset`` is recorded (compile state, run records) unless "none".
    """

    def apply_model_wrapper(executor, *args, **kwargs):
        if record.stats.disabled:
            return executor(*args, **kwargs)
        x = args[0] if args else kwargs.get("x")
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else None

        def call():
            with registry.REGISTRY.track(record, shape=shape, strict=strict):
                with swap_in(executor.class_obj, record.compiled):
                    return executor(*args, **kwargs)

        n_messages = len(cache.messages) if cache is not None else 0
        try:
            return compile_cache.run_cached(cache, call, retry_if=torch_compat.is_compile_error)
        except registry.RecompileError:
            raise
        except Exception as e:
            if not torch_compat.is_compile_error(e) or record.options.get("fullgraph"):  # fullgraph: a graph break is an error
                raise
            # compile failure: fall back to eager, visibly
            registry.REGISTRY.disable(record, f"{type(e).__name__}: {cache.redact(str(e)) if cache is not None else e}")
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
    steadfast_options(model)["compile"] = {"mode": mode, "record_created": record.created, **record.summary(),
                                           **({} if inductor_preset == inductor_presets.NONE
                                              else {"inductor_preset": inductor_preset})}


def compile_state(model) -> dict | str:
    """Live compile summary of this clone ("off" when it carries no Steadfast compile)."""
    snap = steadfast_options(model).get("compile")
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


def compile_options(backend: str, mode: str, dynamic: str, fullgraph: bool,
                    inductor_preset: str = inductor_presets.NONE) -> CompileOptions:
    """Translate the node's widget values into :class:`CompileOptions` (a preset's inductor config as ``options``,
    None without one). Raises ``ValueError`` for a preset with a backend other than inductor."""
    return CompileOptions(
        backend=backend,
        mode=None if mode == "default" else mode,
        dynamic={"auto": None, "true": True, "false": False}[dynamic],
        fullgraph=fullgraph,
        options=inductor_presets.preset_options(inductor_preset, backend) or None,
    )


# --------------------------------------------------------------------------------------------
# Precision: ComfyUI's own compute-dtype patch (the ModelComputeDtype node's), on the clone.
# --------------------------------------------------------------------------------------------
def set_precision(model, name: str) -> torch.dtype | None:
    """Set the compute dtype of ``model`` (a clone) for precision ``name`` ("model": leave it; returns None) with
    ``ModelPatcher.set_model_compute_dtype``. Raises ``ValueError`` for an unknown name or a dtype the load device
    lacks (:func:`core.optimize.precision.precision_dtype`)."""
    dtype = precision.precision_dtype(name, model.load_device)
    if dtype is not None:
        model.set_model_compute_dtype(dtype)  # the run record reads it back as fingerprint.dtype
    return dtype
