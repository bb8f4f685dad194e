"""Copies of a diffusers pipeline that share its weights: optimize or add a LoRA without touching the original.

:func:`share_pipeline` makes a new pipeline object whose ``nn.Module`` components are *structural* copies
(new module objects, so new attributes, attention processors, fused projections, PEFT LoRA layers and
``torch.compile`` wrappers land on the copy only) holding the *same* parameter and buffer tensors as the
original (no weight memory is added). Used where an input object must stay as it was, e.g. a ComfyUI node
output that ComfyUI caches and may hand to other nodes.

What is safe on such a copy (each checked against diffusers 0.42 / PEFT sources, and measured by
``tests/core/test_pipeline_share.py``): diffusers ``fuse_qkv_projections`` (adds new ``to_qkv`` / ``to_kv``
layers, reads the shared q/k/v weights), ``set_attention_backend`` / ``set_attn_processor`` (per-module
processor objects, copied), VAE slicing / tiling (flags on the module), ``compile_repeated_blocks`` /
``Module.compile`` (a wrapper stored on the module), ``load_lora_weights`` (PEFT replaces submodules of the
copy; the wrapped base layer shares its weight). What is *not* safe on shared tensors: anything that
rewrites a parameter's data in place, e.g. channels-last (``param.data = ...``): name such tensors with
``copy_params`` (they are then copied, costing their memory).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .load import module_components

__all__ = ["share_module", "share_pipeline", "conv_weights", "shared_tensor_count"]

TensorFilter = Callable[[str, torch.Tensor], bool]


def conv_weights(name: str, tensor: torch.Tensor) -> bool:
    """``copy_params`` filter selecting 4-D parameters (conv weights), the ones channels-last rewrites."""
    return tensor.dim() == 4


def share_module(module: torch.nn.Module, copy_params: TensorFilter | None = None) -> torch.nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are the original tensor objects.

    ``copy_params(name, tensor) -> bool`` picks parameters/buffers to copy instead of share (default: none).
    Other tensors stored as plain attributes (caches) are copied. Hooks and attributes are copied as
    ``copy.deepcopy`` does. Raises whatever ``copy.deepcopy`` raises for uncopyable attributes.
    """
    memo: dict[int, Any] = {}
    named: Iterable[tuple[str, torch.Tensor]] = list(module.named_parameters(remove_duplicate=False)) + list(
        module.named_buffers(remove_duplicate=False)
    )
    for name, tensor in named:
        if copy_params is not None and copy_params(name, tensor):
            continue
        memo[id(tensor)] = tensor
    return copy.deepcopy(module, memo)


def share_pipeline(pipe: Any, copy_params: dict[str, TensorFilter] | None = None) -> Any:
    """A new pipeline object like ``pipe`` whose module components are :func:`share_module` copies.

    Args:
        pipe: a ``DiffusionPipeline`` (anything with ``.components`` and settable component attributes).
        copy_params: per component name, a filter of tensors to copy rather than share (e.g.
            ``{"unet": conv_weights, "vae": conv_weights}`` before channels-last).
    Returns:
        a shallow copy of ``pipe`` (same config, tokenizers and feature extractors, which are only read)
        with a copy of every ``nn.Module`` component and a deep copy of the scheduler (stateful during a
        call). The original pipeline and its modules are not modified.
    """
    copy_params = copy_params or {}
    new = copy.copy(pipe)
    for name, mod in module_components(pipe).items():
        setattr(new, name, share_module(mod, copy_params.get(name)))
    scheduler = getattr(pipe, "scheduler", None)
    if scheduler is not None:
        new.scheduler = copy.deepcopy(scheduler)
    return new


def shared_tensor_count(a: torch.nn.Module, b: torch.nn.Module) -> tuple[int, int]:
    """``(shared, total)``: how many of ``b``'s parameters are the very tensor objects of ``a``'s."""
    ids = {id(p) for p in a.parameters()}
    params = list(b.parameters())
    return sum(1 for p in params if id(p) in ids), len(params)
