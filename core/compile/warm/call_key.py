"""The key of one precompiled block call: what decides, before any variant is read, which artifacts may answer it.

The block's fingerprint (its classes and submodules, and the digest of the code of ``type(block).forward``:
:func:`block_fingerprint`), the process-constant fields (torch, Python, the pack, the host's versions, the compile
options and the jit's guard filter: :func:`static_fields`), the global flags and the trace state read once per model
call (:func:`flags_text`), and the call's arguments (:func:`call_key`: shapes, strides, dtypes, devices, the
structure of ``transformer_options`` and its code keys by value). :func:`key_digest` names its record in the cache.
No ComfyUI imports.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ... import torch_compat
from ..guards import GuardFilterFn
from ..options import CompileOptions
from ..recompiles import guarded_flags
from . import cache as compile_cache
from . import traced_code
from .carried_guards import NotDescribable as _NotDescribable
from .carried_guards import describe_callable

__all__ = [
    "KEY_FORMAT",
    "HOST_DISTRIBUTIONS",
    "HOST_VERSION_MODULES",
    "block_fingerprint",
    "host_versions",
    "static_fields",
    "flags_text",
    "call_key",
    "key_digest",
]

#: 3: the global flags are read outside the blocks' compile contexts (torch_compat.while_compiling); 4: identity from
#: the traced code (no file digests), the trace state in the flags, content-addressed artifacts
KEY_FORMAT = 4


#: Distributions whose code a ComfyUI block's trace can inline (their version is in the key).
HOST_DISTRIBUTIONS = ("comfy-kitchen", "comfy-aimdo", "einops")


#: The host's version module, read when it is loaded (ComfyUI's ``comfyui_version``; never imported here).
HOST_VERSION_MODULES = ("comfyui_version",)


_SIMPLE = (str, int, float, bool, type(None))


_dtype_text: dict[torch.dtype, str] = {}


_device_text: dict[torch.device, str] = {}


def _describe_tensor(t: torch.Tensor) -> tuple:
    dtype, device = t.dtype, t.device  # their text memoised per object (str() of a device costs microseconds)
    dt = _dtype_text.get(dtype) or _dtype_text.setdefault(dtype, str(dtype))
    dev = _device_text.get(device) or _device_text.setdefault(device, str(device))
    return ("T", type(t).__qualname__, tuple(t.shape), t.stride(), dt, dev, t.requires_grad, t.is_inference())


def _describe(v: Any, code_key: bool) -> Any:
    """Hashable description of one call value. ``code_key``: inside a ``transformer_options`` key whose guards the
    jit keeps (patches, attention override): leaves by value, callables by :func:`describe_callable`; elsewhere
    ints/floats/strings by type and callables by name (the jit guard filter drops their guards there, and so does
    the precompiled one). Dispatches on the exact type first (a block call describes a dozen values, per call)."""
    kind = type(v)
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        return _describe_tensor(v)
    if kind is bool or v is None:
        return v
    if kind is dict:
        return ("D", tuple((k if isinstance(k, _SIMPLE) else repr(k), _describe(x, code_key)) for k, x in v.items()))
    if kind is list or kind is tuple:
        return (kind.__name__, tuple(_describe(x, code_key) for x in v))
    if kind is str or kind is int or kind is float:
        return v if code_key else kind.__name__
    if isinstance(v, torch.Tensor):
        return _describe_tensor(v)
    if isinstance(v, _SIMPLE):
        return v if code_key else type(v).__name__
    if isinstance(v, dict):
        return ("D", tuple((k if isinstance(k, _SIMPLE) else repr(k), _describe(v[k], code_key)) for k in v))
    if isinstance(v, torch.dtype | torch.device):
        return str(v)
    if callable(v) and code_key:
        return ("F", describe_callable(v))
    if callable(v):  # outside the code keys (ComfyUI's wrappers, callbacks): the jit drops their guards too
        module = getattr(v, "__module__", None)  # by portable name: a pack's module is named by its install folder
        portable = traced_code.portable_module(module) if isinstance(module, str) else module
        return ("F", portable, getattr(v, "__qualname__", type(v).__qualname__))
    if not code_key:
        return ("O", traced_code.portable_module(type(v).__module__), type(v).__qualname__)
    raise _NotDescribable(f"{type(v).__qualname__} in transformer_options' code keys")


def _transformer_options(v: Mapping[str, Any], code_keys: Sequence[str]) -> Any:
    for k in ("patches", "patches_replace"):
        if _has_leaf(v.get(k)):
            raise _NotDescribable(
                f"transformer_options[{k!r}] is not empty (the jit keeps every guard then: a graph per value)"
            )
    return ("TO", tuple((str(k), _describe(v[k], k in code_keys)) for k in v))


def _has_leaf(value: Any) -> bool:
    if isinstance(value, dict | list | tuple):
        return any(map(_has_leaf, value.values() if isinstance(value, dict) else value))
    return value is not None


def block_fingerprint(module: nn.Module) -> dict[str, Any]:
    """What a block's trace depends on besides its inputs that is known before the trace, computed per block (again
    when ``type(module).forward`` changes): the class, every submodule's name and class, and the digest of the code of
    ``type(module).forward`` (:func:`core.compile.warm.traced_code.root_forward`), so a process whose block class is
    patched never writes into the record of one whose class is not. Module names are portable
    (:func:`core.compile.warm.traced_code.portable_module`): no install folder is in the key.

    Args:
        module: the original (uncompiled) block.
    Returns:
        ``{"class", "modules": [[name, "module.Qualname"], ...], "forward": [path, digest]}``.
    """
    name = traced_code.portable_module
    return {
        "class": f"{name(type(module).__module__)}.{type(module).__qualname__}",
        "modules": [[n, f"{name(type(m).__module__)}.{type(m).__qualname__}"] for n, m in module.named_modules()],
        "forward": list(traced_code.root_forward(module)),
    }


def host_versions() -> dict[str, str | None]:
    """The versions of the host's code a block's trace can inline: :data:`HOST_DISTRIBUTIONS` (None when not
    installed) and ``__version__`` of each loaded :data:`HOST_VERSION_MODULES` (ComfyUI's). Part of the key."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist in HOST_DISTRIBUTIONS:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    for name in HOST_VERSION_MODULES:
        mod = sys.modules.get(name)
        out[name] = None if mod is None else str(getattr(mod, "__version__", None))
    return out


def static_fields(options: CompileOptions, guard_filter_fn: GuardFilterFn | None = None) -> dict[str, Any]:
    """The process-constant part of the key: torch/triton/python fields of the cache key, the compile options (the
    inductor preset is in ``options.options``), the jit's guard filter (its ``repr``: the filters are frozen
    dataclasses) and :func:`host_versions`."""
    env = compile_cache.cache_key_fields("cpu")
    env.pop("device", None)  # the call's devices are in the call description; the cache folder's key has the ISA
    return {
        "format": KEY_FORMAT,
        "env": env,
        "options": options.as_dict(),
        "guard_filter": repr(guard_filter_fn),
        "host": host_versions(),
    }


def flags_text() -> str:
    """The global torch flags compiled code depends on (:func:`core.compile.recompiles.guarded_flags`, the determinism
    flags among them), inductor's ``deterministic`` setting, the digest of Dynamo's and inductor's config
    (:func:`core.torch_compat.compile_config_digest`) and the switches a trace reads unguarded
    (:func:`core.torch_compat.trace_state`), as canonical JSON. Cost: docs/benchmarks.md section 21."""
    return json.dumps(
        [
            guarded_flags(),
            torch_compat.inductor_deterministic(load=True),
            torch_compat.compile_config_digest(),
            torch_compat.trace_state(),
        ],
        sort_keys=True,
        default=str,
    )


def call_key(
    fingerprint: Mapping[str, Any],
    static: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    code_keys: Sequence[str] = ("optimized_attention_override",),
    flags: str | None = None,
) -> tuple:
    """The hashable in-memory key of one block call (hash it with :func:`key_digest` for the file name).

    Args:
        fingerprint: :func:`block_fingerprint` of the block.
        static: :func:`static_fields`.
        args, kwargs: the call's arguments (after the contiguous-inputs hook). ``transformer_options`` (a dict
            argument named so, or the last positional dict): its structure, and its code keys by value.
        code_keys: ``transformer_options`` keys described by value (callables by identity).
        flags: :func:`flags_text`, when the caller has it (computed here otherwise).
    Returns:
        a nested tuple; equal keys mean an equal trace.
    Raises:
        _NotDescribable: a value the key cannot describe (patched ``transformer_options``, a callable object...).
    """

    def one(name: Any, v: Any) -> Any:
        if isinstance(v, dict) and (name == "transformer_options" or "optimized_attention_override" in v):
            return _transformer_options(v, code_keys)
        return _describe(v, True)  # an argument of the block: the jit keeps its guards

    desc = (
        tuple(one(i, a) for i, a in enumerate(args)),
        tuple((k, one(k, v)) for k, v in kwargs.items()),
        flags if flags is not None else flags_text(),
    )
    return (id(fingerprint), id(static), desc)


def key_digest(fingerprint: Mapping[str, Any], static: Mapping[str, Any], key: tuple) -> str:
    """sha256 (hex, 32 characters) of the canonical JSON of the block fingerprint, static fields and the call
    description in ``key`` (:func:`call_key`): the artifact's file name."""
    body = json.dumps({"block": fingerprint, "static": static, "call": key[2]}, sort_keys=True, default=repr)
    return hashlib.sha256(body.encode()).hexdigest()[:32]
