"""A managed, persistent torch.compile cache: the same compiled kernels across process restarts.

Inductor keeps its FX-graph and AOT-autograd caches and kernels under ``TORCHINDUCTOR_CACHE_DIR``: a persistent
one turns a cold start into a warm one (docs/benchmarks.md). One directory per workflow-chosen *name* and environment
*key*, ``<root>/<name>/<key>`` (:mod:`core.compile.warm.cache_location`), with a manifest of the key fields; a foreign
or unreadable one, or a corrupt ``.so`` failing a compile, is moved aside (never deleted). No ComfyUI imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

import torch

from ... import paths, torch_compat
from ...version import __version__
from .cache_location import DEFAULT_NAME, CacheRefused, check_location, check_name

log = logging.getLogger("steadfast.compile_cache")

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"
MANIFEST = "steadfast_cache.json"
# {relative path: [size, mtime_ns, ctime_ns, sha256]} of what inductor wrote while watched
FILES = "steadfast_files.json"
LOCK_FILE = ".steadfast.lock"  # the cross-process lock of the record (hidden: never an artifact)
WRITERS = ".steadfast-writers.json"  # {pid: first activation ns} of the live processes using the folder
GRACE_NS = 2_000_000_000  # a file another live process may be writing is recorded once unchanged this long
WATCH_SLACK_NS = 50_000_000  # file times use the kernel's coarse clock (a tick behind time.time_ns); 50 ms covers it
CACHE_FORMAT = 1
_ENV_LOCK = threading.RLock()
_last_dir: list[str | None] = [None]  # the directory inductor last compiled into under our activation
_active: list[CompileCache] = []  # the caches active now (innermost last), process-wide like the environment
_lock_depth: dict[str, int] = {}  # cache path -> how deep this process holds its cross-process lock
_registered: set[str] = set()  # cache paths this process has put in their WRITERS
T = TypeVar("T")


@functools.cache
def _triton_version() -> str | None:
    """The installed Triton distribution and its version (None without), read once per process: the Triton a
    running process has imported does not change when a package is reinstalled under it."""
    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"):
        with contextlib.suppress(PackageNotFoundError):
            return f"{dist} {version(dist)}"
    return None


def cache_key_fields(
    device: torch.device | str | None = None, inductor_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What compiled artifacts depend on: ``{"format", "torch" (with its CUDA build), "triton" (None without),
    "python" (implementation major.minor), "device", "pack" (version), "trace" (the switches a trace reads that
    torch's own FX-graph and AOTAutograd cache keys leave out: :func:`core.torch_compat.trace_state`, the SDPA
    backends among them; two processes with other SDPA switches would otherwise share kernels lowered for the
    other backend)}``, plus ``"inductor_options"`` (sorted) when
    given and not empty (an inductor preset, :mod:`core.compile.presets`: one directory per preset; caches made
    without one keep their key). ``"device"`` is what kernels are built for: ``"cpu AVX512"`` (the ISA inductor
    targets) or ``"cuda <name> sm90"`` (``device`` defaults to CUDA when available, else CPU; other device types
    give their type name)."""
    dev = torch.device(device if device is not None else "cuda" if torch.cuda.is_available() else "cpu")
    described = f"cpu {torch.backends.cpu.get_cpu_capability()}" if dev.type == "cpu" else dev.type
    if dev.type == "cuda" and torch.cuda.is_available():
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        described = f"cuda {torch.cuda.get_device_name(index)} sm{major}{minor}"
    cuda, py = torch.version.cuda, platform.python_version_tuple()
    pack = __version__
    fields = {
        "format": CACHE_FORMAT,
        "torch": torch.version.__version__ + (f" cuda{cuda}" if cuda else ""),
        "triton": _triton_version(),
        "python": f"{platform.python_implementation()} {py[0]}.{py[1]}",
        "device": described,
        "pack": str(pack),
        "trace": torch_compat.trace_state(),
    }
    if inductor_options:
        fields["inductor_options"] = {k: inductor_options[k] for k in sorted(inductor_options)}
    return fields


