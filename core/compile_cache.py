"""A managed, persistent torch.compile cache: the same compiled kernels across process restarts.

Inductor keeps its FX-graph cache, AOT-autograd cache and compiled C++/Triton kernels under
``TORCHINDUCTOR_CACHE_DIR`` (default ``/tmp/torchinductor_<user>``, often wiped). Pointing it at a
persistent directory is what turns a cold start into a warm one: measured on this CPU for a
regional Flux, 45 s -> 8.5 s first call in a new process (``research/torch_probe.md`` section 5;
PyTorch's "Compile Time Caching Configuration" tutorial). What stays is Dynamo tracing, guard
building and loading the ``.so`` files.

This module owns one directory per *name* and *key* (:func:`cache_key_fields`: torch, triton, python,
device, pack version): ``<root>/<name>/<key>``. Where the root may be and which names a workflow may pick is
:mod:`core.compile_cache_location` (inductor and Triton load pickles and shared objects from there). A
``steadfast_cache.json`` manifest in it repeats the key fields; a directory whose manifest is unreadable or names other fields is moved aside (never
deleted, never a crash) with a message, and a fresh one is used. Inductor itself skips corrupt
cache entries with a warning and recompiles (its FX-graph lookup catches unpickling errors);
:meth:`CompileCache.quarantine` is the last resort adapters call when a compile fails while the
cache was active.

Measured here (``tests/core/test_compile_cache.py``): a corrupt FX-graph or AOT-autograd entry is
skipped by inductor (a logged warning, then a normal compile), but a corrupt compiled ``.so`` makes
the compile fail (``BackendCompilerFailed: ImportError ... file too short``): :func:`run_cached`
moves the directory aside and retries once, so that too costs a recompile, not a failure.

Global state: :meth:`CompileCache.activate` sets ``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR`` (``<path>/triton``, as torch's own ``fresh_cache`` does) only for the duration
of a ``with`` block (around Steadfast's compiled calls) and restores the previous values (or their
absence) afterwards; when the directory differs from the one inductor last saw it clears inductor's
memoised paths (:func:`core.torch_compat.clear_inductor_caches`, what ``fresh_cache`` does). Caveat: the
variables are process-wide, so an inductor compile in another thread during that window also uses
this directory. This module imports nothing from ComfyUI.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import logging
import os
import platform
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from . import torch_compat
from .compile_cache_location import DEFAULT_NAME, CacheRefused, check_location, check_name

log = logging.getLogger("steadfast.compile_cache")

__all__ = ["INDUCTOR_ENV", "TRITON_ENV", "MANIFEST", "CACHE_FORMAT", "device_description", "cache_key_fields",
           "cache_key", "CompileCache", "open_cache", "caused_by_cache", "run_cached"]

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"
MANIFEST = "steadfast_cache.json"
CACHE_FORMAT = 1
_ENV_LOCK = threading.RLock()
_last_dir: list[str | None] = [None]  # the directory inductor last compiled into under our activation
T = TypeVar("T")


def _pack_version() -> str:
    package = (__package__ or "").rpartition(".")[0]
    if not package:
        return "unknown"
    try:
        return str(getattr(importlib.import_module(package), "__version__", "unknown"))
    except ImportError:  # pragma: no cover
        return "unknown"


def _triton_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return None


def device_description(device: torch.device | str | None = None) -> str:
    """What the generated kernels were built for: ``"cpu AVX512"`` or ``"cuda NVIDIA H100 80GB HBM3 sm90"``.

    CPU: ``torch.backends.cpu.get_cpu_capability()`` (the vector ISA inductor targets). CUDA/ROCm:
    device name and compute capability. Other device types: the type name. ``device`` defaults to
    CUDA when available, else CPU.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cpu":
        try:
            isa = torch.backends.cpu.get_cpu_capability()
        except (AttributeError, RuntimeError):  # pragma: no cover
            isa = platform.machine()
        return f"cpu {isa}"
    if dev.type == "cuda" and torch.cuda.is_available():
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda {torch.cuda.get_device_name(index)} sm{major}{minor}"
    return dev.type


def cache_key_fields(device: torch.device | str | None = None, pack_version: str | None = None) -> dict[str, Any]:
    """Everything compiled artifacts depend on that the directory name must separate.

    ``{"format", "torch", "triton", "python", "device", "pack"}``: torch version (with its CUDA
    build), triton distribution + version (None without triton), Python ``major.minor`` (bytecode),
    :func:`device_description`, the pack version (defaults to this package's ``__version__``).
    """
    cuda = torch.version.cuda
    return {
        "format": CACHE_FORMAT,
        "torch": torch.version.__version__ + (f" cuda{cuda}" if cuda else ""),
        "triton": _triton_version(),
        "python": f"{platform.python_implementation()} {platform.python_version_tuple()[0]}."
                  f"{platform.python_version_tuple()[1]}",
        "device": device_description(device),
        "pack": pack_version or _pack_version(),
    }


