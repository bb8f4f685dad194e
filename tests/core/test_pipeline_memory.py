"""Pipelines inside the host's memory management (issue 24 item 7) and the pipeline-wide attention pin (item 3).

A pipeline loaded for a GPU with ``keep_on_cpu`` stays on the CPU; :func:`on_run_device` asks the host to make room
(ComfyUI: ``comfy.model_management.free_memory``), moves it for the call and back after it. The real move to a GPU:
``tests/comfy/test_gpu_correctness.py::test_pipeline_moves_to_the_gpu_only_for_the_call``.
"""

from __future__ import annotations

import pipeline_fixtures as tp
import pytest
import torch

from steadfast.core.optimize import attention as attn_mod
from steadfast.core.pipelines.attention import UnsupportedAttentionError, resolve_attention
from steadfast.core.pipelines.load import RUN_DEVICE_ATTR, on_run_device, pipeline_bytes, run_device
from steadfast.core.pipelines.share import share_pipeline


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory):
    return tp.tiny_dir(tmp_path_factory.mktemp("tiny"), "sd")


def test_keep_on_cpu_records_the_run_device_and_moves_nothing(sd_dir):
    pipe = tp.fresh(sd_dir, device="cuda:0", keep_on_cpu=True)  # no CUDA needed: nothing is moved at load
    assert getattr(pipe, RUN_DEVICE_ATTR) == "cuda:0" and run_device(pipe) == torch.device("cuda:0")
    assert all(p.device.type == "cpu" for p in pipe.unet.parameters())
    assert getattr(share_pipeline(pipe), RUN_DEVICE_ATTR) == "cuda:0"  # the optimized copies run there too
    assert run_device(tp.fresh(sd_dir)) == torch.device("cpu")
    assert pipeline_bytes(pipe) == sum(
        t.numel() * t.element_size()
        for m in pipe.components.values()
        if isinstance(m, torch.nn.Module)
        for t in [*m.parameters(), *m.buffers()]
    )


class _FakePipe:
    """Records moves; one module component (so :func:`pipeline_bytes` has something to count)."""

    def __init__(self, device):
        self.components = {"unet": torch.nn.Linear(4, 4)}
        setattr(self, RUN_DEVICE_ATTR, device)
        self.calls = []

    def to(self, device):
        self.calls.append(("to", str(device)))
        return self


def test_on_run_device_makes_room_moves_and_moves_back_even_on_error():
    pipe = _FakePipe("cuda:0")

    def make_room(size, device):
        pipe.calls.append(("make_room", size, str(device)))

    with on_run_device(pipe, make_room):
        pipe.calls.append("call")
    assert pipe.calls == [("make_room", 4 * 4 * 4 + 4 * 4, "cuda:0"), ("to", "cuda:0"), "call", ("to", "cpu")]
    pipe.calls.clear()
    with pytest.raises(RuntimeError, match="out of memory"), on_run_device(pipe, make_room):
        raise RuntimeError("out of memory")
    assert pipe.calls[-1] == ("to", "cpu")
    cpu = _FakePipe("cpu")
    with on_run_device(cpu, make_room):
        pass
    assert cpu.calls == []  # a CPU pipeline is left alone


def test_a_pipeline_pin_torch_refuses_for_masks_or_fp32_is_refused_up_front(sd_dir, monkeypatch):
    """The pin covers the whole call (text encoder, VAE): a backend that fails with a mask or in fp32 (CUDA flash,
    emulated here: CPU kernels take every case) is refused when optimizing, not after the steps."""
    real = attn_mod._probe

    def fake(name, device, dtype, head_dim, mask=False, deterministic=False):
        if name == "flash" and (mask or dtype == torch.float32):
            return "RuntimeError: No available kernel. Aborting execution."
        return real(name, device, dtype, head_dim, mask, deterministic)

    monkeypatch.setattr(attn_mod, "_probe", fake)
    unet = tp.fresh(sd_dir).unet
    with pytest.raises(UnsupportedAttentionError, match="pinned around the whole pipeline call"):
        resolve_attention("flash", unet, "cpu", torch.bfloat16)
    assert resolve_attention("math", unet, "cpu", torch.bfloat16)[1] == "math"
