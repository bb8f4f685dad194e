"""core/record/explain.py: a mismatch lists every recorded field that differs, classed; identical explains nothing."""

from __future__ import annotations

import copy
import json

import pytest

from steadfast.core.record import explain


def _record() -> dict:
    return {
        "seeds": [42, 43],
        "batch_seed_mode": "incremental",
        "sampler": "euler",
        "scheduler": "normal",
        "steps": 4,
        "cfg": 7.0,
        "denoise": 1.0,
        "latent_shape": [2, 4, 8, 8],
        "latent_sha256": "ab" * 32,
        "model": {"digest": "11" * 32, "file": "tiny.safetensors", "file_size": 123},
        "fingerprint": {
            "torch": "2.14.1",
            "python": "3.11.7",
            "num_threads": 2,
            "dtype": "torch.float32",
            "attention": "pytorch_sdpa:auto",
            "compile": {"mode": "regional", "backend": "inductor", "first_call_seconds": 12.5},
            "flags": {"deterministic_algorithms": True},
            "comfyui": "0.8.0",
        },
    }


@pytest.mark.parametrize(
    "path,value,field",
    [
        (("fingerprint", "num_threads"), 1, "fingerprint.num_threads"),
        (("fingerprint", "attention"), "pytorch_sdpa:math", "fingerprint.attention"),
        (("fingerprint", "compile", "mode"), "full", "fingerprint.compile.mode"),
        (("fingerprint", "dtype"), "torch.bfloat16", "fingerprint.dtype"),
        (("seeds",), [7, 8], "seeds"),
        (("model", "digest"), "22" * 32, "model.digest"),
        (("fingerprint", "flags", "deterministic_algorithms"), False, "fingerprint.flags.deterministic_algorithms"),
        # issue 24: ComfyUI 0.33's loading switches and the model digest's parts are labelled
        (("fingerprint", "fast_disk"), True, "fingerprint.fast_disk"),
        (("fingerprint", "cuda_graphs"), "disabled (--disable-cuda-graphs)", "fingerprint.cuda_graphs"),
        (("fingerprint", "comfy_compiler"), "on", "fingerprint.comfy_compiler"),
        (("fingerprint", "dynamic_vram"), True, "fingerprint.dynamic_vram"),
        (("model", "patches_digest"), "33" * 32, "model.patches_digest"),
        (("model", "base_digest"), "44" * 32, "model.base_digest"),
    ],
)
def test_each_change_is_named_and_known(path, value, field) -> None:
    ref, now = _record(), _record()
    target = now
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    e = explain.explain(json.dumps(ref), now)
    assert [d.field for d in e.diffs] == [field]
    assert e.diffs[0].known and not e.identical
    text = e.as_text()
    assert f"{field}: " in text and "->" in text and "changes bits" in text


def test_thread_change_text() -> None:
    now = _record()
    now["fingerprint"]["num_threads"] = 1
    assert "fingerprint.num_threads: 2 -> 1  [changes bits" in explain.explain(_record(), now).as_text()


def test_identical_environments_explain_nothing_and_say_so() -> None:
    ref, now = _record(), copy.deepcopy(_record())
    now["latent_sha256"] = "cd" * 32  # the thing being explained, not a cause
    now["fingerprint"]["compile"]["first_call_seconds"] = 1.0  # timings differ every run
    e = explain.explain(ref, now)
    assert e.identical and e.diffs == ()
    assert "nothing recorded differs" in e.as_text()


def test_unknown_fields_are_may_change_and_absent_is_shown() -> None:
    now = _record()
    now["fingerprint"]["python"] = "3.12.1"
    del now["fingerprint"]["comfyui"]
    e = explain.explain(_record(), now)
    by = {d.field: d for d in e.diffs}
    assert not by["fingerprint.python"].known and by["fingerprint.comfyui"].now == "<absent>"
    assert "may change bits" in e.as_text()


def test_bad_records_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        explain.explain("{oops", _record())
    with pytest.raises(ValueError, match="JSON object"):
        explain.explain("[1, 2]", _record())


def test_expected_difference_tells_design_from_failure() -> None:
    ref = _record()
    compiled = copy.deepcopy(ref)
    compiled["fingerprint"]["compile"]["mode"] = "full"
    expected, text = explain.expected_difference(json.dumps(ref), json.dumps(compiled))
    assert expected is True and "fingerprint.compile.mode" in text and text.startswith("different, as expected")
    # only a timing differs: nothing known to change bits, so a difference in the outputs breaks the promise
    slower = copy.deepcopy(ref)
    slower["fingerprint"]["compile"]["first_call_seconds"] = 99.0
    assert explain.expected_difference(ref, slower) == (
        False,
        "DIFFERENT although no recorded setting known to change bits differs: a broken promise",
    )
    assert explain.expected_difference(ref, None)[0] is False
    with pytest.raises(ValueError):
        explain.expected_difference("not json", ref)


def test_every_cpu_setting_has_its_label_in_explain() -> None:
    """The labels live with their user (core/record/explain.py), one per key of ``portable.cpu_settings()``: a new
    setting without a label would be explained as "may change bits"; determinism holds no record labels."""
    from steadfast.core.determinism import portable

    assert set(explain.EXPLAIN_LABELS) == set(portable.cpu_settings())
    assert not hasattr(portable, "EXPLAIN_LABELS")
