"""CUDA determinism as current practice does it, the part a CPU can test (issue 46, item 5):

- set: ``CUBLASLT_WORKSPACE_SIZE`` beside ``CUBLAS_WORKSPACE_CONFIG`` at the pack's import (vLLM's recipe), an
  operator's value kept;
- recorded: both in the environment fingerprint where CUDA is available (a fake CUDA here), absent without it;
- explained: a difference in either is a named cause, and the two upstream sources of run-to-run differences (a LoRA
  on fp8 weights under Dynamic VRAM, ComfyUI issue 15365; ComfyUI's multi-GPU CFG split) are named when a record
  shows them in use, even when no recorded field differs.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from steadfast.core.determinism import cublas as cublas_config
from steadfast.core.record import environment, explain


def test_both_variables_are_set_at_import() -> None:
    record = cublas_config.cublas_config_record()  # the package __init__ called ensure_cublas_workspace_config()
    assert record is not None
    assert record.lt_workspace_size == os.environ["CUBLASLT_WORKSPACE_SIZE"]
    if record.lt_set_by_steadfast:
        assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == cublas_config.CUBLASLT_WORKSPACE_KIB == "1"


@pytest.mark.parametrize("preset", [None, "4096"])
def test_set_when_unset_and_an_operators_value_kept(monkeypatch: pytest.MonkeyPatch, preset: str | None) -> None:
    monkeypatch.setattr(cublas_config, "_cublas_record", None)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    if preset is None:
        monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    else:
        monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", preset)
    cublas_config.ensure_cublas_workspace_config()
    record = cublas_config.cublas_config_record()
    want = preset or cublas_config.CUBLASLT_WORKSPACE_KIB
    assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == record.lt_workspace_size == want
    assert record.lt_set_by_steadfast is (preset is None)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == record.value == ":4096:8"
    assert cublas_config.cublas_env() == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUBLASLT_WORKSPACE_SIZE": want}


def _fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)


def test_recorded_in_the_fingerprint_where_cuda_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "1")
    if not torch.cuda.is_available():
        fp = environment.environment_fingerprint()
        assert "cublas_workspace_config" not in fp and "cublaslt_workspace_size" not in fp
    _fake_cuda(monkeypatch)
    fp = environment.environment_fingerprint()
    assert (fp["cublas_workspace_config"], fp["cublaslt_workspace_size"]) == (":16:8", "1")
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE")
    assert environment.environment_fingerprint()["cublaslt_workspace_size"] is None


def _record(**fp) -> dict:
    base = {
        "seeds": [42],
        "fingerprint": {"torch": "2.11.0", "num_threads": 8, "dtype": "torch.float16", "dynamic_vram": False},
        "model": {"digest": "d" * 64, "patched_keys": 0},
    }
    base["fingerprint"].update(fp)
    return base


@pytest.mark.parametrize("field", ["cublas_workspace_config", "cublaslt_workspace_size", "multigpu_cfg_split"])
def test_a_difference_in_each_is_a_named_cause(field: str) -> None:
    values = {
        "cublas_workspace_config": (":4096:8", ":16:8"),
        "cublaslt_workspace_size": ("1", None),
        "multigpu_cfg_split": (None, ["cuda:1"]),
    }[field]
    a, b = _record(), _record()
    for rec, v in zip((a, b), values):
        if v is not None:
            rec["fingerprint"][field] = v
    (diff,) = explain.explain(a, b).diffs
    assert diff.field.startswith(f"fingerprint.{field}") and diff.known, diff
    expected, text = explain.expected_difference(a, b)
    assert expected and field in text


def test_a_lora_on_fp8_weights_under_dynamic_vram_is_named_with_nothing_recorded_differing() -> None:
    rec = _record(dynamic_vram=True, dtype="torch.float8_e4m3fn (compute torch.bfloat16)")
    rec["model"]["patched_keys"] = 192
    e = explain.explain(rec, copy.deepcopy(rec))
    assert e.identical and e.upstream == (explain.UPSTREAM_LORA_FP8_DYNAMIC_VRAM,)
    text = e.as_text()
    assert "nothing recorded differs" in text and "issue 15365" in text and "5-7/255" in text
    assert "--disable-dynamic-vram" in text and e.as_dict()["upstream"] == list(e.upstream)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"dynamic_vram": False}, "Dynamic VRAM off"),
        ({"dtype": "torch.bfloat16"}, "weights not fp8"),
        ({"patched_keys": 0}, "no LoRA"),
    ],
)
def test_the_lora_fp8_source_needs_all_three(change: dict, why: str) -> None:
    rec = _record(dynamic_vram=True, dtype="torch.float8_e4m3fn")
    rec["model"]["patched_keys"] = 12
    if "patched_keys" in change:
        rec["model"]["patched_keys"] = change["patched_keys"]
    else:
        rec["fingerprint"].update(change)
    assert explain.upstream_sources(rec) == [], why


def test_the_multigpu_cfg_split_is_named_beside_the_differing_fields() -> None:
    a, b = _record(multigpu_cfg_split=["cuda:1"]), _record(multigpu_cfg_split=["cuda:1"], num_threads=4)
    e = explain.explain(a, b)
    assert [d.field for d in e.diffs] == ["fingerprint.num_threads"]
    assert e.upstream == (explain.UPSTREAM_MULTIGPU_CFG_SPLIT,)
    assert "different devices" in e.as_text() and "MultiGPU CFG Split" in e.as_text()
    assert explain.upstream_sources(_record()) == []
