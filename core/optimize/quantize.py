"""Dynamic quantization of Linear layers with torchao (int8 or float8 activations and weights), on copies.

torchao does the work (``torchao.quantization.quantize_`` with ``Int8DynamicActivationInt8WeightConfig`` or
``Float8DynamicActivationFloat8WeightConfig``); this module only decides *which* Linears to quantize
(:func:`choose_linears`: plain floating weights, both features >= ``MIN_FEATURES`` and multiples of
``MULTIPLE``; every skip counted with its reason) and wraps each in a :class:`QuantizedLinear`:

* it registers the *original* ``weight``/``bias`` Parameters (same objects), so ``state_dict()`` keys and
  values are unchanged and weight patches addressed to ``<path>.weight`` (LoRA) land on the full-precision
  weight, as without quantization. A Parameter assigned to it is assigned to the source Linear too, and
  :meth:`QuantizedLinear.refresh_` first adopts the source's current Parameters: ComfyUI patches (and restores)
  whichever module is in the tree, and skips re-patching when a copy of the model with the same weight patches
  was loaded before, so the source and the wrapper must always hold the same tensors (else a LoRA can go
  missing on one of the copies; docs/benchmarks.md section 21);
* :meth:`QuantizedLinear.refresh_` builds a quantized copy (a plain ``nn.Linear`` quantized by torchao) from
  the current weight, and builds it again only when the weight or bias changed since (other tensor, new
  data, in-place update, other device/dtype): a LoRA applied before a run is quantized with the weight;
* ``forward`` runs the quantized copy only. The source Linear's values are never changed by this module;
  it only receives the Parameters ComfyUI assigns through the wrapper (restored by ComfyUI's unpatching).

One :class:`QuantizedLinear` per model copy (ComfyUI clone); copies never share one (ComfyUI also keeps
per-module load state, ``comfy_patched_weights``, on the modules in the tree).

The full-precision weights stay (LoRA and ComfyUI's unpatching need them): the int8 copies add about a
quarter of the quantized layers' fp32 weight bytes. Output bits differ from the unquantized model (measured
in ``tests/core/test_optimize_quantize.py``); they are run-to-run identical.

torchao is imported only when a quantized copy is built (:func:`require_torchao`; a clear "pip install
torchao" error when it is missing); importing it changes process-wide state (``docs/architecture.md``).
``fp8-dynamic`` needs a CUDA GPU with compute capability >= 8.9 (:func:`check_supported`).
This module imports nothing from ComfyUI.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter
from typing import Any

import torch
from torch import Tensor, nn

from .. import torch_compat

__all__ = [
    "MODES",
    "MIN_FEATURES",
    "MULTIPLE",
    "FP8_MIN_CAPABILITY",
    "QuantizeUnavailable",
    "require_torchao",
    "torchao_version",
    "check_supported",
    "config_for",
    "Choice",
    "choose_linears",
    "quantized_copy",
    "QuantizedLinear",
    "quantize_in_place",
]

MODES = ("off", "int8-dynamic", "fp8-dynamic")
#: Linears with fewer input or output features are left alone (quantizing activations costs more than it saves).
MIN_FEATURES = 64
#: in/out features must be multiples of this (float8 scaled matmul needs 16; int8 uses the same rule).
MULTIPLE = 16
FP8_MIN_CAPABILITY = (8, 9)
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class QuantizeUnavailable(RuntimeError):
    """Quantization cannot run here: torchao is missing, or the device lacks what the mode needs."""


def require_torchao() -> Any:
    """The ``torchao.quantization`` module. Raises :class:`QuantizeUnavailable` ("pip install torchao")
    when torchao is not installed or too old to have the configs used here."""
    try:
        tq = importlib.import_module("torchao.quantization")
        for name in (
            "quantize_",
            "Int8DynamicActivationInt8WeightConfig",
            "Float8DynamicActivationFloat8WeightConfig",
        ):
            getattr(tq, name)
    except (ImportError, AttributeError) as e:
        raise QuantizeUnavailable(
            f"quantize needs torchao (pip install torchao; tested with 0.18): {type(e).__name__}: {e}"
        ) from e
    return tq


def torchao_version() -> str:
    """torchao's version (imports it; :class:`QuantizeUnavailable` when missing)."""
    require_torchao()
    return str(importlib.import_module("torchao").__version__)


