"""Regional and full ``torch.compile`` without touching the model: options, lazy compiled blocks, swap-in.

Regional compilation compiles each repeated block (a transformer block) separately instead of the
whole network. Identical blocks run the same ``forward`` code object, so Dynamo's per-code-object
cache lets all of them share one graph; on this CPU it compiled about 2.2x faster than a full
compile with the same steady-state speed (``/work/shared/research/torch_probe.md`` sections 3 and 6;
the technique is diffusers' ``ModelMixin.compile_repeated_blocks``).

Nothing here mutates the model permanently: :func:`compile_blocks` returns lazy ``torch.compile``
wrappers (compilation happens at their first call) and :func:`swap_in` installs them only for the
duration of a ``with`` block, as ComfyUI's ``apply_torch_compile_wrapper`` does around each
``apply_model`` call. This module imports nothing from ComfyUI.

Two regional options keep a warmed model at one graph per structural block variant
(:class:`CompileOptions`): ``contiguous_inputs`` (strided block inputs would add a graph) and
``specialize_ints`` (ints that change between blocks would add graphs under dynamic shapes). Which blocks to
compile: :func:`core.blocks.choose_blocks`; guard filters: :mod:`core.guard_filters`. A "full" compile is one
block: the whole diffusion model as a path of its parent (ComfyUI's ``BaseModel.diffusion_model``).
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from . import torch_compat
from .guard_filters import GuardFilterFn

__all__ = ["CompileOptions", "compile_blocks", "contiguous_inputs_hook", "swap_in"]


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Settings for ``torch.compile`` (same meaning as its arguments).

    ``backend``: "inductor" (real compile, C++ on CPU), "eager" (Dynamo tracing only, for tests),
    "aot_eager", or any registered backend. ``mode``: an inductor preset ("default",
    "max-autotune-no-cudagraphs", ...) or None. ``dynamic``: None = automatic dynamic after the first
    shape change, True = symbolic shapes from the start, False = one graph per shape.
    ``options``: inductor config overrides (the names inductor's ``list_options()`` gives).
    ``contiguous_inputs`` (used by :func:`compile_blocks`, so also by a "full" compile whose one path is the
    whole diffusion model): give every tensor argument of a
    compiled block dense row-major strides *before* Dynamo sees it (:func:`contiguous_inputs_hook`,
    a forward pre-hook on the ``OptimizedModule``, outside the compiled frame). Dynamo guards on
    strides, so a block that is sometimes handed a strided view would otherwise compile a second
    graph on the first call (measured: ComfyUI's Wan and SD3 first blocks get
    ``x.flatten(2).transpose(1, 2)``; diffusers' Flux single blocks a sliced ``hidden_states``). A copy
    moves values exactly (no arithmetic), so outputs are unchanged; dense tensors pass through
    untouched (no copy). Not passed to ``torch.compile``.
    ``specialize_ints`` (used by :func:`compile_blocks` too): trace compiled blocks with Dynamo's
    ``specialize_int`` config on (:func:`core.torch_compat.specialize_int`, torch's ``config.patch`` around
    each call of a compiled block). Python ints are then constants with ordinary guards, which ``guard_filter_fn`` can
    drop. Without it, with ``dynamic=None``/``True`` an int that changes between blocks (ComfyUI's
    ``transformer_options["block"]`` index) becomes symbolic and is specialised through shape-env
    guards that no guard filter sees: one graph per distinct value (measured on an SDXL-layout UNet:
    6 graphs instead of 2 on the first call). Tensor shapes keep following ``dynamic``. Trade-off:
    ints a block receives that carry sizes (e.g. HunyuanVideo I2V's ``modulation_dims``) then give
    one graph per distinct value, as with ``dynamic=False``. The config is process-global while a
    compiled block runs: a Dynamo compile in another thread at that moment also sees it.
    """

    backend: str = "inductor"
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False
    options: Mapping[str, Any] | None = None
    contiguous_inputs: bool = True
    specialize_ints: bool = True

    def to_kwargs(self, guard_filter_fn: GuardFilterFn | None = None) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile`` (a fresh dict each call; torch pops from ``options``).

        torch refuses ``mode`` together with ``options``. When both are needed (explicit
        ``options``, or a ``guard_filter_fn``, which travels inside ``options``) and the backend is
        inductor, the preset's config (:func:`core.torch_compat.inductor_mode_options`) is merged into ``options``
        (explicit options win) and ``mode`` is dropped: the same config torch would apply.
        Raises :class:`core.torch_compat.TorchAPIMissing` when a filter is given and this torch does not take
        guard filters, ``ValueError`` when ``mode`` and options must be combined for a non-inductor backend,
        or when the mode is unknown.
        """
        options: dict[str, Any] = dict(self.options or {})
        if guard_filter_fn is not None:
            if not torch_compat.supports_guard_filter_fn():
                raise torch_compat.TorchAPIMissing(
                    f"torch {torch.version.__version__} does not take torch.compile(options={{'guard_filter_fn': ...}}); "
                    "Steadfast's guard filters need torch >= 2.8")
            options["guard_filter_fn"] = guard_filter_fn
        mode = self.mode
        if mode is not None and options:
            if self.backend != "inductor":
                raise ValueError(
                    f"torch.compile takes either mode or options; cannot merge mode={mode!r} into options "
                    f"for backend {self.backend!r} (only inductor modes are known config presets)"
                )
            preset = torch_compat.inductor_mode_options(mode, self.dynamic)
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
                "fullgraph": self.fullgraph, "options": opts, "contiguous_inputs": self.contiguous_inputs,
                "specialize_ints": self.specialize_ints}


# ---------------------------------------------------------------------------------------------
# Compile and swap
# ---------------------------------------------------------------------------------------------
def _split(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition(".")
    return parent, name


def _dense_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(int(size), 1)
    return tuple(reversed(strides))


def _contiguous(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        # is_contiguous() ignores strides of size-1 dims, Dynamo's guards do not (diffusers' Flux hands
        # its single blocks a [1, N, C] slice with stride[0] = (N + text) * C): compare all strides.
        if value.layout is not torch.strided or value.stride() == _dense_strides(value.shape):
            return value
        if any(st == 0 and sz > 1 for st, sz in zip(value.stride(), value.shape)):
            return value  # expanded (broadcast) view: a copy could be huge (e.g. an attention mask)
        return value.clone(memory_format=torch.contiguous_format)
    if type(value) in (tuple, list):  # plain containers only (not namedtuples/dataclasses)
        items = [_contiguous(v) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(items)
    return value


def contiguous_inputs_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook (``with_kwargs=True``) making tensor arguments contiguous.

    Tensors given directly (positional or keyword) or inside a plain ``tuple``/``list`` whose
    strides are not exactly the dense row-major strides of their shape (size-1 dims included, as
    Dynamo guards them) are replaced by a contiguous clone (same values, bit for bit); dicts
    (``transformer_options``) and other objects are left alone, and so are expanded views (a
    stride-0 dim of size > 1: materialising a broadcast mask could cost far more memory than it
    saves compile time). Returns ``None`` (nothing to change) when every tensor already has dense
    strides, so the common case allocates nothing. Caveat: a block that mutates a *strided* input in
    place and whose caller relies on that side effect (rather than the returned value) would see the
    copy mutated instead; no ComfyUI parent checked in ``core/blocks.py`` does.
    """
    new_args = _contiguous(args)
    new_kwargs = {k: _contiguous(v) for k, v in kwargs.items()}
    if new_args is args and all(new_kwargs[k] is kwargs[k] for k in kwargs):
        return None
    return new_args, new_kwargs


