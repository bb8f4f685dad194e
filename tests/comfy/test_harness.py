"""The ComfyUI harness (headless/comfy_server.py) and the tiny SD1.5 checkpoint (headless/tiny_sd15.py),
proved with STOCK ComfyUI nodes only: CheckpointLoaderSimple -> CLIPTextEncode x2 -> EmptyLatentImage 64x64
-> KSampler (euler, 4 steps) -> VAEDecode -> SaveImage, PNG read back through GET /view, pixels hashed.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_sd15
from comfy_server import ComfyServer, PromptFailed, PromptRejected
from PIL import Image

pytestmark = pytest.mark.comfyui

SCRIPTS = Path(__file__).resolve().parents[2] / "headless"
TINY_CKPT_NAME = tiny_sd15.CHECKPOINT_NAME

PROMPT_A = "a red fox in the snow, photograph"
PROMPT_B = "a blue car parked at night"


def sd15_prompt(seed: int, text: str, negative: str = "blurry", steps: int = 4) -> dict[str, Any]:
    """API-format txt2img graph of stock nodes; node "9" (SaveImage) holds the image."""
    return {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": TINY_CKPT_NAME}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": text, "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": negative, "clip": ["4", 1]}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "seed": seed,
                "steps": steps,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
                "model": ["4", 0],
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
            },
        },
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "steadfast_harness", "images": ["8", 0]}},
    }


def render(server: ComfyServer, seed: int, text: str) -> tuple[np.ndarray, dict[str, Any]]:
    """Run the graph; return the saved image's pixels (uint8 [64,64,3]) and the history entry."""
    entry = server.wait(server.queue(sd15_prompt(seed, text)), timeout=300)
    images = entry["outputs"]["9"]["images"]
    assert len(images) == 1, images
    pixels = np.asarray(Image.open(io.BytesIO(server.view(images[0]))).convert("RGB"))
    return pixels, entry


def pixel_hash(pixels: np.ndarray) -> str:
    return hashlib.sha256(
        f"{pixels.dtype}|{pixels.shape}|".encode() + np.ascontiguousarray(pixels).tobytes()
    ).hexdigest()


def cached_nodes(entry: dict[str, Any]) -> list[str]:
    """Node ids the run took from ComfyUI's cache (``execution_cached`` message)."""
    nodes: list[str] = []
    for event, data in entry["status"]["messages"]:
        if event == "execution_cached":
            nodes += data["nodes"]
    return nodes


@pytest.fixture(scope="module")
def baseline(comfy_server: ComfyServer) -> tuple[np.ndarray, str]:
    comfy_server.free()
    pixels, entry = render(comfy_server, seed=1, text=PROMPT_A)
    assert entry["status"]["status_str"] == "success"
    return pixels, pixel_hash(pixels)


def test_checkpoint_is_detected_as_sd15_with_clip_and_taesd(tiny_ckpt: Path) -> None:
    # In a child process so this test process never imports comfy.
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "tiny_sd15.py"), str(tiny_ckpt), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (info["model_config"], info["model_type"], info["clip"], info["vae"]) == (
        "SD15",
        "EPS",
        "SD1ClipModel",
        "TAESD",
    )
    assert info["cond_max_abs_diff"] > 0.1  # two prompts give clearly different text conditioning
    assert info["max_abs_diff_prompt"] > 0.05 and info["max_abs_diff_seed"] > 0.05
    assert info["max_abs_diff_rerun"] == 0.0
    assert 0.05 < info["image_std"] and info["pct_saturated"] < 20.0  # an image, neither flat nor clipped


def test_render_is_a_real_image(baseline: tuple[np.ndarray, str]) -> None:
    pixels, _ = baseline
    assert pixels.shape == (64, 64, 3) and pixels.dtype == np.uint8
    assert pixels.std() > 5.0
    assert len(np.unique(pixels)) > 32


def test_rerun_after_free_is_bit_identical(comfy_server: ComfyServer, baseline: tuple[np.ndarray, str]) -> None:
    comfy_server.free()
    pixels, entry = render(comfy_server, seed=1, text=PROMPT_A)
    assert cached_nodes(entry) == []  # /free dropped the caches: every node ran again
    assert pixel_hash(pixels) == baseline[1]
    assert np.array_equal(pixels, baseline[0])


def test_seed_changes_pixels(comfy_server: ComfyServer, baseline: tuple[np.ndarray, str]) -> None:
    pixels, entry = render(comfy_server, seed=2, text=PROMPT_A)
    assert "3" not in cached_nodes(entry)
    assert pixel_hash(pixels) != baseline[1]
    assert (pixels != baseline[0]).any(axis=-1).mean() > 0.1  # not a stray pixel: a different image


def test_prompt_changes_pixels(comfy_server: ComfyServer, baseline: tuple[np.ndarray, str]) -> None:
    pixels, entry = render(comfy_server, seed=1, text=PROMPT_B)
    assert "6" not in cached_nodes(entry)
    assert pixel_hash(pixels) != baseline[1]
    assert (pixels != baseline[0]).any(axis=-1).mean() > 0.1


def test_invalid_prompt_raises_prompt_rejected_with_node_errors(comfy_server: ComfyServer) -> None:
    prompt = sd15_prompt(1, PROMPT_A)
    prompt["4"]["inputs"]["ckpt_name"] = "no_such_checkpoint.safetensors"
    with pytest.raises(PromptRejected) as info:
        comfy_server.queue(prompt)
    assert "4" in info.value.node_errors
    assert "no_such_checkpoint" in json.dumps(info.value.node_errors)


def test_runtime_error_raises_prompt_failed(comfy_server: ComfyServer) -> None:
    # A 3-channel image has no alpha channel: ImageToMask fails while executing (not at validation).
    prompt = {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageToMask", "inputs": {"image": ["1", 0], "channel": "alpha"}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
    }
    with pytest.raises(PromptFailed) as info:
        comfy_server.run(prompt)
    assert info.value.node_id == "2"
    assert info.value.exception_type is not None and "IndexError" in info.value.exception_type
    assert info.value.exception_message
    assert comfy_server.is_running()


@pytest.mark.slow
def test_same_pixels_after_server_restart(comfy_server: ComfyServer, baseline: tuple[np.ndarray, str]) -> None:
    old_pid = comfy_server.process.pid
    comfy_server.restart()
    assert comfy_server.process.pid != old_pid
    pixels, _ = render(comfy_server, seed=1, text=PROMPT_A)
    assert pixel_hash(pixels) == baseline[1]


@pytest.mark.slow
def test_builder_is_deterministic(tiny_ckpt: Path, tmp_path: Path) -> None:
    # Another process, another time: the bytes must equal the (possibly long-)cached file of the same version.
    out = tmp_path / "rebuilt.safetensors"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "tiny_sd15.py"), str(out), "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert out.read_bytes() == tiny_ckpt.read_bytes()
    assert tiny_sd15.BUILDER_VERSION in tiny_ckpt.name
