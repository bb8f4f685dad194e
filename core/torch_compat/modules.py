"""Modules and tensors: compiled-module wrappers, module hooks, operator names, tensor versions, fp32 precision.

Part of :mod:`core.torch_compat` (its face re-exports every public name); no ComfyUI imports."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch

from .base import TorchAPIMissing, _api


def tensor_version(t: torch.Tensor) -> int | None:
    """The tensor's in-place version counter (``Tensor._version``): it grows with every in-place write, so a
    cached derivative (a quantized copy) can tell that the tensor's data changed. None for an inference tensor
    (made under ``torch.inference_mode``, as ComfyUI loads weights), which has no counter."""
    if t.is_inference():
        return None
    try:
        return int(t._version)
    except AttributeError as e:
        raise TorchAPIMissing(
            f"change detection needs Tensor._version, which torch {torch.__version__} does not have ({e})"
        ) from e


def orig_module(module: Any) -> Any:
    """The module an ``OptimizedModule`` (what ``torch.compile(module)`` returns) wraps: its ``_orig_mod``;
    ``module`` itself for anything else (a plain module, a function, None).

    Args:
        module: a ``torch.compile`` result or any other object.
    Returns:
        the original ``nn.Module`` (same object, not a copy), or ``module`` unchanged.
    """
    return getattr(module, "_orig_mod", module)


def has_compiled_call() -> bool:
    """Whether this torch's ``nn.Module`` has ``_compiled_call_impl``, the slot ``Module.compile()`` fills with the
    compiled ``_call_impl`` (compile in place, what diffusers' ``compile_repeated_blocks`` uses; torch >= 2.2)."""
    return hasattr(torch.nn.Module, "_compiled_call_impl")


def compiled_call(module: torch.nn.Module) -> Callable[..., Any] | None:
    """The compiled call ``module.compile()`` installed on ``module`` (``Module._compiled_call_impl``), or None when
    ``module`` was not compiled in place (or this torch has no such slot: see :func:`has_compiled_call`)."""
    return getattr(module, "_compiled_call_impl", None)


def set_compiled_call(module: torch.nn.Module, call: Callable[..., Any]) -> None:
    """Replace the compiled call of ``module`` (after ``module.compile()``) by ``call``, which every later
    ``module(...)`` runs instead of ``forward``.

    Raises:
        TorchAPIMissing: this torch's ``nn.Module`` has no ``_compiled_call_impl`` (wrapping the in-place compiled
            call of a ``Module.compile()``d block, e.g. to make its inputs contiguous, needs it).
    """
    if not has_compiled_call():
        raise TorchAPIMissing(
            f"wrapping a Module.compile()d call needs torch.nn.Module._compiled_call_impl, which "
            f"torch {torch.__version__} does not have; Steadfast is checked against torch 2.13/2.14"
        )
    module._compiled_call_impl = call


def has_fp32_precision_api() -> bool:
    """Whether this torch has the per-backend fp32 precision API (torch >= 2.9, ``torch._C`` getter/setter)."""
    return hasattr(torch._C, "_get_fp32_precision_getter") and hasattr(torch._C, "_set_fp32_precision_setter")


def get_fp32_precision(backend: str, op: str) -> str:
    """The fp32 precision of ``backend`` ("generic", "cuda", "mkldnn") for ``op`` ("all", "matmul", "conv",
    "rnn"): "ieee", "tf32", "bf16" or "none" (inherit). Raises :class:`TorchAPIMissing` before torch 2.9 and
    ``RuntimeError`` for a pair torch does not know."""
    return str(_api("torch._C", "_get_fp32_precision_getter", "reading fp32 precision")(backend, op))


def set_fp32_precision(backend: str, op: str, value: str) -> None:
    """Set the fp32 precision of ``backend``/``op`` (see :func:`get_fp32_precision`). Raises
    :class:`TorchAPIMissing` before torch 2.9 and ``RuntimeError`` for an unknown pair or value."""
    _api("torch._C", "_set_fp32_precision_setter", "setting fp32 precision")(backend, op, value)


def module_hook_dicts() -> tuple[dict, ...]:
    """torch's process-wide module hook dicts (``torch.nn.modules.module._global_forward_hooks`` and its
    siblings: forward, forward pre, backward, backward pre, ``_global_forward_hooks_with_kwargs``): a hook
    registered with ``register_module_forward_hook`` runs for every module. Raises :class:`TorchAPIMissing` when
    none is found."""
    mod = importlib.import_module("torch.nn.modules.module")
    names = (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
        "_global_forward_hooks_with_kwargs",
    )
    found = tuple(d for d in (getattr(mod, n, None) for n in names) if isinstance(d, dict))
    if not found:
        raise TorchAPIMissing(
            f"precompiled blocks need torch.nn.modules.module._global_forward_hooks, which torch "
            f"{torch.__version__} does not have"
        )
    return found


def operator_name(fn: Any) -> str | None:
    """The qualified name of a torch operator object, or None when ``fn`` is not one.

    A trace that calls ``torch.ops.<namespace>.<op>`` (ComfyUI 0.33's Flux calls
    ``torch.ops.comfy_kitchen.apply_rope``) guards the packet by identity; the precompiled blocks carry that guard
    by this name (:func:`core.compile.warm.carried_guards.describe_callable`).

    Args:
        fn: any value.
    Returns:
        ``"op aten::add"`` for an ``OpOverloadPacket``, ``"op aten::add.Tensor"`` for an ``OpOverload``, None
        otherwise (``torch._ops`` missing included: then no operator can be described).
    """
    ops = sys.modules.get("torch._ops")
    if ops is None:
        return None
    packet, overload = getattr(ops, "OpOverloadPacket", None), getattr(ops, "OpOverload", None)
    if packet is not None and isinstance(fn, packet):
        name = getattr(fn, "_qualified_op_name", None)
        return f"op {name}" if isinstance(name, str) else None
    if overload is not None and isinstance(fn, overload):
        try:
            return f"op {fn.name()}"
        except Exception:  # noqa: BLE001 (an overload without a readable name: not describable)
            return None
    return None


#: dispatch keys whose kernels give shapes, never values (a Python ``Meta`` kernel cannot change an output's bits)
SHAPE_ONLY_KEYS = ("Meta",)
#: operator namespaces torch registers itself (its Python registrations come with the torch version)
TORCH_NAMESPACES = ("aten", "prims", "prim", "_c10d_functional", "c10d", "quantized_decomposed")


def operator_python_kernels(fn: Any) -> tuple[dict[str, Any], list[str]]:
    """The Python functions behind a torch operator's kernels, for an identity that is more than its name.

    A ``torch.library`` operator can have kernels written in Python: ``torch.library.custom_op`` keeps them on its
    ``CustomOpDef`` (``torch._library.custom_ops.OPDEFS``: the function, one per device type, the fake/abstract one,
    autograd's), and ``torch.library.Library.impl`` hands them to the C++ dispatcher, keeping only the key
    ``"<ns>/<name>/<dispatch key>"`` in ``torch.library._impls``. A trace runs those kernels (a
    ``CompositeImplicitAutograd`` one is inlined into the graph), so two processes with the same operator name and
    other kernels trace other graphs.

    Args:
        fn: any value (an ``OpOverloadPacket`` or ``OpOverload`` is read; anything else gives nothing).
    Returns:
        ``(functions, opaque)``: ``{role: function}`` of a ``custom_op`` (roles ``"init"``, ``"backend:<device>"``,
        ``"abstract"``, ``"setup_context"``, ``"backward"``, ``"vmap"``), and the dispatch keys of the kernels
        registered through ``Library.impl`` whose function the dispatcher holds out of reach (to refuse), but for
        :data:`SHAPE_ONLY_KEYS` and the :data:`TORCH_NAMESPACES`. Both empty for an operator with C++ kernels only,
        or when torch's records are gone.
    """
    name = operator_name(fn)
    if name is None:
        return {}, []
    qualname = name[3:].split(".")[0]  # "op ns::name[.overload]" -> "ns::name"
    ns, _, short = qualname.partition("::")
    functions: dict[str, Any] = {}
    defs = getattr(sys.modules.get("torch._library.custom_ops"), "OPDEFS", None)  # a WeakValueDictionary
    opdef = defs.get(qualname) if defs is not None and hasattr(defs, "get") else None
    if opdef is not None:
        for role, attr in (
            ("init", "_init_fn"),
            ("abstract", "_abstract_fn"),
            ("setup_context", "_setup_context_fn"),
            ("backward", "_backward_fn"),
            ("vmap", "_vmap_fn"),
        ):
            value = getattr(opdef, attr, None)
            if value is not None:
                functions[role] = value
        for device, value in sorted((getattr(opdef, "_backend_fns", None) or {}).items(), key=str):
            functions[f"backend:{device}"] = value
    impls = getattr(sys.modules.get("torch.library"), "_impls", set())
    prefix = f"{ns}/{short}"
    opaque = sorted(
        {
            k.rsplit("/", 1)[-1]
            for k in impls
            if (k.startswith(prefix + "/") or k.startswith(prefix + "."))
            and k.rsplit("/", 1)[-1] not in SHAPE_ONLY_KEYS
        }
    )
    if ns in TORCH_NAMESPACES:  # torch's own Python registrations: their version is torch's, in every key
        opaque = []
    if opdef is not None:  # custom_op registers its own kernels through Library.impl: those are the functions above
        opaque = []
    return functions, opaque
