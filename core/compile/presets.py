"""Named inductor config presets for ``torch.compile(options=...)`` (Optimize Model's ``inductor_preset``).

``diffusers-fast`` is the inductor recipe of PyTorch's "Accelerating Generative AI Part III: Diffusion, Fast"
(pytorch.org/blog/accelerating-generative-ai-3) as repeated in diffusers' "Accelerate inference of text-to-image
diffusion models" tutorial (``docs/source/en/tutorials/fast_diffusion.md``): 1x1 convolutions as matmuls,
coordinate-descent tuning of generated kernels (checking all directions), no epilogue fusion. Coordinate-descent
tuning tunes Triton (GPU) kernels; on CPU the preset mostly changes how convolutions lower (docs/benchmarks.md
measures it, bits included: a preset changes generated code, so compare, never assume). No ComfyUI imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["PRESETS", "PRESET_NAMES", "NONE", "preset_options"]

NONE = "none"
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        NONE: MappingProxyType({}),
        "diffusers-fast": MappingProxyType(
            {
                "conv_1x1_as_mm": True,
                "coordinate_descent_tuning": True,
                "epilogue_fusion": False,
                "coordinate_descent_check_all_directions": True,
            }
        ),
    }
)
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


def preset_options(name: str, backend: str) -> dict[str, Any]:
    """The inductor config of preset ``name`` (a fresh dict; ``{}`` for "none"). Raises ``ValueError`` for an
    unknown name, or for a preset other than "none" with a backend other than inductor (only inductor reads
    these settings; others would ignore or refuse them)."""
    if name not in PRESETS:
        raise ValueError(f"inductor_preset must be one of {', '.join(PRESET_NAMES)}, got {name!r}")
    if name != NONE and backend != "inductor":
        raise ValueError(
            f"inductor_preset {name!r} sets inductor's config and needs backend 'inductor', "
            f"got backend {backend!r}; use inductor_preset 'none' with this backend"
        )
    return dict(PRESETS[name])