def check_supported(mode: str, device: torch.device | str) -> None:
    """Raise :class:`QuantizeUnavailable` (or ``ValueError`` for an unknown mode) unless ``mode`` can run on
    ``device``: ``int8-dynamic`` on CPU and CUDA; ``fp8-dynamic`` only on CUDA with compute capability >= 8.9
    (Ada, Hopper and newer). Does not import torchao."""
    if mode not in MODES:
        raise ValueError(f"quantize: unknown mode {mode!r}; expected one of {MODES}")
    device = torch.device(device)
    if mode == "fp8-dynamic":
        major, minor = FP8_MIN_CAPABILITY
        need = f"a CUDA GPU with compute capability >= {major}.{minor} (Ada/Hopper or newer)"
        if device.type != "cuda" or not torch.cuda.is_available():
            raise QuantizeUnavailable(
                f"quantize=fp8-dynamic needs {need}; this model runs on {device}. "
                "Use int8-dynamic (CPU and GPU) or off"
            )
        cap = torch.cuda.get_device_capability(device)
        if tuple(cap) < FP8_MIN_CAPABILITY:
            raise QuantizeUnavailable(
                f"quantize=fp8-dynamic needs {need}; {torch.cuda.get_device_name(device)} "
                f"has {cap[0]}.{cap[1]}. Use int8-dynamic or off"
            )
    elif mode == "int8-dynamic" and device.type not in ("cpu", "cuda"):
        raise QuantizeUnavailable(f"quantize=int8-dynamic runs on CPU and CUDA only; this model runs on {device}")


def config_for(mode: str) -> Any:
    """The torchao config object for ``mode`` (imports torchao), with ``set_inductor_config=False``: by default
    torchao's configs set five inductor config values process-wide and never restore them (coordinate-descent
    tuning, ``force_fuse_int_mm_with_mul``, ...: every later compile in the server, of any model, would change;
    found by ``tests/comfy/test_process_state.py``)."""
    tq = require_torchao()
    if mode == "int8-dynamic":
        return tq.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    if mode == "fp8-dynamic":
        return tq.Float8DynamicActivationFloat8WeightConfig(set_inductor_config=False)
    raise ValueError(f"quantize: no torchao config for mode {mode!r}")


@dataclasses.dataclass(frozen=True)
class Choice:
    """Which Linears of a module tree :func:`choose_linears` picked (``paths``, dotted) and why the others
    were skipped (``skipped``: reason -> count)."""

    paths: tuple[str, ...]
    skipped: dict[str, int]

    def as_text(self) -> str:
        text = f"{len(self.paths)} Linear layers"
        if self.skipped:
            text += " (skipped: " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) + ")"
        return text


def _skip_reason(mod: nn.Linear) -> str:
    w = mod.weight
    if type(w) not in (Tensor, nn.Parameter) or w.dtype not in _FLOAT_DTYPES:
        return "not a plain fp32/bf16/fp16 weight"
    if min(mod.in_features, mod.out_features) < MIN_FEATURES:
        return f"smaller than {MIN_FEATURES} features"
    if mod.in_features % MULTIPLE or mod.out_features % MULTIPLE:
        return f"features not multiples of {MULTIPLE}"
    return ""


def choose_linears(root: nn.Module) -> Choice:
    """The ``nn.Linear`` modules under ``root`` (subclasses such as ComfyUI's ops included; ``root`` itself
    excluded) worth quantizing, and counts of the others by reason. A :class:`QuantizedLinear` already in the
    tree counts as its source (chosen again, so applying quantization twice is idempotent)."""
    paths: list[str] = []
    skipped: Counter[str] = Counter()
    for name, mod in root.named_modules():
        if not name:
            continue
        if isinstance(mod, QuantizedLinear):
            paths.append(name)
        elif isinstance(mod, nn.Linear):
            why = _skip_reason(mod)
            if why:
                skipped[why] += 1
            else:
                paths.append(name)
    return Choice(tuple(paths), dict(skipped))


