"""Differential test of the precompiled route: after every kind of change, a precompiled block answers with the
bytes of a jit of the changed configuration compiled in a fresh process with an empty compile cache (the reference
shares nothing with the route: no process, no cache folder, no inductor cache), or runs the jit with the reason named.

For each change (:data:`tests/fixtures/precompiled_diff_child.CASES`), one process saves the artifact of the
unchanged configuration (module-scoped), the change is made, and a fresh process answers the same call through the
route. The issue 45 changes also run the other way (a changed process saves into the shared cache, and an unchanged
one must still answer with its own bytes), and so do a file edited after import and an operator with a Python
kernel registered through ``torch.library.Library.impl``. On the code before this test (019f4a9) the globals, hooks,
instance ``forward``, closures, the ``weight_function`` closure, the edited helper file and the inductor config
cases answered with the saved configuration's bytes (see docs/benchmarks.md section 16); on 2363d88 the issue 45
cases did (section 25).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch_version  # CI's second row runs it too (torch 2.14)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CHILD = FIXTURES / "precompiled_diff_child.py"

#: the changes, each with what must hold: "equal" (a precompiled answer, or any jit answer, equal to the reference),
#: "new key" (no artifact answers after the change: the key differs, so the jit answers and saves), or the text the
#: fallback reason must contain (the route must not answer from an artifact)
CASES = {
    "global_attention_flag": "another configuration",
    "global_monkeypatched": "another configuration",
    "global_constant": "another configuration",
    "forward_hook": "the block has a hook",
    "forward_pre_hook": "the block has a hook",
    "submodule_hook": "submodule 'o' has a hook",
    "instance_forward": "the block has an instance forward",
    "object_patch_submodule": "submodule 'o' has an instance forward",
    "closure_value": "another configuration",
    "function_attribute": "another configuration",
    "class_swapped": "equal",
    "lora_in_place": "equal",
    "lowvram_lora_closure": "guard_check failed",
    "lowvram_lora_object": "guard_check failed",
    "dynamic_vram_bias_function": "guard_check failed",
    "attn_patch": "patches",
    "attention_override": "equal",
    "transformer_options_contents": "equal",
    "inductor_config_written": "equal",
    "inductor_config_env": "equal",
    "source_edited": "runs other code",
    "dtype": "equal",
    "shape": "equal",
    # issue 45
    "submodule_class_method": "Linear.forward runs other code",
    "class_forward": "new key",
    "class_forward_after_answer": "new key",
    "sdpa_flash_off": "new key",
    "sdpa_kernel_math": "new key",
    "function_defaults": "diff_helpers:finish runs other code",
    "options_str": "transformer_options['mode']",
    "options_int": "transformer_options['gain']",
    "custom_op_kernel": "op sfdiff::mix",
}
#: changes whose reference output differs from the saved configuration's (the case is not vacuous)
CHANGES_OUTPUT = {
    "global_attention_flag",
    "global_monkeypatched",
    "global_constant",
    "forward_hook",
    "forward_pre_hook",
    "submodule_hook",
    "instance_forward",
    "object_patch_submodule",
    "closure_value",
    "function_attribute",
    "lora_in_place",
    "lowvram_lora_closure",
    "lowvram_lora_object",
    "dynamic_vram_bias_function",
    "attn_patch",
    "attention_override",
    "source_edited",
    "dtype",
    "shape",
    "submodule_class_method",
    "class_forward",
    "class_forward_after_answer",
    "sdpa_flash_off",
    "sdpa_kernel_math",
    "function_defaults",
    "options_str",
    "options_int",
    "custom_op_kernel",
}
#: the issue 45 changes run the other way too: the changed process saves into the shared cache, the unchanged one
#: answers after it (contamination: a patched process's artifact answering an unpatched one)
REVERSE = (
    "submodule_class_method",
    "class_forward",
    "sdpa_flash_off",
    "sdpa_kernel_math",
    "function_defaults",
    "options_str",
    "options_int",
    "custom_op_kernel",
)
EDIT = ("torch.tanh(a) * scale + 0.0", "torch.tanh(a) * scale + 1.25")


def _child(mods: Path, cache: Path, case: str, mode: str = "route", extra_env: dict | None = None) -> dict:
    env = {**os.environ, "STEADFAST_PRECOMPILED": "1", **(extra_env or {})}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, str(CHILD), str(ROOT), str(mods), str(cache), case, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (case, mode, out.stdout[-2000:], out.stderr[-3000:])
    return json.loads(lines[-1][7:])


def _mods(base: Path, where: Path, edited: bool = False) -> Path:
    mods = where / "mods"
    shutil.copytree(base / "mods", mods)
    if edited:
        f = mods / "diff_helpers.py"
        f.write_text(f.read_text().replace(*EDIT))
    return mods


def _reference(tmp: Path, mods: Path, case: str, extra_env: dict | None = None) -> str:
    """The jit of ``case`` in a fresh process with an empty compile cache (a new folder)."""
    empty = tmp / f"ref-{case}-{len(list(tmp.glob('ref-*')))}"
    got = _child(mods, empty, case, "jit", extra_env)
    assert got["input_matters"], case
    return got["out"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The unchanged configuration, saved by one process into a cache (copied per case), and its reference."""
    base = tmp_path_factory.mktemp("diff")
    mods = base / "mods"
    mods.mkdir()
    shutil.copy(FIXTURES / "diff_helpers.py", mods / "diff_helpers.py")
    cache = base / "cache"
    reference = _reference(base, mods, "save")
    first = _child(mods, cache, "save", extra_env={"SF_DIFF_RUNS": "3"})
    assert first["input_matters"] and first["outs"] == [reference] * 3
    assert first["state"]["saves"] >= 1 and not first["state"]["reasons"], first["state"]
    # the saving process reads its own saves back, as a warm-started one would: its later calls are the artifacts'
    assert first["state"]["loads"] >= 1 and first["state"]["hits"] >= 4 and first["state"]["fallbacks"] == 0, first
    again = _child(mods, cache, "save")  # the saved artifact answers an unchanged configuration
    assert again["out"] == reference and again["state"]["hits"] >= 2 and again["state"]["fallbacks"] == 0, again
    assert set(again["state"]["answered"]) and all(
        v["root"] == "method __main__:DiffBlock.forward" for v in again["state"]["answered"].values()
    ), again["state"]
    return base, reference


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_precompiled_answer_equals_a_fresh_jit_of_the_changed_configuration(saved, tmp_path, case):
    base, saved_ref = saved
    mods = _mods(base, tmp_path, edited=case == "source_edited")
    cache = tmp_path / "cache"
    shutil.copytree(base / "cache", cache)
    extra = {"TORCHINDUCTOR_FREEZING": "1"} if case == "inductor_config_env" else {}
    got = _child(mods, cache, case, "route", extra)
    want_out = _reference(tmp_path, mods, case, extra)
    state, want = got["state"], CASES[case]
    print(
        f"\n[{case}] route {got['out'][:12]} reference {want_out[:12]} saved {saved_ref[:12]} hits {state['hits']} "
        f"(before the change {got['hits_before']}) loads {state['loads']} fallbacks {state['fallbacks']} "
        f"reasons {state['reasons']}"
    )
    assert got["input_matters"]
    assert got["out"] == want_out, (case, state)  # never another configuration's bytes
    if case in CHANGES_OUTPUT:
        assert want_out != saved_ref, f"{case}: the change does not change the output (a vacuous case)"
    if case == "class_forward_after_answer":
        assert got["hits_before"] >= 2, "the artifact did not answer before the change"
    if want == "new key":  # no artifact answered after the change
        assert state["hits"] == got["hits_before"] and state["saves"] >= 1, (case, state)
    elif want != "equal":  # the saved artifact must not answer: the jit did, with the reason named
        assert state["fallbacks"] >= 1 and any(want in r for r in state["reasons"].values()), (case, state)