def cache_key(fields: Mapping[str, Any]) -> str:
    """Directory name: a readable slug plus 12 hex of SHA-256 of the canonical JSON of ``fields``, e.g.
    ``"torch2.14.1-cpu-AVX512-3f2a9c01b7de"`` (only ``[A-Za-z0-9._-]``)."""
    digest = hashlib.sha256(json.dumps(dict(fields), sort_keys=True, default=str).encode()).hexdigest()[:12]
    torch_v = str(fields.get("torch", "")).split("+")[0].split(" ")[0]
    device = str(fields.get("device", "")).split(" ") + [""]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"torch{torch_v}-{device[0]}-{device[1]}").strip("-_")
    return f"{slug}-{digest}"


@dataclasses.dataclass
class CompileCache:
    """An opened cache directory: ``path`` = ``<root>/<key>``, ``root`` = ``<operator root>/<name>``; ``messages``:
    what happened to it (no absolute paths: they reach HTTP clients)."""

    root: Path
    key: str
    fields: dict[str, Any]
    source: str = ""
    name: str = DEFAULT_NAME
    messages: list[str] = dataclasses.field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.root / self.key

    @contextlib.contextmanager
    def activate(self, *, trust_writes: bool = False) -> Iterator[Path]:
        """Yields :attr:`path`, ``TORCHINDUCTOR_CACHE_DIR`` (``TRITON_CACHE_DIR`` = ``<path>/triton``) inside the
        block, process-wide, restored after; re-entrant; inductor's memoised paths cleared when the folder changes.

        Trust on write: when Dynamo or inductor compiled (or loaded from this cache) inside the block
        (:func:`core.torch_compat.compile_activity` grew), or ``trust_writes`` is set (inductor work that is not a
        compile: its CPU ISA test programs, :mod:`core.compile.warm.preload`), the files written during the block are
        checksummed into :data:`FILES`; a block that compiled nothing (every steady model call) costs no file-system
        access. A recorded file found changed by someone else moves the cache aside (:meth:`quarantine`)."""
        target = str(self.path.resolve())
        if target not in _registered:
            _register_writer(self, target)
        with _ENV_LOCK:
            previous = {k: os.environ.get(k) for k in (INDUCTOR_ENV, TRITON_ENV)}
            nested = previous[INDUCTOR_ENV] == target
            if not nested:
                os.environ.update({INDUCTOR_ENV: target, TRITON_ENV: os.path.join(target, "triton")})
                if _last_dir[0] != target:
                    torch_compat.clear_inductor_caches()
                    _last_dir[0] = target
        since, activity = time.time_ns() - WATCH_SLACK_NS, torch_compat.compile_activity()
        _active.append(self)
        try:
            yield self.path
        finally:
            _active.remove(self)
            if not nested:
                with _ENV_LOCK:
                    for k, v in previous.items():
                        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                if trust_writes or torch_compat.compile_activity() != activity:  # rare: the record under the lock
                    with contextlib.suppress(OSError), self.locked():
                        if (problem := _record_written(self, since)) is not None:
                            self.quarantine(problem)

    def quarantine(self, reason: str) -> str:
        """Move the key directory aside (``<key>.bad-<ms>``), start an empty one; returns the message (also logged,
        kept in :attr:`messages`). Never raises: an unmovable directory is reported."""
        target = self.root / f"{self.key}.bad-{int(time.time() * 1000)}"
        try:
            with self.locked():
                torch_compat.clear_inductor_caches()
                _last_dir[0] = None
            os.replace(self.path, target)
            self.path.mkdir(parents=True, exist_ok=True)
            _write_manifest(self)
            msg = f"compile cache {self.name!r}: {reason}; moved aside, starting empty"
            log.warning("%s (%s -> %s)", msg, self.path, target)
        except OSError as e:
            msg = f"compile cache {self.name!r}: {reason}; could not move it aside ({type(e).__name__})"
            log.warning("%s: %s", msg, e)
        self.messages.append(msg := self.redact(msg))
        return msg

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The record's lock, across threads (``_ENV_LOCK``) and processes (an exclusive ``flock`` of
        :data:`LOCK_FILE` in the key directory; ``msvcrt.locking`` on Windows): every read-modify-write of
        :data:`FILES`, a precompiled block's variants and a move aside runs under it, so servers sharing one folder
        do not lose each other's updates. Re-entrant in this process."""
        with _ENV_LOCK:
            key = str(self.path)
            depth = _lock_depth.get(key, 0)
            fd = None
            if depth == 0:
                self.path.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o600)
                _os_lock(fd, True)
            _lock_depth[key] = depth + 1
            try:
                yield
            finally:
                _lock_depth[key] -= 1
                if fd is not None:
                    with contextlib.suppress(OSError):
                        _os_lock(fd, False)
                    os.close(fd)

    def read_trusted(self, rel: str) -> tuple[bytes | None, str | None]:
        """The bytes of the recorded file ``rel`` (relative to :attr:`path`), checked against its recorded sha256.

        Args:
            rel: a relative posix path inside the key directory, e.g. ``"precompiled/ab12.pt2"``.
        Returns:
            ``(data, None)`` when the file is recorded in :data:`FILES` and its bytes match; ``(None, None)`` when
            there is no such file; ``(None, reason)`` when it exists but is not recorded (untrusted: never handed
            out) or its bytes differ (the cache is then moved aside by :meth:`quarantine`; the reason says so).
        """
        f = self.path / rel
        if not f.is_file() or f.is_symlink():
            return None, None
        data, problem = self._read_checked(f, rel)
        if problem is None:
            return data, None
        # another process may be between replacing the file and recording it (both under the lock): read again
        # under the lock before calling anything untrusted or moving the folder aside
        with self.locked():
            if not f.is_file() or f.is_symlink():
                return None, None
            data, problem = self._read_checked(f, rel)
            if problem == "unrecorded":
                return None, f"{rel} was not written while Steadfast watched: not loaded"
            if problem is not None:
                return None, self.quarantine(f"an artifact changed since it was written ({rel}: checksum differs)")
        return data, None

    def _read_checked(self, f: Path, rel: str) -> tuple[bytes | None, str | None]:
        """``(data, None)`` when ``f``'s bytes match the sha256 recorded for ``rel``; else ``(None, "unrecorded")``
        or ``(None, "differs")``."""
        with _ENV_LOCK:
            entry = _load_files(self).get(rel)
        if not (isinstance(entry, list) and entry):
            return None, "unrecorded"
        try:
            data = f.read_bytes()
        except OSError:
            return None, "differs"
        return (data, None) if hashlib.sha256(data).hexdigest() == entry[-1] else (None, "differs")

    def write_once(self, rel: str, data: bytes) -> bool:
        """Write a content-addressed file: ``rel`` is named by a digest of ``data``, so a file already recorded under
        it holds these bytes and is left as it is (a reader may have it open; two servers saving the same artifact
        at once both keep working). Otherwise :meth:`write_recorded`. Returns whether it wrote. Raises
        ``OSError``."""
        f = self.path / rel
        with self.locked():
            entry = _load_files(self).get(rel)
            if isinstance(entry, list) and entry and f.is_file() and not f.is_symlink():
                return False
            self.write_recorded(rel, data)
        return True

    def write_recorded(self, rel: str, data: bytes) -> None:
        """Write ``data`` to ``rel`` (relative to :attr:`path`; folders made) atomically and record its sha256 in
        :data:`FILES`, so that :meth:`read_trusted` and every later open check it. Raises ``OSError``."""
        f = self.path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.parent / f".{f.name}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        with self.locked():
            os.replace(tmp, f)
            files = _load_files(self)
            files[rel] = [*_stat_key(f.stat()), hashlib.sha256(data).hexdigest()]
            _save_files(self, files)

    def recorded(self) -> dict[str, list]:
        """The file record (:data:`FILES`): ``{relative posix path: [size, mtime_ns, ctime_ns, sha256]}`` of the files
        written while Steadfast watched, or adopted (a copy; empty when there is none or it is unreadable)."""
        with _ENV_LOCK:
            return dict(_load_files(self))

    def adopt(self, staged: Mapping[str, Path], digests: Mapping[str, str]) -> None:
        """Move files the caller has checked into the key directory and record them, under the cache's lock (no
        compile in this process sees a half-moved folder).

        Args:
            staged: ``{relative posix path: file}`` moved in with ``os.replace`` (folders made; same filesystem).
            digests: ``{relative posix path: sha256}`` recorded with a fresh stat: every path of ``staged``, and
                files already in place with those bytes (the caller checked them).
        Raises:
            OSError: a move or the record failed (what was moved stays; unrecorded files are never handed out).
        """
        with self.locked():
            for rel, src in staged.items():
                target = self.path / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, target)
            files = _load_files(self)
            for rel, digest in digests.items():
                files[rel] = [*_stat_key((self.path / rel).stat()), digest]
            _save_files(self, files)

    def redact(self, text: str) -> str:
        """``text`` with this cache's absolute paths replaced by ``<compile cache 'name'>`` (a file in it:
        ``<compile cache 'name'>/ab/x.so``), any other absolute path as :func:`core.paths.redact` shows it.

        Args:
            text: any message (an exception text, a quarantine reason).
        Returns:
            the text; unchanged when it holds no absolute path.
        """
        label = f"<compile cache {self.name!r}>"
        roots = {str(self.path.resolve()), str(self.path), str(self.root.resolve()), str(self.root)}
        return paths.redact(text, [(r, label) for r in sorted(roots)])

    def as_dict(self) -> dict[str, Any]:
        """What clients may see: name, root source, messages; never the path or key (where to plant a cache)."""
        return {"name": self.name, "source": self.source, "messages": list(self.messages)}


