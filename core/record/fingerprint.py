"""Environment fingerprint: everything outside the workflow that can change output bits.

Fields: torch version, thread count (fp32 CPU output differs between 1 and 2 threads:
``docs/measurements.md``, ``scripts/measure_cpu.py``), CPU vector ISA, GPU, the global
determinism/TF32 flags, plus what the caller adds (dtype, attention backend, compile mode, seeds ...).
Host names, paths and times are deliberately not included, so equal environments give equal digests.
"""
from __future__ import annotations

import enum
import hashlib
import json
import math
import platform
from pathlib import PurePath
from typing import Any

import numpy as np
import torch

from ..determinism.portable import cpu_settings
from ..determinism.torch_state import snapshot_state

__all__ = ["FINGERPRINT_VERSION", "environment_fingerprint", "fingerprint_digest"]

FINGERPRINT_VERSION = 1


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cuda_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {"cuda_available": False, "cuda": torch.version.cuda, "cudnn": None,
                              "gpu": None, "gpu_capability": None, "gpu_count": 0}
    try:
        available = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - builds without CUDA
        available = False
    if not available:
        return fields
    fields["cuda_available"] = True
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


def environment_fingerprint(**extra: Any) -> dict[str, Any]:
    """A JSON-safe dict describing this process's numerics-relevant environment.

    Fields: ``fingerprint_version``, ``torch``, ``python``, ``numpy``, ``platform``, ``machine``,
    ``cpu`` (model name), ``cpu_capability`` (torch's vector ISA, e.g. "AVX512"), ``cuda_available``,
    ``cuda``/``cudnn`` versions, ``gpu`` name/capability/count, ``num_threads``,
    ``num_interop_threads``, ``flags`` (``snapshot_state(load_inductor=True).as_dict()``), ``cpu_settings``
    (the CPU code-path settings in use, :func:`core.determinism.portable.cpu_settings`), then every
    keyword in ``extra`` (values: JSON scalars, lists/tuples, dicts, ``torch.dtype``/``device``,
    enums, paths; non-finite floats become strings).

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
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "flags": snapshot_state(load_inductor=True).as_dict(),
        "cpu_settings": cpu_settings(),
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
    canonical = json.dumps(_jsonable(d, "$"), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
