"""Model identity for run records: a content digest of what was sampled, computed once and cached.

The digest covers every parameter and buffer of the diffusion model *as it is when sampled* (after LoRA and
other weight patches are applied), in name order: SHA-256 over ``name|dtype|shape|`` and the C-order bytes
of each tensor (:func:`core.hashing.tensor_bytes`), so another file, another dtype, another LoRA or strength
gives another digest. Hashing reads every weight once (about 1 s per GB on one CPU core), so results are
cached per module object and caller token (ComfyUI: the ModelPatcher's ``patches_uuid`` and patch list);
the cache holds no strong reference to the module. This module imports nothing from ComfyUI.
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Hashable, Iterable
from typing import Any

import torch

from .hashing import tensor_bytes

__all__ = ["tensors_digest", "module_digest", "clear"]

_CACHE: "weakref.WeakKeyDictionary[torch.nn.Module, dict[Hashable, dict[str, Any]]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def tensors_digest(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """``{"digest": 64-hex, "tensors": n, "bytes": total}`` over ``(name, tensor)`` pairs sorted by name.

    Tensors on any device (copied to CPU one at a time). Raises TypeError for a dtype without a byte view
    (see :func:`core.hashing.tensor_bytes`)."""
    h = hashlib.sha256(b"steadfast-model-digest-v1|")
    count = total = 0
    for name, t in sorted(named, key=lambda item: item[0]):
        data = tensor_bytes(t.detach())
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(data))
        count += 1
        total += data.nbytes
    return {"digest": h.hexdigest(), "tensors": count, "bytes": total}


def module_digest(module: torch.nn.Module, token: Hashable = None) -> dict[str, Any]:
    """:func:`tensors_digest` of ``module``'s parameters and buffers, cached for ``(module, token)``.

    ``token`` must change whenever the weights do (a caller that patches weights passes its patch state).
    The returned dict has an extra ``"cached": bool``."""
    with _LOCK:
        hit = _CACHE.get(module, {}).get(token)
    if hit is not None:
        return {**hit, "cached": True}
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    with torch.no_grad():
        result = tensors_digest(named)
    with _LOCK:
        _CACHE.setdefault(module, {})[token] = result
    return {**result, "cached": False}


def clear() -> None:
    """Forget every cached digest."""
    with _LOCK:
        _CACHE.clear()