def active_cache() -> CompileCache | None:
    """The innermost :class:`CompileCache` whose :meth:`CompileCache.activate` block is running (process-wide, as
    ``TORCHINDUCTOR_CACHE_DIR``), or None."""
    return _active[-1] if _active else None


def _os_lock(fd: int, take: bool) -> None:
    """Take (blocking) or release an exclusive lock on the open file ``fd``."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_LOCK if take else msvcrt.LK_UNLCK, 1)
        return
    fcntl.flock(fd, fcntl.LOCK_EX if take else fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _register_writer(cache: CompileCache, target: str) -> None:
    """Put this process in the folder's :data:`WRITERS` (once; the dead are dropped), under the lock."""
    _registered.add(target)
    with contextlib.suppress(OSError, ValueError), cache.locked():
        f = cache.path / WRITERS
        try:
            writers = {int(k): v for k, v in json.loads(f.read_text(encoding="utf-8")).items()}
        except (OSError, ValueError, AttributeError):
            writers = {}
        writers = {pid: t for pid, t in writers.items() if pid != os.getpid() and _alive(pid)}
        writers[os.getpid()] = time.time_ns()
        tmp = cache.path / f".{WRITERS}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(writers), encoding="utf-8")
        os.replace(tmp, f)


def _other_writers(cache: CompileCache) -> bool:
    """Whether another live process uses the folder (read under the lock)."""
    try:
        writers = json.loads((cache.path / WRITERS).read_text(encoding="utf-8"))
        return any(int(pid) != os.getpid() and _alive(int(pid)) for pid in writers)
    except (OSError, ValueError, AttributeError):
        return False


