"""Child process for test_dynamic_vram.py: Optimize Model, quantize and the model digest on a ModelPatcher that
behaves as ComfyUI's Dynamic VRAM one, in-process on the CPU, printing one JSON line. Not a test module.

    python tests/comfy/dynamic_vram_child.py REPO_ROOT CKPT

Dynamic VRAM (``ModelPatcherDynamic``) is only built for a GPU load device (on the CPU its ``__new__`` returns a
plain ModelPatcher), so the checkpoint's ModelPatcher is given a subclass whose ``is_dynamic()`` is True: what the
pack reads to decide. ``clone(disable_dynamic=True)`` then takes ComfyUI's real path (a non-dynamic copy rebuilt from
``cached_patcher_init``, as core's TorchCompileModel). Where ComfyUI has no ``is_dynamic`` (0.8.0) the emulation is
skipped and the plain paths are checked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(sys.argv[1])
sys.path.insert(0, str(ROOT / "headless"))
import tiny_sd15  # noqa: E402

tiny_sd15.import_comfy()
import torch  # noqa: E402


def params_state(module: torch.nn.Module) -> dict[str, str]:
    return {n: f"{p.data_ptr()}|{tuple(p.stride())}" for n, p in module.named_parameters()}


def main() -> None:
    import comfy.model_management  # noqa: F401
    import comfy.model_patcher
    import comfy.sd

    sys.path.insert(0, str(ROOT / "scripts"))
    from _steadfast_import import import_steadfast

    import_steadfast(ROOT)
    from steadfast.nodes.host import identity
    from steadfast.nodes.optimize_node import SteadfastOptimizeModel
    from steadfast.nodes.patches import dynamic_vram as dv
    from steadfast.nodes.patches import options as so
    from steadfast.nodes.patches import quantize as quantize_patch

    out: dict[str, Any] = {"has_dynamic": hasattr(comfy.model_patcher.ModelPatcher, "is_dynamic")}
    model = comfy.sd.load_checkpoint_guess_config(sys.argv[2], output_vae=False, output_clip=False)[0]
    unet = model.model.diffusion_model
    out["compiler_state"] = dv.comfy_compiler_state()

    def optimize(m, **kw):
        args = dict(
            qkv_fusion=False,
            channels_last=False,
            attention="auto",
            compile="off",
            backend="eager",
            mode="default",
            dynamic="auto",
            fullgraph=False,
        )
        args.update(kw)
        res = SteadfastOptimizeModel.execute(model=m, **args)
        return res.args[0], res.args[1]

    if out["has_dynamic"]:

        class EmulatedDynamic(type(model)):
            def is_dynamic(self):
                return True

        dyn = model.clone()
        dyn.__class__ = EmulatedDynamic
        assert dv.is_dynamic(dyn)
        before = params_state(unet)
        opt, report = optimize(dyn, qkv_fusion=True, channels_last=True)
        out["dyn_report"] = report
        out["dyn_options"] = {k: getattr(so.steadfast_options(opt), k) for k in ("qkv_fusion", "channels_last")}
        out["dyn_object_patches"] = len(opt.object_patches)
        out["dyn_callbacks"] = sorted(
            k for k in ("steadfast.qkv", "steadfast.layout") if any(k in str(cbs) for cbs in opt.callbacks.values())
        )
        out["dyn_is_dynamic"] = dv.is_dynamic(opt)
        out["params_untouched"] = params_state(unet) == before
        try:
            optimize(dyn, quantize="int8-dynamic")
            out["dyn_quantize"] = "accepted"
        except ValueError as e:
            out["dyn_quantize"] = str(e)
        comp, report = optimize(dyn, qkv_fusion=True, compile="regional")
        out["compiled_clone_dynamic"] = dv.is_dynamic(comp)
        out["compiled_clone_same_module"] = comp.model is model.model
        out["compiled_report"] = report
        out["compiled_qkv"] = so.steadfast_options(comp).qkv_fusion

        # the Comfy Compiler (absent in 0.33.0): emulate its switch and Dynamic VRAM being active
        import comfy.memory_management as memory

        args = comfy.model_management.args
        saved = (getattr(memory, "aimdo_enabled", False),)
        args.disable_comfy_compiler = False
        memory.aimdo_enabled = True
        try:
            out["compiler_on_state"] = dv.comfy_compiler_state()
            try:
                optimize(model, compile="regional")
                out["compiler_on_compile"] = "accepted"
            except ValueError as e:
                out["compiler_on_compile"] = str(e)
            _, report = optimize(model, attention="math")  # no forward replaced: allowed
            out["compiler_on_attention_only"] = "accepted"
            args.disable_comfy_compiler = True
            out["compiler_disabled_state"] = dv.comfy_compiler_state()
        finally:
            memory.aimdo_enabled = saved[0]
            del args.disable_comfy_compiler
    else:
        plain, report = optimize(model, qkv_fusion=True, compile="regional")
        out["plain_report"] = report
        out["plain_qkv"] = so.steadfast_options(plain).qkv_fusion

    # quantize's refusal when ComfyUI did not apply a layer's patches (partial / dynamic load)
    q, _ = optimize(model, quantize="int8-dynamic")
    paths = [k[len("diffusion_model.") :] for k in q.object_patches if k.startswith("diffusion_model.")]
    layers = [q.object_patches[f"diffusion_model.{p}"] for p in paths]
    key = f"diffusion_model.{paths[0]}.weight"
    fake_patcher = type("P", (), {"patches": {key: [(1.0, torch.zeros(1), 1.0, None, None)]}})()
    out["unpatched_before_load"] = quantize_patch.unpatched_keys(fake_patcher, paths, layers)
    layers[0].comfy_patched_weights = True
    out["unpatched_after_load"] = quantize_patch.unpatched_keys(fake_patcher, paths, layers)
    del layers[0].comfy_patched_weights

    # the model digest: base weights + patches, the same whether a patch is in the Parameter or not
    lora_key = next(
        k
        for k in model.model.state_dict()
        if k.startswith("diffusion_model.") and k.endswith(".weight") and model.model.state_dict()[k].ndim == 2
    )
    w = model.model.state_dict()[lora_key]
    patched = model.clone()
    patched.add_patches({lora_key: (torch.full_like(w, 0.01),)}, strength_patch=1.0)
    out["digest_plain"] = identity.model_identity_of(model)
    out["digest_patched_unapplied"] = identity.model_identity_of(patched)  # as Dynamic VRAM: never written back
    patched.patch_model(device_to=torch.device("cpu"))  # legacy: the patch written into the Parameter
    out["digest_patched_applied"] = identity.model_identity_of(patched)
    out["param_changed_by_patch"] = not torch.equal(
        model.model.state_dict()[lora_key], patched.backup[lora_key].weight
    )
    patched.unpatch_model()
    half = model.clone()
    half.add_patches({lora_key: (torch.full_like(w, 0.01),)}, strength_patch=0.5)
    out["digest_half"] = identity.model_identity_of(half)
    print("RESULT " + json.dumps(out, default=str))


if __name__ == "__main__":
    main()
