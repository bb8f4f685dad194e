"""Why a compiled block recompiles: global-flag fingerprints, parameter identity, Dynamo's messages explained.

Dynamo's ``GLOBAL_STATE`` guard names a changed flag but not its values: :func:`explain_recompile` gives them
(``"global flag changed since compile: deterministic_algorithms False -> True"``). ComfyUI applies LoRA with a new
``nn.Parameter`` unless ``weight_inplace_update`` is set (:class:`ParamIdentity` sees it). No ComfyUI imports.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import torch_compat
from ..determinism.torch_state import snapshot_state
from ..paths import redact

#: Dynamo's GLOBAL_STATE name -> the fingerprint fields that can explain it, first the setting users change (a name
#: not listed is its own field: ``deterministic_algorithms``, ``num_threads``, ``grad_mode``, ``default_dtype``, ...).
DYNAMO_GUARDED: dict[str, tuple[str, ...]] = {
    "deterministic_algorithms_warn_only": ("deterministic_warn_only",),
    "allow_tf32": ("float32_matmul_precision", "cuda_matmul_allow_tf32"),
    "allow_fp16_reduce": ("allow_fp16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction_split_k"),
    "allow_bf16_reduce": ("allow_bf16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction_split_k"),
    "autocast_state": ("autocast",),
    "torch_function_all_disabled": ("torch_function",),
}


def guarded_flags() -> dict[str, Any]:
    """JSON-safe fingerprint of the process-global torch settings compiled code depends on.

    :func:`core.determinism.torch_state.snapshot_state` (without inductor) plus ``grad_mode``, ``inference_mode``,
    ``default_dtype`` (e.g. ``"torch.float32"``), ``autocast`` (devices with autocast on) and ``torch_function``.
    """
    state = snapshot_state(load_inductor=False).as_dict()
    state.pop("inductor_deterministic", None)
    dyn = torch_compat.dynamo_global_state()
    autocast = dyn.get("autocast_state", {})
    state.update(
        grad_mode=torch.is_grad_enabled(),
        inference_mode=torch.is_inference_mode_enabled(),
        default_dtype=str(torch.get_default_dtype()),
        autocast=[i for i, on in enumerate(autocast.get("enabled", [])) if on] if autocast else None,
        torch_function=[dyn.get("torch_function"), dyn.get("torch_function_all_disabled")] if dyn else None,
    )
    return state


@dataclass(frozen=True)
class ParamIdentity:
    """Which parameter / buffer objects ``modules = {prefix: module}`` held at one moment (weak references), named
    ``"<prefix>.<param name>"``; in-place updates (``weight_inplace_update``) keep the object."""

    refs: dict[str, weakref.ref]

    @classmethod
    def capture(cls, modules: Mapping[str, nn.Module]) -> ParamIdentity:
        return cls({name: weakref.ref(t) for name, t in _tensors(modules).items()})

    def replaced(self, modules: Mapping[str, nn.Module]) -> list[str]:
        """Names whose current tensor object differs from the captured one (new or removed names too)."""
        now = _tensors(modules)
        gone = [n for n, ref in self.refs.items() if n not in now or ref() is not now[n]]
        return gone + [n for n in now if n not in self.refs]


def _tensors(modules: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.{name}": t
        for prefix, mod in modules.items()
        for name, t in [*mod.named_parameters(), *mod.named_buffers()]
        if t is not None
    }


def code_of(module: Any) -> Any:
    """The code object Dynamo caches compiled entries on (all wrappers of one ``forward`` share them and the
    ``recompile_limit``): the class's ``forward`` (of the wrapped module for an ``OptimizedModule``:
    :func:`core.torch_compat.orig_module`), else None."""
    return getattr(getattr(type(torch_compat.orig_module(module)), "forward", None), "__code__", None)


_REASON_LINE = re.compile(r"^\s*-\s*(?:\d+/\d+:\s*)?(.*)$")
_TYPE_ID = re.compile(r"___check_type_id\((?P<path>[^,]+),\s*\d+\),\s*type=<class '(?P<cls>[\w.]+)'>")


def parse_recompile(message: str) -> dict[str, Any]:
    """Dynamo's ``"Recompiling function F in FILE:LINE ... - 0/1: reason"`` message as
    ``{"function": "F in FILE:LINE" or "", "reason": first reason (else the message), "reasons": [...]}``."""
    lines = message.splitlines() or [message]
    function = lines[0].removeprefix("Recompiling function ").strip() if lines[0].startswith("Recompiling") else ""
    function = redact(function)  # "forward in comfy/ldm/modules/attention.py:848": no install path in records
    reasons = [redact(r) for line in lines[1:] if (m := _REASON_LINE.match(line)) and (r := m.group(1).strip())]
    return {"function": function, "reason": reasons[0] if reasons else redact(message.strip()), "reasons": reasons}


def parse_limit_hit(message: str) -> dict[str, Any]:
    """Dynamo's recompile-limit warning (the frame then runs eagerly) as
    ``{"kind": "recompile_limit", "limit": first line, "function", "reason"}``."""
    lines = [ln.strip() for ln in message.splitlines()]
    field = {
        k: ln.split(":", 1)[1].strip() for ln in lines for k in ("function", "last reason") if ln.startswith(k + ":")
    }
    reason = field.get("last reason", "")
    return {
        "kind": "recompile_limit",
        "limit": lines[0] if lines else message,
        "function": redact(field.get("function", "")),
        "reason": _REASON_LINE.sub(r"\1", "- " + reason) if reason else message,
    }


def explain_recompile(event: dict[str, Any], known: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``event`` (from :func:`parse_recompile`), same dict, with a readable ``reason`` where the raw one (then in
    ``guard``) hides the cause. ``GLOBAL_STATE changed: <names>``: :func:`guarded_flags` against the fingerprint in
    ``known`` closest on the names' :data:`DYNAMO_GUARDED` fields (a group's fields derived from its changed first
    one left out) -> ``cause="global_flag"``, ``flag_changes`` (``["name before -> now"]``). ``___check_type_id``
    on a submodule (e.g. QKV fusion swapped its class) -> ``cause="module_type"``."""
    names = list(dict.fromkeys(n for r in event["reasons"] for n in r.partition("GLOBAL_STATE changed:")[2].split()))
    if names:
        fields, now = {f for n in names for f in DYNAMO_GUARDED.get(n, (n,))}, guarded_flags()
        diffs = ([(k, s[k], now[k]) for k in sorted(fields & s.keys() & now.keys()) if s[k] != now[k]] for s in known)
        closest = min(diffs, key=len, default=[])
        changed = {k for k, _, _ in closest}
        derived = {f for n in names for f in DYNAMO_GUARDED.get(n, ("",))[1:] if DYNAMO_GUARDED[n][0] in changed}
        texts = [f"{k} {before} -> {after}" for k, before, after in closest if k not in derived]
        event.update(
            cause="global_flag",
            guard=event["reason"],
            flag_changes=texts,
            reason="global flag changed since compile: " + ", ".join(texts or names),
        )
    elif (m := _TYPE_ID.search(event["reason"])) is not None:
        cls = m.group("cls").rsplit(".", 1)[-1]
        event.update(
            cause="module_type",
            guard=event["reason"],
            reason=f"submodule {m.group('path').strip()} changed "
            f"type since compile (compiled for {cls}): an object patch (e.g. QKV fusion) swapped it",
        )
    return event


