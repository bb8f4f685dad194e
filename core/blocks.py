"""The one block finder: which blocks of a model regional compilation compiles, and how they were chosen.

:func:`choose_blocks` uses the declared table (:mod:`core.block_table`) for ComfyUI's models, explicit class
names when given (diffusers' ``_repeated_blocks``), and otherwise auto-discovers repeated blocks at the level
the table would pick: children of ``nn.ModuleList``/``nn.ModuleDict`` containers repeated model-wide, refused
outer blocks searched inside, pure wrappers unwrapped, tiny groups dropped. Every choice is checked with
:func:`core.block_safety.safe_to_swap`, and the result (:class:`BlockChoice`) says how it was made. Tests:
``tests/core/test_compile.py`` (small modules) and ``tests/comfy/test_architectures.py`` (every ComfyUI model,
meta device; small seeded SD1.5/SDXL/Flux/SD3/Wan under regional compile). No ComfyUI imports.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from collections.abc import Sequence
from typing import Any

from torch import nn

from .block_safety import CONTAINERS, SwapCheck, safe_to_swap, swap_refusal
from .block_table import declared_blocks_for, regional_unsupported_reason

__all__ = ["BlockChoice", "Discovery", "choose_blocks"]

@dataclasses.dataclass
class Discovery:
    """How :func:`choose_blocks` auto-discovered blocks (``BlockChoice.discovery``).

    ``paths``: chosen blocks (module order). ``groups``: ``{class: [paths]}``. ``refused``:
    candidates that were not swappable (their insides were searched instead). ``dropped``:
    ``{class: parameter share}`` of repeated groups left out as too small.
    """

    paths: list[str]
    groups: dict[str, list[str]]
    refused: dict[str, str]
    dropped: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view."""
        return dataclasses.asdict(self)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@functools.lru_cache(maxsize=256)
def _forward_only_calls(cls: type) -> str | None:
    """``name`` when ``cls.forward`` is just ``return self.<name>(...)`` (docstring allowed), else None."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef):
        return None
    body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Call):
        return None
    func = body[0].value.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return func.attr
    return None


def _discover(root: nn.Module, min_repeats: int, min_param_share: float) -> Discovery:
    """Choose repeated blocks of an undeclared model, at the level regional compilation needs.

    1. Candidates are children of ``nn.ModuleList``/``nn.ModuleDict`` containers (not containers
       themselves) whose class ``__name__`` occurs at least ``min_repeats`` times among all
       candidates of the model (counted model-wide: SD1.5 has one ``BasicTransformerBlock`` per list).
    2. In module order, the outermost candidates are kept unless :func:`safe_to_swap` refuses them;
       then their insides are searched instead (UNet: ``input_blocks.N`` -> ``BasicTransformerBlock``).
    3. A kept block that is a pure wrapper (one child that is not a container, no own parameters or
       buffers, and a ``forward`` that is only ``return self.<child>(...)``, e.g. HiDream's
       ``HiDreamImageBlock``) is replaced by its child when that child is swappable.
    4. Class groups holding less than ``min_param_share`` of the model's parameters are dropped
       (e.g. Chroma's 5-layer guidance approximator, HunyuanVideo's 2 token-refiner blocks).

    The result is meant to match the declared table (:data:`core.block_table.COMFY_REPEATED_BLOCKS`); tests
    compare them on ComfyUI's models.
    """
    cands: list[tuple[str, nn.Module]] = []
    for path, mod in root.named_modules():
        if isinstance(mod, CONTAINERS):
            for name, child in mod.named_children():
                if not isinstance(child, CONTAINERS):
                    cands.append((f"{path}.{name}" if path else name, child))
    counts: dict[str, int] = {}
    for _, m in cands:
        counts[type(m).__name__] = counts.get(type(m).__name__, 0) + 1
    chosen: list[str] = []
    refused: dict[str, str] = {}
    for path, m in cands:
        if counts[type(m).__name__] < min_repeats or any(path.startswith(k + ".") for k in chosen):
            continue
        reason = swap_refusal(root, path)
        if reason is not None:
            refused[path] = reason
            continue
        chosen.append(path)
    unwrapped: list[str] = []
    for path in chosen:
        mod = root.get_submodule(path)
        while True:
            kids = list(mod.named_children())
            if (len(kids) != 1 or isinstance(kids[0][1], CONTAINERS)
                    or any(True for _ in mod.parameters(recurse=False))
                    or any(True for _ in mod.buffers(recurse=False))
                    or _forward_only_calls(type(mod)) != kids[0][0]):
                break
            child_path = f"{path}.{kids[0][0]}"
            if swap_refusal(root, child_path) is not None:
                break
            path, mod = child_path, kids[0][1]
        unwrapped.append(path)
    groups: dict[str, list[str]] = {}
    for path in unwrapped:
        groups.setdefault(type(root.get_submodule(path)).__name__, []).append(path)
    total = _numel(root)
    dropped: dict[str, float] = {}
    if total > 0 and min_param_share > 0:
        for cls in list(groups):
            share = sum(_numel(root.get_submodule(p)) for p in groups[cls]) / total
            if share < min_param_share:
                dropped[cls] = round(share, 4)
                del groups[cls]
    order = {p: i for i, (p, _) in enumerate(root.named_modules())}
    paths = sorted((p for ps in groups.values() for p in ps), key=order.__getitem__)
    return Discovery(paths=paths, groups=groups, refused=refused, dropped=dropped)


@dataclasses.dataclass
class BlockChoice:
    """What :func:`choose_blocks` picked for a model.

    ``paths``: blocks to compile (only swappable ones, module order). ``how``: "declared" (the table),
    "named" (``classes`` given), "auto-discovered" or "unsupported" (``reason`` says why; ``paths`` is then
    empty). ``classes``: ``{class: count}``. ``check``: the :class:`SwapCheck` of the candidate paths.
    ``discovery``: set when auto-discovered.
    """

    paths: list[str]
    how: str
    classes: dict[str, int]
    check: SwapCheck | None = None
    discovery: Discovery | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view."""
        return dataclasses.asdict(self)

    def as_text(self) -> str:
        """One or more lines for a node report."""
        if self.how == "unsupported":
            return f"regional compile unsupported: {self.reason}"
        head = (f"{len(self.paths)} blocks ({self.how}): "
                + ", ".join(f"{n} x {k}" for k, n in self.classes.items()))
        extra = []
        if self.check is not None:
            extra += [f"  refused {p}: {r}" for p, r in self.check.refused.items()]
            extra += [f"  {n} structural variants of {k} (one graph each)"
                      for k, n in self.check.variants.items() if n > 1]
            extra += [f"  warning: {w}" for w in self.check.warnings]
        if self.discovery is not None and self.discovery.dropped:
            extra.append("  small repeated groups left eager: "
                         + ", ".join(f"{k} ({v:.1%} of params)" for k, v in self.discovery.dropped.items()))
        if self.reason:
            extra.append(f"  note: {self.reason}")
        return "\n".join([head, *extra])


