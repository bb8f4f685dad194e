"""Regional and full ``torch.compile`` without touching the model: options, block discovery, swap-in.

Regional compilation compiles each repeated block (a transformer block) separately instead of the
whole network. Identical blocks run the same ``forward`` code object, so Dynamo's per-code-object
cache lets all of them share one graph; on this CPU it compiled about 2.2x faster than a full
compile with the same steady-state speed (``/work/shared/research/torch_probe.md`` sections 3 and 6;
the technique is diffusers' ``ModelMixin.compile_repeated_blocks``).

Nothing here mutates the model permanently: :func:`compile_blocks` returns lazy ``torch.compile``
wrappers (compilation happens at their first call) and :func:`swap_in` installs them only for the
duration of a ``with`` block, as ComfyUI's ``apply_torch_compile_wrapper`` does around each
``apply_model`` call. This module imports nothing from ComfyUI.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

log = logging.getLogger("steadfast.compile")

GuardFilterFn = Callable[[Sequence[Any]], Sequence[bool]]

__all__ = [
    "CompileOptions",
    "SkipGuardsOn",
    "skip_guards_on",
    "supports_guard_filter_fn",
    "inductor_mode_options",
    "find_repeated_blocks",
    "repeated_block_groups",
    "declared_repeated_blocks",
    "compile_blocks",
    "compile_full",
    "swap_in",
]


def supports_guard_filter_fn() -> bool:
    """Whether this torch accepts ``torch.compile(options={"guard_filter_fn": fn})``.

    Feature-detected (not a version check): Dynamo's ``_optimize`` must take a ``guard_filter_fn``
    argument, which ``torch.compile`` fills from ``options`` (torch >= 2.8-ish; present in 2.13/2.14).
    """
    try:
        from torch._dynamo import eval_frame
    except ImportError:  # pragma: no cover - torch without dynamo
        return False
    target = getattr(eval_frame, "_optimize", None) or getattr(eval_frame, "optimize", None)
    if target is None:  # pragma: no cover
        return False
    try:
        return "guard_filter_fn" in inspect.signature(target).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return False


def inductor_mode_options(mode: str, dynamic: bool | None = None) -> dict[str, Any] | None:
    """The inductor config that ``torch.compile(mode=mode)`` applies, or ``None`` if not exposed.

    Uses ``torch._inductor.list_mode_options(mode, dynamic)`` (feature-detected), which is exactly
    what torch's inductor wrapper applies for ``mode``. ``"default"`` gives ``{}``.
    Raises ``ValueError`` for a mode torch does not know.
    """
    try:
        from torch._inductor import list_mode_options
    except ImportError:  # pragma: no cover
        return None
    try:
        return dict(list_mode_options(mode, dynamic))
    except RuntimeError as e:  # "Unrecognized mode=..."
        raise ValueError(str(e)) from e


@dataclasses.dataclass(frozen=True)
class SkipGuardsOn:
    """Guard filter keeping every Dynamo guard whose name does NOT contain ``substring``.

    Callable as ``guard_filter_fn(entries) -> list[bool]`` (``entries`` are Dynamo
    ``GuardFilterEntry`` objects with a ``.name``). A dataclass rather than a closure so two filters
    for the same substring compare equal (the registry reuses compiled blocks only for equal
    settings). Source: ComfyUI's ``TorchCompileModel`` drops guards on ``transformer_options``,
    whose entries (sigmas, block indices...) change every step and would otherwise recompile.

    Dropping a guard is only safe for values that do not change the traced computation.
    """

    substring: str = "transformer_options"

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        return [self.substring not in getattr(e, "name", "") for e in entries]


def skip_guards_on(substring: str = "transformer_options") -> SkipGuardsOn:
    """A guard filter dropping guards whose name contains ``substring`` (see :class:`SkipGuardsOn`)."""
    return SkipGuardsOn(substring)


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Settings for ``torch.compile`` (same meaning as its arguments).

    ``backend``: "inductor" (real compile, C++ on CPU), "eager" (Dynamo tracing only, for tests),
    "aot_eager", or any registered backend. ``mode``: an inductor preset ("default",
    "max-autotune-no-cudagraphs", ...) or None. ``dynamic``: None = automatic dynamic after the first
    shape change, True = symbolic shapes from the start, False = one graph per shape.
    ``options``: inductor config overrides (``torch._inductor.list_options()``).
    """

    backend: str = "inductor"
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False
    options: Mapping[str, Any] | None = None

    def to_kwargs(self, guard_filter_fn: GuardFilterFn | None = None) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile`` (a fresh dict each call; torch pops from ``options``).

        torch refuses ``mode`` together with ``options``. When both are needed (explicit
        ``options``, or a ``guard_filter_fn``, which travels inside ``options``) and the backend is
        inductor, the preset's config (:func:`inductor_mode_options`) is merged into ``options``
        (explicit options win) and ``mode`` is dropped: the same config torch would apply.
        When this torch does not support guard filters the filter is left out and a warning logged.

        Raises ``ValueError`` when ``mode`` and options must be combined for a non-inductor backend,
        or when the mode is unknown.
        """
        options: dict[str, Any] = dict(self.options or {})
        if guard_filter_fn is not None:
            if supports_guard_filter_fn():
                options["guard_filter_fn"] = guard_filter_fn
            else:  # pragma: no cover - old torch
                log.warning("this torch has no guard_filter_fn support; compiling without the guard filter")
        mode = self.mode
        if mode is not None and options:
            if self.backend != "inductor":
                raise ValueError(
                    f"torch.compile takes either mode or options; cannot merge mode={mode!r} into options "
                    f"for backend {self.backend!r} (only inductor modes are known config presets)"
                )
            preset = inductor_mode_options(mode, self.dynamic)
            if preset is None:  # pragma: no cover
                raise ValueError(f"cannot combine mode={mode!r} with options: list_mode_options unavailable")
            options = {**preset, **options}
            mode = None
        return {
            "backend": self.backend,
            "mode": mode,
            "dynamic": self.dynamic,
            "fullgraph": self.fullgraph,
            "options": options or None,
        }

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view (option values that are not JSON scalars become their ``repr``)."""
        opts = None
        if self.options is not None:
            opts = {k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
                    for k, v in self.options.items()}
        return {"backend": self.backend, "mode": self.mode, "dynamic": self.dynamic,
                "fullgraph": self.fullgraph, "options": opts}


