"""One compile-artifact file a fleet of servers can share: a managed compile-cache folder as a checked tar.

The warm state is the pack's compile-cache folder ``<root>/<name>/<key>`` (:mod:`core.compile.warm.cache`): on a CPU no
torch blob carries inductor's compiled ``.so`` files (docs/benchmarks.md section 13), the folder does.
:func:`export_artifact` writes the files recorded in ``steadfast_files.json`` whose bytes still match ("trust on
write") into one tar (gzip), a JSON manifest first (format, cache name, key and key fields, every member's size and
SHA-256); :func:`import_artifact` checks the whole file's pinned SHA-256, then the manifest against THIS machine's key
fields, then every member (a regular file at a plain relative path, listed, size and SHA-256 equal, stream-hashed into
a staging folder, never ``extractall``), and only then moves the files into the cache and records them. Nothing is
unpickled or loaded.
No ComfyUI imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import IO, Any

import torch

from ... import paths, switches
from ...version import __version__
from . import cache as cc
from .cache_location import CacheRefused, check_location, check_name

__all__ = [
    "ARTIFACT_FORMAT",
    "MANIFEST_MEMBER",
    "ARTIFACT_ENV",
    "ARTIFACT_SHA_ENV",
    "MAX_BYTES_ENV",
    "ArtifactInfo",
    "ArtifactRefused",
    "export_artifact",
    "import_artifact",
    "inspect_artifact",
    "load_from_env",
    "loaded_artifacts",
    "cache_note",
    "file_sha256",
]

log = logging.getLogger("steadfast.compile_cache")

ARTIFACT_FORMAT = 1
MANIFEST_MEMBER = "steadfast_artifact.json"
ARTIFACT_ENV = switches.COMPILE_ARTIFACT.name
#: Set to 1 by an operator to import artifacts with no pinned digest (refused otherwise).
UNPINNED_ENV = switches.COMPILE_ARTIFACT_UNPINNED.name
#: What reading an artifact's headers up to its manifest may take (PAX/GNU long-name headers included).
MAX_HEADER_BYTES = 1 << 20
ARTIFACT_SHA_ENV = switches.COMPILE_ARTIFACT_SHA256.name
MAX_BYTES_ENV = switches.COMPILE_ARTIFACT_MAX_BYTES.name
DEFAULT_MAX_BYTES = 16 << 30  # a GPU model's kernels are hundreds of MB; a CPU one's, about 1 MB
MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists files, it is never this big
_CHUNK = 1 << 20
_LOADED: list[dict[str, Any]] = []  # what this process imported (or refused) at start, for compile_state


class ArtifactRefused(ValueError):
    """An artifact that is not imported (or a cache that cannot be exported): tampered, foreign, malformed, or
    clashing with the existing cache. The message says why and never contains an absolute path (it can reach HTTP
    clients); the existing cache is untouched."""


@dataclasses.dataclass
class ArtifactInfo:
    """What an export or import did.

    Attributes:
        file: the artifact's file name (no folder).
        sha256: SHA-256 of the whole artifact file (hex), the digest an operator pins.
        name: the compile-cache name the artifact is for.
        key: the cache key (the ``<key>`` folder); not for HTTP clients (:meth:`as_dict` leaves it out).
        fields: the key fields (:func:`core.compile.warm.cache.cache_key_fields`).
        files: files carried (export) or in the artifact (import).
        bytes: their total size, bytes.
        written: files moved into the cache (import; the others were already there with the same bytes).
        unrecorded: files of the source cache left out because the pack never recorded them (export).
        changed: recorded files left out because their bytes no longer match the record (export).
        created: when the artifact was written (Unix seconds).
    """

    file: str
    sha256: str
    name: str
    key: str
    fields: dict[str, Any]
    files: int = 0
    bytes: int = 0
    written: int = 0
    unrecorded: int = 0
    changed: int = 0
    created: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """What clients may see: file name, digest, cache name, counts, torch and device fields; never the key or a
        path."""
        return {
            "file": self.file,
            "sha256": self.sha256,
            "name": self.name,
            "files": self.files,
            "bytes": self.bytes,
            "written": self.written,
            "torch": self.fields.get("torch"),
            "device": self.fields.get("device"),
            "created": self.created,
        }


class _HashingReader(io.RawIOBase):
    """A file object that hashes what is read through it (``tarfile.addfile`` reads exactly the member size)."""

    def __init__(self, fh: IO[bytes]) -> None:
        super().__init__()
        self.fh, self.h, self.n = fh, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(size)
        self.h.update(data)
        self.n += len(data)
        return data


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of a file, read in 1 MiB chunks.

    Args:
        path: the file.
    Returns:
        64 lowercase hex digits.
    Raises:
        OSError: unreadable.
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_manifest(key_dir: Path) -> dict[str, Any]:
    try:
        body = json.loads((key_dir / cc.MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ArtifactRefused(
            f"not a Steadfast compile-cache folder (its {cc.MANIFEST} is missing or unreadable: {type(e).__name__})"
        ) from None
    if (
        not isinstance(body, dict)
        or body.get("steadfast_compile_cache") != cc.CACHE_FORMAT
        or not isinstance(body.get("fields"), dict)
        or body.get("key") != key_dir.name
    ):
        raise ArtifactRefused(f"{cc.MANIFEST} of another format, or of another folder")
    return body


def export_artifact(
    cache: cc.CompileCache | str | os.PathLike[str], out_path: str | os.PathLike[str], *, compress: bool = True
) -> ArtifactInfo:
    """Write the compile cache ``cache`` as one artifact file ``out_path`` (a tar, written to a temporary file next
    to it, then renamed).

    The first member is ``steadfast_artifact.json`` (format, cache name, key, key fields, pack version, created
    time, ``members``: ``{relpath: [size, sha256]}``), then the files, in the order listed. Only files recorded in
    the cache's ``steadfast_files.json`` whose SHA-256 still equals the record are carried; unrecorded files
    (untrusted) and changed ones are left out and counted.

    Args:
        cache: an opened :class:`core.compile.warm.cache.CompileCache`, or the path of a key folder
        ``<root>/<name>/<key>``
            (the name is its parent folder's name).
        out_path: the artifact file to write (replaced if it exists).
        compress: gzip the tar (default; sizes and times: docs/benchmarks.md section 21).
    Returns:
        the :class:`ArtifactInfo` (``files`` carried, ``unrecorded``/``changed`` left out, ``sha256`` of the file).
    Raises:
        ArtifactRefused: not a Steadfast cache folder, a file changed while it was written, or nothing to carry.
        OSError: the output cannot be written.
    """
    if isinstance(cache, cc.CompileCache):
        key_dir, name = cache.path, cache.name
    else:
        key_dir = Path(cache).expanduser().absolute()
        name = key_dir.parent.name
    body = _read_manifest(key_dir)
    recorded = cc.CompileCache(root=key_dir.parent, key=key_dir.name, fields=body["fields"], name=name).recorded()
    members: dict[str, list[Any]] = {}
    unrecorded = changed = 0
    for f in sorted(key_dir.rglob("*")):
        rel = f.relative_to(key_dir).as_posix()
        if f.is_symlink() or not f.is_file() or (f.parent == key_dir and f.name in (cc.MANIFEST, cc.FILES)):
            continue
        if f.name.startswith(".") or f.name.endswith((".lock", ".tmp")):
            continue
        entry = recorded.get(rel)
        if not (isinstance(entry, list) and entry and isinstance(entry[-1], str)):
            unrecorded += 1
            continue
        digest = file_sha256(f)
        if digest != entry[-1]:
            changed += 1
            log.warning("compile artifact export: %s changed since it was recorded; left out", rel)
            continue
        members[rel] = [f.stat().st_size, digest]
    if not members:
        raise ArtifactRefused(
            f"compile cache {name!r} holds no recorded files to carry (run the workflow once with "
            f"this cache first; {unrecorded} unrecorded, {changed} changed)"
        )
    created = time.time()
    manifest = {
        "steadfast_artifact": ARTIFACT_FORMAT,
        "name": name,
        "key": key_dir.name,
        "fields": body["fields"],
        "pack": __version__,
        "created": created,
        "members": members,
    }
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    out = Path(out_path).expanduser().absolute()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tarfile.open(tmp, "w:gz" if compress else "w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(MANIFEST_MEMBER)
            info.size, info.mtime, info.mode = len(data), int(created), 0o644
            tar.addfile(info, io.BytesIO(data))
            for rel, (size, digest) in members.items():
                info = tarfile.TarInfo(rel)
                info.size, info.mtime, info.mode = size, int(created), 0o644
                with (key_dir / rel).open("rb") as fh:
                    reader = _HashingReader(fh)
                    tar.addfile(info, reader)
                if reader.h.hexdigest() != digest or reader.n != size:
                    raise ArtifactRefused(f"{rel} changed while the artifact was written; nothing written")
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    total = sum(size for size, _ in members.values())
    log.info(
        "compile artifact %s: %d files, %d bytes from cache %r (%d unrecorded, %d changed left out)",
        out.name,
        len(members),
        total,
        name,
        unrecorded,
        changed,
    )
    return ArtifactInfo(
        file=out.name,
        sha256=file_sha256(out),
        name=name,
        key=key_dir.name,
        fields=body["fields"],
        files=len(members),
        bytes=total,
        unrecorded=unrecorded,
        changed=changed,
        created=created,
    )


def _open_manifest(tar: tarfile.TarFile) -> tuple[dict[str, Any], tarfile.TarInfo]:
    """The first member, checked (``steadfast_artifact.json``, a regular file, JSON of our format), and its header."""
    first = tar.next()
    if first is None or first.name != MANIFEST_MEMBER or not first.isreg():
        raise ArtifactRefused(f"not a Steadfast compile artifact (its first member is not {MANIFEST_MEMBER})")
    if first.size > MAX_MANIFEST_BYTES:
        raise ArtifactRefused("its manifest is implausibly large")
    fh = tar.extractfile(first)
    try:
        body = json.loads(fh.read(MAX_MANIFEST_BYTES + 1) if fh else b"")
    except ValueError:
        raise ArtifactRefused("its manifest is not JSON") from None
    if not isinstance(body, dict) or body.get("steadfast_artifact") != ARTIFACT_FORMAT:
        raise ArtifactRefused(
            f"an artifact of another format ({str(body.get('steadfast_artifact'))[:20]!r}; "
            f"this pack reads format {ARTIFACT_FORMAT})"
            if isinstance(body, dict)
            else "its manifest is not an object"
        )
    members = body.get("members")
    if (
        not isinstance(body.get("fields"), dict)
        or not isinstance(members, dict)
        or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], str)
            for v in members.values()
        )
    ):
        raise ArtifactRefused("its manifest is malformed (fields or members)")
    return body, first


class _BudgetedInfo(tarfile.TarInfo):
    """A tar header whose extended headers (PAX, GNU long names) are refused past :data:`MAX_HEADER_BYTES`, before
    tarfile reads them into memory (it reads an extended header whole)."""

    _EXTENDED = (
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    )

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in self._EXTENDED and self.size > MAX_HEADER_BYTES:
            raise ArtifactRefused(f"an extended tar header of {self.size} bytes (at most {MAX_HEADER_BYTES})")
        return super()._proc_member(tarfile_)


def _tar(path: Path, fileobj: IO[bytes] | None = None) -> tarfile.TarFile:
    try:
        return tarfile.open(path if fileobj is None else None, mode="r:*", fileobj=fileobj, tarinfo=_BudgetedInfo)
    except (OSError, tarfile.TarError) as e:
        raise ArtifactRefused(f"{path.name} is not a readable tar ({type(e).__name__})") from None


def inspect_artifact(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of an artifact (no other member is read), plus ``sha256`` and ``bytes`` of the whole file.

    Args:
        path: the artifact file.
    Returns:
        the manifest dict (``name``, ``key``, ``fields``, ``pack``, ``created``, ``members``) with ``sha256`` and
        ``bytes`` added.
    Raises:
        ArtifactRefused: unreadable, not a tar, not our manifest.
    """
    p = Path(path).expanduser()
    with _tar(p) as tar:
        body, _ = _open_manifest(tar)
    try:
        body.update(sha256=file_sha256(p), bytes=p.stat().st_size)
    except OSError as e:
        raise ArtifactRefused(f"{p.name} is unreadable ({type(e).__name__})") from None
    return body


def _field_differences(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    out = []
    for k in sorted({*theirs, *ours}):
        if theirs.get(k) != ours.get(k):
            t, o = theirs.get(k, "(none)"), ours.get(k, "(none)")
            out.append(f"made for {k} {t}, this is {o}")
    return out


def _check_member(m: tarfile.TarInfo, listed: Mapping[str, list[Any]], seen: set[str]) -> str:
    """The member's relative path, or :class:`ArtifactRefused` for anything but a listed regular file at a plain
    relative path, seen once."""
    name = m.name
    rel = PurePosixPath(name)
    if not (m.isreg() and m.type in (tarfile.REGTYPE, tarfile.AREGTYPE)) or m.issparse():
        raise ArtifactRefused(f"member {name[:120]!r} is not a regular file (a link, device or folder)")
    if (
        not name
        or rel.is_absolute()
        or "\\" in name
        or any(p in ("..", ".", "") for p in name.split("/"))
        or name.split("/")[0].endswith(":")
        or rel.as_posix() != name
        or "\0" in name
    ):
        raise ArtifactRefused(f"member {name[:120]!r} is not a plain relative path")
    if name in (cc.MANIFEST, cc.FILES, MANIFEST_MEMBER) or name not in listed:
        raise ArtifactRefused(f"member {name[:120]!r} is not listed in the manifest")
    if name in seen:
        raise ArtifactRefused(f"member {name[:120]!r} appears twice")
    if m.size != listed[name][0]:
        raise ArtifactRefused(f"member {name[:120]!r} has {m.size} bytes, the manifest says {listed[name][0]}")
    return name


def max_artifact_bytes() -> int:
    """The most bytes an imported artifact may list: ``$STEADFAST_COMPILE_ARTIFACT_MAX_BYTES`` (an integer), else
    16 GiB. Raises ``ValueError`` for a value that is not a positive integer."""
    raw = switches.COMPILE_ARTIFACT_MAX_BYTES.text()
    if not raw:
        return DEFAULT_MAX_BYTES
    value = int(raw)
    if value <= 0:
        raise ValueError(f"${MAX_BYTES_ENV} must be a positive number of bytes, not {raw!r}")
    return value


def _check_size(total: int, root: Path) -> None:
    """Refuse, before a member is read, an artifact whose manifest lists more bytes than the cap
    (:func:`max_artifact_bytes`) or than the free space under ``root`` (pinned or not: a full disk stops more than
    this server)."""
    try:
        cap = max_artifact_bytes()
    except ValueError as e:
        raise ArtifactRefused(str(e)) from None
    if total < 0 or total > cap:
        raise ArtifactRefused(f"it lists {total} bytes, more than the {cap} allowed (${MAX_BYTES_ENV})")
    free = shutil.disk_usage(root).free
    if total > free:
        raise ArtifactRefused(f"it lists {total} bytes and the compile cache's disk has {free} free")


def import_artifact(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str],
    name: str | None = None,
    *,
    expected_sha256: str | None = None,
    device: torch.device | str | None = None,
    forbidden: tuple[str | os.PathLike[str], ...] = (),
) -> ArtifactInfo:
    """Check an artifact and move its files into ``<root>/<name>/<key>``, recorded so that
    :func:`core.compile.warm.cache.open_cache` trusts them.

    Order: ``expected_sha256`` of the whole file (when given); the manifest (first member; no other member read
    before it passes): format, the pack version, the key fields equal to
    :func:`core.compile.warm.cache.cache_key_fields` of ``device`` on this machine with the artifact's
    ``inductor_options``, the key recomputed; then every member (regular file, plain relative path, listed once, size
    and SHA-256 equal; their total within the cap, :func:`max_artifact_bytes`, and the free space) stream-hashed into
    a staging folder under ``<root>/<name>``; then the target cache is opened (a foreign or corrupted one is moved
    aside as on any open); a file already there with the same bytes is kept, with other bytes the import is refused
    (the existing cache stays as it was); then the files are moved in and recorded. Never unpickles, imports or loads
    anything.

    Args:
        path: the artifact file.
        root: the operator's compile-cache root (:func:`core.compile.warm.cache_location.resolve_root`).
        name: the cache name; None: the name in the manifest.
        expected_sha256: the operator's pinned SHA-256 (hex) of the whole file; None: not checked (the inner
            manifest only catches corruption, not tampering).
        device: the device the cache is keyed for (as :func:`core.compile.warm.cache.cache_key_fields`; None: the kind
            the manifest names, ``cpu`` or ``cuda``).
        forbidden: folders HTTP clients can write; a root overlapping one is refused.
    Returns:
        the :class:`ArtifactInfo` (``files`` in the artifact, ``written`` moved in).
    Raises:
        ArtifactRefused: with the reason; nothing was written into the cache (a staging folder is removed).
    """
    p = Path(path).expanduser()
    label = p.name
    roots = [(str(Path(root).expanduser().absolute()), "<compile cache root>")]
    try:
        return _import(p, Path(root).expanduser().absolute(), name, expected_sha256, device, forbidden)
    except ArtifactRefused as e:
        raise ArtifactRefused(paths.redact(f"artifact {label}: {e}", roots)) from None
    except CacheRefused as e:
        raise ArtifactRefused(f"artifact {label}: {e}") from None
    except (OSError, tarfile.TarError, EOFError) as e:  # torn file, full disk
        raise ArtifactRefused(
            paths.redact(f"artifact {label}: could not be read or written ({type(e).__name__}: {e})", roots)
        ) from None


def _import(
    p: Path,
    root: Path,
    name: str | None,
    expected_sha256: str | None,
    device: torch.device | str | None,
    forbidden: tuple[str | os.PathLike[str], ...],
) -> ArtifactInfo:
    if not p.is_file():
        raise ArtifactRefused("no such file")
    with p.open("rb") as fh, contextlib.ExitStack() as stack:  # one open file: the bytes pinned are the bytes read
        h = hashlib.sha256()
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
        digest = h.hexdigest()
        if expected_sha256 is not None and digest != expected_sha256.strip().lower():
            raise ArtifactRefused(
                f"SHA-256 {digest[:16]}... is not the pinned {expected_sha256.strip()[:16]}...; "
                "refused (a tampered or other file)"
            )
        fh.seek(0)
        tar = stack.enter_context(_tar(p, fh))
        body, first = _open_manifest(tar)
        name = body.get("name") if name is None else name
        if not isinstance(name, str) or check_name(name) != name:
            raise ArtifactRefused(f"cache name {str(name)[:80]!r} is not a plain name")
        theirs = body["fields"]
        if not isinstance(theirs.get("inductor_options", {}), dict):
            raise ArtifactRefused("its manifest is malformed (inductor_options)")
        if body.get("pack") != __version__:
            raise ArtifactRefused(f"made by Steadfast {body.get('pack')}, this is {__version__}")
        if device is None:
            device = "cuda" if str(theirs.get("device", "")).startswith("cuda") else "cpu"
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise ArtifactRefused(f"made for {theirs.get('device')}, this machine has no CUDA device")
        ours = cc.cache_key_fields(device, theirs.get("inductor_options"))
        ours_json = json.loads(json.dumps(ours, default=str))
        if diff := _field_differences(theirs, ours_json):
            raise ArtifactRefused("made for another machine: " + "; ".join(diff))
        key = cc.cache_key(ours)
        if body.get("key") != key:
            raise ArtifactRefused("its key does not match its fields (a hand-edited manifest)")
        listed: dict[str, list[Any]] = body["members"]
        root.mkdir(parents=True, exist_ok=True)
        _check_size(sum(size for size, _ in listed.values()), root)
        named = check_location(root, name, tuple(Path(f) for f in forbidden))
        named.mkdir(parents=True, exist_ok=True)
        staging = named / f".artifact-staging-{os.getpid()}-{int(time.time() * 1000)}"
        staging.mkdir()
        try:
            seen: set[str] = set()
            for m in tar:  # from the first member again (tarfile keeps the headers it read)
                if m is first:
                    continue
                rel = _check_member(m, listed, seen)
                seen.add(rel)
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                if src is None:
                    raise ArtifactRefused(f"member {rel[:120]!r} has no data")
                h, n = hashlib.sha256(), 0
                with target.open("xb") as out:
                    while chunk := src.read(_CHUNK):
                        h.update(chunk)
                        n += len(chunk)
                        out.write(chunk)
                if n != listed[rel][0] or h.hexdigest() != listed[rel][1]:
                    raise ArtifactRefused(f"member {rel[:120]!r} does not match its checksum (corrupted or tampered)")
            if missing := sorted(set(listed) - seen):
                raise ArtifactRefused(f"{len(missing)} listed member(s) missing (e.g. {missing[0][:120]!r})")
            info = _move_in(staging, root, name, key, theirs, listed, device, forbidden)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    info.file, info.sha256, info.created = p.name, digest, float(body.get("created") or 0.0)
    return info


def _move_in(
    staging: Path,
    root: Path,
    name: str,
    key: str,
    fields: dict[str, Any],
    listed: dict[str, list[Any]],
    device: torch.device | str,
    forbidden: tuple[str | os.PathLike[str], ...],
) -> ArtifactInfo:
    cache = cc.open_cache(
        root,
        name,
        device=device,
        inductor_options=fields.get("inductor_options"),
        source="compile artifact",
        forbidden=forbidden,
    )
    if cache is None:
        raise ArtifactRefused(f"compile cache {name!r} could not be opened (see the server log)")
    if cache.key != key:
        raise ArtifactRefused("the cache opened for it has another key")
    new: dict[str, str] = {}
    clashes = []
    for rel, (_size, digest) in listed.items():
        target = cache.path / rel
        if target.is_symlink() or (target.exists() and not target.is_file()):
            clashes.append(rel)
        elif target.exists():
            if file_sha256(target) != digest:
                clashes.append(rel)
        else:
            new[rel] = digest
    if clashes:
        raise ArtifactRefused(
            f"compile cache {name!r} already holds other bytes at {len(clashes)} of its paths "
            f"(e.g. {min(clashes)[:120]!r}); nothing imported, the existing cache is used as it is "
            "(remove that cache folder to start from the artifact)"
        )
    cache.adopt({rel: staging / rel for rel in new}, {rel: listed[rel][1] for rel in listed})
    total = sum(size for size, _ in listed.values())
    return ArtifactInfo(
        file="", sha256="", name=name, key=key, fields=fields, files=len(listed), bytes=total, written=len(new)
    )


def load_from_env(
    root: str | os.PathLike[str] | None,
    *,
    device: torch.device | str | None = None,
    forbidden: tuple[str | os.PathLike[str], ...] = (),
    root_note: str = "",
    environ: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Import the artifacts named in ``$STEADFAST_COMPILE_ARTIFACT`` (paths separated by ``os.pathsep``), each
    checked against its digest in ``$STEADFAST_COMPILE_ARTIFACT_SHA256`` (comma-separated, one per file, in order).
    An artifact without a digest is refused unless ``$STEADFAST_COMPILE_ARTIFACT_UNPINNED`` is 1 (then imported with
    a warning); an empty entry in the list is refused. A world-writable artifact, folder or cache root is warned
    about. One log line per artifact. Never raises: a refusal is logged and listed.

    Args:
        root: the operator's compile-cache root; None: the cache is off (every artifact is refused, ``root_note``
            says why).
        device: the device the server compiles for (keys the cache).
        forbidden: folders HTTP clients can write.
        root_note: why ``root`` is None, for the refusal.
        environ: the environment (default ``os.environ``).
    Returns:
        one dict per artifact (also kept for :func:`loaded_artifacts`): ``status`` ("imported" or "refused"),
        ``file`` (name only), and :meth:`ArtifactInfo.as_dict` or ``reason``.
    """
    env = os.environ if environ is None else environ
    raw = [x.strip() for x in switches.COMPILE_ARTIFACT.text(env).split(os.pathsep) if x.strip()]
    pin_text = switches.COMPILE_ARTIFACT_SHA256.text(env)
    pins = [x.strip() for x in pin_text.split(",")] if pin_text else []
    unpinned_ok = switches.COMPILE_ARTIFACT_UNPINNED.on(env)
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        label = Path(item).name
        try:
            if pins and len(pins) != len(raw):
                raise ArtifactRefused(f"${ARTIFACT_SHA_ENV} has {len(pins)} digest(s) for {len(raw)} artifact(s)")
            if pins and not pins[i]:
                raise ArtifactRefused(
                    f"its entry in ${ARTIFACT_SHA_ENV} is empty (give its sha256: `steadfast "
                    "artifact inspect` prints it)"
                )
            if not pins and not unpinned_ok:
                raise ArtifactRefused(
                    f"it is not pinned: set ${ARTIFACT_SHA_ENV} to its sha256 (`steadfast artifact "
                    f"inspect` prints it), or ${UNPINNED_ENV}=1 to import it unchecked"
                )
            if root is None:
                raise ArtifactRefused(f"the compile cache is off ({root_note or 'no root'})")
            if not pins:
                log.warning(
                    "Steadfast compile artifact %s: imported WITHOUT a pinned digest ($%s=1)", label, UNPINNED_ENV
                )
            for what, path in (
                ("the artifact", Path(item)),
                ("the artifact's folder", Path(item).parent),
                ("the compile cache root", Path(root)),
            ):
                if (note := paths.world_writable(path)) is not None:
                    log.warning("Steadfast compile artifact %s: %s %s", label, what, note)
            info = import_artifact(
                item, root, expected_sha256=pins[i] if pins else None, device=device, forbidden=forbidden
            )
            entry = {"status": "imported", **info.as_dict()}
            log.info(
                "Steadfast compile artifact %s: imported %d files (%d new) into compile cache %r",
                label,
                info.files,
                info.written,
                info.name,
            )
        except Exception as e:  # a refusal never stops the server
            reason = str(e) if isinstance(e, ArtifactRefused) else paths.redact(f"{type(e).__name__}: {e}")
            if not reason.startswith("artifact "):
                reason = f"artifact {label}: {reason}"
            entry = {"status": "refused", "file": label, "reason": reason}
            log.warning("Steadfast compile artifact %s: refused: %s", label, reason)
        out.append(entry)
        _LOADED.append(entry)
    return out


def loaded_artifacts() -> list[dict[str, Any]]:
    """What :func:`load_from_env` did in this process (copies; no paths, no keys)."""
    return [dict(e) for e in _LOADED]


def cache_note(name: str) -> str | None:
    """A line for the Optimize node's cache report: the artifacts imported into cache ``name`` at start (None when
    none was)."""
    done = [e for e in _LOADED if e.get("status") == "imported" and e.get("name") == name]
    if not done:
        return None
    return "warm state from compile artifact " + ", ".join(f"{e['file']} ({e['files']} files)" for e in done)
