"""Dynamic VRAM and the Comfy Compiler: what a MODEL's patcher is, and which optimizations it refuses or skips.

Dynamic VRAM (ComfyUI >= 0.1x, comfy-aimdo; on by default on NVIDIA in 0.33): ModelPatcherDynamic never patches
the stored Parameters. Every comfy op gets ``comfy_cast_weights=True`` and a LoRA is applied by a function at cast
time (comfy/model_patcher.py ModelPatcherDynamic.load: ``<param>_lowvram_function``); a module without
``comfy_cast_weights`` takes a plain ``weight.to(device)`` with no patch.
"""

from __future__ import annotations

from ..host.identity import comfy_compiler_state

__all__ = [
    "NOT_APPLIED_DYNAMIC",
    "is_dynamic",
    "compile_clone",
    "non_dynamic_base",
    "comfy_compiler_state",
    "check_comfy_compiler",
]

NOT_APPLIED_DYNAMIC = "not applied: Dynamic VRAM"


def is_dynamic(model) -> bool:
    """Whether ``model`` (a ModelPatcher) is ComfyUI's ``ModelPatcherDynamic`` (False before ComfyUI had it)."""
    check = getattr(model, "is_dynamic", None)
    return bool(check()) if callable(check) else False


def compile_clone(model):
    """The clone Optimize Model compiles: a plain ``model.clone()``, or for a Dynamic VRAM model
    ``model.clone(disable_dynamic=True)`` on the module of its kept non-dynamic copy (:func:`non_dynamic_base`):
    ``model``'s patches, options and wrappers as they are now, on a module built once. Core's
    ``TorchCompileModel.execute`` compiles the same kind of copy (ComfyUI 0.33 ``comfy_extras/nodes_torch_compile.py``;
    ComfyUI PR 12612: the dynamic patcher gave many graph breaks and guard failures). Versions without Dynamic VRAM
    have no ``is_dynamic`` and no ``clone(disable_dynamic=...)``: the plain clone.

    The clone's ``parent`` is the kept copy, not ``model``: when the clone is garbage-collected, ComfyUI's
    loaded-model entry moves to its parent (``LoadedModel._switch_parent``), which must be a patcher of the same
    module for that module's memory to stay accounted for and unloadable."""
    if not is_dynamic(model):
        return model.clone()
    base = non_dynamic_base(model)
    m = model.clone(disable_dynamic=True, model_override=base.get_clone_model_override())
    m.parent = base
    return m


def non_dynamic_base(model):
    """The one non-dynamic copy of the Dynamic VRAM ModelPatcher ``model``, built on first use and kept while
    ``model`` lives.

    ComfyUI executes Optimize Model again whenever a prompt without it has evicted its output (0.33.0's RAM-pressure
    cache drops every output the running prompt does not use; 0.8.0's classic cache too). ``clone(disable_dynamic=
    True)`` rebuilds the model from ``cached_patcher_init``, loading the checkpoint's weights again: once per
    execution, so once per prompt in a server that alternates workflows. Here it runs once per ``model``, as
    ComfyUI's own ``ModelPatcherDynamic.get_non_dynamic_delegate`` keeps its copy (comfy/model_patcher.py), and
    :func:`compile_clone` clones ``model`` onto the copy's module (``model_override``, as that method does).

    The copy's ``parent`` is cleared: it is a patcher of another module than ``model``'s, and with ``model`` as its
    parent ComfyUI's loaded-model entry would move to ``model`` when the copy is collected (and the copy would refer
    back to ``model``).

    The copy is kept on ``model`` itself (not in a table keyed by it): a value that referred back to ``model`` (a
    wrapper's closure in the copied ``model_options``) would then be a cycle the garbage collector frees, never a
    table entry that keeps both models alive.

    Args:
        model: a ComfyUI ``ModelPatcherDynamic`` (``is_dynamic()`` True).
    Returns:
        a non-dynamic ``ModelPatcher`` over its own module, the same object for every call with ``model``.
    """
    base = getattr(model, _BASE_ATTR, None)
    if base is None:
        base = model.clone(disable_dynamic=True)
        base.parent = None
        setattr(model, _BASE_ATTR, base)  # on the patcher, as ComfyUI keeps its delegate: it goes with ``model``
    return base


#: the attribute of a Dynamic VRAM ModelPatcher holding its non-dynamic copy (:func:`non_dynamic_base`); ``clone()``
#: does not copy it, so a clone (other patches, perhaps) makes its own
_BASE_ATTR = "steadfast_non_dynamic_base"


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
