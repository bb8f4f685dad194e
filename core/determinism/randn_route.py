"""The one process-wide swap of torch: ``torch.randn`` routed to the portable draw while the pack samples.

:func:`portable_generator_randn` replaces the attribute ``torch.randn`` around the Seeded Sampler's
``sample_custom`` call (torchsde's CPU Brownian-tree draws) and a Pipeline Sampler's pipeline call (diffusers'
``randn_tensor``), so CPU-generator draws in code the pack does not own give :func:`.randn.portable_randn`'s bytes;
**only** on a torch whose own CPU kernel does not give those bytes (:func:`routed_dtypes` not empty: ARM, CPUs
without AVX2, ``ATEN_CPU_CAPABILITY=default``) and only for those dtypes. On x86 AVX2/AVX512 nothing is replaced.
Listed in docs/architecture.md's table of process-wide changes (``tests/comfy/test_process_state.py``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from .randn import PORTABLE_DTYPES, portable_randn, torch_draws_portable, torch_half_uses_float32_kernel

__all__ = ["portable_generator_randn", "route_record", "routed_dtypes"]


def routed_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes whose CPU-generator ``torch.randn`` :func:`portable_generator_randn` sends to :func:`portable_randn`.

    Only where routing changes bits towards the portable ones, on the torch that runs:

    - a dtype whose ``torch.randn`` already gives the portable bytes here (:func:`torch_draws_portable`:
      x86 AVX2/AVX512) is left alone: routing would change nothing and cost time;
    - float16/bfloat16 on a torch that draws them with its own half algorithm (torch 2.11:
      :func:`torch_half_uses_float32_kernel` False) are left alone too: the portable bytes follow torch
      2.14's algorithm and would differ from plain torch/diffusers in almost every value. Those draws are
      torch's own, i.e. not portable across CPUs; :func:`route_record` says so in run records.
    Checked once per process (the probes are cached).
    """
    return tuple(
        d
        for d in PORTABLE_DTYPES
        if not torch_draws_portable(d) and (d == torch.float32 or torch_half_uses_float32_kernel(d))
    )


def route_record() -> dict[str, str]:
    """What a CPU-generator ``torch.randn`` of each portable dtype gives under :func:`portable_generator_randn`.

    For run records. Returns ``{"float32": ..., "float16": ..., "bfloat16": ...}``, each one of
    ``"torch.randn (portable bytes here)"``, ``"routed to portable_randn"`` or
    ``"torch.randn, not portable (this torch's own half algorithm)"``.
    """
    routed = routed_dtypes()
    out = {}
    for d in PORTABLE_DTYPES:
        name = str(d).replace("torch.", "")
        if d in routed:
            out[name] = "routed to portable_randn"
        elif torch_draws_portable(d):
            out[name] = "torch.randn (portable bytes here)"
        else:
            out[name] = "torch.randn, not portable (this torch's own half algorithm)"
    return out


_ROUTE_LOCK = threading.Lock()
_ROUTE_DEPTH = 0
_ORIGINAL_RANDN = None
_ROUTED: tuple[torch.dtype, ...] = ()


_PASSIVE = {"generator", "dtype", "device", "layout", "size"}  # the only keywords a routed call may carry


def _routed_randn(*size, **kwargs):
    """``torch.randn`` replacement: calls that draw a routed dtype from a CPU generator on the CPU go portable."""
    generator = kwargs.get("generator")
    dims = kwargs.get("size", size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size)
    device = kwargs.get("device")
    target = torch.device(device) if device is not None else torch.get_default_device()
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    if (
        isinstance(generator, torch.Generator)
        and generator.device.type == "cpu"
        and target.type == "cpu"
        and dtype in _ROUTED
        and set(kwargs) <= _PASSIVE
        and kwargs.get("layout") in (None, torch.strided)
        and all(isinstance(d, int) for d in dims)
    ):
        return portable_randn(dims, generator, dtype=dtype)
    return _ORIGINAL_RANDN(*size, **kwargs)


@contextlib.contextmanager
def portable_generator_randn() -> Iterator[None]:
    """While active, ``torch.randn(..., generator=<CPU generator>)`` on the CPU gives the portable bytes.

    For noise drawn inside code the pack does not own: torchsde's ``BrownianInterval`` (ComfyUI's
    ``BrownianTreeNoiseSampler`` with ``cpu=True``: ``torchsde/_brownian/brownian_interval.py``
    ``_randn`` calls ``torch.randn(size, dtype=, device=, generator=)``) and diffusers' ``randn_tensor``
    (``diffusers/utils/torch_utils.py``: one ``torch.randn(shape, generator=g, device=, dtype=,
    layout=)`` per generator). Draws without a generator (the global RNG), on other devices, of other
    dtypes or with ``out=``/``requires_grad``/``names`` keep ``torch.randn``.

    Process-wide only where it changes bits: the attribute ``torch.randn`` is replaced for the duration
    (re-entrant, reference counted) only when :func:`routed_dtypes` is not empty (no AVX2 kernel: ARM,
    ``ATEN_CPU_CAPABILITY=default``, old x86), and then routes only those dtypes. On an x86 AVX2/AVX512 CPU
    torch's own bytes are the portable ones and ``torch.randn`` is not touched. Code holding its own
    reference to the original function is not affected.

    Yields:
        None.
    """
    global _ROUTE_DEPTH, _ORIGINAL_RANDN, _ROUTED
    routed = routed_dtypes()  # probes once per process, before any patch
    with _ROUTE_LOCK:
        if _ROUTE_DEPTH == 0 and routed:
            _ORIGINAL_RANDN = torch.randn
            _ROUTED = routed
            torch.randn = _routed_randn
        _ROUTE_DEPTH += 1
    try:
        yield
    finally:
        with _ROUTE_LOCK:
            _ROUTE_DEPTH -= 1
            if _ROUTE_DEPTH == 0 and _ORIGINAL_RANDN is not None:
                torch.randn = _ORIGINAL_RANDN
                _ORIGINAL_RANDN = None
                _ROUTED = ()
