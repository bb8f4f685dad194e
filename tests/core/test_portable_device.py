"""Portable mode refuses a model or pipeline on a GPU (issue 24 item 9): its records would say ``portable: true`` for
bits a GPU computed. Through a server on a GPU:
``tests/comfy/test_gpu_correctness.py::test_portable_mode_refuses_a_cuda_model``."""

from __future__ import annotations

import pytest
import torch

from steadfast.core.determinism import portable


def test_portable_mode_refuses_a_gpu_device_with_a_message(monkeypatch):
    monkeypatch.setenv(portable.ENV_FLAG, "1")
    for device in ("cuda:0", torch.device("cuda", 1), "mps"):
        with pytest.raises(portable.PortableModeError, match="--cpu") as err:
            portable.check_device(device, "the model")
        assert f"the model on {device}" in str(err.value)
    portable.check_device("cpu")
    portable.check_device(torch.device("cpu"))


def test_outside_portable_mode_any_device_passes(monkeypatch):
    monkeypatch.delenv(portable.ENV_FLAG, raising=False)
    portable.check_device("cuda:0")
