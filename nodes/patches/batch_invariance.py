"""Bits that depend only on the workflow: per-row model calls and memory-independent attention.

ComfyUI decides from free memory how many conds go into one model call (``comfy/samplers.py``,
``_calc_cond_batch``: ``memory_required(...) * 1.5 < free_memory``) and how sub-quadratic / split
attention chunk their work (``comfy/ldm/modules/attention.py``). The kernels then see another batch size
or chunk size and the float results change in their last bits: a busier machine gives other bytes, and
item i of a batch is not the batch-1 run at seed + i.

The cure, on ComfyUI's official extension points:

* a keyed ``WrappersMP.CALC_COND_BATCH`` wrapper evaluates every row alone: one call of ComfyUI's own
  ``_calc_cond_batch`` per (batch item, conditioning), each with a batch of 1. Nothing is left for free
  memory to group, and the model always sees the same call shape;
* ``transformer_options["optimized_attention_override"]`` pins attention to PyTorch SDPA (no chunking by
  free memory) unless Optimize Model already chose an SDPA backend.

Limits, raised as :class:`BatchInvarianceError` rather than run with bits that depend on memory: a
conditioning made of several entries (Conditioning Combine / Set Area / Set Mask) is still grouped by
ComfyUI from free memory, and a ControlNet hint with several images is per item in ComfyUI's batch.
Turn ``batch_invariant`` off on Determinism Setup to sample those (the run record then says so).
"""

from __future__ import annotations

from typing import Any

import torch

import comfy.utils
from comfy.patcher_extension import WrappersMP

from ...core.optimize.plan import StepReport
from .attention import attention_override, comfy_attention_passthrough

KEY_ROWS = "steadfast.batch_invariant"

POLICY_ON = {
    "rows": "each (batch item, conditioning) evaluated alone, batch 1",
    "attention": "PyTorch SDPA unless Optimize Model chose a backend (never chunked by free memory)",
}
POLICY_OFF = "off: ComfyUI groups conds and chunks attention by free memory; bits may depend on load and batch"


class BatchInvarianceError(RuntimeError):
    """A conditioning that per-row evaluation cannot make independent of free memory (message says why)."""


def _row_of(value: Any, n: int, r: int) -> Any:
    """Row ``r`` of a cond value as ComfyUI would broadcast it to a batch of ``n`` (``repeat_to_batch_size``)."""
    if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] > 1:
        return comfy.utils.repeat_to_batch_size(value, n)[r : r + 1]
    if isinstance(value, list):
        return [_row_of(v, n, r) for v in value]
    return value


def _entry_row(entry: dict, n: int, r: int) -> dict:
    """A conditioning entry whose per-item tensors are reduced to row ``r`` of a batch of ``n``."""
    conds = entry.get("model_conds", {})
    if not any(isinstance(getattr(c, "cond", None), (torch.Tensor, list)) for c in conds.values()):
        return entry
    out = dict(entry)
    out["model_conds"] = {
        k: (c._copy_with(_row_of(c.cond, n, r)) if isinstance(getattr(c, "cond", None), (torch.Tensor, list)) else c)
        for k, c in conds.items()
    }
    return out


def check_rows_possible(conds: list) -> None:
    """Raise :class:`BatchInvarianceError` for a conditioning that per-row calls cannot make memory-independent."""
    for j, cond in enumerate(conds):
        if cond is None:
            continue
        entries = [e for e in cond if "default" not in e]
        if len(entries) > 1:
            raise BatchInvarianceError(
                f"conditioning {j} has {len(entries)} entries (Conditioning Combine / Set Area / Set Mask): ComfyUI "
                "groups them into one model call by free memory, so the bits would depend on the load of the "
                "machine. Set batch_invariant off on Determinism Setup to sample it anyway (recorded)."
            )
        for e in entries:
            hint = getattr(e.get("control"), "cond_hint_original", None)
            if isinstance(hint, torch.Tensor) and hint.ndim >= 1 and hint.shape[0] > 1:
                raise BatchInvarianceError(
                    f"conditioning {j} carries a ControlNet hint with {hint.shape[0]} images: ComfyUI spreads them "
                    "over the batch, which per-item evaluation cannot reproduce. Use one hint image, or set "
                    "batch_invariant off on Determinism Setup."
                )