def _write_manifest(cache: CompileCache) -> None:
    body = {"steadfast_compile_cache": CACHE_FORMAT, "key": cache.key, "fields": cache.fields, "created": time.time()}
    tmp = cache.path / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, cache.path / MANIFEST)


def _walk(cache: CompileCache) -> Iterator[tuple[str, os.stat_result, Path]]:
    """``(relative path, stat, path)`` of each artifact: regular files, without our own and hidden/lock/tmp files."""
    for f in cache.path.rglob("*"):
        if not f.is_file() or f.is_symlink() or f.name.startswith(".") or f.name.endswith((".lock", ".tmp")):
            continue
        if f.parent == cache.path and f.name in (MANIFEST, FILES):
            continue
        yield f.relative_to(cache.path).as_posix(), f.stat(), f


def _sha256(f: Path) -> str:
    h = hashlib.sha256()
    with f.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load_files(cache: CompileCache) -> dict[str, list]:
    try:
        body = json.loads((cache.path / FILES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def _save_files(cache: CompileCache, files: dict[str, list]) -> None:
    tmp = cache.path / f".{FILES}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(files, sort_keys=True), encoding="utf-8")
    os.replace(tmp, cache.path / FILES)


def _stat_key(st: os.stat_result) -> list[int]:
    """``[size, mtime_ns, ctime_ns]``: ``os.utime`` can restore the mtime, not the ctime (the kernel sets it)."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _check(cache: CompileCache, rel: str, entry: Any, st: os.stat_result, f: Path) -> tuple[list | None, str | None]:
    """``(entry to keep, problem)`` for a recorded file found with ``st``: the same stat keeps it unread; another
    stat is read: the same checksum keeps it (stat updated, e.g. a copy of the folder), another is a problem."""
    if not (isinstance(entry, list) and len(entry) in (3, 4)):  # 3: [size, mtime_ns, sha256]
        return None, None
    if len(entry) == 4 and entry[:3] == _stat_key(st):
        return entry, None
    if _sha256(f) != entry[-1]:
        return None, f"an artifact changed since it was written ({rel}: checksum differs)"
    return [*_stat_key(st), entry[-1]], None


def _record_written(cache: CompileCache, since_ns: int) -> str | None:
    """After a block that compiled: record the files written from ``since_ns`` on (their ctime, which no one can set
    back) with their checksums; a recorded file changed before that (by someone else) is checked and, with another
    checksum, returned as the problem, never recorded again. Files neither recorded nor written now (dropped in by
    something else) stay unrecorded: untrusted. While another live process uses the folder (:data:`WRITERS`), a
    file written in the window is recorded only once unchanged for :data:`GRACE_NS` (it may be another process's,
    half written); the pack's own artifacts are recorded by :meth:`CompileCache.write_recorded`. Call under
    :meth:`CompileCache.locked`. Returns None when all is well."""
    old = _load_files(cache)
    new: dict[str, list] = {}
    shared, stable_before = _other_writers(cache), time.time_ns() - GRACE_NS
    for rel, st, f in _walk(cache):
        if st.st_ctime_ns >= since_ns and (not shared or st.st_ctime_ns <= stable_before):
            new[rel] = [*_stat_key(st), _sha256(f)]  # written while we watched (by us, or stable for the grace)
        elif rel in old:
            kept, problem = _check(cache, rel, old[rel], st, f)
            if problem is not None:
                return problem
            if kept is not None:
                new[rel] = kept
    if new != old:
        _save_files(cache, new)
    return None


def _files_problem(cache: CompileCache) -> str | None:
    """The first recorded artifact whose bytes changed since it was written (None when all that remain match).
    Files that are not recorded (not written while the pack watched) are said in :attr:`CompileCache.messages`,
    untrusted; recorded ones that are gone are dropped from the record.

    Why: inductor's in-process retry after a corrupted ``.so`` compiles code that is not bit-equal to a fresh
    process's; checking the bytes first keeps a corrupted cache on the fresh-compile bits (docs/benchmarks.md
    section 21)."""
    old, new, foreign = _load_files(cache), {}, []
    for rel, st, f in _walk(cache):
        if rel not in old:
            foreign.append(rel)
            continue
        kept, problem = _check(cache, rel, old[rel], st, f)
        if problem is not None:
            return problem
        if kept is not None:
            new[rel] = kept
    if new != old:
        _save_files(cache, new)
    if foreign:
        cache.messages.append(
            f"compile cache {cache.name!r}: {len(foreign)} file(s) not written while Steadfast "
            f"watched (e.g. {min(foreign)}): not checked; remove the cache folder to start "
            "clean"
        )
        log.warning("%s", cache.messages[-1])
    return None


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
    stored, wanted = body.get("fields"), json.loads(json.dumps(cache.fields, default=str))
    if stored == wanted:
        return None
    diff = (
        sorted(k for k in {*stored, *wanted} if stored.get(k) != wanted.get(k))
        if isinstance(stored, dict)
        else ["fields"]
    )
    return f"made for another environment (differs in {', '.join(diff)})"


def open_cache(
    root: str | os.PathLike[str],
    name: str = DEFAULT_NAME,
    *,
    device: torch.device | str | None = None,
    inductor_options: Mapping[str, Any] | None = None,
    source: str = "",
    forbidden: tuple[str | os.PathLike[str], ...] = (),
) -> CompileCache | None:
    """Open (create) ``<root>/<name>/<key>`` (:func:`cache_key_fields` of ``device``, ``inductor_options``),
    ``root`` the operator's, ``name`` the workflow's. :class:`CacheRefused`, before creating anything: not a plain
    name, a root overlapping a ``forbidden`` folder (HTTP clients write there), a name that is a link, a file or
    escapes the root. A foreign
    manifest is moved aside with a message. None, with a logged warning, when it cannot be created or written."""
    if check_name(name) != name:
        raise CacheRefused(f"compile cache name {name!r} is not a plain name")
    base = Path(root).expanduser().absolute()
    f = cache_key_fields(device, inductor_options)
    try:
        base.mkdir(parents=True, exist_ok=True)
        named = check_location(base, name, tuple(Path(p) for p in forbidden))
        cache = CompileCache(root=named, key=cache_key(f), fields=f, source=source, name=name)
        cache.path.mkdir(parents=True, exist_ok=True)
        with cache.locked():  # another server may be replacing a file and recording it (both under the lock)
            if (problem := _manifest_problem(cache) or _files_problem(cache)) is not None:
                cache.quarantine(problem)
            elif not (cache.path / MANIFEST).exists():
                _write_manifest(cache)
        for what, folder in (("root", base), ("folder", named)):
            if (note := paths.world_writable(folder)) is not None:
                cache.messages.append(f"compile cache {name!r}: its {what} {note}")
                log.warning("%s (%s)", cache.messages[-1], folder)
        probe = cache.path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        log.warning("compile cache under %s/%s unusable (%s): running without the managed cache", base, name, e)
        return None
    return cache


def existing_cache(
    root: str | os.PathLike[str],
    name: str = DEFAULT_NAME,
    *,
    device: torch.device | str | None = None,
    forbidden: tuple[str | os.PathLike[str], ...] = (),
) -> CompileCache | None:
    """``<root>/<name>/<key>`` (:func:`cache_key_fields` of ``device``, no inductor preset) when it exists and checks
    out, read only: its manifest fits and every recorded file that remains has its recorded bytes. Nothing is
    created, recorded or moved aside: a compile's :func:`open_cache` does that, with its message in the run record.

    Args:
        root, name: as :func:`open_cache`.
        device: what the kernels are for (None: CUDA when available, else CPU).
        forbidden: folders HTTP clients can write.
    Returns:
        the cache, or None when there is none or it does not check out.
    Raises:
        CacheRefused: as :func:`open_cache` (a path for a name, a root overlapping a ``forbidden`` folder).
    """
    if check_name(name) != name:
        raise CacheRefused(f"compile cache name {name!r} is not a plain name")
    named = check_location(Path(root).expanduser().absolute(), name, tuple(Path(p) for p in forbidden))
    f = cache_key_fields(device)
    cache = CompileCache(root=named, key=cache_key(f), fields=f, source="warm start", name=name)
    try:
        if not (cache.path / MANIFEST).is_file() or _manifest_problem(cache) is not None:
            return None
        recorded = _load_files(cache)
        for rel, st, file in _walk(cache):
            if rel in recorded and _check(cache, rel, recorded[rel], st, file)[1] is not None:
                return None
    except OSError:
        return None
    return cache


def run_cached(
    cache: CompileCache | None, fn: Callable[[], T], *, retry_if: Callable[[BaseException], bool] = lambda e: True
) -> T:
    """``fn()`` with ``cache`` active (plain ``fn()`` for None). When it raises an exception for which
    ``retry_if(e)`` holds (adapters pass "is a compile error") and that, or an exception in its cause/context chain,
    names a file inside the cache (e.g. ``BackendCompilerFailed`` wrapping ``ImportError: <cache>/xx/yy.so: file
    too short``), the cache is quarantined and ``fn`` runs once more with an empty one; anything else, or a second
    failure, propagates."""
    if cache is None:
        return fn()
    try:
        with cache.activate():
            return fn()
    except Exception as e:
        marker, chain, link = str(cache.path.resolve()), [], e
        while link is not None and all(link is not c for c in chain):
            chain.append(link)
            link = link.__cause__ or link.__context__
        if not (retry_if(e) and any(marker in str(x) or any(marker in str(a) for a in x.args) for x in chain)):
            raise
        cache.quarantine(
            f"compile failed on a cached file ({type(e).__name__}: {cache.redact(str(e))[:300]}); "
            "compiled again in this process, which on torch 2.11 was measured not bit-equal to a fresh "
            "process's compile: restart ComfyUI for those bits"
        )
    with cache.activate():
        return fn()
