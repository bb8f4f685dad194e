"""Child process for test_optimize_model_plan.py: Optimize Model's plan (validation, ordered steps, step reports) on
the tiny checkpoint's ModelPatcher, in-process on the CPU, printing one JSON line. Not a test module.

    python tests/comfy/optimize_plan_child.py REPO_ROOT CKPT
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

WIDGETS = dict(
    qkv_fusion=False,
    channels_last=False,
    attention="auto",
    compile="off",
    backend="eager",
    mode="default",
    dynamic="auto",
    fullgraph=False,
)


def main() -> None:
    import comfy.sd

    sys.path.insert(0, str(ROOT / "scripts"))
    from _steadfast_import import import_steadfast

    import_steadfast(ROOT)
    from steadfast.core import pipelines
    from steadfast.nodes import optimize_node
    from steadfast.nodes.inputs import COMPILE_CHOICES

    model = comfy.sd.load_checkpoint_guess_config(sys.argv[2], output_vae=False, output_clip=False)[0]
    cpu = torch.device("cpu")
    out: dict[str, Any] = {"compile_choices": COMPILE_CHOICES}

    def widgets(**kw: Any) -> dict[str, Any]:
        return {**WIDGETS, **kw}

    def refusal(**kw: Any) -> str:
        try:
            optimize_node.model_options(**widgets(**kw))
        except ValueError as e:
            return str(e)
        return "accepted"

    # validation, before anything is cloned
    out["bad_quantize"] = refusal(quantize="no-such-mode")
    out["preset_off_inductor_compiling"] = refusal(compile="regional", inductor_preset="diffusers-fast")
    out["preset_off_inductor_not_compiling"] = refusal(inductor_preset="diffusers-fast")
    out["bad_scope"] = refusal(compile="partial")

    # one plan type: the MODEL path's options are the pipeline path's
    opts = optimize_node.model_options(
        **widgets(qkv_fusion=True, channels_last=True, attention="math", precision="fp32")
    )
    out["same_type"] = type(opts) is pipelines.OptimizeOptions
    out["scope"], out["compile_backend"] = opts.scope, opts.compile.backend
    m, steps = optimize_node.optimize_model(model, opts, cpu)
    out["steps"] = [[s.step, s.applied] for s in steps]
    out["all_step_reports"] = all(type(s) is pipelines.StepReport for s in steps)
    out["plan_text"] = "\n".join(line for s in steps for line in s.lines)
    node = optimize_node.SteadfastOptimizeModel.execute(
        model=model, **widgets(qkv_fusion=True, channels_last=True, attention="math", precision="fp32")
    )
    out["node_text"] = node.args[1]
    out["clone_not_input"] = m is not model

    # compiling comes last; a preset with compile off is a note in the plan
    opts = optimize_node.model_options(**widgets(qkv_fusion=True, compile="regional", attention="math"))
    _, steps = optimize_node.optimize_model(model, opts, cpu)
    out["compile_steps"] = [s.step for s in steps]
    out["compile_modules"] = next(s.modules for s in steps if s.step == "compile")
    opts = optimize_node.model_options(**widgets(inductor_preset="diffusers-fast"))
    _, steps = optimize_node.optimize_model(model, opts, cpu)
    out["preset_steps"] = [[s.step, s.applied, s.lines] for s in steps]
    print("RESULT " + json.dumps(out, default=str))


if __name__ == "__main__":
    main()
