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
=========================  ==========================================  ===============================
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

import torch

import comfy.ldm.modules.attention as comfy_attention
from comfy.patcher_extension import CallbacksMP, WrappersMP

from ..core import determinism, registry
from ..core.compile import CompileOptions, swap_in
from ..core.optimize import attention as sdpa
from ..core.optimize import layout, qkv

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
# Determinism: an OUTER_SAMPLE wrapper that applies the policy around one sampling call.
# --------------------------------------------------------------------------------------------
def add_determinism(model, policy: determinism.DeterminismPolicy) -> None:
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
# torch.nn.attention.sdpa_kernel. One function object per backend so compile guards stay stable.
# --------------------------------------------------------------------------------------------
def _sdpa_override(backend: str, func: Callable, *args, **kwargs):
    with sdpa.sdpa_context(backend):
        return comfy_attention.attention_pytorch(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def attention_override(backend: str) -> Callable:
    """The ``optimized_attention_override`` callable that runs PyTorch SDPA on ``backend``."""
    fn = functools.partial(_sdpa_override, backend)
    fn.__name__ = f"steadfast_sdpa_{backend}"  # type: ignore[attr-defined]
    return fn


def set_attention(model, backend: str) -> None:
    """Route the model's attention through PyTorch SDPA with a pinned backend ("auto" = torch's choice)."""
    to = model.model_options.setdefault("transformer_options", {})
    to["optimized_attention_override"] = attention_override(backend)
    steadfast_options(model)["attention"] = f"pytorch_sdpa:{backend}"


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
        q, k, v = qkv.fused_project(self.inner, x, context, value)
        if mask is None:
            out = comfy_attention.optimized_attention(q, k, v, self.heads, attn_precision=self.attn_precision,
                                                      transformer_options=transformer_options)
        else:
            out = comfy_attention.optimized_attention_masked(q, k, v, self.heads, mask, attn_precision=self.attn_precision,
                                                             transformer_options=transformer_options)
        return self.to_out(out)


def _fusable_paths(model) -> list[tuple[str, torch.nn.Module]]:
    root = model.get_model_object("diffusion_model")
    return [(name, mod) for name, mod in qkv.find_fusable_attention(root)
            if type(mod).__name__ == "CrossAttention"]


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
def add_compile(model, record: registry.CompileRecord, mode: str) -> None:
    """Register the compile wrappers for ``record`` (created by :func:`registry.REGISTRY.get_or_create`).

    ``APPLY_MODEL``: swap the compiled blocks in for one ``apply_model`` call, tracked by the registry
    (compile seconds, graphs, recompiles with reasons). ``OUTER_SAMPLE``: group the calls of one
    sampling run. A compile error falls back to eager for this model, visibly: the record is marked
    ``disabled`` with the reason (shown on Warmup, in run records and /steadfast/compile_state) and a
    warning is logged.
    """

    def apply_model_wrapper(executor, *args, **kwargs):
        if record.disabled:
            return executor(*args, **kwargs)
        x = args[0] if args else kwargs.get("x")
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else None
        try:
            with registry.REGISTRY.track(record, shape=shape):
                with swap_in(executor.class_obj, record.compiled):
                    return executor(*args, **kwargs)
        except registry.RecompileError:
            raise
        except Exception as e:  # compile failure: fall back to eager, visibly
            record.fail(f"{type(e).__name__}: {e}")
            log.warning("Steadfast: compile failed for %s, running it EAGER from now on: %s", record.label, e)
            return executor(*args, **kwargs)

    def outer_sample_wrapper(executor, *args, **kwargs):
        with registry.REGISTRY.run(record):
            return executor(*args, **kwargs)

    model.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, KEY_COMPILE)
    model.remove_wrappers_with_key(WrappersMP.OUTER_SAMPLE, KEY_COMPILE)
    model.add_wrapper_with_key(WrappersMP.APPLY_MODEL, KEY_COMPILE, apply_model_wrapper)
    model.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, KEY_COMPILE, outer_sample_wrapper)
    model.weight_inplace_update = True  # LoRA patches keep Parameter identity -> no recompiles
    steadfast_options(model)["compile"] = {"mode": mode, "record_created": record.created, **record.summary()}


def compile_state(model) -> dict | str:
    """Live compile summary of this clone ("off" when it carries no Steadfast compile)."""
    snap = steadfast_options(model).get("compile")
    if not snap:
        return "off"
    rec = registry.REGISTRY.get(model.model)
    if rec is not None and rec.created == snap.get("record_created"):
        return {"mode": snap["mode"], **rec.summary()}
    return snap


def compile_options(backend: str, mode: str, dynamic: str, fullgraph: bool) -> CompileOptions:
    """Translate the node's widget values into :class:`CompileOptions`."""
    return CompileOptions(
        backend=backend,
        mode=None if mode == "default" else mode,
        dynamic={"auto": None, "true": True, "false": False}[dynamic],
        fullgraph=fullgraph,
    )


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
