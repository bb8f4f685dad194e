"""core.record.environment: which settings of the running ComfyUI are known to break run-to-run equality, and
explain's labels."""

from __future__ import annotations

from steadfast.core.record.environment import run_to_run_risks
from steadfast.core.record.explain import explain

QUIET = {
    "comfy_aimdo": None,
    "comfy_kitchen": None,
    "dynamic_vram": False,
    "comfy_fast": [],
    "comfy_numeric_args": {},
    "fp16_accumulation": False,
}


def test_quiet_server_has_no_known_risk():
    assert run_to_run_risks(QUIET) == []
    assert run_to_run_risks({}) == []  # 0.8.0 records lack the fields: not in use


def test_dynamic_vram_is_named_with_the_upstream_issue_and_the_switch():
    risks = run_to_run_risks({**QUIET, "dynamic_vram": True, "comfy_aimdo": "0.4.10"})
    assert len(risks) == 1
    assert "16490" in risks[0] and "--disable-dynamic-vram" in risks[0]


def test_fast_autotune_is_named_but_fp16_accumulation_alone_is_not_a_run_to_run_risk():
    assert run_to_run_risks({**QUIET, "comfy_fast": ["fp16_accumulation"]}) == []
    risks = run_to_run_risks({**QUIET, "comfy_fast": ["autotune", "fp16_accumulation"]})
    assert len(risks) == 1 and "cuDNN benchmark" in risks[0]
    both = run_to_run_risks({**QUIET, "dynamic_vram": True, "comfy_fast": ["autotune"]})
    assert len(both) == 2


def _record(**fp):
    return {"seeds": [1], "fingerprint": {"torch": "2.11.0", "comfyui": "0.33.0", **QUIET, **fp}}


def test_explain_labels_each_new_comfy_field_as_changing_bits():
    changed = {
        "comfyui": "0.8.0",
        "dynamic_vram": True,
        "comfy_fast": ["fp16_accumulation"],
        "fp16_accumulation": True,
        "comfy_numeric_args": {"force_fp16": True},
        "comfy_kitchen": "0.2.1",
    }
    diffs = {d.field: d for d in explain(_record(), _record(**changed)).diffs}
    for name in (
        "comfyui",
        "dynamic_vram",
        "comfy_fast",
        "fp16_accumulation",
        "comfy_numeric_args.force_fp16",
        "comfy_kitchen",
    ):
        assert diffs[f"fingerprint.{name}"].known, name
    assert "16490" not in diffs["fingerprint.dynamic_vram"].why  # the reason is short; the report names the issue
    assert "Dynamic VRAM" in diffs["fingerprint.dynamic_vram"].why


def test_explain_aimdo_version_alone_may_change_bits():
    diffs = explain(_record(), _record(comfy_aimdo="0.4.10")).diffs
    assert [(d.field, d.known) for d in diffs] == [("fingerprint.comfy_aimdo", False)]


def test_fast_disk_and_the_comfy_compiler_are_named_with_their_switches():
    risks = run_to_run_risks({"fast_disk": True, "comfy_compiler": "on"})
    assert len(risks) == 2
    assert "15528" in risks[0] and "--fast-disk" in risks[0]
    assert "--disable-comfy-compiler" in risks[1]
    assert run_to_run_risks({"fast_disk": False, "comfy_compiler": "absent", "cuda_graphs": "allowed"}) == []


def test_per_process_reads_equal_a_fresh_read():
    """The CPU's name and flags and the installed Triton are read once per process (``functools.cache``): the cached
    value is what a fresh read (``/proc/cpuinfo``, the distributions' metadata) gives, and the second call does not
    read again (the same object)."""
    import os
    import platform

    from steadfast.core.compile.warm import cache
    from steadfast.core.determinism import portable
    from steadfast.core.record import environment

    for read in (environment._cpu_name, portable._cpu_flags, cache._triton_version):
        assert read() == read.__wrapped__(), read.__name__
        assert read() is read(), read.__name__
    assert environment._cpu_name()
    if os.path.exists("/proc/cpuinfo") and platform.machine() == "x86_64":  # a "flags" line (aarch64: "Features")
        assert "sse2" in portable._cpu_flags()
