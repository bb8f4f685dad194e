"""Portable CPU mode: the settings that decide CPU output bits, pinned so that any x86-64 CPU with AVX2 and
FMA (Intel or AMD, AVX512/AMX or not) runs the same code paths.

The recipe (``steadfast run --portable`` sets it; ``docs/reproducing.md`` gives it for a hand-started
ComfyUI). The environment variables must be set *before* the process starts (torch, oneDNN and MKL read them
once at start-up):

- ``ATEN_CPU_CAPABILITY=avx2``: ATen's vectorized kernels (softmax, SDPA, elementwise, ``randn``'s Box-Muller)
  take their AVX2 build on every CPU, AVX512 ones included.
- ``ONEDNN_MAX_CPU_ISA=AVX2`` *and* oneDNN switched off in the process (``torch.backends.mkldnn.enabled =
  False``): convolutions and GELU take ATen's own kernels (im2col + BLAS), whose blocking does not depend on
  the CPU's cache sizes; the ISA cap is a second line for anything that still reaches oneDNN.
- ``MKL_CBWR=COMPATIBLE,STRICT``: MKL's conditional numerical reproducibility in its cross-vendor branch.
  MKL honours *only* ``COMPATIBLE`` on a non-Intel CPU; ``AVX2``, ``AVX512`` ... read back as ``AUTO`` (it
  picks per CPU), so ``MKL_CBWR=AVX2`` would not pin AMD (docs/benchmarks.md section 21).
  ``MKL_ENABLE_INSTRUCTIONS=AVX2`` is set as well (an upper bound, harmless under COMPATIBLE).
- threads: ``OMP_NUM_THREADS`` = ``MKL_NUM_THREADS`` = N (default 1), ``MKL_DYNAMIC=FALSE`` and
  ``torch.set_num_threads(N)``: CPU reductions split their work by the thread count.
- inductor: its ``cpp.simdlen`` config = 256 (AVX2 width; :mod:`core.torch_compat`), but compiled code also
  depends on the C++ compiler and its version, so :func:`refuse` makes a compile request an error in portable mode.

In the ComfyUI process the pack applies the in-process part at import when ``STEADFAST_PORTABLE=1``
(:func:`apply_in_process`), and every run record carries :func:`cpu_settings` (read back, not as requested).
This module imports nothing from ComfyUI.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

from .. import switches

__all__ = [
    "ENV_FLAG",
    "PortableModeError",
    "portable_env",
    "is_portable",
    "check_cpu",
    "apply_in_process",
    "pin_thread",
    "cpu_settings",
    "refuse",
    "check_device",
    "SETTINGS_ENV",
]
__all__ += ["free_memory_refusals", "FREE_MEMORY_NODES"]  # ComfyUI's free-memory choices (kept apart for merges)

ENV_FLAG = switches.PORTABLE.name
ENV_THREADS = switches.PORTABLE_THREADS.name
DEFAULT_THREADS = 1
SIMDLEN = 256

# The environment variables that decide CPU code paths (read back into the run record as the server sees them).
SETTINGS_ENV = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_DYNAMIC",
    "MKL_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_DEBUG_CPU_TYPE",
    ENV_FLAG,
    ENV_THREADS,
)

# Second-line ISA caps: set by portable_env, recorded, not required (oneDNN is off, MKL runs COMPATIBLE).
CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")

# MKL's mkl_cbwr_get values (mkl_service.h, MKL 2024).
_CBWR_NAMES = {
    1: "OFF",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
}
_CBWR_STRICT = 0x10000


class PortableModeError(RuntimeError):
    """Something that cannot be made portable was asked for in portable CPU mode, or this CPU cannot run it."""


def portable_env(threads: int = DEFAULT_THREADS) -> dict[str, str]:
    """The environment variables of portable mode, for a process started with them.

    Args:
        threads: intra-op thread count (every machine must use the same one; the golden hashes use 1).

    Returns:
        ``{name: value}`` to add to the child's environment (it also sets ``STEADFAST_PORTABLE=1``).

    Raises:
        ValueError: ``threads`` < 1.
    """
    if threads < 1:
        raise ValueError(f"portable mode needs a fixed thread count >= 1, got {threads}")
    n = str(int(threads))
    return {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "MKL_CBWR": "COMPATIBLE,STRICT",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "MKL_DYNAMIC": "FALSE",
        "MKL_NUM_THREADS": n,
        "OMP_NUM_THREADS": n,
        ENV_FLAG: "1",
        ENV_THREADS: n,
    }


def is_portable() -> bool:
    """True when this process runs in portable CPU mode (``STEADFAST_PORTABLE=1``)."""
    return switches.PORTABLE.text() == "1"


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``), read once per process; empty where that file is not there."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def check_cpu() -> None:
    """Raise :class:`PortableModeError` unless this is an x86-64 CPU with AVX2 and FMA (what the recipe pins).

    On a system without ``/proc/cpuinfo`` (Windows, macOS) the x86-64 check alone is made: the flags cannot be
    read there, so the error would come from torch itself if AVX2 were missing."""
    import platform

    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        raise PortableModeError(
            f"portable CPU mode pins x86-64 AVX2 code paths; this machine is {machine} "
            f"(an ARM CPU runs other kernels: the same bytes cannot be promised, see "
            f"docs/reproducing.md for the graded verdict instead)"
        )
    flags = _cpu_flags()
    if flags and not {"avx2", "fma"} <= flags:
        raise PortableModeError(
            "portable CPU mode needs AVX2 and FMA; this CPU lacks " + ", ".join(sorted({"avx2", "fma"} - flags))
        )


def apply_in_process() -> dict[str, Any]:
    """Apply the in-process part of portable mode (oneDNN off, thread count, inductor simdlen).

    Call it where the process starts (the pack does at import when :func:`is_portable`). The environment part
    (:func:`portable_env`) must already be in place: it is checked here, since setting it now would be too late.
    The second-line caps in :data:`CAPS` are recorded but not required: with oneDNN off and MKL in its
    COMPATIBLE branch their value does not change the bits (``tests/comfy/test_portable.py`` varies them).

    Returns:
        :func:`cpu_settings` after applying.

    Raises:
        PortableModeError: an environment variable of the recipe is missing or has another value, or the CPU
            cannot run the recipe (:func:`check_cpu`).
    """
    import torch

    check_cpu()
    threads = int(switches.PORTABLE_THREADS.text() or DEFAULT_THREADS)
    want = {k: v for k, v in portable_env(threads).items() if k not in CAPS}
    wrong = {k: os.environ.get(k) for k, v in want.items() if os.environ.get(k) != v}
    if wrong:
        raise PortableModeError(
            "portable CPU mode: these variables must be set before the process starts: "
            + ", ".join(f"{k}={want[k]} (is {v!r})" for k, v in sorted(wrong.items()))
        )
    torch.backends.mkldnn.enabled = False
    torch.set_num_threads(threads)
    pin_thread()
    return cpu_settings()


def pin_thread() -> None:
    """In portable mode, set inductor's ``cpp.simdlen`` in the calling thread (nothing outside portable mode).

    torch 2.14's inductor config keeps a value set in one thread to that thread (ComfyUI samples in a
    worker thread, the pack is imported in the main one); torch 2.11's is process-wide. So the sampler calls this
    before sampling. oneDNN's switch and the thread count are process-wide in both."""
    if not is_portable():
        return
    from .. import torch_compat  # imports torch: kept out of this module's import (the CLI reads it first)

    torch_compat.set_inductor_simdlen(SIMDLEN)