def cache_key(fields: Mapping[str, Any]) -> str:
    """Directory name for ``fields``: a readable slug plus 12 hex of SHA-256 of the canonical JSON.

    E.g. ``"torch2.14.1-cpu-AVX512-3f2a9c01b7de"``. Only ``[A-Za-z0-9._-]`` characters.
    """
    digest = hashlib.sha256(json.dumps(dict(fields), sort_keys=True, default=str).encode()).hexdigest()[:12]
    torch_v = str(fields.get("torch", "")).split("+")[0].split(" ")[0]
    device = str(fields.get("device", "")).split(" ")
    slug = f"torch{torch_v}-{device[0]}-{device[1] if len(device) > 1 else ''}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", slug).strip("-_")
    return f"{slug}-{digest}"


@dataclasses.dataclass
class CompileCache:
    """One opened cache directory (see :func:`open_cache`).

    ``root``: ``<operator root>/<name>``; ``path``: ``<root>/<key>`` (what ``TORCHINDUCTOR_CACHE_DIR`` is set
    to), ``fields``: the key fields, ``messages``: what happened when it was opened (moved-aside directories
    ...; no absolute paths: they reach HTTP clients), ``source``: where the root came from.
    """

    root: Path
    key: str
    fields: dict[str, Any]
    source: str = ""
    name: str = DEFAULT_NAME
    messages: list[str] = dataclasses.field(default_factory=list)
    activations: int = 0

    @property
    def path(self) -> Path:
        return self.root / self.key

    @contextlib.contextmanager
    def activate(self) -> Iterator[Path]:
        """Set ``TORCHINDUCTOR_CACHE_DIR`` to :attr:`path` inside the block; restore it after.

        The previous value (or its absence) is recorded and put back in ``finally``, also when
        inductor rewrote the variable meanwhile (``cache_dir()`` writes its absolute path back).
        Re-entrant: an inner activation of the same path changes nothing. Yields the path.
        """
        target = str(self.path.resolve())
        triton = os.path.join(target, "triton")
        with _ENV_LOCK:
            previous = {k: os.environ.get(k) for k in (INDUCTOR_ENV, TRITON_ENV)}
            nested = previous[INDUCTOR_ENV] == target
            if not nested:
                os.environ[INDUCTOR_ENV] = target
                os.environ[TRITON_ENV] = triton
                if _last_dir[0] != target:
                    torch_compat.clear_inductor_caches()
                    _last_dir[0] = target
            self.activations += 1
        try:
            yield self.path
        finally:
            if not nested:
                with _ENV_LOCK:
                    for k, v in previous.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v

    def quarantine(self, reason: str) -> str:
        """Move the whole key directory aside (``<key>.bad-<unix time>``), start an empty one.

        For a compile that failed while this cache was active. Returns the message (also logged
        and appended to :attr:`messages`); never raises (an unmovable directory is reported).
        """
        return _move_aside(self, reason)

    def redact(self, text: str) -> str:
        """``text`` with this cache's absolute paths replaced by ``<compile cache 'name'>`` (for clients)."""
        for p in sorted({str(self.path.resolve()), str(self.path), str(self.root.resolve()), str(self.root)},
                        key=len, reverse=True):
            text = text.replace(p, f"<compile cache {self.name!r}>")
        return text

    def as_dict(self) -> dict[str, Any]:
        """What clients may see (``/steadfast/compile_state``, node text): name, root source, messages.

        Never the absolute path nor the key (they would tell an attacker where to plant a poisoned cache).
        """
        return {"name": self.name, "source": self.source, "messages": list(self.messages)}


def _write_manifest(cache: CompileCache) -> None:
    body = {"steadfast_compile_cache": CACHE_FORMAT, "key": cache.key, "fields": cache.fields,
            "created": time.time()}
    tmp = cache.path / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, cache.path / MANIFEST)


def _move_aside(cache: CompileCache, reason: str) -> str:
    target = cache.root / f"{cache.key}.bad-{int(time.time() * 1000)}"
    try:
        with _ENV_LOCK:
            torch_compat.clear_inductor_caches()
            _last_dir[0] = None
        os.replace(cache.path, target)
        cache.path.mkdir(parents=True, exist_ok=True)
        _write_manifest(cache)
        msg = f"compile cache {cache.name!r}: {reason}; moved aside, starting empty"
        log.warning("%s (%s -> %s)", msg, cache.path, target)
    except OSError as e:
        msg = f"compile cache {cache.name!r}: {reason}; could not move it aside ({type(e).__name__})"
        log.warning("%s: %s", msg, e)
    msg = cache.redact(msg)
    cache.messages.append(msg)
    return msg


