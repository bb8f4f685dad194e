"""Environment fingerprint: everything outside the workflow that can change output bits.

Fields: torch version, thread count (fp32 CPU output differs between 1 and 2 threads:
``docs/measurements.md``, ``scripts/measure_cpu.py``), CPU vector ISA, GPU, the global
determinism/TF32 flags, plus what the caller adds (dtype, attention backend, compile mode, seeds ...).
Host names, paths and times are deliberately not included, so equal environments give equal digests.

The running ComfyUI's settings that touch determinism are part of the environment too. ComfyUI has added, since 0.8.0,
features that change output bits or break run-to-run equality: Dynamic VRAM
(comfy-aimdo, the default on NVIDIA GPUs from 0.1x on), comfy-kitchen kernels, and ``--fast`` options
(``fp16_accumulation``, ``fp8_matrix_mult``, ``cublas_ops``, ``autotune``: ``comfy/cli_args.py``
``PerformanceFeature``). The node layer (``nodes/host/identity.py``) reads them from the running server into a plain
dict; this module, which imports nothing from ComfyUI, says which of them are known to break run-to-run equality,
so that the detection can be tested on any machine.

The dict (``ComfyEnvironment`` fields, all JSON): ``comfyui`` (version), ``comfy_aimdo`` / ``comfy_kitchen``
(installed versions, or None), ``dynamic_vram`` (bool: ComfyUI's ``comfy.memory_management.aimdo_enabled``),
``comfy_fast`` (sorted ``--fast`` option values), ``comfy_numeric_args`` (the numeric command-line switches that
are set, e.g. ``{"force_fp16": true}``), ``fast_disk`` / ``cuda_graphs`` / ``comfy_compiler`` (ComfyUI 0.33's
loading switches; None where absent) and ``fp16_accumulation`` (``torch.backends.cuda.matmul.
allow_fp16_accumulation`` where torch has it).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import math
import platform
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np
import torch

from ..determinism.cublas import cublas_env
from ..determinism.portable import cpu_settings
from ..determinism.torch_state import snapshot_state

__all__ = ["FINGERPRINT_VERSION", "NUMERIC_ARGS", "environment_fingerprint", "fingerprint_digest", "run_to_run_risks"]

FINGERPRINT_VERSION = 1


@functools.cache
def _cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), read once per process."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cuda_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {
        "cuda_available": False,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "gpu": None,
        "gpu_capability": None,
        "gpu_count": 0,
    }
    try:
        available = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - builds without CUDA
        available = False
    if not available:
        return fields
    fields["cuda_available"] = True
    env = cublas_env()  # read by cuBLAS / cuBLASLt when PyTorch first sizes their workspaces
    fields["cublas_workspace_config"] = env["CUBLAS_WORKSPACE_CONFIG"]
    fields["cublaslt_workspace_size"] = env["CUBLASLT_WORKSPACE_SIZE"]
    fields["gpu_count"] = torch.cuda.device_count()
    fields["gpu"] = torch.cuda.get_device_name(0)
    fields["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    if torch.backends.cudnn.is_available():
        fields["cudnn"] = torch.backends.cudnn.version()
    return fields


def _jsonable(value: Any, path: str) -> Any:
    """Canonicalise ``value`` for JSON; raise TypeError for objects without a stable text form."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (torch.dtype, torch.device, PurePath)):
        return str(value)
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, path)
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return _jsonable(value.item(), path)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{path}.{k}") for k, v in value.items()}
    raise TypeError(f"fingerprint field {path!r} has no stable JSON form: {type(value).__name__}")