@pytest.mark.parametrize("case", REVERSE)
def test_a_changed_process_saving_first_does_not_answer_an_unchanged_one(saved, tmp_path, case):
    """Contamination: a patched (or otherwise changed) process saves its variant into the cache the unchanged
    configuration saved before; the unchanged process answers after it with its own bytes, from its own artifact."""
    base, saved_ref = saved
    mods = _mods(base, tmp_path)
    cache = tmp_path / "cache"
    shutil.copytree(base / "cache", cache)
    changed = _child(mods, cache, case, "route")
    assert changed["state"]["saves"] >= 1 or changed["state"]["fallbacks"] >= 1, changed["state"]
    plain = _child(mods, cache, "save", "route")
    print(f"\n[{case} reversed] changed {changed['out'][:12]} then plain {plain['out'][:12]} saved {saved_ref[:12]}")
    assert changed["out"] != saved_ref
    assert plain["out"] == saved_ref and plain["state"]["hits"] >= 2, plain["state"]


def test_a_file_edited_after_import_is_not_the_identity(saved, tmp_path):
    """A process imports ``diff_helpers``, the file is then updated on disk (a pack update), and the process
    compiles and saves: its artifact holds the old code. A restarted process runs the new file: it must get the
    new code's bytes (a fresh jit's), never the artifact's."""
    base, saved_ref = saved
    mods, cache = _mods(base, tmp_path), tmp_path / "cache"
    first = _child(mods, cache, "save", "route", {"SF_DIFF_EDIT_AFTER_IMPORT": "1"})
    assert first["out"] == saved_ref and first["state"]["saves"] >= 1  # it ran (and saved) the old code
    assert EDIT[0].replace("0.0", "0.5") in (mods / "diff_helpers.py").read_text()
    restarted = _child(mods, cache, "save", "route")
    want = _reference(tmp_path, mods, "save")
    print(f"\n[edited after import] restarted {restarted['out'][:12]} reference {want[:12]} {restarted['state']}")
    assert want != saved_ref and restarted["out"] == want, restarted["state"]
    assert restarted["state"]["hits"] == 0 and any(
        "diff_helpers:finish runs other code" in r for r in restarted["state"]["reasons"].values()
    ), restarted["state"]


