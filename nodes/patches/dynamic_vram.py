"""Dynamic VRAM and the Comfy Compiler: what a MODEL's patcher is, and which optimizations it refuses or skips.

Dynamic VRAM (ComfyUI >= 0.1x, comfy-aimdo; on by default on NVIDIA in 0.33): ModelPatcherDynamic never patches
the stored Parameters. Every comfy op gets ``comfy_cast_weights=True`` and a LoRA is applied by a function at cast
time (comfy/model_patcher.py ModelPatcherDynamic.load: ``<param>_lowvram_function``); a module without
``comfy_cast_weights`` takes a plain ``weight.to(device)`` with no patch.
"""

from __future__ import annotations

from ..host.identity import comfy_compiler_state

__all__ = ["NOT_APPLIED_DYNAMIC", "is_dynamic", "compile_clone", "comfy_compiler_state", "check_comfy_compiler"]

NOT_APPLIED_DYNAMIC = "not applied: Dynamic VRAM"


def is_dynamic(model) -> bool:
    """Whether ``model`` (a ModelPatcher) is ComfyUI's ``ModelPatcherDynamic`` (False before ComfyUI had it)."""
    check = getattr(model, "is_dynamic", None)
    return bool(check()) if callable(check) else False


def compile_clone(model):
    """The clone Optimize Model compiles: ``model.clone(disable_dynamic=True)`` for a Dynamic VRAM model, as core's
    ``TorchCompileModel.execute`` does (ComfyUI 0.33 ``comfy_extras/nodes_torch_compile.py``; ComfyUI PR 12612: the
    dynamic patcher gave many graph breaks and guard failures), a plain ``clone()`` otherwise (and on ComfyUI
    versions without Dynamic VRAM, whose ``clone`` has no ``disable_dynamic``). The non-dynamic copy loads its
    weights again (``cached_patcher_init``), as core's node does."""
    return model.clone(disable_dynamic=True) if is_dynamic(model) else model.clone()


def check_comfy_compiler(what: str) -> None:
    """Refuse ``what`` (an optimization that replaces the model's forwards) while the Comfy Compiler is on: it fails
    on packs that patch forwards ("aimdo memory compile error", ComfyUI issues 16342, 16223) and this pack has no
    supported way to pause it around its own forwards. Raises ``ValueError`` naming ``--disable-comfy-compiler``."""
    if comfy_compiler_state() == "on":
        raise ValueError(
            f"{what} replaces the model's forward functions, which the Comfy Compiler (on with Dynamic "
            "VRAM) does not support (ComfyUI issues 16342, 16223). Start ComfyUI with "
            "--disable-comfy-compiler to use it, or turn it off in Optimize Model."
        )