def environment_fingerprint(*, measured: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A JSON-safe dict describing this process's numerics-relevant environment.

    Fields: ``fingerprint_version``, ``torch``, ``python``, ``numpy``, ``platform``, ``machine``,
    ``cpu`` (model name), ``cpu_capability`` (torch's vector ISA, e.g. "AVX512"), ``cuda_available``,
    ``cuda``/``cudnn`` versions, ``gpu`` name/capability/count, where CUDA is available
    ``cublas_workspace_config`` / ``cublaslt_workspace_size`` (the ``CUBLAS_WORKSPACE_CONFIG`` /
    ``CUBLASLT_WORKSPACE_SIZE`` variables, None where unset: :mod:`core.determinism.cublas`; absent without CUDA,
    where no cuBLAS call decides a bit), ``num_threads``,
    ``num_interop_threads``, ``flags`` (``snapshot_state(load_inductor=True).as_dict()``), ``cpu_settings``
    (the CPU code-path settings in use, :func:`core.determinism.portable.cpu_settings`), then every
    keyword in ``extra`` (values: JSON scalars, lists/tuples, dicts, ``torch.dtype``/``device``,
    enums, paths; non-finite floats become strings).

    Args:
        measured: ``num_threads``, ``flags`` and ``cpu_settings`` as measured elsewhere (the Seeded Sampler reads
            them inside sampling, where Determinism Setup's policy holds): recorded instead of reading them now.
            None or empty: read now.
        extra: the caller's fields, after the built-in ones.

    Raises:
        ValueError: an ``extra`` key collides with a built-in field.
        TypeError: an ``extra`` value has no stable JSON form (e.g. an arbitrary object).
    """
    fp: dict[str, Any] = {
        "fingerprint_version": FINGERPRINT_VERSION,
        "torch": torch.version.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "cpu_capability": _cpu_capability(),
        **_cuda_fields(),
        "num_threads": measured["num_threads"] if measured else torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "flags": measured["flags"] if measured else snapshot_state(load_inductor=True).as_dict(),
        "cpu_settings": measured["cpu_settings"] if measured else cpu_settings(),
    }
    clash = sorted(set(extra) & set(fp))
    if clash:
        raise ValueError(f"extra fingerprint fields collide with built-in ones: {clash}")
    for key, value in extra.items():
        fp[key] = _jsonable(value, key)
    return fp


def _cpu_capability() -> str | None:
    getter = getattr(torch.backends.cpu, "get_cpu_capability", None)
    try:
        return str(getter()) if getter is not None else None
    except RuntimeError:
        return None


def fingerprint_digest(d: dict[str, Any]) -> str:
    """64-hex SHA-256 of the canonical JSON of ``d`` (sorted keys, no whitespace, ASCII, no NaN).

    Raises:
        TypeError: a value has no stable JSON form (see :func:`environment_fingerprint`).
    """
    canonical = json.dumps(
        _jsonable(d, "$"), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


#: ComfyUI command-line switches that change which dtype or attention runs (``comfy/cli_args.py``), recorded when
#: set. Names not present in a ComfyUI version are skipped.
NUMERIC_ARGS = (
    "force_fp32",
    "force_fp16",
    "fp32_unet",
    "fp64_unet",
    "bf16_unet",
    "fp16_unet",
    "fp8_e4m3fn_unet",
    "fp8_e5m2_unet",
    "fp8_e8m0fnu_unet",
    "fp16_vae",
    "fp32_vae",
    "bf16_vae",
    "cpu_vae",
    "fp8_e4m3fn_text_enc",
    "fp8_e5m2_text_enc",
    "fp16_text_enc",
    "fp32_text_enc",
    "bf16_text_enc",
    "force_upcast_attention",
    "dont_upcast_attention",
    "use_split_cross_attention",
    "use_quad_cross_attention",
    "use_pytorch_cross_attention",
    "use_sage_attention",
    "use_flash_attention",
    "disable_xformers",
    "deterministic",
    "disable_smart_memory",
)


def run_to_run_risks(env: Mapping[str, Any]) -> list[str]:
    """Settings of the running ComfyUI known to break run-to-run equality, each as one plain sentence.

    Args:
        env: the ComfyUI environment dict (module docstring); missing keys count as "not in use".
    Returns:
        One line per known risk (empty when none is known): what is on, what upstream reported, what to do.
        Sources: ComfyUI issues 16490 (Dynamic VRAM restores a ``ModelSamplingDiscrete`` schedule into later
        runs of the same checkpoint) and 15365 (LoRA-patched fp8 weights not run-to-run deterministic under
        comfy-aimdo); ``--fast autotune`` sets ``torch.backends.cudnn.benchmark`` (``comfy/model_management.py``),
        which picks convolution algorithms by timing.
    """
    risks = []
    if env.get("dynamic_vram"):
        risks.append(
            "Dynamic VRAM (comfy-aimdo) is active: upstream reports state leaking between runs of the same "
            "checkpoint (ComfyUI issue 16490: a ModelSamplingDiscrete schedule kept after the node is removed) and "
            "LoRA-patched fp8 weights differing run to run (issue 15365). For run-to-run equality start ComfyUI "
            "with --disable-dynamic-vram."
        )
    if env.get("fast_disk"):
        risks.append(
            "--fast-disk is on: weights are loaded from disk-backed memory, which upstream reports changes "
            "outputs (ComfyUI issue 15528). For run-to-run equality start ComfyUI without --fast-disk."
        )
    if env.get("comfy_compiler") == "on":
        risks.append(
            "the Comfy Compiler is on (memory compiler + CUDA graphs with Dynamic VRAM): Optimize Model "
            "refuses compile, qkv_fusion and quantize under it; start ComfyUI with --disable-comfy-compiler "
            "to use them."
        )
    fast = set(env.get("comfy_fast") or ())
    if "autotune" in fast:
        risks.append(
            "--fast autotune turns cuDNN benchmark on for the whole server (convolution algorithms chosen "
            "by timing): Determinism Setup turns it off around sampling only, so VAE decoding and other "
            "nodes still vary. Start ComfyUI without it for run-to-run equality."
        )
    return risks
