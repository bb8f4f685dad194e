"""core/compile/warm/precompiled.py: the precompiled route of regional blocks. The key (in-process), and in FRESH
processes (tests/fixtures/precompiled_child.py): an artifact saved by one process answers another with the jit's
bytes (the child's block carries an unread dtype attribute and ``transformer_options`` small ints: without
``core.torch_compat.portable_guard_state`` its artifact fails to load); a replaced attention override, an added
patch, weights changed in place, a changed Python constant and a new shape are honoured bit-equal to the jit path
with the fallback visible in the state; a corrupted or unrecorded artifact is never loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from steadfast.core import torch_compat
from steadfast.core.compile.guards import comfy_guard_filter
from steadfast.core.compile.options import CompileOptions
from steadfast.core.compile.registry import CompileRegistry
from steadfast.core.compile.warm import cache as cc
from steadfast.core.compile.warm import cache_location as loc
from steadfast.core.compile.warm import call_key as ck
from steadfast.core.compile.warm import carried_guards, traced_code
from steadfast.core.compile.warm import precompiled as pc

# torch's aot_compile, inductor's ISA pick and its loads differ between torch 2.11 and 2.14: CI runs this on both rows
pytestmark = pytest.mark.torch_version

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "tests" / "fixtures" / "precompiled_child.py"


def _closure(factor):
    def scaled(q):
        return q * factor

    return scaled


def test_callables_are_described_by_code_and_captured_values():
    a, b, c = _closure(2.0), _closure(2.0), _closure(3.0)
    assert a is not b and pc.describe_callable(a) == pc.describe_callable(b)  # same code, same captured value
    assert pc.describe_callable(a) != pc.describe_callable(c)  # same code and name, another captured value
    other = test_callables_are_described_by_code_and_captured_values
    assert pc.describe_callable(_closure) != pc.describe_callable(other)
    with pytest.raises(pc._NotDescribable):
        pc.describe_callable(_closure(object()))  # a captured value the key cannot describe
    with pytest.raises(pc._NotDescribable):
        pc.describe_callable(torch.nn.Identity())  # a callable object


def test_call_key_covers_inputs_callables_and_flags_not_per_step_values():
    from tiny_modules import Block

    block = Block()
    fp, static = pc.block_fingerprint(block), pc.static_fields(CompileOptions())
    x = torch.randn(2, 4, 16)

    def key(x=x, flags=None, **to):
        return pc.call_key(
            fp,
            static,
            (x,),
            flags=flags,
            kwargs={
                "transformer_options": {
                    "optimized_attention_override": _closure(1.0),
                    "block_index": 0,
                    "sigmas": torch.tensor([1.0]),
                    "uuids": [object()],
                    **to,
                }
            },
        )

    base = key()
    assert key(block_index=7, sigmas=torch.tensor([0.5]), uuids=[object()]) == base  # the jit drops these guards
    assert key(optimized_attention_override=_closure(2.0)) != base
    assert key(extra=1) != base  # structure: a new key (the jit guards on the dict's keys)
    assert key(x=x.bfloat16()) != base and key(x=torch.randn(2, 5, 16)) != base
    assert key(x=x.transpose(0, 1).contiguous().transpose(0, 1)) != base  # strides
    assert key(wrappers={"f": [_closure(object())]}) == key(wrappers={"f": [_closure(2.0)]})  # not a code key
    assert pc.call_key(fp, static, (x, 3), {}) != pc.call_key(fp, static, (x, 4), {})  # an int argument: by value
    with pytest.raises(pc._NotDescribable):
        pc.call_key(fp, static, (x, object()), {})
    with pytest.raises(pc._NotDescribable, match="patches"):
        key(patches={"attn1_patch": [_closure(1.0)]})
    assert key(patches={}) != base and key(patches={}) == key(patches={})  # empty: described, no route refusal
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not previous)
    try:
        assert key() != base  # the determinism flags are in the key
    finally:
        torch.use_deterministic_algorithms(previous)
    assert pc.key_digest(fp, static, base) == pc.key_digest(fp, static, key())  # stable text digest
    other_filter = pc.static_fields(CompileOptions(), comfy_guard_filter(code_keys=("patches",)))
    assert pc.key_digest(fp, other_filter, base) != pc.key_digest(fp, static, base)
    assert pc.key_digest(fp, pc.static_fields(CompileOptions(dynamic=True)), base) != pc.key_digest(fp, static, base)
    assert len(pc.key_digest(fp, static, base)) == 32
    flags, n = pc.flags_text(), 200
    assert key(flags=flags) == base
    t0 = time.perf_counter()
    for _ in range(n):
        key(flags=flags)
    us = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(n):
        pc.flags_text()
    flags_us = (time.perf_counter() - t0) / n * 1e6
    print(
        f"\n[precompiled] call key: {us:.0f} us per block call, + {flags_us:.0f} us once per model call for the "
        "flags (this machine, shared)"
    )
    assert us < 5000


def test_values_are_described_by_their_kind_subclasses_included():
    """The exact-type fast path of ``_describe`` (issue 35: a block call describes a dozen values per call) keeps
    the rule for subclasses and odd values: an IntEnum or a str Enum is an int or a str (by value in a code key, by
    its type's name elsewhere), ``torch.Size`` and other tuple subclasses are objects, a Parameter is a tensor, a
    dict subclass is a dict, and a tensor carries its strides."""
    import collections
    import enum

    class Level(enum.IntEnum):
        LOW = 1

    class Mode(str, enum.Enum):
        FAST = "fast"

    assert ck._describe(Level.LOW, True) == Level.LOW and ck._describe(Level.LOW, False) == "Level"
    assert ck._describe(Mode.FAST, True) == Mode.FAST and ck._describe(Mode.FAST, False) == "Mode"
    assert ck._describe(3, False) == "int" and ck._describe(3, True) == 3 and ck._describe(True, False) is True
    assert ck._describe(torch.Size([1, 2]), False) == ("O", "torch", "Size")
    assert ck._describe(collections.OrderedDict(a=1), False) == ("D", (("a", "int"),))
    assert ck._describe({"a": [1, (2.0, "s")]}, True) == ("D", (("a", ("list", (1, ("tuple", (2.0, "s"))))),))
    assert ck._describe(torch.nn.Parameter(torch.zeros(2)), False)[:2] == ("T", "Parameter")
    t = torch.zeros(2, 3).t()
    assert ck._describe(t, False) == ("T", "Tensor", (3, 2), (1, 3), "torch.float32", "cpu", False, False)
    assert ck._describe(torch.float16, True) == "torch.float16" and ck._describe(torch.device("cpu"), True) == "cpu"
    assert ck._describe(object(), False) == ("O", "builtins", "object")
    with pytest.raises(pc._NotDescribable):
        ck._describe(object(), True)


def test_fingerprint_names_structure_and_the_code_of_the_root_forward(monkeypatch):
    """The fingerprint holds no file: the class, the submodules and the digest of ``type(block).forward``; a patched
    class forward gives another fingerprint (so it never writes into the unpatched record), restored gives it back."""
    from tiny_modules import Block

    fp = pc.block_fingerprint(Block())
    assert fp["class"] == "tiny_modules.Block" and ["lin", "torch.nn.modules.linear.Linear"] in fp["modules"]
    assert "files" not in fp and fp["forward"][0] == "method tiny_modules:Block.forward"
    assert len(fp["forward"][1]) == 16

    def patched(self, x):
        return x * 2.0

    monkeypatch.setattr(Block, "forward", patched)
    assert pc.block_fingerprint(Block())["forward"] != fp["forward"]
    monkeypatch.undo()
    assert pc.block_fingerprint(Block()) == fp


def test_switch_and_support(monkeypatch):
    monkeypatch.setenv(torch_compat.PRECOMPILED_ENV, "0")
    assert torch_compat.aot_compile_support() == (False, f"off (${torch_compat.PRECOMPILED_ENV}=0)")
    assert pc.PrecompiledState.detect().enabled is False
    monkeypatch.delenv(torch_compat.PRECOMPILED_ENV)
    on, why = torch_compat.aot_compile_support()
    assert on is True and why.startswith("on (")  # torch 2.11 and 2.14 (2.11: the setting turned on while saving)
    assert ("enable_aot_compile" in why) is (not torch._dynamo.config.enable_aot_compile)
    monkeypatch.setenv(torch_compat.PRECOMPILED_ENV, "1")
    assert torch_compat.aot_compile_support()[0] is True


def test_the_route_is_opt_in_on_devices_it_has_not_passed_on(monkeypatch):
    """Issue 35: the precompiled route has run on the CPU only, so on any other device (CUDA first) the jit answers
    unless ``$STEADFAST_PRECOMPILED=1``, and the fallback names the device and the switch. A meta tensor stands in
    for a CUDA one here (the gate reads the device type of the call's first tensor, before the key)."""
    from tiny_modules import Block

    assert pc.untried_device((torch.ones(1),)) is None and pc.untried_device((3, {})) is None
    assert pc.untried_device((7, torch.empty(2, device="meta"))) == "meta"
    monkeypatch.delenv(torch_compat.PRECOMPILED_ENV, raising=False)
    default = pc.PrecompiledState.detect()
    assert default.enabled and not default.explicit
    monkeypatch.setenv(torch_compat.PRECOMPILED_ENV, "1")
    assert pc.PrecompiledState.detect().explicit
    calls = []
    block = pc.PrecompiledBlock(Block(), lambda *a, **k: calls.append(a) or "jit", CompileOptions(), None, default)
    monkeypatch.setattr(pc.compile_cache, "active_cache", lambda: object())  # a cache is active: the route is on
    assert block(torch.empty(2, 4, 16, device="meta")) == "jit" and len(calls) == 1
    assert default.fallbacks == 1 and "meta" in default.reasons["meta"] and "=1" in default.reasons["meta"]
    assert default.calls == 0  # nothing of the route ran


def test_records_carry_the_precompiled_state(monkeypatch):
    from tiny_modules import Tiny, block_paths

    monkeypatch.delenv(torch_compat.PRECOMPILED_ENV, raising=False)  # the default
    reg, model = CompileRegistry(), Tiny()
    rec, _ = reg.get_or_create(model, CompileOptions(), block_paths(model), guard_filter_fn=comfy_guard_filter())
    assert isinstance(rec.precompiled, pc.PrecompiledState) and rec.precompiled.enabled
    assert rec.summary()["precompiled"]["saves"] == 0 and rec.as_dict()["precompiled"]["enabled"] is True
    assert all(isinstance(c, pc.PrecompiledBlock) for c in rec.compiled.values())
    assert rec.block_modules()["blocks.0"] is model.blocks[0]
    x = torch.randn(1, 3, 8)
    from steadfast.core.compile.swap import compile_blocks, swap_in

    plain = compile_blocks(model, ["blocks.0"], CompileOptions(), comfy_guard_filter())
    with torch.no_grad():  # no compile cache active: the jit alone answers, the route counts nothing
        with swap_in(model, {"blocks.0": rec.compiled["blocks.0"]}):
            got = model(x)
        with swap_in(model, plain):
            assert torch.equal(got, model(x))
    assert rec.precompiled.as_dict()["hits"] == rec.precompiled.as_dict()["fallbacks"] == 0
    eager, _ = CompileRegistry().get_or_create(Tiny(), CompileOptions(backend="eager"), ["blocks.0"])
    assert eager.precompiled is None and "precompiled" not in eager.summary()


# ---------------------------------------------------------------------------------------------
# Fresh processes (inductor on CPU): one cold child saves, the others load.
# ---------------------------------------------------------------------------------------------
def _child(root: Path, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (cc.INDUCTOR_ENV, cc.TRITON_ENV, loc.CACHE_ENV)}
    env.pop(torch_compat.PRECOMPILED_ENV, None)  # the default: on, both rows
    out = subprocess.run(
        [sys.executable, str(CHILD), str(ROOT), str(root), mode], capture_output=True, text=True, env=env, timeout=600
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (out.stdout[-2000:], out.stderr[-3000:])
    return json.loads(lines[-1][7:])


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    root = tmp_path_factory.mktemp("precompiled")
    result = _child(root, "cold")
    pristine = tmp_path_factory.mktemp("pristine") / "cache"
    shutil.copytree(root, pristine)  # as the cold process left it (the warm test adds artifacts)
    return root, result, pristine


def _artifacts(root: Path) -> list[Path]:
    return sorted((root / loc.DEFAULT_NAME).glob(f"*/{pc.PRECOMPILED_DIR}/*.pt2"))


def test_an_artifact_from_one_process_answers_another_bit_equal(cold):
    root, c, _ = cold
    assert c["other_input_differs"]  # the random-weight model's output depends on its input
    s = c["state"]
    assert s["enabled"] and s["reason"].startswith("on (")
    assert s["saves"] == 1 and s["hits"] == s["loads"] == 0  # 3 equal blocks share one artifact
    assert len(_artifacts(root)) == 1
    w = _child(root, "warm")
    assert w["out"] == c["out"] and w["jit_same"]  # loaded artifact == the cold jit == this process's jit
    assert w["guard_checks_per_hit"] == 1  # the route's guard_check; the artifact's own check is off (not twice)
    assert w["one_tree"]  # torch's guards and the pack's checks run as one tree, a copy of the artifact's (issue 45)
    cases = w["cases"]
    first = cases["override_replaced"]["state"]
    assert first["loads"] == 1 and first["hits"] == 3 and first["fallbacks"] == 0
    print(
        f"\n[precompiled, fresh process, 3 blocks] cold first call {c['first_s']:.2f} s (saves "
        f"{s['save_seconds']:.2f} s after it), warm first call {w['first_s']:.2f} s (load "
        f"{first['load_seconds']:.2f} s), torch {w['torch']}"
    )
    for name, case in cases.items():  # every change honoured, bit-equal to the jit path
        assert case["same"] and case["changed"], name
    # a replaced override, or the same code with another captured value: new keys (saved), never the old trace
    assert cases["override_replaced"]["state"]["saves"] == 1 and cases["override_closure"]["state"]["saves"] == 2
    assert cases["patch_added"]["state"]["fallbacks"] == 3
    assert "patches" in cases["patch_added"]["state"]["reasons"]["call"]
    weights = cases["weights_in_place"]["state"]
    assert weights["hits"] == cases["patch_added"]["state"]["hits"] + 3  # the artifact ran, with the new weights
    constant = cases["constant_attribute"]["state"]
    assert constant["fallbacks"] == weights["fallbacks"] + 3
    assert any("guard_check failed" in r for r in constant["reasons"].values())
    assert cases["shape"]["state"]["saves"] == 3


def test_a_corrupted_artifact_quarantines_the_cache(cold, tmp_path):
    _, c, pristine = cold
    copy = tmp_path / "copy"
    shutil.copytree(pristine, copy)
    (art,) = _artifacts(copy)
    data = bytearray(art.read_bytes())
    data[len(data) // 2] ^= 0xFF
    art.write_bytes(bytes(data))
    w = _child(copy, "cold")
    assert w["out"] == c["out"] and w["state"]["loads"] == w["state"]["hits"] == 0
    assert any("checksum differs" in m and "moved aside" in m for m in w["messages_at_open"] + w["messages"])


def test_an_unrecorded_artifact_is_never_loaded(cold, tmp_path):
    _, c, pristine = cold
    copy = tmp_path / "copy"
    shutil.copytree(pristine, copy)
    (art,) = _artifacts(copy)
    files = art.parents[1] / cc.FILES
    recorded = json.loads(files.read_text())
    del recorded[f"{pc.PRECOMPILED_DIR}/{art.name}"]
    files.write_text(json.dumps(recorded))
    w = _child(copy, "cold")
    assert w["out"] == c["out"] and w["state"]["loads"] == w["state"]["hits"] == 0
    assert any("not written while Steadfast watched" in r for r in w["state"]["reasons"].values())


def test_a_failing_precompiled_call_falls_back_to_the_jit(tmp_path, monkeypatch):
    """guard_check passes but the artifact raises: the jit answers (same bytes as the jit alone), the key runs the
    jit from then on, the reason is recorded; an out-of-memory error passes through unchanged."""
    from tiny_modules import Block

    class Broken:
        calls = 0

        def guard_check(self, *a, **k):
            return True

        def __call__(self, *a, **k):
            Broken.calls += 1
            raise RuntimeError("kernel failed")

    block = Block()
    jit = torch.compile(block, backend="eager")
    state = pc.PrecompiledState(True, "test")
    routed = pc.wrap(block, jit, CompileOptions(backend="eager"), comfy_guard_filter(), state)
    always = carried_guards.Matched((), (), ())  # no carried guards: they hold
    code = traced_code.CodeIdentity((), ())  # no traced code to re-check

    def answer(fn):
        return (pc.Entry.ANSWERS, pc.Answer(fn, always, code, "0" * 32, "method tiny_modules:Block.forward"))

    monkeypatch.setattr(pc.PrecompiledBlock, "_resolve", lambda self, *a: answer(Broken()))
    cache = cc.open_cache(tmp_path, device="cpu")
    x = torch.randn(2, 3, 16)
    with torch.no_grad(), cache.activate():
        got, again = routed(x), routed(x)
        assert torch.equal(got, jit(x)) and torch.equal(again, got)
    assert Broken.calls == 1 and state.hits == 0 and state.fallbacks == 2
    assert any("RuntimeError: kernel failed" in r for r in state.reasons.values())

    class OutOfMemory(Broken):
        def __call__(self, *a, **k):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    state2 = pc.PrecompiledState(True, "test")
    routed2 = pc.wrap(block, jit, CompileOptions(backend="eager"), comfy_guard_filter(), state2)
    monkeypatch.setattr(pc.PrecompiledBlock, "_resolve", lambda self, *a: answer(OutOfMemory()))
    with torch.no_grad(), cache.activate(), pytest.raises(RuntimeError, match="out of memory"):
        routed2(x)
    assert state2.fallbacks == 0


def test_the_report_says_on_or_off_once():
    """Issue 46's trip: Optimize's report said "precompiled blocks: on, on (...)"."""
    from steadfast.core.compile.use import _on_off

    on, why = torch_compat.aot_compile_support()
    said = _on_off(on, why)
    assert said.startswith("on" if on else "off") and not said.startswith(("on, on", "off, off"))
    assert _on_off(False, "torch 2.0 has no torch.compiler.load_compiled_function").startswith("off: torch 2.0")