def test_an_operator_kernel_registered_through_library_impl_is_refused(saved, tmp_path):
    """An operator whose Python ``CompositeImplicitAutograd`` kernel is registered through ``Library.impl`` is
    inlined into the graph, and the dispatcher holds its function out of reach: the route refuses it (the jit
    answers, with the reason) instead of carrying it by name. Two processes with other kernels of one operator. On
    2363d88 the second process was answered by the first's artifact."""
    base, _ = saved
    mods, cache = _mods(base, tmp_path), tmp_path / "cache"
    first = _child(mods, cache, "save", "route", {"SF_DIFF_LIBOP": "2.0"})
    second = _child(mods, cache, "save", "route", {"SF_DIFF_LIBOP": "3.0"})
    want = _reference(tmp_path, mods, "save", {"SF_DIFF_LIBOP": "3.0"})
    print(f"\n[Library.impl] first {first['out'][:12]} second {second['out'][:12]} reference {want[:12]}")
    assert first["out"] != want  # the kernel decides the bytes: the case is not vacuous
    reasons = second["state"]["reasons"].values()
    assert second["state"]["hits"] == 0 and any("Library.impl" in r for r in reasons), second["state"]
    # Known limit, not the route's: the jit itself, under the shared compile cache, may give the first kernel's bytes
    # (torch keys its caches on the graph before the kernel is decomposed; measured here: second == first). Only an
    # empty cache gives the reference; docs/compatibility.md says so.
    assert second["out"] in (want, first["out"])
