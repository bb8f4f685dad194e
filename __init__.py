"""ComfyUI-Steadfast: fast diffusion inference that stays reproducible.

ComfyUI entry point (V3 ``comfy_entrypoint``) plus ``WEB_DIRECTORY``. Importing this package outside
ComfyUI works too: the ComfyUI adapters are only loaded when ``comfy_api`` is importable.
"""

from __future__ import annotations

from .core.determinism import cublas as _cublas_config

# CUBLAS_WORKSPACE_CONFIG only takes effect if it is set before cuBLAS starts, so set it as early as
# ComfyUI lets a pack run code: at import. It is recorded, and reported by Determinism Setup.
_cublas_config.ensure_cublas_workspace_config()

# Portable CPU mode (STEADFAST_PORTABLE=1, set by `steadfast run --portable`): oneDNN off, threads and inductor's
# vector width pinned before any model runs. A missing start-up variable fails the import loudly.
from .core.determinism import portable as _portable  # noqa: E402

if _portable.is_portable():
    _portable.apply_in_process()

WEB_DIRECTORY = "./js"
from .core.version import __version__  # noqa: E402,F401  (the one source: core/version.py)

try:  # feature detection, not a version check: the pinned V3 node API (docs/compatibility.md) is what we build on
    import comfy_api.v0_0_2  # noqa: F401
except ImportError:  # plain Python / library use
    pass
else:
    from .nodes import comfy_entrypoint  # noqa: F401