def _mkl_cbwr() -> str | None:
    """MKL's CBWR branch in use (``mkl_cbwr_get(MKL_CBWR_ALL)`` through ``libtorch_cpu``), or None when unknown."""
    from .. import torch_compat

    get = getattr(torch_compat.libtorch_cpu(), "mkl_serv_cbwr_get", None)
    if get is None:
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    value = int(get(-1))
    name = _CBWR_NAMES.get(value & 0xFFFF, str(value & 0xFFFF))
    return name + (",STRICT" if value & _CBWR_STRICT else "")


def _mkl_max_threads() -> int | None:
    from .. import torch_compat

    fn = getattr(torch_compat.libtorch_cpu(), "mkl_get_max_threads", None)
    if fn is None:
        return None
    fn.restype = ctypes.c_int
    return int(fn())


def cpu_settings() -> dict[str, Any]:
    """The settings that decide CPU bits, as in use in this process (read back from torch and MKL).

    Returns:
        ``portable`` (bool), ``aten_capability`` (``torch.backends.cpu.get_cpu_capability()``),
        ``mkldnn_enabled``, ``mkl_cbwr`` (MKL's branch in use, e.g. "COMPATIBLE,STRICT"; None when MKL's
        service functions are not reachable), ``threads`` (``torch.get_num_threads()``), ``mkl_max_threads``,
        ``inductor_simdlen`` (None = inductor picks this CPU's widest), ``cpu_flags`` (the AVX512/AMX/AVX2
        flags this CPU has) and ``env`` (every variable of :data:`SETTINGS_ENV` that is set, as this process
        sees it).
    """
    import torch

    getter = getattr(torch.backends.cpu, "get_cpu_capability", None)
    try:
        cap = str(getter()) if getter is not None else None
    except RuntimeError:
        cap = None
    from .. import torch_compat

    simdlen = torch_compat.inductor_simdlen()
    flags = sorted(
        f
        for f in _cpu_flags()
        if f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "avx_vnni")
    )
    return {
        "portable": is_portable(),
        "aten_capability": cap,
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
        "mkl_cbwr": _mkl_cbwr(),
        "threads": torch.get_num_threads(),
        "mkl_max_threads": _mkl_max_threads(),
        "inductor_simdlen": simdlen,
        "cpu_flags": flags,
        "env": {k: os.environ[k] for k in SETTINGS_ENV if k in os.environ},
    }


