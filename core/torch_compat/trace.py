"""What a trace reads and torch neither guards nor keys its caches on, and the code objects a trace ran.

Part of :mod:`core.torch_compat` (its face re-exports every public name); no ComfyUI imports.

* :func:`trace_state`: process-global switches read while a graph is traced or lowered (the SDPA backend
  enablement and priority order, ``opt_einsum``, ``mkldnn``, functorch's config). Dynamo's guards do not check them,
  and neither inductor's FX-graph cache key nor AOTAutograd's includes them, so two processes with different
  switches share one compiled artifact unless the caller keys it on them (measured: issue 45, the SDPA cases).
* :func:`traced_code_objects`: every code object Dynamo traced for an ``aot_compile`` call, as objects (torch's own
  ``SourceInfo`` keeps only the module name, line numbers and a checksum of the source read again from disk).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import types
from collections.abc import Iterator
from typing import Any

import torch

from .base import TorchAPIMissing, _api

#: the SDPA backend switches (``torch.backends.cuda.*_sdp_enabled``; on a CPU build too: the CPU's flash kernel
#: is taken only while ``flash_sdp_enabled()``), read through ``torch._C`` where the public getter is missing
_SDP_GETTERS = ("flash", "mem_efficient", "math", "cudnn", "overrideable", "fa3")


def _sdp_state() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _SDP_GETTERS:
        getter = getattr(torch._C, f"_get_{name}_sdp_enabled", None)
        if getter is not None:
            out[name] = bool(getter())
    reduction = getattr(torch._C, "_get_math_sdp_allow_fp16_bf16_reduction", None)
    if reduction is not None:
        out["math_fp16_bf16_reduction"] = bool(reduction())
    order = getattr(torch._C, "_get_sdp_priority_order", None)
    if order is not None:
        out["priority"] = [int(b) for b in order()]
    if not out:
        raise TorchAPIMissing(
            f"precompiled blocks key their artifacts on the SDPA backend switches (torch._C._get_*_sdp_enabled), "
            f"which torch {torch.__version__} does not have"
        )
    return out


_functorch_digests: dict[bytes, str] = {}


def _functorch_config_digest() -> str:
    """sha256 (16 hex) of functorch's config (``torch._functorch.config.get_hash()``, torch's own hash of the entries
    that are not ``compile_ignored``), memoised on that hash."""
    try:
        cfg = importlib.import_module("torch._functorch.config")
        probe = cfg.get_hash()
    except (ImportError, AttributeError) as e:
        raise TorchAPIMissing(
            f"precompiled blocks need torch._functorch.config.get_hash, which torch {torch.__version__} does not have"
        ) from e
    got = _functorch_digests.get(probe)
    if got is None:
        got = _functorch_digests[probe] = hashlib.sha256(probe).hexdigest()[:16]
    return got


def trace_state() -> dict[str, Any]:
    """The process-global switches a trace or its lowering reads that torch does not guard or key on.

    Returns:
        ``{"sdpa": {"flash": bool, "mem_efficient": bool, "math": bool, "cudnn": bool, ..., "priority": [int]},
        "opt_einsum": [enabled, strategy], "mkldnn": bool, "functorch": digest}``: JSON-safe, equal in two processes
        with the same switches. ``sdpa`` is what ``torch.nn.attention.sdpa_kernel`` and
        ``torch.backends.cuda.enable_*_sdp`` change (AOTAutograd picks the SDPA backend while it lowers
        ``scaled_dot_product_attention``, on the CPU too). Cost: a few microseconds.
    Raises:
        TorchAPIMissing: the SDPA getters or functorch's config hash are gone.
    """
    einsum = torch.backends.opt_einsum
    return {
        "sdpa": _sdp_state(),
        "opt_einsum": [bool(einsum.enabled), getattr(einsum, "strategy", None)],
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        "functorch": _functorch_config_digest(),
    }


@contextlib.contextmanager
def traced_code_objects() -> Iterator[list[types.CodeType]]:
    """Context manager: yields a list that receives every code object Dynamo traced for an ``aot_compile`` run
    inside the block (the root function's and every inlined one's, in trace order).

    torch 2.11 and 2.14 build an artifact's ``SourceInfo`` from ``graph_capture_output.traced_code`` by calling
    ``torch._dynamo.package.SourceInfo.add_code(code)`` once per code object; this wraps that method while the block
    runs (process-wide; the original is put back in ``finally``) and keeps the objects themselves. Raises
    :class:`TorchAPIMissing` when the class or method is gone.
    """
    info = _api("torch._dynamo.package", "SourceInfo", "precompiled blocks (the code a trace ran)")
    original = getattr(info, "__dict__", {}).get("add_code")
    if original is None:
        raise TorchAPIMissing(
            f"precompiled blocks record the code a trace ran through torch._dynamo.package.SourceInfo.add_code, "
            f"which torch {torch.__version__} does not have"
        )
    codes: list[types.CodeType] = []

    def add_code(self: Any, code: types.CodeType) -> None:
        codes.append(code)
        return original(self, code)

    info.add_code = add_code
    try:
        yield codes
    finally:
        info.add_code = original
