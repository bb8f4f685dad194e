"""Dynamic VRAM and the Comfy Compiler: what a MODEL's patcher is, and which optimizations it refuses or skips.

Dynamic VRAM (ComfyUI >= 0.1x, comfy-aimdo; on by default on NVIDIA in 0.33): ModelPatcherDynamic never patches
the stored Parameters. Every comfy op gets ``comfy_cast_weights=True`` and a LoRA is applied by a function at cast
time (comfy/model_patcher.py ModelPatcherDynamic.load: ``<param>_lowvram_function``); a module without
``comfy_cast_weights`` takes a plain ``weight.to(device)`` with no patch.
"""

from __future__ import annotations

from comfy.model_patcher import ModelPatcher

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
    ``model.clone(disable_dynamic=True)`` on the module of the non-dynamic copy kept for its base module
    (:func:`non_dynamic_base`): ``model``'s patches, options and wrappers as they are now, on a module built once.
    Core's ``TorchCompileModel.execute`` compiles the same kind of copy (ComfyUI 0.33 ``comfy_extras/
    nodes_torch_compile.py``; ComfyUI PR 12612: the dynamic patcher gave many graph breaks and guard failures).
    Versions without Dynamic VRAM have no ``is_dynamic`` and no ``clone(disable_dynamic=...)``: the plain clone.

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
    """The one non-dynamic copy of the module under the Dynamic VRAM ModelPatcher ``model``: a bare ModelPatcher
    (no patches, options or wrappers) over a module rebuilt from ``cached_patcher_init``, built on first use and kept
    while that base module lives.

    ComfyUI executes Optimize Model again whenever a prompt without it has evicted its output (0.33.0's RAM-pressure
    cache drops every output the running prompt does not use; 0.8.0's classic cache too), and the node before it
    (a LoRA loader returns a new patcher) as well. ``clone(disable_dynamic=True)`` rebuilds the model from
    ``cached_patcher_init``, loading the checkpoint's weights again: once per execution, so once per prompt in a
    server that alternates workflows. Here it runs once per base module, whichever patcher of it comes in: every
    ModelPatcherDynamic of one module (a checkpoint's, its LoRA clones') shares the copy, as the classic
    ModelPatchers of one module share it, and :func:`compile_clone` clones ``model`` onto the copy's module
    (``model_override``, as ComfyUI's ``ModelPatcherDynamic.get_non_dynamic_delegate``), so each execution brings its
    own patches and ComfyUI patches and unpatches the shared weights as it does for any clones of one module.

    The copy is kept on the dynamic base module, where ComfyUI keeps its own per-module Dynamic VRAM state
    (``dynamic_vbars``, ``dynamic_pins``, ``dynamic_patchers`` in ``ModelPatcherDynamic.__init__``), so it is freed
    with that module. It is a fresh ModelPatcher, not a clone of ``model``: a clone would carry ``model``'s patches,
    options and ``parent`` and keep that patcher (and its LoRA's tensors) alive as long as the module. Being the first
    patcher of its module, its backup dicts are the ones every clone onto the module shares.

    Args:
        model: a ComfyUI ``ModelPatcherDynamic`` (``is_dynamic()`` True).
    Returns:
        a non-dynamic ``ModelPatcher`` with ``parent`` None, the same object for every patcher of ``model.model``.
    Raises:
        ValueError: ``model`` has no ``cached_patcher_init`` to rebuild the module from (a custom loader), naming
            the ways out.
    """
    base = getattr(model.model, _BASE_ATTR, None)
    if base is None:
        if getattr(model, "cached_patcher_init", None) is None:
            raise ValueError(
                "compile under Dynamic VRAM runs on a non-dynamic copy of the model, which ComfyUI rebuilds with "
                "the loader's cached_patcher_init, and this MODEL's loader did not register one (a custom "
                "loader). Load it with a core loader, start ComfyUI with --disable-dynamic-vram, or set compile "
                "to off."
            )
        module = model.clone(disable_dynamic=True).model  # ComfyUI's own rebuild (cached_patcher_init)
        base = ModelPatcher(  # ComfyUI's constructor, as its loaders call it: none of ``model``'s patches
            module,
            model.load_device,
            model.offload_device,
            model.model_size(),
            weight_inplace_update=model.weight_inplace_update,
        )
        setattr(model.model, _BASE_ATTR, base)  # not a Module: a plain attribute of the dynamic module
    return base


#: the attribute of a Dynamic VRAM base module (``ModelPatcherDynamic.model``) holding its non-dynamic copy
#: (:func:`non_dynamic_base`)
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