def refuse(what: str, why: str) -> None:
    """Raise :class:`PortableModeError` for ``what`` when in portable mode; do nothing otherwise.

    Args:
        what: the request, as the user named it (e.g. "compile (inductor)").
        why: why it cannot be made portable.

    Raises:
        PortableModeError: in portable mode.
    """
    if is_portable():
        raise PortableModeError(
            f"portable CPU mode refuses {what}: {why}. Run without --portable "
            f"(STEADFAST_PORTABLE) for it, or leave it out of the workflow."
        )


def check_optimize(
    *, compile: str = "off", backend: str = "", quantize: str = "off", precision: str = "model"
) -> None:
    """Refuse, in portable mode, the optimizations whose CPU bits cannot be pinned (nothing outside it).

    Args:
        compile: the compile widget ("off", "regional", "full"); refused unless "off" or backend "eager"
            (inductor's C++ code depends on the C++ compiler and its version, not only on the ISA).
        backend: the compile backend.
        quantize: refused unless "off" (torchao's CPU kernels pick per ISA: VNNI/AMX or not).
        precision: "model"/"fp32" pass; bf16/fp16 are refused (CPU low-precision matmuls take AMX, AVX512-BF16
            or emulated paths by CPU; not measured portable).

    Raises:
        PortableModeError: in portable mode, for each refused request (the first one found).
    """
    if compile != "off" and backend != "eager":
        refuse(
            f"compile={compile} (backend {backend})",
            "compiled C++ kernels depend on the C++ compiler, its version and flags, not only on the vector ISA",
        )
    if quantize != "off":
        refuse(f"quantize={quantize}", "torchao's CPU kernels are chosen per CPU (VNNI, AMX)")
    if precision not in ("model", "fp32"):
        refuse(
            f"precision={precision}",
            "CPU bf16/fp16 matmuls take AMX, AVX512-BF16 or emulated paths by CPU (not measured portable; fp32 is)",
        )


def check_device(device: Any, what: str = "the model") -> None:
    """Refuse, in portable mode, to compute on any device but the CPU (portable mode pins CPU code paths only: a
    record saying ``portable: true`` for bits a GPU computed would be false).

    Args:
        device: a ``torch.device`` or its text ("cuda:0", "cpu").
        what: what would run there, as the user knows it (e.g. "the model", "the pipeline").

    Raises:
        PortableModeError: in portable mode, for a device other than the CPU.
    """
    kind = str(device).split(":", 1)[0]
    if kind != "cpu":
        refuse(
            f"{what} on {device}",
            "portable mode pins the CPU's code paths; a GPU computes with its own kernels, "
            "which portable mode cannot pin. Start ComfyUI with --cpu (steadfast run --portable does not pass it "
            "for you on a machine with a GPU)",
        )


def check_threads(num_threads: int | None) -> None:
    """Refuse, in portable mode, a thread count other than the portable one (0/None = keep it).

    Raises:
        PortableModeError: in portable mode, for another count.
    """
    want = int(switches.PORTABLE_THREADS.text() or DEFAULT_THREADS)
    if num_threads and num_threads != want:
        refuse(
            f"num_threads={num_threads}",
            f"portable mode pins {want} thread(s) on every machine (CPU "
            f"reductions split by thread count); set num_threads to 0 or {want}",
        )