def quantized_copy(
    weight: Tensor,
    bias: Tensor | None,
    mode: str,
    *,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Linear:
    """A plain ``nn.Linear`` holding a torchao-quantized copy of ``weight`` (``[out, in]``) and a copy of
    ``bias``, on ``device``/``dtype`` (default: the weight's). ``weight`` and ``bias`` are not modified."""
    tq = require_torchao()
    device = weight.device if device is None else device
    dtype = weight.dtype if dtype is None else dtype
    out_f, in_f = weight.shape
    lin = nn.Linear(in_f, out_f, bias=bias is not None, device="meta", dtype=dtype)
    with torch.no_grad():
        lin.weight = nn.Parameter(weight.detach().to(device=device, dtype=dtype, copy=True), requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias.detach().to(device=device, dtype=dtype, copy=True), requires_grad=False)
        tq.quantize_(lin, config_for(mode))
    return lin.requires_grad_(False)


def _state(t: Tensor | None) -> tuple[Any, ...]:
    if t is None:
        return (None,)
    return (id(t), torch_compat.tensor_version(t), t.data_ptr(), t.device, t.dtype, tuple(t.shape))


class QuantizedLinear(nn.Module):
    """Drop-in for a Linear ``source`` whose forward runs a torchao-quantized copy of its current weight.

    Registers the source's own ``weight``/``bias`` Parameters (no copy, same state-dict keys); the quantized
    copy is a private attribute, built by :meth:`refresh_` (call it before running, and whenever the weights
    may have changed; it is a no-op when they have not). Input ``[..., in_features]`` -> ``[..., out_features]``
    in the input's dtype.
    """

    def __init__(self, source: nn.Linear, mode: str):
        super().__init__()
        if mode not in MODES or mode == "off":
            raise ValueError(f"QuantizedLinear: mode must be one of {MODES[1:]}, got {mode!r}")
        self.in_features, self.out_features, self.mode = source.in_features, source.out_features, mode
        self.weight = source.weight
        self.bias = source.bias
        object.__setattr__(self, "source", source)  # not a registered child: no duplicate parameters
        object.__setattr__(self, "quantized", None)
        object.__setattr__(self, "_built_from", None)
        self.builds = 0

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in ("weight", "bias") and "source" in self.__dict__:
            setattr(self.source, name, value)  # keep the source holding the same tensor (see module docstring)

    def sync_(self) -> None:
        """Adopt the source Linear's current ``weight``/``bias`` objects (assigned to it while it was in the tree)."""
        for name in ("weight", "bias"):
            value = getattr(self.source, name)
            if getattr(self, name) is not value:
                nn.Module.__setattr__(self, name, value)

    def refresh_(
        self, device: torch.device | None = None, dtype: torch.dtype | None = None, token: Any = None
    ) -> bool:
        """(Re)build the quantized copy from the current ``weight``/``bias`` when they (or the target
        ``device``/``dtype``, default the weight's, or ``token``) changed since the last build. Returns True
        when it built. In-place writes are seen through the version counter, except on inference tensors
        (no counter): for those the caller passes a ``token`` naming the weight patches applied (ComfyUI's
        ``patches_uuid``)."""
        self.sync_()
        device = self.weight.device if device is None else torch.device(device)
        dtype = self.weight.dtype if dtype is None else dtype
        key = (_state(self.weight), _state(self.bias), device, dtype, token)
        if key == self._built_from:
            return False
        q = quantized_copy(self.weight, self.bias, self.mode, device=device, dtype=dtype)
        if self.quantized is None:
            object.__setattr__(self, "quantized", q)
        else:  # keep the module object (compiled graphs reference it); swap its parameters
            self.quantized.weight, self.quantized.bias = q.weight, q.bias
        object.__setattr__(self, "_built_from", key)
        self.builds += 1
        return True

    def release_(self) -> None:
        """Drop the quantized weights (the module object stays, so compiled graphs stay valid); the next
        :meth:`refresh_` builds them again. For when the model leaves its device."""
        if self.quantized is not None:
            self.quantized.weight, self.quantized.bias = None, None
        object.__setattr__(self, "_built_from", None)

    def forward(self, x: Tensor) -> Tensor:
        q = self.quantized
        if q is None or q.weight is None:
            raise RuntimeError("QuantizedLinear ran before refresh_() built its quantized weight")
        dtype = q.weight.dtype
        return q(x) if x.dtype == dtype else q(x.to(dtype)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}"


def quantize_in_place(root: nn.Module, mode: str = "int8-dynamic") -> Choice:
    """Replace the Linears :func:`choose_linears` picks in ``root`` by built :class:`QuantizedLinear` s (``root`` is
    modified: for scripts and tests; ComfyUI's path patches a clone instead). Returns the choice. Raises
    :class:`QuantizeUnavailable` without torchao, ``ValueError`` for an unknown ``mode``."""
    choice = choose_linears(root)
    for path in choice.paths:
        parent, _, leaf = path.rpartition(".")
        holder = root.get_submodule(parent) if parent else root
        q = QuantizedLinear(holder.get_submodule(leaf), mode)
        q.refresh_()
        setattr(holder, leaf, q)
    return choice
