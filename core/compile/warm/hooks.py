"""The hooks the jit runs and the precompiled route cannot: the route calls ``type(block).forward`` itself, so a
hook or an instance ``forward`` on the block or any submodule (an object patch, another node pack), or a process-wide
module hook, sends the call to the jit. :func:`hooks_reason` says why (on a miss); :func:`build_hook_checks` puts the
same checks into an answer's tree of C++ guards, read on every call. No ComfyUI imports.

With grad mode off (ComfyUI samples under ``torch.inference_mode``), a module's backward hooks do nothing in its
forward: ``nn.Module._call_impl`` hands them to ``torch.utils.hooks.BackwardHook``, whose ``setup_input_hook`` and
``setup_output_hook`` return the tensors unchanged unless grad is enabled and one requires grad, and a non-full
backward hook is registered on the output's ``grad_fn``, which is None. So with grad off only the forward hooks
(:data:`FORWARD_HOOK_DICTS`) send a call to the jit, and an answer's tree built with grad off checks that grad is
still off instead of the backward hook dicts of every submodule.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from ... import torch_compat

__all__ = ["HOOK_DICTS", "FORWARD_HOOK_DICTS", "hook_dicts", "hooks_reason", "build_hook_checks"]

#: the per-module hook dicts ``nn.Module`` calls (each empty when the module has no hook of that kind)
HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
#: those that act in a forward with grad mode off (the module docstring)
FORWARD_HOOK_DICTS = HOOK_DICTS[:2]


def hook_dicts(grad_enabled: bool) -> tuple[str, ...]:
    """The per-module hook dicts a forward runs with grad mode ``grad_enabled``: all of :data:`HOOK_DICTS`, or with
    grad off :data:`FORWARD_HOOK_DICTS` (a backward hook does nothing in a forward without grad)."""
    return HOOK_DICTS if grad_enabled else FORWARD_HOOK_DICTS


def hooks_reason(module: nn.Module) -> str | None:
    """Why the route may not call ``type(module).forward`` for ``module``: a hook on it or on any submodule, an
    instance ``forward`` on it or a submodule, or a process-wide module hook (the jit runs them; an artifact's own
    guards do not catch a submodule's hook). None when there is none. Walks the submodules' dicts (no names
    built). Cost: docs/benchmarks.md section 21."""
    if any(_global_hooks()):
        return "a process-wide module hook is set (register_module_forward_hook...; the jit runs it)"
    backward = torch.is_grad_enabled()  # without grad, a backward hook does nothing in a forward
    stack = [module]
    while stack:
        m = stack.pop()
        d = m.__dict__
        if (
            d["_forward_hooks"]
            or d["_forward_pre_hooks"]
            or (backward and (d["_backward_hooks"] or d["_backward_pre_hooks"]))
            or "forward" in d
        ):
            return _hook_text(module, m)
        stack.extend(d["_modules"].values())
    return None


def _hook_text(block: nn.Module, m: nn.Module) -> str:
    what = "an instance forward (an object patch or another node pack)" if "forward" in m.__dict__ else "a hook"
    if m is block:
        return f"the block has {what}: the jit runs it"
    name = next((n for n, sub in block.named_modules() if sub is m), "?")
    return f"submodule {name!r} has {what}: the jit runs it"


@functools.cache
def _global_hooks() -> tuple[dict, ...]:
    return torch_compat.module_hook_dicts()


def build_hook_checks(tree: Any, module: nn.Module, grad_enabled: bool = True) -> None:
    """:func:`hooks_reason`'s checks as leaves of ``tree`` (:class:`core.torch_compat.GuardTree`, its root's value the
    call's locals with the block as ``self``): every process-wide module hook dict empty, and for the block and each
    submodule, reached through ``_modules`` as the call finds them, its hook dicts (:func:`hook_dicts`) empty and no
    ``forward`` in its ``__dict__``. A submodule replaced later is read through the same path (its hooks are
    checked); one that is missing fails the tree. A submodule added later needs no leaf: the traced code calls
    submodules by name, and a container it iterates (``ModuleList``, ``Sequential``) is guarded by torch's own tree
    (a ``DictGuardManager`` checks its length).

    Args:
        tree: the builder.
        module: the block.
        grad_enabled: the grad mode the tree is built for (the call's). False: one leaf checks that grad is still
            off, and the backward hook dicts get none (they do nothing in a forward without grad).
    Raises:
        what torch's builders raise (the caller keeps :func:`hooks_reason` per call).
    """
    for i, hooks in enumerate(_global_hooks()):
        tree.length(tree.constant(hooks, f"torch's process-wide module hooks {i}"), 0, hooks, "no process-wide hook")
    frame = tree.frame({"self": module})
    if not grad_enabled:
        tree.holds(frame, _grad_off, "grad mode is off (a backward hook does nothing in a forward without grad)")
    names = hook_dicts(grad_enabled)

    def walk(manager: Any, m: nn.Module, name: str) -> None:
        d = m.__dict__
        dm = tree.attr(manager, "__dict__", f"{name}.__dict__", d)
        tree.absent(dm, "forward", f"{name} has no instance forward")
        for attr in names:
            tree.length(tree.item(dm, attr, f"{name}.{attr}", d[attr]), 0, d[attr], f"{name} has no {attr}")
        subs = d["_modules"]
        sm = tree.item(dm, "_modules", f"{name}._modules", subs)
        for child_name, child in subs.items():
            if child is not None:
                walk(tree.item(sm, child_name, f"{name}.{child_name}", child), child, f"{name}.{child_name}")

    walk(tree.item(frame, "self", "L['self']", module), module, "the block")


def _grad_off(_locals: Any) -> bool:
    return not torch.is_grad_enabled()