# ComfyUI's choices that follow free memory (docs/reproducing.md, "Free memory"), per node class: what the node
# leaves to free memory, and the fix. Samplers are checked for Determinism Setup (batch_invariant) upstream.
SAMPLERS_OF_A_MODEL = {  # class -> the inputs that carry the model (directly, or through a guider)
    "KSampler": ("model",),
    "KSamplerAdvanced": ("model",),
    "SamplerCustom": ("model",),
    "SamplerCustomAdvanced": ("guider",),
    "SteadfastSeededSampler": ("model",),
}
FREE_MEMORY_NODES = {
    "VAEDecode": (
        "decodes as many items at once as free memory allows and its split attention slices by free "
        "memory (comfy/sd.py, comfy/ldm/modules/diffusionmodules/model.py)",
        "use VAE Decode (Steadfast) instead (each item alone, SDPA attention)",
    ),
    "VAEDecodeTiled": (
        "its VAE's split attention slices by free memory (comfy/ldm/modules/diffusionmodules/model.py)",
        "use VAE Decode (Steadfast) instead",
    ),
    "VAEEncode": (
        "encodes as many images at once as free memory allows and its split attention slices by free "
        "memory (comfy/sd.py)",
        "encode outside portable mode and feed the latent in (Save Latent / "
        "Load Latent): the pack has no memory-independent VAE Encode",
    ),
    "VAEEncodeTiled": (
        "its VAE's split attention slices by free memory",
        "encode outside portable mode and feed the latent in (Save Latent / Load Latent)",
    ),
    "VAEEncodeForInpaint": (
        "encodes by free memory like VAE Encode",
        "encode outside portable mode and feed the latent in (Save Latent / Load Latent)",
    ),
}
_MODEL_LINKS = ("model", "guider")  # the inputs a model travels through (patch nodes name theirs "model")


def _link(value: Any, prompt: dict[str, Any]) -> str | None:
    if isinstance(value, list) and len(value) == 2 and str(value[0]) in prompt:
        return str(value[0])
    return None


def _batch_invariant_upstream(prompt: dict[str, Any], node: str, inputs: tuple[str, ...]) -> bool:
    """Whether a Determinism Setup with ``batch_invariant`` on lies on the model path into ``node``."""
    todo = [n for k in inputs if (n := _link(prompt[node].get("inputs", {}).get(k), prompt))]
    seen: set[str] = set()
    while todo:
        cur = todo.pop()
        if cur in seen:
            continue
        seen.add(cur)
        spec = prompt[cur]
        if spec.get("class_type") == "SteadfastDeterminismSetup":
            if spec.get("inputs", {}).get("batch_invariant", True) is not False:
                return True
            continue  # batch_invariant off here: ComfyUI's choices stay open on this path
        todo += [n for k in _MODEL_LINKS if (n := _link(spec.get("inputs", {}).get(k), prompt))]
    return False


def free_memory_refusals(prompt: dict[str, Any]) -> list[str]:
    """What portable mode refuses in an API-format workflow: the nodes whose output bits ComfyUI lets free memory
    decide, each named with the fix. Portable mode pins the CPU's code paths, not the machine's load, so two PCs
    with different free RAM would otherwise give other bytes for the same workflow.

    - a sampler (KSampler, KSamplerAdvanced, SamplerCustom, SamplerCustomAdvanced through its guider, Seeded
      Sampler) whose model does not come through Determinism Setup with ``batch_invariant`` on: ComfyUI groups
      conds into one model call by free memory (``comfy/samplers.py``) and chunks its CPU default attention
      (sub-quadratic) by free memory (``comfy/ldm/modules/attention.py``);
    - the VAE nodes of :data:`FREE_MEMORY_NODES` (ComfyUI's VAE Decode / Encode and their tiled forms).

    Args:
        prompt: ``{node id: {"class_type": ..., "inputs": {...}}}`` (ComfyUI's API format).

    Returns:
        One message per refused node (empty: nothing left to free memory that this check knows of).
    """
    out: list[str] = []
    for nid in sorted(prompt, key=lambda k: (len(str(k)), str(k))):
        spec = prompt[nid]
        cls = spec.get("class_type", "")
        if cls in SAMPLERS_OF_A_MODEL and not _batch_invariant_upstream(prompt, nid, SAMPLERS_OF_A_MODEL[cls]):
            out.append(
                f"node {nid} ({cls}): its model does not come through Determinism Setup with "
                f"batch_invariant on, so ComfyUI groups its conds into one model call and chunks its "
                f"attention by free memory (the bits would depend on the machine's load). Fix: put "
                f"Determinism Setup (batch_invariant on) between the model loader and node {nid}."
            )
        elif cls in FREE_MEMORY_NODES:
            what, fix = FREE_MEMORY_NODES[cls]
            out.append(f"node {nid} ({cls}): {what}. Fix: {fix}.")
    return out
