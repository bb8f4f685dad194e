"""Absolute server paths never reach a client: they are shown relative to a known root instead.

A ComfyUI server is reachable by browsers that must not learn where it is installed (home folder, user
name, install layout). Every text the pack hands out (errors, reports, ``GET /steadfast/compile_state``)
goes through :func:`redact`, in two passes:

1. the known roots, replaced literally, longest first among the given roots (so a folder name with spaces,
   backslashes or a drive letter goes whole): a path under a given root (e.g. ComfyUI's ``models/diffusers``
   folder) is shown relative to it (``models/diffusers/sd15``), a source file under a ``sys.path`` entry as
   its module path (``comfy/ldm/modules/attention.py``), anything else under the user's home folder as
   ``~/...``;
2. a pattern for any other absolute path, shown as ``.../parent/name``. A POSIX path is taken to end at
   whitespace (prose around it stays readable); a Windows path (drive letter) may hold single spaces inside
   its folder names. A path with spaces under no known root can therefore be only partly hidden.

No ComfyUI imports: the node layer passes ComfyUI's folders as ``roots``.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterable, Sequence

__all__ = ["display_path", "redact", "redact_value", "find_absolute_paths", "ABSOLUTE_PATH"]

Roots = Sequence[tuple[str, str]]

_SEG = r"[\w.+@~%-]+"
ABSOLUTE_PATH = re.compile(
    rf"(?<![\w.:/\\~-])/{_SEG}(?:/{_SEG})+/?"  # POSIX: /a/b/c (not a URL, not a relative a/b)
    r"|(?<![\w])[A-Za-z]:[\\/](?:[^\\/\s'\":*?<>|]+(?: [^\\/\s'\":*?<>|]+)*[\\/])*"  # Windows: C:\a b\c
    r"[^\\/\s'\":*?<>|]*"
)
"""An absolute path inside free text (the pattern :func:`redact` replaces and tests search for)."""


def _norm(path: str) -> str:
    return os.path.normcase(os.path.normpath(path))


def _code_roots() -> list[tuple[str, str]]:
    """``sys.path`` entries (site-packages, ComfyUI's folder ...): a file under one shows as its module path."""
    return [(p, "") for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)]


def _home_roots() -> list[tuple[str, str]]:
    """The user's home folder as ``~`` (not when it is a filesystem or drive root)."""
    home = os.path.expanduser("~")
    if not home or home == "~" or not os.path.isabs(home) or not _parts(home):
        return []
    return [(home, "~")]


def _parts(path: str) -> list[str]:
    """The folder names of ``path`` (no drive, no empty parts)."""
    return [x for x in re.split(r"[\\/]+", path) if x and not re.fullmatch(r"[A-Za-z]:", x)]


def _candidates(roots: Roots) -> list[tuple[str, str, bool]]:
    """Every known root in the order tried, as ``(root, label, is_code_root)``: the given roots longest first, the
    ``sys.path`` entries shortest first (the fullest module path: ``comfy/ldm/x.py`` rather than ``ldm/x.py``),
    the home folder."""
    given = sorted(roots, key=lambda rl: len(_norm(rl[0])), reverse=True)
    code = sorted(_code_roots(), key=lambda rl: len(_norm(rl[0])))
    return [
        (r, lab, is_code)
        for r, lab, is_code in (
            *((r, lab, False) for r, lab in given),
            *((r, lab, True) for r, lab in code),
            *((r, lab, False) for r, lab in _home_roots()),
        )
        if r and _parts(r)
    ]


def _is_module_path(rel: str) -> bool:
    """Whether ``rel`` (forward slashes, relative to a ``sys.path`` entry) reads as a module path: every folder and
    the file's stem a Python identifier. A short entry such as ``/tmp`` (pytest puts a package's parent on
    ``sys.path``) must not turn ``/tmp/pytest-of-x/run-1/comfy/x.py`` into ``pytest-of-x/run-1/comfy/x.py``:
    the entry the module is imported from gives ``comfy/x.py``."""
    *folders, last = rel.split("/")
    return all(f.isidentifier() for f in folders) and last.split(".", 1)[0].isidentifier()


_NAME = r"[\w.~+@%-]"  # a character that continues a file or folder name
_REST = r"(?:[\\/]+[^\s'\"`<>|*?,;:()\[\]{}]*)?"  # after a root: a separator, then the relative part


@functools.lru_cache(maxsize=512)
def _root_pattern(root: str) -> re.Pattern[str]:
    """A root as literal text: not inside a longer name, followed by a separator and the rest, or by a non-name
    character. A Windows root (drive letter) matches case-blind, with either separator or doubled backslashes
    (an exception's ``repr`` of the path)."""
    root = root.rstrip("\\/") or root
    if re.match(r"[A-Za-z]:[\\/]", root):
        seps = r"(?:\\\\|[\\/])"
        body = seps.join(re.escape(x) for x in re.split(r"[\\/]+", root))
        flags = re.IGNORECASE
    else:
        body, flags = re.escape(root), 0
    return re.compile(rf"(?<![\w.~+@%/\\-]){body}(?P<rest>{_REST})(?!{_NAME})", flags)


