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
import os
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


def reexecuted_optimize(ckpt: str, dynamic_class: type, optimize: Any) -> dict[str, Any]:
    """Optimize Model executed again on Dynamic VRAM MODELs of one base module, as ComfyUI does whenever a prompt
    without it has evicted its output (0.33.0's RAM-pressure cache drops every output the running prompt does not
    use), with the node before it (a LoRA loader: a new patcher each time) run again too: how often the weights are
    loaded again (``cached_patcher_init``), which module each compiled copy runs, the bytes of a sample from each
    against the non-dynamic copy built the old way, and which patcher ComfyUI's loaded-model list holds the
    non-dynamic module by once the node's output is gone. The checkpoint is loaded here, so that its module (and the
    copy kept with it) can be freed at the end."""
    import gc
    import weakref

    import comfy.model_management as mm
    import comfy.sample
    import comfy.sd

    from steadfast.nodes.patches.dynamic_vram import is_dynamic as dv_is_dynamic
    from steadfast.nodes.patches.dynamic_vram import non_dynamic_base

    reloads = []
    dyn = comfy.sd.load_checkpoint_guess_config(ckpt, output_vae=False, output_clip=False)[0].clone()
    dyn.__class__ = dynamic_class
    init = dyn.cached_patcher_init

    def counted(*a: Any, **kw: Any) -> Any:
        reloads.append(1)
        return init[0](*a, **kw)

    dyn.cached_patcher_init = (counted, *init[1:])
    g = torch.Generator().manual_seed(5)
    pos = [[torch.randn(1, 77, 768, generator=g), {}]]
    neg = [[torch.randn(1, 77, 768, generator=g), {}]]
    noise = torch.randn(1, 4, 8, 8, generator=g)

    def sample(m: Any) -> torch.Tensor:
        latent = torch.zeros(1, 4, 8, 8)
        return comfy.sample.sample(m, noise, 2, 3.0, "euler", "normal", pos, neg, latent, disable_pbar=True, seed=5)

    lora_key = next(k for k, w in dyn.model.state_dict().items() if k.endswith("to_q.weight"))
    w = dyn.model.state_dict()[lora_key]

    def lora(m: Any, value: float = 0.02) -> Any:
        """what LoraLoaderModelOnly returns: a clone of ``m`` (another Dynamic VRAM patcher, same module) + patches"""
        out = m.clone()
        out.add_patches({lora_key: (torch.full_like(w, value),)}, strength_patch=1.0)
        return out

    compile_eager = {"compile": "regional", "backend": "eager"}
    lora_in = lora(dyn)
    lora_opt, _ = optimize(lora_in, **compile_eager)  # ckpt -> LoRA -> Optimize: the copy is built here
    lora_opt_again, _ = optimize(lora(dyn), **compile_eager)  # both executed again: a new LoRA patcher
    first, _ = optimize(dyn, **compile_eager)  # ckpt -> Optimize
    second, _ = optimize(dyn, **compile_eager)
    kept = non_dynamic_base(dyn)
    res: dict[str, Any] = {
        "reexec_reloads": len(reloads),
        "reexec_same_module": first.model is second.model is lora_opt.model is lora_opt_again.model is kept.model,
        "reexec_module_is_dynamic_ones": first.model is dyn.model,
        "reexec_dynamic": [dv_is_dynamic(m) for m in (first, second, lora_opt, lora_opt_again)],
        "reexec_kept_is_bare": kept.patches == {} and kept.parent is None and not kept.object_patches,
    }
    del kept
    lora_in_ref = weakref.ref(lora_in)  # kept alive by its Optimize output, by nothing of the copy
    la_first = sample(lora_opt)
    del lora_in, lora_opt
    gc.collect()
    res["reexec_lora_patcher_freed"] = lora_in_ref() is None
    old_way = dyn.clone(disable_dynamic=True)  # what Optimize compiled before: a fresh non-dynamic copy per execution
    reloads.clear()
    a, b = sample(first), sample(second)
    ref, _ = optimize(old_way, **compile_eager)
    r = sample(ref)
    after = first.clone()  # a LoRA-like patch after Optimize: a clone sharing the reused module
    after.add_patches({lora_key: (torch.full_like(w, 0.02),)}, strength_patch=1.0)
    p = sample(after)
    a_again = sample(second)
    lora_ref, _ = optimize(lora(dyn).clone(disable_dynamic=True), **compile_eager)
    la, lb, lr = la_first, sample(lora_opt_again), sample(lora_ref)
    res.update(
        reexec_equal=torch.equal(a, b) and torch.equal(a, r),
        reexec_max_abs_vs_old=float((a - r).abs().max()),
        reexec_patch_after_changes=not torch.equal(p, a),
        reexec_unpatched_again=torch.equal(a_again, a) and torch.equal(sample(second), a),  # after the LoRA ones too
        reexec_lora_equal_old=torch.equal(la, lr) and torch.equal(lb, lr),
        reexec_lora_max_abs_vs_old=float((la - lr).abs().max()),
        reexec_lora_changes=not torch.equal(la, a),
    )
    saved = noise.clone()
    noise.add_(1.0)  # the random-weight model must depend on its input
    res["reexec_input_dependent"] = not torch.equal(sample(second), a)
    noise.copy_(saved)
    dyn.add_patches({lora_key: (torch.full_like(w, 0.03),)}, strength_patch=1.0)  # changed in place (no node
    third, _ = optimize(dyn, **compile_eager)  # should do that): each execution takes the patches as they are now
    fresh, _ = optimize(dyn.clone(disable_dynamic=True), **compile_eager)
    t3 = sample(third)
    res.update(
        reexec_current_patches=torch.equal(t3, sample(fresh)) and not torch.equal(t3, a),
        reexec_current_same_module=third.model is first.model,
    )
    module = first.model
    del first, second, after, a_again, third, fresh, lora_opt_again
    gc.collect()
    holders = [lm.model for lm in mm.current_loaded_models if lm.real_model is not None and lm.real_model() is module]
    res["reexec_tracked_by"] = [
        "dead"
        if h is None
        else ("dynamic" if dv_is_dynamic(h) else "non-dynamic, same module")
        if h.model is module
        else "another module"
        for h in holders
    ]
    gone = weakref.ref(module)  # the copy goes with its Dynamic VRAM module: nothing else keeps it
    del module, holders, dyn, old_way, ref, lora_ref  # every patcher that leads to the dynamic module
    gc.collect()
    res["reexec_freed_with_its_model"] = gone() is None
    return res


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

        out.update(reexecuted_optimize(sys.argv[2], EmulatedDynamic, optimize))
        custom = dyn.clone()  # a custom loader's MODEL: no cached_patcher_init to rebuild the copy from
        custom.model = comfy.sd.load_checkpoint_guess_config(sys.argv[2], output_vae=False, output_clip=False)[0].model
        custom.cached_patcher_init = None
        try:
            optimize(custom, compile="regional")
            out["no_rebuild_recipe"] = "accepted"
        except ValueError as e:
            out["no_rebuild_recipe"] = str(e)

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
    # torch 2.11 can die with SIGSEGV at interpreter exit, after the result is printed: its Dynamo guard finalizers
    # free a GuardManager that reads a freed capsule (docs/compatibility.md, the torch 2.11 exit row). Leave now.
    sys.stdout.flush()
    os._exit(0)
