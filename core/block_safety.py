"""Can a block be swapped for a compiled wrapper? A runtime check of any block choice, and its structural variants.

A compiled block replaces the original in its parent for one call (:func:`core.compile.swap_in`). That is only
correct when the caller calls it generically; :func:`safe_to_swap` refuses blocks whose caller is a known
non-generic one (:data:`core.block_table.NON_GENERIC_PARENTS`) or whose caller's source file dispatches with
``isinstance`` on the block's class, and counts structurally different blocks of one class (each is one more
Dynamo graph of the same ``forward``). Imports nothing from ComfyUI (it reads the caller's source text).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
from collections.abc import Sequence
from typing import Any

from torch import nn

from . import torch_compat
from .block_table import NON_GENERIC_PARENTS

__all__ = ["SwapCheck", "safe_to_swap", "swap_refusal", "CONTAINERS"]

@dataclasses.dataclass
class SwapCheck:
    """Result of :func:`safe_to_swap`.

    ``safe``: paths that may be swapped (input order). ``refused``: ``{path: reason}``.
    ``variants``: ``{block class: number of distinct configurations}`` among the safe blocks: each
    variant is one more graph of the same ``forward`` on the first call (a recompile that is not a
    warm-up failure). ``warnings``: human-readable notes (e.g. more variants than the recompile limit).
    """

    safe: list[str]
    refused: dict[str, str]
    variants: dict[str, int]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        """True when nothing was refused."""
        return not self.refused

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view."""
        return dataclasses.asdict(self)

    def as_text(self) -> str:
        """Short multi-line summary for a node's report."""
        lines = [f"{len(self.safe)} blocks safe to swap"
                 + (f" ({', '.join(f'{n} variants of {k}' for k, n in self.variants.items() if n > 1)})"
                    if any(n > 1 for n in self.variants.values()) else "")]
        lines += [f"refused {p}: {r}" for p, r in self.refused.items()]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


#: Plain containers: never called themselves; their owner iterates them.
CONTAINERS = (nn.ModuleList, nn.ModuleDict)


def _caller(root: nn.Module, path: str) -> tuple[str, nn.Module]:
    """The module whose forward calls the block at ``path``: the nearest ancestor that is not a
    plain ``ModuleList``/``ModuleDict`` (those are never called; their owner iterates them)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        anc_path = ".".join(parts[:cut])
        anc = root.get_submodule(anc_path)
        if type(anc) not in CONTAINERS:
            return anc_path, anc
    return "", root  # pragma: no cover - the loop always ends at root


@functools.lru_cache(maxsize=256)
def _source_of(module_name: str) -> str | None:
    mod = sys.modules.get(module_name)
    if mod is None:
        return None
    try:
        return inspect.getsource(mod)
    except (OSError, TypeError):
        return None


def _isinstance_hits(caller: nn.Module, block: nn.Module) -> list[str]:
    """``isinstance(..., Name)`` uses in the caller's source file naming a class of the block's MRO."""
    names = [k.__name__ for k in type(block).__mro__
             if not k.__module__.startswith(("torch.", "builtins"))]
    src = _source_of(type(caller).__module__)
    if not src or not names:
        return []
    hits = []
    alt = "|".join(re.escape(n) for n in names)
    pattern = re.compile(r"isinstance\(\s*[^,()]+,\s*(?:\([^)]*)?\b(?:[\w.]+\.)?(" + alt + r")\b")
    for lineno, line in enumerate(src.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("#"):
            continue
        m = pattern.search(line)
        if m:
            hits.append(f"{type(caller).__module__}:{lineno}: isinstance(..., {m.group(1)})")
    return hits


def _signature(block: nn.Module) -> tuple:
    """Structural signature: child module types and parameter shapes, plus bool/str/None/float
    attributes (ints are left out: ids like ``layer_id`` are often never read by forward)."""
    children = tuple((n, type(m).__name__) for n, m in block.named_modules())
    params = tuple((n, tuple(p.shape)) for n, p in block.named_parameters())
    attrs = []
    for mod_name, mod in block.named_modules():
        for k, v in vars(mod).items():
            if k.startswith("_") or k == "training":
                continue
            if isinstance(v, (bool, str, float)) or v is None:
                attrs.append((mod_name, k, v))
    return children, params, tuple(attrs)


def swap_refusal(root: nn.Module, path: str) -> str | None:
    """Why the block at ``path`` must not be swapped, or None. Raises ``ValueError`` for a bad path."""
    if not path:
        raise ValueError("empty block path: the root is compiled whole, not swapped")
    try:
        block = root.get_submodule(path)
    except AttributeError as e:
        raise ValueError(f"{type(root).__name__} has no submodule {path!r}: {e}") from e
    caller_path, caller = _caller(root, path)
    cname = type(caller).__name__
    if cname in NON_GENERIC_PARENTS:
        return f"called by {cname} ({caller_path or 'root'}): {NON_GENERIC_PARENTS[cname]}"
    hits = _isinstance_hits(caller, block)
    if hits:
        return f"caller {cname} ({caller_path or 'root'}) may dispatch on the block's class: " + "; ".join(hits[:3])
    return None


def safe_to_swap(root: nn.Module, paths: Sequence[str], *, recompile_limit: int | None = None) -> SwapCheck:
    """Check that each block at ``paths`` (dotted, relative to ``root``) can be swapped for a compiled wrapper.

    A block is refused when the module that calls it (nearest ancestor that is not a plain
    ``ModuleList``/``ModuleDict``) is a known non-generic caller (:data:`NON_GENERIC_PARENTS`, e.g.
    the UNet's ``TimestepEmbedSequential``), or when the source file defining that caller's class
    contains ``isinstance(x, C)`` for a class ``C`` in the block's MRO (heuristic; a file without
    available source is not scanned). Blocks of one class with different structure (child types,
    parameter shapes, bool/str/float attributes) are counted as variants; more variants than
    ``recompile_limit`` (default: :func:`core.torch_compat.recompile_limit`) gives a warning: Dynamo
    would run the surplus blocks eagerly. Int attributes are not compared, so an int that forward
    branches on (Wan VACE's ``block_id``) is not seen. Raises ``ValueError`` for an empty or unknown path.
    """
    safe: list[str] = []
    refused: dict[str, str] = {}
    sigs: dict[str, set] = {}
    for path in paths:
        reason = swap_refusal(root, path)
        if reason is not None:
            refused[path] = reason
            continue
        safe.append(path)
        block = root.get_submodule(path)
        sigs.setdefault(type(block).__name__, set()).add(_signature(block))
    variants = {k: len(v) for k, v in sigs.items()}
    limit = torch_compat.recompile_limit() if recompile_limit is None else recompile_limit
    warnings = [f"{n} structurally different {k} blocks > recompile_limit={limit}: Dynamo would run the "
                f"surplus ones eagerly" for k, n in variants.items() if n > limit]
    return SwapCheck(safe=safe, refused=refused, variants=variants, warnings=warnings)
