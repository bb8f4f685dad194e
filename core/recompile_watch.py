"""Why a compiled block recompiles: global-flag fingerprints, parameter identity, Dynamo's messages explained.

* **Global flags** (:func:`guarded_flags`): Dynamo's ``GLOBAL_STATE`` guard checks deterministic algorithms,
  TF32, reduced-precision reductions, thread count, grad mode, default dtype and autocast, and names the flag
  but not the values; :func:`explain_recompile` turns it into ``"global flag changed since compile:
  deterministic_algorithms False -> True"`` (tested in ``tests/core/test_recompile_watch.py``).
* **Parameters replaced by new tensors** (:class:`ParamIdentity`): ComfyUI's ModelPatcher applies LoRA with
  ``set_attr_param`` (a new ``nn.Parameter``) unless ``weight_inplace_update`` is set; a new object can fail a guard.
* **Cache entries per code object** (:func:`code_of`): all ``torch.compile`` wrappers of one ``forward`` share
  Dynamo's per-code-object cache and its ``recompile_limit``.

No ComfyUI imports; changes no global state.
"""
from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import torch_compat
from .torch_state import snapshot_state

__all__ = ["DYNAMO_GUARDED", "FlagChange", "guarded_flags", "flag_changes", "closest_changes",
           "describe_flag_changes", "dynamo_global_state_names", "fingerprint_fields_for", "explain_global_state",
           "explain_guard", "ParamIdentity", "code_of", "parse_recompile", "parse_limit_hit", "explain_recompile"]

#: Dynamo's GLOBAL_STATE name -> the fingerprint fields that can explain it (the setting users change first).
DYNAMO_GUARDED: dict[str, tuple[str, ...]] = {
    "deterministic_algorithms": ("deterministic_algorithms",),
    "deterministic_algorithms_warn_only": ("deterministic_warn_only",),
    "allow_tf32": ("float32_matmul_precision", "cuda_matmul_allow_tf32"),
    "allow_fp16_reduce": ("allow_fp16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction_split_k"),
    "allow_bf16_reduce": ("allow_bf16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction_split_k"),
    "num_threads": ("num_threads",),
    "grad_mode": ("grad_mode",),
    "default_dtype": ("default_dtype",),
    "autocast_state": ("autocast",),
    "torch_function": ("torch_function",),
    "torch_function_all_disabled": ("torch_function",),
}


@dataclass(frozen=True)
class FlagChange:
    """One global flag whose value differs: ``name``, value at compile time ``before``, ``now``."""

    name: str
    before: Any
    now: Any

    def as_text(self) -> str:
        return f"{self.name} {self.before} -> {self.now}"


def guarded_flags() -> dict[str, Any]:
    """JSON-safe fingerprint of the process-global torch settings compiled code depends on.

    :func:`core.torch_state.snapshot_state` (without inductor) plus ``grad_mode``, ``inference_mode``,
    ``default_dtype`` (e.g. ``"torch.float32"``), ``autocast`` (devices with autocast on) and ``torch_function``.
    """
    state = snapshot_state(load_inductor=False).as_dict()
    state.pop("inductor_deterministic", None)
    dyn = torch_compat.dynamo_global_state()
    autocast = dyn.get("autocast_state", {})
    state.update(grad_mode=torch.is_grad_enabled(), inference_mode=torch.is_inference_mode_enabled(),
                 default_dtype=str(torch.get_default_dtype()),
                 autocast=[i for i, on in enumerate(autocast.get("enabled", [])) if on] if autocast else None,
                 torch_function=[dyn.get("torch_function"), dyn.get("torch_function_all_disabled")] if dyn else None)
    return state


def flag_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[FlagChange]:
    """Fields present in both fingerprints whose values differ, sorted by name."""
    return [FlagChange(k, before[k], now[k]) for k in sorted(set(before) & set(now)) if before[k] != now[k]]


def closest_changes(known: Sequence[Mapping[str, Any]], now: Mapping[str, Any],
                    only: Iterable[str] | None = None) -> list[FlagChange]:
    """Changes from the fingerprint in ``known`` closest to ``now`` (fewest differences), on fields ``only``."""
    wanted = None if only is None else set(only)
    changes = ([c for c in flag_changes(state, now) if wanted is None or c.name in wanted] for state in known)
    return min(changes, key=len, default=[])


def describe_flag_changes(changes: Sequence[FlagChange]) -> str:
    """``"global flag changed since compile: a False -> True, ..."`` (``""`` for no changes)."""
    return "global flag changed since compile: " + ", ".join(c.as_text() for c in changes) if changes else ""


def dynamo_global_state_names(reason: str) -> list[str]:
    """Dynamo field names in a ``"GLOBAL_STATE changed: a b"`` guard-failure text ([] if none)."""
    head, marker, tail = reason.partition("GLOBAL_STATE changed:")
    return tail.split() if marker else []


def fingerprint_fields_for(dynamo_names: Iterable[str]) -> list[str]:
    """Fingerprint fields that can explain the Dynamo ``GLOBAL_STATE`` names given (no duplicates)."""
    return list(dict.fromkeys(f for name in dynamo_names for f in DYNAMO_GUARDED.get(name, (name,))))