def _manifest_problem(cache: CompileCache) -> str | None:
    """Why the existing manifest does not fit (None when it does or there is none)."""
    manifest = cache.path / MANIFEST
    if not manifest.exists():
        return None
    try:
        body = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"unreadable manifest ({type(e).__name__}: {e})"
    if not isinstance(body, dict) or body.get("steadfast_compile_cache") != CACHE_FORMAT:
        return "manifest of another format"
    stored = body.get("fields")
    if stored != json.loads(json.dumps(cache.fields, default=str)):
        diff = sorted(k for k in set(stored or {}) | set(cache.fields)
                      if (stored or {}).get(k) != cache.fields.get(k)) if isinstance(stored, dict) else ["fields"]
        return f"made for another environment (differs in {', '.join(diff)})"
    return None


def open_cache(root: str | os.PathLike[str], name: str = DEFAULT_NAME, *,
               device: torch.device | str | None = None, fields: Mapping[str, Any] | None = None,
               source: str = "", forbidden: tuple[str | os.PathLike[str], ...] = ()) -> CompileCache | None:
    """Open (create) the cache directory ``<root>/<name>/<key>`` for this environment.

    ``root`` is the operator's (:func:`~core.compile_cache_location.resolve_root`), ``name`` the workflow's choice
    (:func:`~core.compile_cache_location.check_name`).
    ``forbidden``: folders HTTP clients can write (ComfyUI's input/output/temp, user folders); a root that
    overlaps one, a ``name`` that is a symlink, a file, or resolves outside ``root`` raise
    :class:`CacheRefused` before anything is created. ``fields`` default to :func:`cache_key_fields` for
    ``device``. A directory whose manifest is corrupt or names other fields is moved aside with a message
    (in ``messages`` and the log). Returns None, with a logged warning, when the directory cannot be
    created or written (read-only disk ...): callers then run without the managed cache.
    """
    if check_name(name) != name:
        raise CacheRefused(f"compile cache name {name!r} is not a plain name")
    base = Path(root).expanduser().absolute()
    f = dict(fields) if fields is not None else cache_key_fields(device)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.warning("compile cache root %s unusable (%s): running without the managed cache", base, e)
        return None
    named = check_location(base, name, tuple(Path(p) for p in forbidden))
    cache = CompileCache(root=named, key=cache_key(f), fields=f, source=source, name=name)
    try:
        cache.path.mkdir(parents=True, exist_ok=True)
        problem = _manifest_problem(cache)
        if problem is not None:
            _move_aside(cache, problem)
        elif not (cache.path / MANIFEST).exists():
            _write_manifest(cache)
        probe = cache.path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        log.warning("compile cache under %s unusable (%s): running without the managed cache", named, e)
        return None
    return cache


def caused_by_cache(exc: BaseException, cache: CompileCache) -> bool:
    """True when ``exc`` or an exception in its cause/context chain names a file inside the cache.

    E.g. ``BackendCompilerFailed`` wrapping ``ImportError: <cache>/xx/yy.so: file too short``.
    """
    marker = str(cache.path.resolve())
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if marker in str(e) or any(marker in str(a) for a in getattr(e, "args", ())):
            return True
        e = e.__cause__ or e.__context__
    return False


def run_cached(cache: CompileCache | None, fn: Callable[[], T], *,
               retry_if: Callable[[BaseException], bool] = lambda e: True) -> T:
    """``fn()`` with ``cache`` active (just ``fn()`` when ``cache`` is None).

    When ``fn`` raises an exception for which ``retry_if(e)`` is true (adapters pass "is a compile
    error") and that names a file inside the cache (:func:`caused_by_cache`, e.g. a corrupt ``.so``),
    the cache directory is moved aside with a message (:meth:`CompileCache.quarantine`) and ``fn``
    is called once more with an empty cache. Any other exception, or a second failure, propagates.
    """
    if cache is None:
        return fn()
    try:
        with cache.activate():
            return fn()
    except Exception as e:
        if not (retry_if(e) and caused_by_cache(e, cache)):
            raise
        cache.quarantine(f"compile failed on a cached file ({type(e).__name__}: {cache.redact(str(e))[:300]})")
    with cache.activate():
        return fn()
