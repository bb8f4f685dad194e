"""Model identity for run records: a content digest of what was sampled, computed once and cached.

The digest covers every parameter and buffer of the diffusion model *as it is when sampled* (after LoRA and
other weight patches are applied), in name order: SHA-256 over ``name|dtype|shape|`` and the C-order bytes
of each tensor (:func:`core.record.hashing.tensor_bytes`), so another file, another dtype, another LoRA or strength
gives another digest. Hashing reads every weight once, so results are cached per module object and caller
token; the cache holds no strong reference to the module. Cost: docs/benchmarks.md section 21.

A model as ComfyUI samples it is base weights plus weight patches (LoRA ...), and the patches are not always in
the stored Parameters: under Dynamic VRAM they are applied at cast time and never written back, under legacy
lowvram only the modules that fit are patched. So the record's digest is :func:`combined_digest` of the *base*
weights (hashed once per model: :func:`module_digest` with the caller's originals, e.g. ModelPatcher backups) and
:func:`patches_digest` of the patches themselves (keys, strengths, offsets, functions, the patch tensors: small),
both computed before sampling, never inside the step loop. This module imports nothing from ComfyUI.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import torch

from .hashing import tensor_bytes

__all__ = ["tensors_digest", "module_digest", "patches_digest", "combined_digest", "clear"]

_CACHE: weakref.WeakKeyDictionary[torch.nn.Module, dict[Hashable, dict[str, Any]]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def tensors_digest(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """``{"digest": 64-hex, "tensors": n, "bytes": total}`` over ``(name, tensor)`` pairs sorted by name.

    Tensors on any device (copied to CPU one at a time). Raises TypeError for a dtype without a byte view
    (see :func:`core.record.hashing.tensor_bytes`)."""
    h = hashlib.sha256(b"steadfast-model-digest-v1|")
    count = total = 0
    for name, t in sorted(named, key=lambda item: item[0]):
        data = tensor_bytes(t.detach())
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(data))
        count += 1
        total += data.nbytes
    return {"digest": h.hexdigest(), "tensors": count, "bytes": total}


def module_digest(
    module: torch.nn.Module,
    token: Hashable = None,
    named: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None,
) -> dict[str, Any]:
    """:func:`tensors_digest` of ``module``'s parameters and buffers, cached for ``(module, token)``.

    ``token`` must change whenever the hashed tensors do (a caller that patches weights passes its patch state).
    ``named``: called on a cache miss for the ``(name, tensor)`` pairs to hash instead of the module's own (e.g. the
    base weights, with a patched Parameter replaced by its backup). The returned dict has an extra
    ``"cached": bool``."""
    with _LOCK:
        hit = _CACHE.get(module, {}).get(token)
    if hit is not None:
        return {**hit, "cached": True}
    if named is not None:
        named = list(named())
    else:
        named = list(module.named_parameters(remove_duplicate=False)) + list(
            module.named_buffers(remove_duplicate=False)
        )
    with torch.no_grad():
        result = tensors_digest(named)
    with _LOCK:
        _CACHE.setdefault(module, {})[token] = result
    return {**result, "cached": False}


def _feed(h: Any, value: Any, depth: int = 0) -> None:
    """Hash ``value`` (a patch entry) into ``h``: tensors by dtype, shape and bytes; containers item by item;
    objects (e.g. ComfyUI's weight adapters) by type name and attributes; functions by qualified name."""
    if depth > 8:
        h.update(b"<deep>")
    elif isinstance(value, torch.Tensor):
        data = tensor_bytes(value.detach())
        h.update(f"T|{value.dtype}|{tuple(value.shape)}|".encode())
        h.update(memoryview(data))
    elif value is None or isinstance(value, (bool, int, float, str)):
        h.update(f"{type(value).__name__}:{value!r}|".encode())
    elif isinstance(value, (list, tuple)):
        h.update(f"[{len(value)}|".encode())
        for item in value:
            _feed(h, item, depth + 1)
    elif isinstance(value, dict):
        h.update(f"{{{len(value)}|".encode())
        for key in sorted(value, key=str):
            h.update(f"{key}=".encode())
            _feed(h, value[key], depth + 1)
    elif callable(value) and hasattr(value, "__qualname__"):
        h.update(f"fn:{getattr(value, '__module__', '')}.{value.__qualname__}|".encode())
    else:
        h.update(f"obj:{type(value).__module__}.{type(value).__qualname__}|".encode())
        _feed(
            h,
            {k: v for k, v in vars(value).items() if not k.startswith("_")}
            if hasattr(value, "__dict__")
            else repr(value),
            depth + 1,
        )


def patches_digest(patches: Mapping[str, Any]) -> dict[str, Any]:
    """``{"digest": 64-hex, "keys": n}`` over weight patches ``{key: [entries]}`` (ComfyUI's ``ModelPatcher.patches``:
    each entry ``(strength_patch, patch, strength_model, offset, function)``), keys sorted. Another LoRA, strength,
    offset or patch tensor gives another digest; ``{}`` gives the digest of no patches. Reads only the patch
    tensors (LoRA-sized), so it is cheap enough to compute for every run."""
    h = hashlib.sha256(b"steadfast-patches-digest-v1|")
    for key in sorted(patches):
        h.update(f"K|{key}|".encode())
        _feed(h, patches[key])
    return {"digest": h.hexdigest(), "keys": len(patches)}


def combined_digest(base: Mapping[str, Any], patches: Mapping[str, Any]) -> dict[str, Any]:
    """The model digest of a run record: SHA-256 of the base weights' digest and the patches' digest, with both
    parts (``base_digest``, ``patches_digest``, ``patched_keys``) and the base's ``tensors``/``bytes``."""
    h = hashlib.sha256(f"steadfast-model-digest-v2|{base['digest']}|{patches['digest']}".encode())
    return {
        "digest": h.hexdigest(),
        "digest_kind": "base weights + patches (v2)",
        "base_digest": base["digest"],
        "patches_digest": patches["digest"],
        "patched_keys": patches["keys"],
        "tensors": base["tensors"],
        "bytes": base["bytes"],
    }


def clear() -> None:
    """Forget every cached digest."""
    with _LOCK:
        _CACHE.clear()
