"""core/record/verdict.py and core/determinism/portable.py without ComfyUI: thumbnails stay a few KB, the three
levels, the exit codes, the runner's worst-level report, portable mode's refusals and the explain labels of its
settings."""

from __future__ import annotations

import json

import pytest
import torch

from steadfast.core.determinism import portable
from steadfast.core.record import explain, verdict
from steadfast.headless import runner


def _image(seed: int, side: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(1, 8, 8, 3, generator=g)
    return (
        torch.nn.functional.interpolate(
            base.permute(0, 3, 1, 2), size=(side, side), mode="bilinear", align_corners=False
        )
        .permute(0, 2, 3, 1)
        .contiguous()
    )


def test_thumbnail_is_a_few_kb_and_round_trips() -> None:
    img = _image(0, 512)
    ref = verdict.thumbnail(img, "image")
    assert ref["thumb_shape"] == [1, 3, 16, 16] and ref["shape"] == [1, 512, 512, 3]
    assert len(json.dumps(ref)) < 2_500
    back = verdict.decode_thumbnail(json.loads(json.dumps(ref)))
    pooled = torch.nn.functional.adaptive_avg_pool2d(img.permute(0, 3, 1, 2).double(), (16, 16))
    assert float((back - pooled).abs().max()) < 1e-3  # float16 rounding only
    lat = verdict.thumbnail(torch.randn(2, 4, 8, 8), "latent")
    assert lat["thumb_shape"] == [2, 4, 8, 8]  # small latents are kept whole
    big = verdict.thumbnail(torch.randn(9, 16, 128, 128), "latent")
    assert big["thumb_shape"] == [4, 16, 6, 6] and len(json.dumps(big)) < 8_000


def test_three_levels_and_exit_codes() -> None:
    a = _image(0)
    near = a + 1e-4 * torch.randn(a.shape, generator=torch.Generator().manual_seed(1))
    other = _image(2)
    ta, tn, to = (verdict.thumbnail(x) for x in (a, near, other))
    same = verdict.grade("ab" * 32, "ab" * 32, tn, ta)
    assert same.level == "identical" and same.exit_code == 0
    close = verdict.grade("cd" * 32, "ab" * 32, tn, ta)
    assert close.level == "same_picture" and close.exit_code == 3 and close.psnr > 60
    far = verdict.grade("cd" * 32, "ab" * 32, to, ta)
    assert far.level == "different_picture" and far.exit_code == 1 and far.psnr < verdict.SAME_PICTURE_PSNR_DB
    assert verdict.grade("cd" * 32, "ab" * 32, tn, None).level == "unknown"
    assert "SAME PICTURE" in close.as_text() and "DIFFERENT PICTURE" in far.as_text()
    # the graded figures say they are the thumbnails' (a float16 thumbnail's max |delta| is not the output's)
    assert f"both on float16 thumbnails, at most {verdict.THUMB_SIDE} px a side" in close.as_text()
    full = verdict.grade_tensors(a, near, "image")
    assert full.level == "same_picture" and verdict.grade_tensors(a, a.clone()).level == "identical"


def test_a_64px_image_vs_its_128px_upscale_is_a_different_shape() -> None:
    """Measured before: the thumbnails of both are 16x16, so the upscale graded "same picture" (exit 3)."""
    small = _image(0, 64)
    up = torch.nn.functional.interpolate(small.permute(0, 3, 1, 2), size=(128, 128), mode="nearest")
    up = up.permute(0, 2, 3, 1).contiguous()
    assert verdict.thumbnail(small)["thumb_shape"] == verdict.thumbnail(up)["thumb_shape"]  # what hid it
    v = verdict.grade("cd" * 32, "ab" * 32, verdict.thumbnail(up), verdict.thumbnail(small))
    assert v.level == "different_picture" and v.exit_code == 1, v
    assert "shape differs: [1, 64, 64, 3] -> [1, 128, 128, 3]" in v.as_text()
    full = verdict.grade_tensors(small, up)
    assert full.level == "different_picture" and "shape differs" in full.why


def _batch(n: int, seed: int = 0) -> torch.Tensor:
    return torch.cat([_image(seed + i, 32) for i in range(n)])


def test_batch_4_vs_batch_6_is_a_different_shape() -> None:
    """Measured before: a thumbnail keeps 4 items, so a batch of 6 whose first 4 equal the reference's graded
    "same picture"."""
    b6 = _batch(6)
    v = verdict.grade("cd" * 32, "ab" * 32, verdict.thumbnail(b6), verdict.thumbnail(b6[:4]))
    assert v.level == "different_picture" and "shape differs: [4, 32, 32, 3] -> [6, 32, 32, 3]" in v.why, v
    assert verdict.grade_tensors(b6[:4], b6).level == "different_picture"


def test_batch_of_6_with_item_5_inverted_is_not_the_same_picture() -> None:
    """Measured before: item 5 has no thumbnail, items 1-4 are equal: "same picture" (exit 3). Now item 5's bytes
    are compared (their SHA-256 travels in the reference): "ungraded", exit 1; Compare grades every item."""
    b6 = _batch(6)
    inv = b6.clone()
    inv[4] = 1.0 - inv[4]
    ref, now = verdict.thumbnail(b6), verdict.thumbnail(inv)
    assert ref["thumb_shape"][0] == verdict.MAX_ITEMS and len(ref["item_digests"]) == 2
    v = verdict.grade("cd" * 32, "ab" * 32, now, ref)
    assert v.level == "ungraded" and v.exit_code == 1, v
    assert "first: item 5" in v.why and "not graded" in v.why and "UNGRADED" in v.as_text()
    full = verdict.grade_tensors(b6, inv)
    assert full.level == "different_picture" and full.psnr < verdict.SAME_PICTURE_PSNR_DB
    assert "worst: item 5 of 6" in full.why
    # the same batch with only a thumbnailed item changed a little: items 5-6 identical bytes, same picture
    near = b6.clone()
    near[0] += 1e-4
    close = verdict.grade("cd" * 32, "ab" * 32, verdict.thumbnail(near), ref)
    assert close.level == "same_picture" and "items 5-6 of 6: identical bytes" in close.why, close
    # a reference pinned before item digests existed: a differing batch past 4 items is ungraded, not "same"
    old = {k: v for k, v in ref.items() if k != "item_digests"}
    assert verdict.grade("cd" * 32, "ab" * 32, verdict.thumbnail(near), old).level == "ungraded"


def test_a_thumbnailed_item_that_differs_decides_the_verdict() -> None:
    """Items are graded one by one (the worst counts): one inverted item among four is not averaged away."""
    b4 = _batch(4)
    inv = b4.clone()
    inv[2] = 1.0 - inv[2]
    v = verdict.grade("cd" * 32, "ab" * 32, verdict.thumbnail(inv), verdict.thumbnail(b4))
    assert v.level == "different_picture" and "worst: item 3 of 4" in v.why, v


@pytest.mark.parametrize("prefix", ["a", "ab" * 5 + "a", "", "zz" * 6, "ab" * 33])
def test_grade_refuses_a_hash_prefix_below_the_minimum(prefix: str) -> None:
    """Measured before: ``grade(h, h[:1], ...)`` said "identical bytes" for a 1-character prefix."""
    h = "ab" * 32
    with pytest.raises(ValueError, match="prefix of at least 12"):
        verdict.grade(h, prefix, None, None)
    assert verdict.grade(h, h[:12], None, None).level == "identical"  # the documented minimum


def test_env_fields_that_differ_are_listed() -> None:
    rec = {"fingerprint": {"num_threads": 2, "cpu_settings": {"mkl_cbwr": "OFF"}}}
    now = {"fingerprint": {"num_threads": 1, "cpu_settings": {"mkl_cbwr": "COMPATIBLE,STRICT"}}}
    a = _image(0)
    v = verdict.grade_tensors(a, a + 1e-4, "image", record_a=rec, record_b=now)
    text = "\n".join(v.env_diffs)
    assert "fingerprint.num_threads: 2 -> 1" in text
    assert "fingerprint.cpu_settings.mkl_cbwr" in text and "MKL numerical-reproducibility branch" in text


def _result(run: str, h: str, thumb: dict) -> runner.RunResult:
    return runner.RunResult("s", run, hashes={"11": h}, checks={"11": "unchecked"}, references={"11": thumb})


def test_runner_reports_the_worst_level() -> None:
    prompt = {"11": {"class_type": "SteadfastHash", "inputs": {}}}
    a = _image(0)
    ta, tn, to = verdict.thumbnail(a), verdict.thumbnail(a + 1e-4), verdict.thumbnail(_image(2))
    same = runner.compare(prompt, [_result("1", "ab" * 32, ta), _result("2", "ab" * 32, ta)])
    assert same.level == "identical" and same.exit_code == 0
    near = runner.compare(prompt, [_result("1", "ab" * 32, ta), _result("2", "cd" * 32, tn)])
    assert near.level == "same_picture" and near.exit_code == 3 and "SAME PICTURE" in near.as_text()
    far = runner.compare(
        prompt, [_result("1", "ab" * 32, ta), _result("2", "cd" * 32, tn), _result("3", "ef" * 32, to)]
    )
    assert far.level == "different_picture" and far.exit_code == 1
    b6 = _batch(6)
    inv = b6.clone()
    inv[5] = 1.0 - inv[5]
    part = runner.compare(
        prompt, [_result("1", "ab" * 32, verdict.thumbnail(b6)), _result("2", "cd" * 32, verdict.thumbnail(inv))]
    )
    assert part.level == "ungraded" and part.exit_code == 1 and "not graded" in part.as_text(), part.as_text()
    assert runner.pin(prompt, near.results[0])["11"]["inputs"]["expected_reference"] == json.dumps(ta, sort_keys=True)


def test_portable_env_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    env = portable.portable_env()
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_CBWR"] == "COMPATIBLE,STRICT"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1" and env["STEADFAST_PORTABLE"] == "1"
    with pytest.raises(ValueError):
        portable.portable_env(0)
    monkeypatch.delenv("STEADFAST_PORTABLE", raising=False)
    portable.check_optimize(compile="regional", backend="inductor", quantize="int8", precision="bf16")  # not portable
    monkeypatch.setenv("STEADFAST_PORTABLE", "1")
    with pytest.raises(portable.PortableModeError, match="compile=regional"):
        portable.check_optimize(compile="regional", backend="inductor")
    with pytest.raises(portable.PortableModeError, match="quantize"):
        portable.check_optimize(quantize="int8")
    with pytest.raises(portable.PortableModeError, match="precision=bf16"):
        portable.check_optimize(precision="bf16")
    with pytest.raises(portable.PortableModeError, match="num_threads=4"):
        portable.check_threads(4)
    portable.check_optimize(compile="regional", backend="eager", precision="fp32")
    portable.check_threads(0)


def test_apply_in_process_refuses_a_missing_startup_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in portable.portable_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    with pytest.raises(portable.PortableModeError, match="MKL_CBWR=COMPATIBLE,STRICT"):
        portable.apply_in_process()


CPU_SETTINGS_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from _steadfast_import import import_steadfast
import_steadfast()
import torch
from steadfast.core.determinism import portable
torch.set_num_threads(3)
torch.backends.mkldnn.enabled = False
print(json.dumps({"settings": portable.cpu_settings(), "mkl": torch.backends.mkl.is_available()}))
"""


@pytest.mark.parametrize("isa, want_cap", [("default", "DEFAULT"), ("avx2", "AVX2")])
def test_cpu_settings_read_back_what_a_fresh_process_was_given(isa: str, want_cap: str) -> None:
    """``cpu_settings()`` against what a child process was started with (not against the calls it makes):
    ATen capability from ``ATEN_CPU_CAPABILITY``, 3 threads, oneDNN off, MKL's branch from ``MKL_CBWR``."""
    import os
    import platform
    import subprocess
    import sys
    from pathlib import Path

    if isa == "avx2" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"ATEN_CPU_CAPABILITY=avx2 needs an x86-64 CPU (this is {platform.machine()})")
    scripts = Path(__file__).resolve().parents[2] / "scripts"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": isa, "MKL_CBWR": "COMPATIBLE,STRICT"}
    proc = subprocess.run(
        [sys.executable, "-c", CPU_SETTINGS_CHILD, str(scripts)], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    s = out["settings"]
    if want_cap == "AVX2" and "avx2" not in s["cpu_flags"]:
        pytest.skip("this CPU has no AVX2: ATEN_CPU_CAPABILITY=avx2 falls back")
    assert s["aten_capability"] == want_cap and s["threads"] == 3 and s["mkldnn_enabled"] is False, s
    assert s["env"]["ATEN_CPU_CAPABILITY"] == isa and s["env"]["MKL_CBWR"] == "COMPATIBLE,STRICT"
    if not out["mkl"]:
        pytest.skip("this torch build has no MKL: mkl_cbwr is None by design (nothing to read back)")
    assert s["mkl_cbwr"] == "COMPATIBLE,STRICT", s  # MKL is present: its branch must be read back, not None


def test_cpu_settings_are_labelled() -> None:
    s = portable.cpu_settings()
    a = {"fingerprint": {"cpu_settings": s}}
    b = json.loads(json.dumps(a))
    b["fingerprint"]["cpu_settings"]["aten_capability"] = "DEFAULT"
    b["fingerprint"]["cpu_settings"]["env"]["ATEN_CPU_CAPABILITY"] = "default"
    diffs = {d.field: d for d in explain.explain(a, b).diffs}
    assert diffs["fingerprint.cpu_settings.aten_capability"].known
    assert "ATEN_CPU_CAPABILITY" in diffs["fingerprint.cpu_settings.aten_capability"].why
    assert diffs["fingerprint.cpu_settings.env.ATEN_CPU_CAPABILITY"].known
