"""What a ``torch.compile`` is asked for: :class:`CompileOptions`, and :data:`COMPILE_SCOPES`, the one list of compile
choices.

Both paths hold one :class:`CompileOptions` whole (:class:`core.optimize.plan.OptimizeOptions` ``compile``) and name
where it applies with a scope from :data:`COMPILE_SCOPES` (the nodes' ``compile`` widget offers exactly these).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from .. import torch_compat
from .guards import GuardFilterFn

__all__ = ["COMPILE_SCOPES", "CompileOptions"]

#: Where a compile applies: nowhere, the repeated blocks (regional), or the whole denoiser (full). The one list:
#: Optimize Model's and Pipeline Optimize's ``compile`` widget choices and the plan's ``scope`` come from it.
COMPILE_SCOPES = ("off", "regional", "full")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """``torch.compile``'s arguments plus two settings that each remove a first-call recompile (``tests/comfy/
    test_architectures.py``): ``contiguous_inputs`` (:func:`core.compile.swap.contiguous_inputs_hook`: Dynamo guards on
    strides, Wan's and SD3's first block get a strided view) and ``specialize_ints``
    (:func:`core.torch_compat.specialize_int`, process-global meanwhile: ints such as ComfyUI's block index become
    constants whose guards a filter drops; ints carrying sizes, e.g. HunyuanVideo I2V's ``modulation_dims``, then give
    a graph per value)."""

    backend: str = "inductor"
    mode: str | None = None
    dynamic: bool | None = None
    fullgraph: bool = False
    options: Mapping[str, Any] | None = None
    contiguous_inputs: bool = True
    specialize_ints: bool = True

    def to_kwargs(self, guard_filter_fn: GuardFilterFn | None = None) -> dict[str, Any]:
        """Fresh ``torch.compile`` kwargs (torch pops from ``options``), ``guard_filter_fn`` in ``options``, under
        which inductor's preset for ``mode`` is merged (torch refuses both). :class:`core.torch_compat.TorchAPIMissing`
        (no guard filters in this torch); ``ValueError`` (unknown mode; mode plus options off inductor)."""
        options: dict[str, Any] = dict(self.options or {})
        if guard_filter_fn is not None:
            if not torch_compat.supports_guard_filter_fn():
                raise torch_compat.TorchAPIMissing(
                    f"torch {torch.version.__version__} does not take torch.compile(options={{'guard_filter_fn': "
                    "...}); Steadfast's guard filters need torch >= 2.8"
                )
            options["guard_filter_fn"] = guard_filter_fn
        mode = self.mode
        if mode is not None and options:
            if self.backend != "inductor":
                raise ValueError(
                    f"torch.compile takes either mode or options; cannot merge mode={mode!r} into options "
                    f"for backend {self.backend!r} (only inductor modes are known config presets)"
                )
            options, mode = {**torch_compat.inductor_mode_options(mode, self.dynamic), **options}, None
        return {
            "backend": self.backend,
            "mode": mode,
            "dynamic": self.dynamic,
            "fullgraph": self.fullgraph,
            "options": options or None,
        }

    def as_text(self) -> str:
        """One readable line for reports, e.g. ``backend eager, mode default, dynamic auto, fullgraph off;
        inductor options: max_autotune=True``.

        Returns:
            the settings as words (``dynamic`` None is "auto"; contiguous_inputs / specialize_ints named only
            when off); inductor options as ``name=value`` pairs, sorted.
        """
        dyn = {None: "auto", True: "on (dynamic shapes)", False: "off (one graph per shape)"}.get(
            self.dynamic, str(self.dynamic)
        )
        parts = [
            f"backend {self.backend}",
            f"mode {self.mode or 'default'}",
            f"dynamic {dyn}",
            f"fullgraph {'on' if self.fullgraph else 'off'}",
        ]
        parts += [f"{name} off" for name in ("contiguous_inputs", "specialize_ints") if not getattr(self, name)]
        text = ", ".join(parts)
        if self.options:
            shown = {k: v for k, v in self.options.items() if k != "guard_filter_fn"}
            if shown:
                text += "; inductor options: " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        return text

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable view (option values that are not JSON scalars become their ``repr``)."""
        opts = (
            None
            if self.options is None
            else {
                k: v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
                for k, v in self.options.items()
            }
        )
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "options": opts}