def _named(root: nn.Module, classes: Sequence[str]) -> list[str]:
    """Submodules (not ``root``) whose class ``__name__`` is in ``classes``, outermost only, module order."""
    wanted, kept = set(classes), []
    for path, mod in root.named_modules():
        if path and type(mod).__name__ in wanted and not any(path.startswith(k + ".") for k in kept):
            kept.append(path)
    return kept


def choose_blocks(root: nn.Module, *, classes: Sequence[str] | None = None, discover: bool = False,
                  min_repeats: int = 2, min_param_share: float = 0.05) -> BlockChoice:
    """The blocks to compile regionally in ``root`` (a diffusion model), with how they were chosen.

    The one block finder of the pack. By default the table decides (:func:`core.block_table.declared_blocks_for`):
    declared classes, outermost matches; a declared model where none is found (e.g. a class renamed in a newer
    ComfyUI) is auto-discovered, with a ``reason``; a model in :data:`core.block_table.REGIONAL_UNSUPPORTED` gets
    ``how="unsupported"`` and no paths; an unknown model is auto-discovered (``_discover``: repeated children of
    ``ModuleList``/``ModuleDict``s, at least ``min_repeats`` per class model-wide, groups under
    ``min_param_share`` of the parameters dropped). ``classes`` (e.g. diffusers' ``_repeated_blocks``) picks
    those classes instead of the table, without fallback; ``discover=True`` ignores the table. Every path is
    checked with :func:`core.block_safety.safe_to_swap`; refused ones are left out (``check.refused``).
    Raises ``ValueError`` for ``classes`` together with ``discover``, ``min_repeats < 1`` or ``min_param_share``
    outside [0, 1].
    """
    if classes is not None and discover:
        raise ValueError("choose_blocks: give classes or discover=True, not both")
    if min_repeats < 1:
        raise ValueError(f"min_repeats must be >= 1, got {min_repeats}")
    if not 0.0 <= min_param_share <= 1.0:
        raise ValueError(f"min_param_share must be in [0, 1], got {min_param_share}")
    declared = None if (classes is not None or discover) else declared_blocks_for(type(root))
    if declared == ():
        return BlockChoice(paths=[], how="unsupported", classes={},
                           reason=regional_unsupported_reason(type(root)) or "declared unsupported")
    discovery, reason = None, None
    if classes is not None:
        how, paths = "named", _named(root, classes)
        if not paths:
            reason = f"none of the classes {list(classes)} found in {type(root).__name__}"
    else:
        how, paths = "declared", _named(root, declared) if declared else []
        if not paths:
            if declared:
                reason = f"declared classes {list(declared)} not found in {type(root).__name__}; auto-discovered instead"
            discovery = _discover(root, min_repeats, min_param_share)
            paths, how = discovery.paths, "auto-discovered"
    check = safe_to_swap(root, paths)
    counts: dict[str, int] = {}
    for p in check.safe:
        k = type(root.get_submodule(p)).__name__
        counts[k] = counts.get(k, 0) + 1
    return BlockChoice(paths=check.safe, how=how, classes=counts, check=check, discovery=discovery, reason=reason)