class FullgraphBreakError(RuntimeError):
    """``fullgraph=True`` and Dynamo met a graph break: the message names the cause, where, and the switch."""


_USER_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


def graph_break_message(error: BaseException, label: str) -> str:
    """A user's explanation of Dynamo's ``Unsupported`` (a graph break) raised under ``fullgraph=True``.

    Args:
        error: the exception Dynamo raised (its text: a first line, ``Explanation:``/``Hint:`` lines and
            ``from user code:`` frames).
        label: the compiled model's name (the compile record's label).
    Returns:
        "what happened / where / what to do" on separate lines; file names without install paths.
    """
    text = str(error)
    lines = [ln.strip() for ln in text.splitlines()]
    first = next((ln for ln in lines if ln), type(error).__name__)
    explanation = next((ln.removeprefix("Explanation:").strip() for ln in lines if ln.startswith("Explanation:")), "")
    frames = [
        f"{m['fn']} ({redact(m['file'])}:{m['line']})"
        for m in _USER_FRAME.finditer(text.partition("from user code:")[2])
    ]
    where = " -> ".join(frames[-5:]) if frames else "not reported by Dynamo"
    cause = f"{first}: {explanation}" if explanation else first
    avoid = (
        "attention=comfy (ComfyUI's own attention, sub-quadratic on CPU) breaks the graph: choose an SDPA "
        "attention (auto, math ...) on Optimize Model, or turn on Determinism Setup's batch_invariant"
        if any("attention_sub_quad" in f or "get_free_memory" in f for f in frames)
        else "change the code the 'where' line names"
    )
    return (
        f"{label}: graph break under fullgraph=True. fullgraph requires each compiled block to trace as ONE "
        f"graph, and Dynamo could not trace this:\n"
        f"  cause: {cause}\n"
        f"  where (innermost last): {where}\n"
        f"What to do: switch `fullgraph` off on the Optimize node that compiled this model (Optimize Model or "
        f"Pipeline Optimize): the block then runs as several graphs (counted as graph_breaks in "
        f"GET /steadfast/compile_state). Or {avoid}."
    )
