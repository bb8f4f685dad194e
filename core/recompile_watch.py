"""Why a compiled block recompiles: global-flag fingerprints, parameter identity, Dynamo's messages explained.

Three things make Dynamo compile a block again although the model and the inputs look the same:

* **global flags** (:func:`guarded_flags`): Dynamo's ``GLOBAL_STATE`` guard checks
  ``torch.are_deterministic_algorithms_enabled()`` (and its warn-only mode), TF32 (the cuda matmul
  flag, which ``torch.set_float32_matmul_precision("high")`` also sets), fp16/bf16 reduced-precision
  reductions, the thread count, grad mode, the default dtype and autocast (measured on torch 2.14:
  toggling each gives a recompile whose only reason is ``GLOBAL_STATE changed: <name>``). Dynamo's
  message names the flag but not the values; :func:`describe_flag_changes` turns a fingerprint
  taken at compile time and one taken now into ``"global flag changed since compile:
  deterministic_algorithms False -> True"``. The fingerprint also holds flags Dynamo does *not*
  guard (``float32_matmul_precision`` itself, cuDNN TF32, fp16 accumulation) so the message can
  name the setting the user actually changed.
* **parameters replaced by new tensors** (:class:`ParamIdentity`): ComfyUI's ModelPatcher applies
  LoRA with ``set_attr_param`` (a new ``nn.Parameter``) unless ``weight_inplace_update`` is set;
  every new Parameter object can fail a guard (ComfyUI research notes, section 3.1).
* **cache entries per code object** (:func:`core.torch_compat.cache_entry_count`): all ``torch.compile`` wrappers of
  one ``forward`` share Dynamo's per-code-object cache and its ``recompile_limit`` (measured: the
  entries of two backends add up to the same limit), so the true distance to the limit is the
  number of entries on the code object, not a per-model count.

It also reads Dynamo's recompile messages (:func:`parse_recompile`, :func:`parse_limit_hit`) and explains them
(:func:`explain_recompile`). This module imports nothing from ComfyUI and changes no global state.
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

__all__ = [
    "DYNAMO_GUARDED",
    "FlagChange",
    "guarded_flags",
    "flag_changes",
    "closest_changes",
    "describe_flag_changes",
    "dynamo_global_state_names",
    "fingerprint_fields_for",
    "explain_global_state",
    "explain_guard",
    "ParamIdentity",
    "code_of",
    "parse_recompile",
    "parse_limit_hit",
    "explain_recompile",
]

# Dynamo's GLOBAL_STATE field name -> the fingerprint fields that can explain it (most specific first).
DYNAMO_GUARDED: dict[str, tuple[str, ...]] = {
    "deterministic_algorithms": ("deterministic_algorithms",),
    "deterministic_algorithms_warn_only": ("deterministic_warn_only",),
    "allow_tf32": ("float32_matmul_precision", "cuda_matmul_allow_tf32"),
    "allow_fp16_reduce": ("allow_fp16_reduced_precision_reduction",
                          "allow_fp16_reduced_precision_reduction_split_k"),
    "allow_bf16_reduce": ("allow_bf16_reduced_precision_reduction",
                          "allow_bf16_reduced_precision_reduction_split_k"),
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
        """``"name before -> now"``."""
        return f"{self.name} {self.before} -> {self.now}"


def guarded_flags() -> dict[str, Any]:
    """Fingerprint of the process-global torch settings compiled code depends on (JSON-safe dict).

    Keys: every field of :func:`core.torch_state.snapshot_state` except the reporting-only
    ``inductor_deterministic`` (``fp32_precision`` as a ``{"backend.op": value}`` dict), plus
    ``grad_mode``, ``inference_mode``, ``default_dtype`` (e.g. ``"torch.float32"``), ``autocast``
    (the devices with autocast on) and ``torch_function`` (Dynamo's torch-function state).
    Reading it has no side effects (inductor is not imported); about 50 us.
    """
    state = snapshot_state(load_inductor=False).as_dict()
    state.pop("inductor_deterministic", None)
    dyn = torch_compat.dynamo_global_state()
    autocast = dyn.get("autocast_state", {})
    state["grad_mode"] = torch.is_grad_enabled()
    state["inference_mode"] = torch.is_inference_mode_enabled()
    state["default_dtype"] = str(torch.get_default_dtype())
    state["autocast"] = [i for i, on in enumerate(autocast.get("enabled", [])) if on] if autocast else None
    tf = (dyn.get("torch_function"), dyn.get("torch_function_all_disabled")) if dyn else None
    state["torch_function"] = list(tf) if tf is not None else None
    return state


def flag_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[FlagChange]:
    """Fields whose values differ between two :func:`guarded_flags` fingerprints (sorted by name).

    Fields missing on one side are ignored (fingerprints from another torch version).
    """
    return [FlagChange(k, before[k], now[k]) for k in sorted(set(before) & set(now)) if before[k] != now[k]]


def closest_changes(known: Sequence[Mapping[str, Any]], now: Mapping[str, Any],
                    only: Iterable[str] | None = None) -> list[FlagChange]:
    """Changes from the known fingerprint closest to ``now`` (fewest differing fields).

    ``known``: fingerprints under which compiled code exists. ``only``: restrict to these field
    names (e.g. the fields Dynamo named). Returns ``[]`` when ``known`` is empty or one of them
    equals ``now`` on the considered fields.
    """
    wanted = set(only) if only is not None else None
    best: list[FlagChange] | None = None
    for state in known:
        changes = [c for c in flag_changes(state, now) if wanted is None or c.name in wanted]
        if best is None or len(changes) < len(best):
            best = changes
        if not best:
            break
    return best or []


def describe_flag_changes(changes: Sequence[FlagChange]) -> str:
    """``"global flag changed since compile: a False -> True, b 2 -> 1"`` (``""`` for no changes)."""
    if not changes:
        return ""
    return "global flag changed since compile: " + ", ".join(c.as_text() for c in changes)


def dynamo_global_state_names(reason: str) -> list[str]:
    """Dynamo field names in a ``"GLOBAL_STATE changed: a b "`` guard-failure text ([] if none)."""
    marker = "GLOBAL_STATE changed:"
    i = reason.find(marker)
    if i < 0:
        return []
    return reason[i + len(marker):].split()


def fingerprint_fields_for(dynamo_names: Iterable[str]) -> list[str]:
    """Fingerprint field names that can explain the Dynamo ``GLOBAL_STATE`` names given."""
    out: list[str] = []
    for name in dynamo_names:
        for field in DYNAMO_GUARDED.get(name, (name,)):
            if field not in out:
                out.append(field)
    return out


def explain_global_state(known: Sequence[Mapping[str, Any]], now: Mapping[str, Any],
                         dynamo_names: Iterable[str]) -> list[FlagChange]:
    """The flag changes behind Dynamo's ``GLOBAL_STATE changed: <names>``, with values.

    Compares ``now`` with the closest fingerprint in ``known`` on the fields that can explain the
    names (:data:`DYNAMO_GUARDED`); when a group's most specific field changed (e.g.
    ``float32_matmul_precision`` for Dynamo's ``allow_tf32``), the fields derived from it are left
    out. ``[]`` when nothing known explains it.
    """
    names = list(dict.fromkeys(dynamo_names))
    changes = closest_changes(known, now, only=fingerprint_fields_for(names))
    changed = {c.name for c in changes}
    derived = {f for n in names for f in DYNAMO_GUARDED.get(n, ())[1:] if DYNAMO_GUARDED.get(n, ("",))[0] in changed}
    return [c for c in changes if c.name not in derived]


_TYPE_ID = re.compile(r"___check_type_id\((?P<path>[^,]+),\s*\d+\),\s*type=<class '(?P<cls>[\w.]+)'>")


def explain_guard(reason: str) -> tuple[str, str] | None:
    """``(cause, readable reason)`` for guard failures whose raw text hides the cause, else None.

    Handled: ``___check_type_id(self._modules['attn1'], ...), type=<class '...CrossAttention'>``
    (a submodule of the compiled block is now another class - an object patch such as QKV fusion
    swapped it in or out) -> ``("module_type", "submodule self._modules['attn1'] changed type since
    compile (compiled for CrossAttention): an object patch (e.g. QKV fusion) swapped it")``.
    """
    m = _TYPE_ID.search(reason)
    if m is not None:
        cls = m.group("cls").rsplit(".", 1)[-1]
        return ("module_type", f"submodule {m.group('path').strip()} changed type since compile (compiled for "
                               f"{cls}): an object patch (e.g. QKV fusion) swapped it")
    return None


class ParamIdentity:
    """Which ``nn.Parameter`` / buffer objects a set of modules held at one moment (weak references).

    ``capture(modules)`` records them; :meth:`replaced` lists the names whose object is no longer
    the same one (``module.weight = new Parameter`` / ``set_attr_param``). An in-place update
    (``param.data.copy_(...)``, ComfyUI's ``weight_inplace_update``) keeps the object and is not
    reported. ``modules``: ``{prefix: module}``; names are ``"<prefix>.<param name>"``.
    """

    def __init__(self, refs: dict[str, weakref.ref]) -> None:
        self._refs = refs

    @classmethod
    def capture(cls, modules: Mapping[str, nn.Module]) -> ParamIdentity:
        """Record the current parameter and buffer objects of ``modules``."""
        return cls({name: weakref.ref(t) for name, t in _tensors(modules)})

    def __len__(self) -> int:
        return len(self._refs)

    def replaced(self, modules: Mapping[str, nn.Module]) -> list[str]:
        """Names whose current tensor object differs from the captured one (new or removed names too)."""
        now = dict(_tensors(modules))
        out = [n for n, ref in self._refs.items() if now.get(n) is None or ref() is not now[n]]
        out += [n for n in now if n not in self._refs]
        return out


def _tensors(modules: Mapping[str, nn.Module]) -> Iterable[tuple[str, torch.Tensor]]:
    for prefix, mod in modules.items():
        for name, t in mod.named_parameters(recurse=True):
            yield f"{prefix}.{name}", t
        for name, t in mod.named_buffers(recurse=True):
            if t is not None:
                yield f"{prefix}.{name}", t


def code_of(module: Any) -> Any:
    """The code object Dynamo caches compiled entries on for ``module`` (its class's ``forward``).

    Accepts an ``OptimizedModule`` (its ``_orig_mod`` is used) or a plain module; None when the
    forward is not a plain Python function.
    """
    mod = getattr(module, "_orig_mod", module)
    fwd = getattr(type(mod), "forward", None)
    return getattr(fwd, "__code__", None)


# ---------------------------------------------------------------------------------------------- Dynamo messages
_REASON_LINE = re.compile(r"^\s*-\s*(?:\d+/\d+:\s*)?(.*)$")


def parse_recompile(message: str) -> dict[str, Any]:
    """Split Dynamo's ``"Recompiling function F in FILE:LINE ... - 0/1: reason"`` log message.

    Returns ``{"function": "F in FILE:LINE" or "", "reason": first reason (the whole message if none),
    "reasons": [every reason line]}``.
    """
    lines = message.splitlines()
    head = lines[0] if lines else message
    function = head.removeprefix("Recompiling function ").strip() if head.startswith("Recompiling") else ""
    reasons = [m.group(1).strip() for line in lines[1:] if (m := _REASON_LINE.match(line))]
    reasons = [r for r in reasons if r]
    return {"function": function, "reason": reasons[0] if reasons else message.strip(), "reasons": reasons}


def parse_limit_hit(message: str) -> dict[str, Any]:
    """Dynamo's recompile-limit warning (it then runs the frame eagerly) as
    ``{"kind": "recompile_limit", "limit": first line, "function", "reason"}``."""
    lines = [ln.strip() for ln in message.splitlines()]
    function = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("function:")), "")
    reason = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("last reason:")), "")
    return {"kind": "recompile_limit", "limit": lines[0] if lines else message, "function": function,
            "reason": _REASON_LINE.sub(r"\1", "- " + reason) if reason else message}


def explain_recompile(event: dict[str, Any], known: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``event`` (from :func:`parse_recompile`) with a readable ``reason`` where the raw one hides the cause.

    A ``GLOBAL_STATE changed`` guard is compared with the closest fingerprint in ``known`` (those compiled code
    exists for) and the current :func:`guarded_flags`: ``cause="global_flag"``, ``flag_changes`` and e.g.
    ``"global flag changed since compile: deterministic_algorithms False -> True"``; guards
    :func:`explain_guard` knows get their ``cause``. The raw text moves to ``guard``. Returns the same dict.
    """
    names = [n for r in event["reasons"] for n in dynamo_global_state_names(r)]
    if names:
        changes = explain_global_state(known, guarded_flags(), names)
        event["cause"], event["guard"] = "global_flag", event["reason"]
        event["flag_changes"] = [c.as_text() for c in changes]
        event["reason"] = (describe_flag_changes(changes) if changes else
                           "global flag changed since compile: " + ", ".join(dict.fromkeys(names)))
    elif (hint := explain_guard(event["reason"])) is not None:
        event["cause"], event["guard"], event["reason"] = hint[0], event["reason"], hint[1]
    return event