# ---------------------------------------------------------------------------------------------
# Which blocks
# ---------------------------------------------------------------------------------------------
def _outermost(paths: Iterator[str]) -> list[str]:
    """Keep paths (in order) that are not inside an already kept path."""
    kept: list[str] = []
    for p in paths:
        if not any(p.startswith(k + ".") for k in kept):
            kept.append(p)
    return kept


def repeated_block_groups(root: nn.Module, min_repeats: int = 2) -> dict[str, list[str]]:
    """Auto-discovered repeated blocks, grouped by class name: ``{class __name__: [dotted paths]}``.

    A candidate is a child of an ``nn.ModuleList`` whose class occurs at least ``min_repeats`` times
    in that list. Only outermost candidates are kept (a ModuleList inside a chosen block is not
    searched again). Groups and paths follow ``root.named_modules()`` order.
    """
    if min_repeats < 1:
        raise ValueError(f"min_repeats must be >= 1, got {min_repeats}")
    candidates: list[tuple[str, str]] = []
    for path, mod in root.named_modules():
        if not isinstance(mod, nn.ModuleList):
            continue
        by_class: dict[str, list[str]] = {}
        for name, child in mod.named_children():
            by_class.setdefault(type(child).__name__, []).append(f"{path}.{name}" if path else name)
        for cls_name, paths in by_class.items():
            if len(paths) >= min_repeats:
                candidates.extend((cls_name, p) for p in paths)
    kept = set(_outermost(p for _, p in candidates))
    groups: dict[str, list[str]] = {}
    for cls_name, p in candidates:
        if p in kept:
            groups.setdefault(cls_name, []).append(p)
    return groups