def _pinned_attention(model_options: dict) -> dict:
    """``model_options`` whose attention never chunks by free memory (SDPA unless a backend is chosen)."""
    to = model_options.get("transformer_options", {})
    current = to.get("optimized_attention_override")
    if current is not None and current is not comfy_attention_passthrough:
        return model_options  # Optimize Model's SDPA backend: already independent of free memory
    return {**model_options, "transformer_options": {**to, "optimized_attention_override": attention_override("auto")}}


def per_row_calc_cond_batch(
    executor, model, conds: list, x_in: torch.Tensor, timestep: torch.Tensor, model_options: dict
) -> list[torch.Tensor]:
    """``CALC_COND_BATCH`` wrapper: one ``_calc_cond_batch`` call per (row of ``x_in``, conditioning).

    Args: as ComfyUI's ``_calc_cond_batch``: ``x_in`` [N, C, H, W] (or [N, C, T, H, W]) the noisy latent,
    ``timestep`` [N] sigmas, ``conds`` one list of entries per conditioning (positive, negative, ...).
    Returns one tensor per conditioning, shaped like ``x_in``, each row computed with a batch of 1.
    Raises :class:`BatchInvarianceError` (see :func:`check_rows_possible`).
    """
    check_rows_possible(conds)
    options = _pinned_attention(model_options)
    n = x_in.shape[0]
    if timestep.ndim == 0 or timestep.shape[0] != n:
        timestep = timestep.expand(n) if timestep.ndim == 0 else comfy.utils.repeat_to_batch_size(timestep, n)
    rows: list[list[torch.Tensor]] = [[] for _ in conds]
    for r in range(n):
        for j, cond in enumerate(conds):
            one = None if cond is None else [_entry_row(e, n, r) for e in cond]
            rows[j].append(executor(model, [one], x_in[r : r + 1], timestep[r : r + 1], options)[0])
    return [torch.cat(parts) for parts in rows]


def add_batch_invariance(model, on: bool) -> StepReport:
    """Install (``on``) or remove the per-row wrapper on ``model`` (a clone).

    Returns:
        a "batch_invariant" :class:`StepReport`, applied when ``on``; ``details["policy"]`` the policy as recorded
        (:data:`POLICY_ON` as a fresh dict, or the :data:`POLICY_OFF` line).
    """
    model.remove_wrappers_with_key(WrappersMP.CALC_COND_BATCH, KEY_ROWS)
    if not on:
        return StepReport("batch_invariant", False, details={"policy": POLICY_OFF})
    model.add_wrapper_with_key(WrappersMP.CALC_COND_BATCH, KEY_ROWS, per_row_calc_cond_batch)
    return StepReport("batch_invariant", True, ["diffusion_model"], {"policy": dict(POLICY_ON)})


# --------------------------------------------------------------------------------------------
# VAE decode: ComfyUI decodes as many items at once as free memory allows (``comfy/sd.py``,
# ``VAE.decode``) and its split attention in the VAE slices by free memory too.
# --------------------------------------------------------------------------------------------
def _vae_attention_blocks(module: torch.nn.Module) -> list[str]:
    """Names of the submodules that pick their attention function at build time (``optimized_attention``)."""
    return [name for name, m in module.named_modules() if callable(getattr(m, "optimized_attention", None))]


def decode_rows(vae, latent: torch.Tensor, on_item=None) -> torch.Tensor:
    """Decode ``latent`` [N, C, h, w] (float) one item at a time with SDPA attention in the VAE.

    Returns the IMAGE [N, H, W, 3] float32 in [0, 1] (as ComfyUI's ``VAEDecode``). Each item is decoded
    with a batch of 1 and the VAE's attention blocks use ComfyUI's ``pytorch_attention`` (object patches on
    a clone of the VAE's ModelPatcher, undone by ComfyUI when another patcher loads), so item i equals a
    batch-1 decode whatever the batch and the free memory. ``on_item(i)`` is called after each item.
    Not covered: when the decode runs out of memory ComfyUI itself retries tiled (it logs a warning).
    """
    import copy  # noqa: PLC0415

    from comfy.ldm.modules.diffusionmodules.model import pytorch_attention  # noqa: PLC0415

    pinned = copy.copy(vae)
    pinned.patcher = vae.patcher.clone()
    for name in _vae_attention_blocks(vae.first_stage_model):
        pinned.patcher.add_object_patch(f"{name}.optimized_attention", pytorch_attention)
    images = []
    for i in range(latent.shape[0]):
        images.append(pinned.decode(latent[i : i + 1]))
        if on_item is not None:
            on_item(i)
    return torch.cat(images)