def explain_global_state(known: Sequence[Mapping[str, Any]], now: Mapping[str, Any],
                         dynamo_names: Iterable[str]) -> list[FlagChange]:
    """The flag changes behind Dynamo's ``GLOBAL_STATE changed: <names>``, with values ([] if unknown).

    When a group's first field changed (``float32_matmul_precision`` for ``allow_tf32``), the fields derived
    from it are left out.
    """
    names = list(dict.fromkeys(dynamo_names))
    changes = closest_changes(known, now, only=fingerprint_fields_for(names))
    changed = {c.name for c in changes}
    derived = {f for n in names for f in DYNAMO_GUARDED.get(n, ("",))[1:] if DYNAMO_GUARDED[n][0] in changed}
    return [c for c in changes if c.name not in derived]


_TYPE_ID = re.compile(r"___check_type_id\((?P<path>[^,]+),\s*\d+\),\s*type=<class '(?P<cls>[\w.]+)'>")


def explain_guard(reason: str) -> tuple[str, str] | None:
    """``(cause, readable reason)`` for a guard whose raw text hides the cause, else None.

    Handled: ``___check_type_id(self._modules['attn1'], ...)``: a submodule changed class since compile (an
    object patch such as QKV fusion swapped it) -> ``("module_type", "submodule ... changed type ...")``.
    """
    m = _TYPE_ID.search(reason)
    if m is None:
        return None
    cls = m.group("cls").rsplit(".", 1)[-1]
    return ("module_type", f"submodule {m.group('path').strip()} changed type since compile (compiled for "
                           f"{cls}): an object patch (e.g. QKV fusion) swapped it")


class ParamIdentity:
    """Which parameter / buffer objects a set of modules held at one moment (weak references).

    :meth:`replaced` lists names whose object changed (``module.weight = new Parameter``, ``set_attr_param``);
    in-place updates (``weight_inplace_update``) keep the object. Names are ``"<prefix>.<param name>"`` for
    ``modules = {prefix: module}``.
    """

    def __init__(self, refs: dict[str, weakref.ref]) -> None:
        self._refs = refs

    @classmethod
    def capture(cls, modules: Mapping[str, nn.Module]) -> ParamIdentity:
        return cls({name: weakref.ref(t) for name, t in _tensors(modules)})

    def replaced(self, modules: Mapping[str, nn.Module]) -> list[str]:
        """Names whose current tensor object differs from the captured one (new or removed names too)."""
        now = dict(_tensors(modules))
        return ([n for n, ref in self._refs.items() if now.get(n) is None or ref() is not now[n]]
                + [n for n in now if n not in self._refs])


def _tensors(modules: Mapping[str, nn.Module]) -> Iterable[tuple[str, torch.Tensor]]:
    for prefix, mod in modules.items():
        for name, t in [*mod.named_parameters(), *mod.named_buffers()]:
            if t is not None:
                yield f"{prefix}.{name}", t


def code_of(module: Any) -> Any:
    """The code object Dynamo caches compiled entries on (the class's ``forward``; ``_orig_mod`` of an
    ``OptimizedModule``); None when it is not a plain Python function."""
    return getattr(getattr(type(getattr(module, "_orig_mod", module)), "forward", None), "__code__", None)


_REASON_LINE = re.compile(r"^\s*-\s*(?:\d+/\d+:\s*)?(.*)$")


def parse_recompile(message: str) -> dict[str, Any]:
    """Dynamo's ``"Recompiling function F in FILE:LINE ... - 0/1: reason"`` message as
    ``{"function": "F in FILE:LINE" or "", "reason": first reason (else the message), "reasons": [...]}``."""
    lines = message.splitlines() or [message]
    function = lines[0].removeprefix("Recompiling function ").strip() if lines[0].startswith("Recompiling") else ""
    reasons = [r for line in lines[1:] if (m := _REASON_LINE.match(line)) and (r := m.group(1).strip())]
    return {"function": function, "reason": reasons[0] if reasons else message.strip(), "reasons": reasons}


def parse_limit_hit(message: str) -> dict[str, Any]:
    """Dynamo's recompile-limit warning (the frame then runs eagerly) as
    ``{"kind": "recompile_limit", "limit": first line, "function", "reason"}``."""
    lines = [ln.strip() for ln in message.splitlines()]
    field = {k: ln.split(":", 1)[1].strip() for ln in lines for k in ("function", "last reason")
             if ln.startswith(k + ":")}
    reason = field.get("last reason", "")
    return {"kind": "recompile_limit", "limit": lines[0] if lines else message, "function": field.get("function", ""),
            "reason": _REASON_LINE.sub(r"\1", "- " + reason) if reason else message}


def explain_recompile(event: dict[str, Any], known: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``event`` (from :func:`parse_recompile`) with a readable ``reason`` where the raw one hides the cause.

    ``GLOBAL_STATE changed``: compared with the closest fingerprint in ``known`` -> ``cause="global_flag"``,
    ``flag_changes`` and the values; guards :func:`explain_guard` knows get their ``cause``. The raw text moves
    to ``guard``. Returns the same dict.
    """
    names = [n for r in event["reasons"] for n in dynamo_global_state_names(r)]
    if names:
        changes = explain_global_state(known, guarded_flags(), names)
        event.update(cause="global_flag", guard=event["reason"], flag_changes=[c.as_text() for c in changes],
                     reason=describe_flag_changes(changes) or
                     "global flag changed since compile: " + ", ".join(dict.fromkeys(names)))
    elif (hint := explain_guard(event["reason"])) is not None:
        event.update(cause=hint[0], guard=event["reason"], reason=hint[1])
    return event
