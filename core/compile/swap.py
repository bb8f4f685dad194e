"""Regional and full ``torch.compile`` without touching the model: lazy compiled blocks, swap-in.

Regional compilation (diffusers' ``compile_repeated_blocks``) compiles each repeated block alone; identical blocks
share one ``forward`` code object, hence one Dynamo graph, and the first call is faster than a full compile
(docs/benchmarks.md section 2). A "full" compile is one block: the model as a path of its parent. :func:`swap_in`
installs the lazy wrappers for one call only (as ComfyUI's ``apply_torch_compile_wrapper``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .. import torch_compat
from .guards import GuardFilterFn
from .options import CompileOptions
from .warm.precompiled import PrecompiledState
from .warm.precompiled import wrap as precompiled_wrap


def _contiguous(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        # is_contiguous() ignores strides of size-1 dims, Dynamo's guards do not: compare all strides
        dense = tuple(math.prod(max(s, 1) for s in value.shape[i + 1 :]) for i in range(value.dim()))
        if value.layout is not torch.strided or value.stride() == dense:
            return value
        if any(st == 0 and sz > 1 for st, sz in zip(value.stride(), value.shape)):
            return value  # expanded (broadcast) view: a copy could be huge (e.g. an attention mask)
        return value.clone(memory_format=torch.contiguous_format)
    if type(value) in (tuple, list):  # plain containers only (not namedtuples/dataclasses)
        items = [_contiguous(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    return value


def contiguous_inputs_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook (``with_kwargs=True``): tensors, direct or in a plain tuple/list, not exactly dense row-major
    (size-1 dims included) become contiguous clones (same bits); dicts, other objects and broadcast views stay.
    ``None`` when nothing changes. An in-place update of a strided input lands on the copy (no table block does)."""
    new_args = _contiguous(args)
    new_kwargs = {k: _contiguous(v) for k, v in kwargs.items()}
    unchanged = new_args is args and all(new_kwargs[k] is kwargs[k] for k in kwargs)
    return None if unchanged else (new_args, new_kwargs)


def _prepare(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    changed = contiguous_inputs_hook(None, args, kwargs)  # type: ignore[arg-type] (the hook ignores the module)
    return (args, kwargs) if changed is None else changed


def _under(fn: Callable[..., Any], contexts: Sequence[Callable[[], Any]]) -> Callable[..., Any]:
    """``fn`` with ``contexts`` in force while a call compiles (:func:`core.torch_compat.while_compiling`)."""
    contexts = tuple(contexts)

    def call(*args: Any, **kwargs: Any) -> Any:
        with torch_compat.while_compiling(contexts):
            return fn(*args, **kwargs)

    return call


def submodule(root: nn.Module, path: str) -> nn.Module:
    """``root.get_submodule(path)``; ``ValueError`` for an empty path (the root is compiled as a path of its
    parent, e.g. ``"diffusion_model"``, never swapped) or an unknown one."""
    if not path:
        raise ValueError("empty block path: compile a whole model as a path of its parent (e.g. 'diffusion_model')")
    try:
        return root.get_submodule(path)
    except AttributeError as e:
        raise ValueError(f"{type(root).__name__} has no submodule {path!r}: {e}") from e


def compile_blocks(
    root: nn.Module,
    paths: Sequence[str],
    options: CompileOptions,
    guard_filter_fn: GuardFilterFn | None = None,
    precompiled: PrecompiledState | None = None,
) -> dict[str, Callable[..., Any]]:
    """``{path: torch.compile(root.get_submodule(path), **options.to_kwargs(guard_filter_fn))}``, lazy; ``root`` is
    not modified; inductor blocks compile under :func:`core.torch_compat.trusted_cpu_isa` (and
    :func:`core.torch_compat.specialize_int` with ``options.specialize_ints``), both held only while a call compiles
    (:func:`core.torch_compat.while_compiling`). With ``precompiled`` (and
    the inductor backend), each is behind a :class:`core.compile.warm.precompiled.PrecompiledBlock` sharing that state.
    ``ValueError``: empty, duplicate or unknown path."""
    out: dict[str, Callable[..., Any]] = {}
    for path in paths:
        if path in out:
            raise ValueError(f"duplicate block path {path!r}")
        compiled = torch.compile(submodule(root, path), **options.to_kwargs(guard_filter_fn))
        if options.contiguous_inputs:
            compiled.register_forward_pre_hook(contiguous_inputs_hook, with_kwargs=True)
        contexts = [torch_compat.specialize_int] if options.specialize_ints else []
        if options.backend == "inductor":  # skip inductor's per-ISA C++ test builds on a cold start
            contexts.append(torch_compat.trusted_cpu_isa)
        if contexts:
            compiled.forward = _under(compiled.forward, contexts)
        if precompiled is not None and options.backend == "inductor":
            prepare = _prepare if options.contiguous_inputs else None
            compiled = precompiled_wrap(
                submodule(root, path), compiled, options, guard_filter_fn, precompiled, contexts, prepare
            )
        out[path] = compiled
    return out


def compiled_for(root: nn.Module, compiled: Mapping[str, Callable[..., Any]]) -> bool:
    """Whether ``compiled`` (:func:`compile_blocks`) was made from ``root``'s own blocks: each path of ``root`` holds
    the module its compiled block wraps. False for another model, e.g. a multi-GPU clone (ComfyUI 0.33's
    ``multigpu_clones``: a deep copy of the model on another device), whose blocks must not be swapped for these."""
    for path, fn in compiled.items():
        try:
            if torch_compat.orig_module(fn) is not submodule(root, path):
                return False
        except ValueError:
            return False
    return True


@contextlib.contextmanager
def swap_in(root: nn.Module, compiled: Mapping[str, Callable[..., Any]]) -> Iterator[nn.Module]:
    """Inside the ``with``, ``root``'s submodules at the paths are the compiled callables (``setattr`` on each
    parent; restored in reverse order in ``finally``); yields ``root``. Raises ``ValueError`` for an empty or
    unknown path, before swapping. Parents dispatching on ``isinstance``: see
    :func:`core.compile.blocks.safe_to_swap`."""
    targets = []
    for path, fn in compiled.items():
        block, (parent_path, _, name) = submodule(root, path), path.rpartition(".")
        targets.append((root.get_submodule(parent_path), name, block, fn))
    try:
        for parent, name, _, fn in targets:
            setattr(parent, name, fn)
        yield root
    finally:
        for parent, name, original, _ in reversed(targets):
            setattr(parent, name, original)
