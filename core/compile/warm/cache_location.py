"""Where a compile cache may live: the operator's root, a workflow's cache *name*, and the checks that keep
HTTP clients out.

Inductor and Triton unpickle and ``dlopen`` what they find in their cache directory, so the root is the
operator's and a workflow only picks a *name* under it, never a path; refused: a root overlapping a folder HTTP
clients can write, a name that is a link or a file or resolves outside the root. Messages never contain an absolute
path (they reach HTTP clients). Tests: ``tests/core/test_compile_cache_security.py``, ``tests/comfy/test_security.py``.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from ... import switches

log = logging.getLogger("steadfast.compile_cache")

CACHE_ENV = switches.COMPILE_CACHE.name
DISABLED_VALUES = ("off", "none", "0", "false", "disabled")
DEFAULT_NAME = "default"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class CacheRefused(ValueError):
    """A cache name or root that would let a workflow choose where the server writes or loads code from (e.g.
    ComfyUI's ``input/`` via ``POST /upload/image``). The message never contains an absolute path."""


def check_name(value: str | None) -> str | None:
    """The cache *name* a workflow chose: ``""``/None -> ``"default"``, ``"off"`` etc. -> None (disabled); 1-64
    of ``[A-Za-z0-9._-]``, first a letter or digit, no ``..``; :class:`CacheRefused` for anything else (paths)."""
    text = "" if value is None else str(value).strip()
    if text.lower() in DISABLED_VALUES:
        return None
    if text and (not NAME_RE.fullmatch(text) or ".." in text):
        raise CacheRefused(
            f"compile_cache must be a cache NAME (letters, digits, '.', '_', '-'; at most 64; e.g. 'default' or "
            f"'flux'), or 'off'; got {text[:80]!r}. Paths are refused: the cache root is set by the server's "
            f"operator (${CACHE_ENV}), not by a workflow."
        )
    return text or DEFAULT_NAME


def resolve_root(user_dir: str | os.PathLike[str] | None = None) -> tuple[Path | None, str]:
    """``(root or None when disabled, where it came from)``: ``$STEADFAST_COMPILE_CACHE`` (``off``/... disables),
    else ``<user_dir>/steadfast/compile_cache`` (ComfyUI's user directory, passed by the adapter)."""
    env = switches.COMPILE_CACHE.text()
    if env:
        disabled = env.lower() in DISABLED_VALUES
        return (None, f"disabled by ${CACHE_ENV}") if disabled else (Path(env).expanduser(), f"${CACHE_ENV}")
    if user_dir is None:
        return None, f"no cache root (no user directory and no ${CACHE_ENV})"
    return Path(user_dir).expanduser() / "steadfast" / "compile_cache", "ComfyUI user directory"


def client_writable(
    input_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    temp_dir: str | os.PathLike[str],
    user_dir: str | os.PathLike[str],
) -> tuple[str, ...]:
    """The folders ComfyUI's HTTP API lets clients write, given its four folders: input (``/upload/*``), output,
    temp, and the per-user folders under the user folder (``/userdata``: ``default`` and every existing one but the
    pack's ``steadfast``). A compile-cache root may never overlap them (:func:`check_location`).

    Args:
        input_dir, output_dir, temp_dir, user_dir: ComfyUI's folders (``folder_paths`` in a server; the default
            layout of a checkout for the CLI).
    Returns:
        the folders as strings (the user folder's children listed when it exists).
    """
    dirs = [os.fspath(input_dir), os.fspath(output_dir), os.fspath(temp_dir), os.path.join(user_dir, "default")]
    if os.path.isdir(user_dir):
        dirs += [e.path for e in os.scandir(user_dir) if e.is_dir() and e.name != "steadfast"]
    return tuple(dirs)


def check_location(root: Path, name: str, forbidden: tuple[Path, ...]) -> Path:
    """``<root>/<name>``; :class:`CacheRefused` when the root overlaps a ``forbidden`` folder (after symlinks),
    or the name is a link, not a directory, or resolves outside ``root``."""
    real_root = root.resolve()
    for real in (Path(os.path.realpath(f)) for f in forbidden):
        if real_root.is_relative_to(real) or real.is_relative_to(real_root):
            log.error("compile cache root %s overlaps %s (a folder clients can write): refused", real_root, real)
            raise CacheRefused(
                "the compile-cache root set by the operator overlaps a folder that HTTP clients can "
                "write (ComfyUI's input/output/temp or a user folder); refused (see the server log)"
            )
    target = root / name
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        log.error("compile cache %s is a symlink or not a directory: refused", target)
        raise CacheRefused(f"compile cache {name!r} is a link or not a folder; refused (see the server log)")
    if not target.resolve().is_relative_to(real_root):
        log.error("compile cache %s resolves outside its root %s: refused", target, real_root)
        raise CacheRefused(f"compile cache {name!r} resolves outside the cache root; refused (see the server log)")
    return target
