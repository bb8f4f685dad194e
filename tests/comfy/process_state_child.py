"""Child process for test_process_state.py: run a full Steadfast workflow in-process (ComfyUI imported, CPU)
and print snapshots of the process-wide state before the pack is imported, after the import, after one run
and after a second run, as one JSON line. Not a test module.

    python tests/comfy/process_state_child.py REPO_ROOT CKPT
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(sys.argv[1])
sys.path.insert(0, str(ROOT / "headless"))
import tiny_sd15  # noqa: E402

tiny_sd15.import_comfy()
import torch  # noqa: E402


def _config(module_name: str) -> dict[str, str]:
    module = sys.modules.get(module_name)
    if module is None or not hasattr(module, "get_config_copy"):
        return {}
    return {k: repr(v) for k, v in module.get_config_copy().items()}


def snapshot() -> dict[str, Any]:
    """Every process-wide setting Steadfast could change, as comparable text."""
    loggers = {"": logging.getLogger()} | {n: logging.getLogger(n) for n in logging.root.manager.loggerDict}
    return {
        "env": dict(os.environ),
        "torch": {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "cudnn.deterministic": torch.backends.cudnn.deterministic,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "num_threads": torch.get_num_threads(),
            "default_dtype": str(torch.get_default_dtype()),
            "grad_enabled": torch.is_grad_enabled(),
        },
        "logging": {
            name: f"level={lg.level} handlers={sorted(type(h).__name__ for h in lg.handlers)} "
            f"propagate={lg.propagate} disabled={lg.disabled}"
            for name, lg in loggers.items()
            if isinstance(lg, logging.Logger)
        },
        "dynamo_config": _config("torch._dynamo.config"),
        "inductor_config": _config("torch._inductor.config"),
    }


def params_state(module: torch.nn.Module) -> dict[str, str]:
    """Per parameter: where its data lives (pointer, strides) and a digest of its values."""
    from steadfast.core.record.hashing import tensor_digest

    return {n: f"{p.data_ptr()}|{tuple(p.stride())}|{tensor_digest(p.detach())}" for n, p in module.named_parameters()}


def main() -> None:
    # ComfyUI's own modules (what a server has imported before it loads custom nodes): their import-time
    # effects (e.g. logging set-up) are ComfyUI's, not the pack's.
    import comfy.ldm.modules.attention  # noqa: E401,F401
    import comfy.model_management  # noqa: E401,F401
    import comfy.patcher_extension
    import comfy.sample
    import comfy.samplers
    import comfy.sd
    import comfy.utils
    import latent_preview  # noqa: F401

    out: dict[str, Any] = {"before_pack": snapshot()}
    sys.path.insert(0, str(ROOT / "scripts"))
    from _steadfast_import import import_steadfast

    import_steadfast(ROOT)
    import comfy.sd

    from steadfast.nodes.determinism_node import SteadfastDeterminismSetup
    from steadfast.nodes.hash_node import SteadfastHash
    from steadfast.nodes.optimize_node import SteadfastOptimizeModel
    from steadfast.nodes.sampler_node import SteadfastSeededSampler

    out["after_import"] = snapshot()

    with torch.inference_mode():  # as ComfyUI's executor runs nodes
        model, clip, _, _ = comfy.sd.load_checkpoint_guess_config(sys.argv[2], output_vae=False, output_clip=True)
        pos = clip.encode_from_tokens_scheduled(clip.tokenize("a red fox"))
        neg = clip.encode_from_tokens_scheduled(clip.tokenize(""))
        unet = model.model.diffusion_model
        out["params_before"] = params_state(unet)
        det = SteadfastDeterminismSetup.execute(model=model, strict=True, allow_tf32=False, num_threads=1).result[0]
        opt = SteadfastOptimizeModel.execute(
            model=det,
            qkv_fusion=True,
            channels_last=True,
            attention="math",
            compile="regional",
            backend="inductor",
            mode="default",
            dynamic="true",
            fullgraph=False,
            quantize="int8-dynamic",
        ).result[0]
    hashes = []
    for key in ("after_run", "after_second_run"):
        with torch.inference_mode():
            latent = {"samples": torch.zeros(1, 4, 8, 8)}
            res = SteadfastSeededSampler.execute(
                model=opt,
                seed=1,
                steps=2,
                cfg=5.0,
                sampler_name="euler_ancestral",
                scheduler="normal",
                positive=pos,
                negative=neg,
                latent_image=latent,
                denoise=1.0,
                batch_seed_mode="incremental",
            )
            hashes.append(SteadfastHash.execute(latent=res.result[0]).result[0])
        out[key] = snapshot()
    out["params_after"] = params_state(unet)
    out["hashes"] = hashes
    print("STATE " + json.dumps(out, default=str))


if __name__ == "__main__":
    main()