def _literal_pass(text: str, roots: Roots) -> str:
    for root, label, is_code in _candidates(roots):
        pattern = _root_pattern(root)

        def sub(m: re.Match[str], label: str = label, root: str = root, is_code: bool = is_code) -> str:
            rel = re.sub(r"[\\/]+", "/", m.group("rest")).strip("/")
            if is_code and rel and not _is_module_path(rel):
                return m.group(0)  # not a module under this entry: a later root (or the regex pass) handles it
            if rel:
                return f"{label}/{rel}" if label else rel
            return label or ".../" + _parts(root)[-1]

        text = pattern.sub(sub, text)
    return text


def _under(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` (forward slashes), or None when ``path`` is not under ``root``."""
    p, r = _norm(path), _norm(root)
    if p == r:
        return ""
    if not p.startswith(r.rstrip(os.sep) + os.sep):
        return None
    return os.path.relpath(path, root).replace(os.sep, "/")


def display_path(path: str, roots: Roots = ()) -> str:
    """What a client may see of the absolute ``path``.

    Args:
        path: a filesystem path (relative paths are returned unchanged).
        roots: ``(absolute root, label)`` pairs tried longest root first; a path under one is shown as
            ``label/relative`` (``label`` alone for the root itself; no label: just ``relative``).
            Then the ``sys.path`` entries (shortest first: the fullest module path, ``comfy/ldm/x.py``
            rather than ``ldm/x.py`` when both ``ComfyUI`` and ``ComfyUI/comfy`` are on it), no label,
            then the home folder as ``~``.
    Returns:
        the path relative to the longest matching root, else ``.../parent/name``; a POSIX path whose first
        component does not exist here (an HTTP route such as ``/steadfast/compile_state``) is unchanged.
    """
    if not (path.startswith("/") or re.match(r"[A-Za-z]:[\\/]", path)):
        return path
    for root, label, is_code in _candidates(roots):
        rel = _under(path, root)
        if is_code and rel and not _is_module_path(rel):
            continue
        if rel is not None and (rel or label):
            return "/".join(x for x in (label, rel) if x)
    parts = _parts(path)
    if path.startswith("/") and parts and not os.path.exists("/" + parts[0]):
        return path  # not a path on this machine: an HTTP route (/steadfast/compile_state) or the like
    return ".../" + "/".join(parts[-2:]) if parts else path


def redact(text: str, roots: Roots = ()) -> str:
    """``text`` with every absolute path in it shown relative to a known root, else as ``.../parent/name``.

    Two passes: first each known root (``roots``, then the ``sys.path`` entries, then the home folder, in the
    order of :func:`display_path`) is replaced literally wherever it stands in the text, with what follows it up
    to whitespace, a quote or a ``:`` (so spaces, backslashes and drive letters inside the root do not matter);
    then :data:`ABSOLUTE_PATH` finds the remaining absolute paths, each replaced by :func:`display_path`.

    Args:
        text: any message (an exception text, a report, a Dynamo recompile reason).
        roots: as for :func:`display_path`.
    Returns:
        the text; unchanged when it holds no absolute path.
    """
    if not isinstance(text, str) or ("/" not in text and "\\" not in text):
        return text
    text = _literal_pass(text, roots)
    return ABSOLUTE_PATH.sub(lambda m: display_path(m.group(0), roots), text)


def redact_value(value, roots: Roots = ()):
    """:func:`redact` applied to every string inside ``value`` (dicts, lists, tuples; keys too).

    Args:
        value: a JSON-like value.
        roots: as for :func:`display_path`.
    Returns:
        a copy with every string redacted (other values unchanged).
    """
    if isinstance(value, str):
        return redact(value, roots)
    if isinstance(value, dict):
        return {redact_value(k, roots): redact_value(v, roots) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v, roots) for v in value)
    return value


def find_absolute_paths(texts: Iterable[str]) -> list[str]:
    """Every absolute path of this machine in ``texts`` (for tests and audits): what :func:`redact` would
    replace (a POSIX path whose first folder does not exist here, such as an HTTP route, is not one).

    Args:
        texts: strings to search.
    Returns:
        the matches, in order.
    """
    found = [m.group(0) for t in texts for m in ABSOLUTE_PATH.finditer(t)]
    return [p for p in found if not p.startswith("/") or os.path.exists("/" + p.split("/")[1])]


def world_writable(path: str | os.PathLike[str]) -> str | None:
    """Why anyone on the machine could replace ``path`` (a file or folder): ``"is world-writable"``, or, for a
    world-writable folder with the sticky bit (``/tmp``), None for the folder itself. None when it is not, does not
    exist, or on Windows (no such mode bits).

    Args:
        path: a file or folder.
    Returns:
        the text to put after the path's description in a warning, or None.
    """
    import stat

    if os.name == "nt":
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if not mode & stat.S_IWOTH:
        return None
    if stat.S_ISDIR(mode) and mode & stat.S_ISVTX:
        return None  # a shared folder with the sticky bit: others cannot replace what is in it
    return "is world-writable: anyone on this machine can replace what the pack will load (chmod o-w)"