class _SpecializeInts:
    """Calls ``fn`` (an ``OptimizedModule``'s dynamo-wrapped forward) inside
    :func:`core.torch_compat.specialize_int` (torch's ``config.patch``: restored after, also on errors)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch_compat.specialize_int():
            return self.fn(*args, **kwargs)


def compile_blocks(root: nn.Module, paths: Sequence[str], options: CompileOptions,
                   guard_filter_fn: GuardFilterFn | None = None) -> dict[str, Callable[..., Any]]:
    """``{path: torch.compile(root.get_submodule(path), **options.to_kwargs(guard_filter_fn))}``.

    Lazy: nothing is traced until a compiled block is called (install them with :func:`swap_in`).
    ``root`` is not modified. With ``options.contiguous_inputs`` (default) each compiled module gets
    :func:`contiguous_inputs_hook` as a forward pre-hook, so strided inputs do not cost an extra
    graph (measured on ComfyUI's Wan and SD3: the first block's strided input recompiled once).
    With ``options.specialize_ints`` (default) its forward runs with Dynamo's ``specialize_int`` on
    (see :class:`CompileOptions`). Raises
    ``ValueError`` for an empty path (compile a whole model as a path of its parent), a
    duplicate, or a path that does not name a submodule.
    """
    out: dict[str, Callable[..., Any]] = {}
    for path in paths:
        if not path:
            raise ValueError("empty block path: compile a whole model as a path of its parent (e.g. 'diffusion_model')")
        if path in out:
            raise ValueError(f"duplicate block path {path!r}")
        try:
            sub = root.get_submodule(path)
        except AttributeError as e:
            raise ValueError(f"{type(root).__name__} has no submodule {path!r}: {e}") from e
        compiled = torch.compile(sub, **options.to_kwargs(guard_filter_fn))
        if options.contiguous_inputs:
            compiled.register_forward_pre_hook(contiguous_inputs_hook, with_kwargs=True)
        if options.specialize_ints:
            compiled.forward = _SpecializeInts(compiled.forward)
        out[path] = compiled
    return out


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
            raise ValueError("cannot swap the root itself; compile it as a path of its parent")
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
