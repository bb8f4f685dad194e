"""core/portable.free_memory_refusals: portable mode names every node whose bits ComfyUI lets free memory decide
(stock samplers without Determinism Setup's batch_invariant, ComfyUI's VAE Decode / Encode), with the fix.
The end-to-end half (the hazard under squeezed free memory on a portable server, the CLI's refusal) is
tests/comfy/test_portable.py::test_portable_mode_and_free_memory."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from steadfast.core.determinism import portable

ROOT = Path(__file__).resolve().parents[2]


def stock() -> dict:
    """Checkpoint -> KSampler -> VAE Decode -> Save Image: ComfyUI's default workflow (API format)."""
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "x.safetensors"}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "b", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "5": {
            "class_type": "KSampler",
            "inputs": {
                "model": ["1", 0],
                "positive": ["2", 0],
                "negative": ["3", 0],
                "latent_image": ["4", 0],
                "seed": 1,
                "steps": 2,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
            },
        },
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "x"}},
    }


def fixed() -> dict:
    """The same with Determinism Setup (batch_invariant on, its default) before the model patch chain and VAE
    Decode (Steadfast): nothing left to free memory."""
    wf = stock()
    wf["8"] = {"class_type": "SteadfastDeterminismSetup", "inputs": {"model": ["1", 0]}}
    wf["9"] = {
        "class_type": "LoraLoaderModelOnly",
        "inputs": {"model": ["8", 0], "lora_name": "l.safetensors", "strength_model": 1.0},
    }
    wf["5"]["inputs"]["model"] = ["9", 0]
    wf["6"]["class_type"] = "SteadfastVAEDecode"
    return wf


def test_a_stock_workflow_is_refused_naming_each_node_and_its_fix() -> None:
    out = portable.free_memory_refusals(stock())
    assert len(out) == 2, out
    assert out[0].startswith("node 5 (KSampler)") and "Determinism Setup (batch_invariant on)" in out[0]
    assert out[1].startswith("node 6 (VAEDecode)") and "VAE Decode (Steadfast)" in out[1]


def test_the_fixed_workflow_and_the_golden_one_pass() -> None:
    assert portable.free_memory_refusals(fixed()) == []
    golden = json.loads((ROOT / "example_workflows" / "api" / "determinism_check.json").read_text())
    assert portable.free_memory_refusals(golden) == []


def test_batch_invariant_off_or_on_another_branch_is_refused() -> None:
    off = fixed()
    off["8"]["inputs"]["batch_invariant"] = False
    assert [m[:16] for m in portable.free_memory_refusals(off)] == ["node 5 (KSampler"]
    other = fixed()  # Determinism Setup feeds a second sampler only; node 5 takes the loader's model
    other["5"]["inputs"]["model"] = ["1", 0]
    other["10"] = copy.deepcopy(other["5"])
    other["10"]["inputs"]["model"] = ["9", 0]
    assert [m[:16] for m in portable.free_memory_refusals(other)] == ["node 5 (KSampler"]
    # a latent that came from a batch-invariant sampler does not make the next sampler's model invariant
    chained = fixed()
    chained["11"] = copy.deepcopy(chained["5"])
    chained["11"]["inputs"].update(model=["1", 0], latent_image=["5", 0])
    assert [m[:17] for m in portable.free_memory_refusals(chained)] == ["node 11 (KSampler"]


def test_custom_sampler_through_its_guider_and_vae_encode() -> None:
    wf = fixed()
    wf["12"] = {
        "class_type": "CFGGuider",
        "inputs": {"model": ["9", 0], "positive": ["2", 0], "negative": ["3", 0], "cfg": 7.0},
    }
    wf["13"] = {"class_type": "SamplerCustomAdvanced", "inputs": {"guider": ["12", 0], "latent_image": ["4", 0]}}
    assert portable.free_memory_refusals(wf) == []
    wf["12"]["inputs"]["model"] = ["1", 0]
    wf["14"] = {"class_type": "VAEEncode", "inputs": {"pixels": ["6", 0], "vae": ["1", 2]}}
    out = portable.free_memory_refusals(wf)
    assert [m.split(":")[0] for m in out] == ["node 13 (SamplerCustomAdvanced)", "node 14 (VAEEncode)"], out
    assert "Save Latent / Load Latent" in out[1]