def find_repeated_blocks(root: nn.Module, class_names: Sequence[str] | None = None,
                         min_repeats: int = 2) -> list[str]:
    """Dotted paths (relative to ``root``) of the blocks to compile regionally.

    With ``class_names``: every submodule (not ``root`` itself) whose class ``__name__`` is listed,
    outermost matches only (a match nested inside another match is skipped). Without: auto-discovery
    via :func:`repeated_block_groups` (repeated same-class children of ``nn.ModuleList``s); the choice
    is logged at INFO level. Returns ``[]`` when nothing matches. Paths are in module order.
    """
    if class_names is not None:
        wanted = set(class_names)
        return _outermost(p for p, m in root.named_modules() if p and type(m).__name__ in wanted)
    groups = repeated_block_groups(root, min_repeats)
    if groups:
        log.info("auto-discovered repeated blocks in %s: %s", type(root).__name__,
                 ", ".join(f"{len(v)} x {k}" for k, v in groups.items()))
    else:
        log.info("no repeated blocks found in %s", type(root).__name__)
    order = {p: i for i, (p, _) in enumerate(root.named_modules())}
    return sorted((p for paths in groups.values() for p in paths), key=order.__getitem__)


def declared_repeated_blocks(root: nn.Module) -> list[str]:
    """Paths of the blocks named by ``root._repeated_blocks`` (diffusers' convention: class names).

    Returns ``[]`` when the attribute is missing or empty (e.g. diffusers' SD3 transformer and VAEs).
    """
    names = getattr(root, "_repeated_blocks", None) or ()
    if isinstance(names, str):
        names = (names,)
    return find_repeated_blocks(root, class_names=list(names)) if names else []


# ---------------------------------------------------------------------------------------------
# Compile and swap
# ---------------------------------------------------------------------------------------------
def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition(".")
    return parent, name


def compile_blocks(root: nn.Module, paths: Sequence[str], options: CompileOptions,
                   guard_filter_fn: GuardFilterFn | None = None) -> dict[str, Callable[..., Any]]:
    """``{path: torch.compile(root.get_submodule(path), **options.to_kwargs(guard_filter_fn))}``.

    Lazy: nothing is traced until a compiled block is called (install them with :func:`swap_in`).
    ``root`` is not modified. Raises ``ValueError`` for an empty path (compile the whole model with
    :func:`compile_full`), a duplicate, or a path that does not name a submodule.
    """
    out: dict[str, Callable[..., Any]] = {}
    for path in paths:
        if not path:
            raise ValueError("empty block path: use compile_full() for the whole model")
        if path in out:
            raise ValueError(f"duplicate block path {path!r}")
        try:
            sub = root.get_submodule(path)
        except AttributeError as e:
            raise ValueError(f"{type(root).__name__} has no submodule {path!r}: {e}") from e
        out[path] = torch.compile(sub, **options.to_kwargs(guard_filter_fn))
    return out


def compile_full(root: nn.Module, options: CompileOptions,
                 guard_filter_fn: GuardFilterFn | None = None) -> Callable[..., Any]:
    """``torch.compile(root, **options.to_kwargs(guard_filter_fn))``: whole-model compile (lazy)."""
    return torch.compile(root, **options.to_kwargs(guard_filter_fn))


@contextlib.contextmanager
def swap_in(root: nn.Module, compiled: Mapping[str, Callable[..., Any]]) -> Iterator[nn.Module]:
    """Temporarily replace ``root``'s submodules at the given paths by the compiled callables.

    Uses ``setattr`` on each parent and puts back exactly what was there in ``finally`` (also on
    exceptions), in reverse order. Yields ``root``. Mirrors ComfyUI's ``apply_torch_compile_wrapper``.
    Pitfall: parents that dispatch on ``isinstance(child, ...)`` see an ``OptimizedModule`` instead
    of the original class, so only compile blocks that their parents call generically.
    Raises ``ValueError`` for an empty or unknown path (before anything is swapped).
    """
    targets = []
    for path, fn in compiled.items():
        if not path:
            raise ValueError("cannot swap the root itself; call the compile_full() result instead")
        parent_path, name = _split(path)
        try:
            parent = root.get_submodule(parent_path)
            original = getattr(parent, name)
        except AttributeError as e:
            raise ValueError(f"{type(root).__name__} has no submodule {path!r}: {e}") from e
        targets.append((parent, name, original, fn))
    done = []
    try:
        for parent, name, original, fn in targets:
            setattr(parent, name, fn)
            done.append((parent, name, original))
        yield root
    finally:
        for parent, name, original in reversed(done):
            setattr(parent, name, original)
