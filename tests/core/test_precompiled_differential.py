"""Differential test of the precompiled route: after every kind of change, a precompiled block answers with the
bytes of a jit compile of the changed configuration, or runs the jit with the reason named.

For each change (:data:`tests/fixtures/precompiled_diff_child.CASES`), one process saves the artifact of the
unchanged configuration (module-scoped), the change is made, and a fresh process answers the same call through the
route and through a plain jit compiled there. On the code before this test (019f4a9) the globals, hooks, instance
``forward``, closures, the ``weight_function`` closure, the edited helper file and the inductor config cases
answered with the saved configuration's bytes (see docs/benchmarks.md section 16).
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

#: the changes, each with what must hold: "equal" (a precompiled answer, or any jit answer, equal to the jit),
#: or the text the fallback reason must contain (the route must not answer from an artifact)
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
    "source_edited": "another configuration",
    "dtype": "equal",
    "shape": "equal",
}
#: changes whose jit output differs from the saved configuration's (the case is not vacuous)
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
}


def _child(mods: Path, cache: Path, case: str, extra_env: dict | None = None) -> dict:
    env = {**os.environ, "STEADFAST_PRECOMPILED": "1", **(extra_env or {})}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, str(CHILD), str(ROOT), str(mods), str(cache), case],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (case, out.stdout[-2000:], out.stderr[-3000:])
    return json.loads(lines[-1][7:])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The unchanged configuration, saved by one process into a cache (copied per case)."""
    base = tmp_path_factory.mktemp("diff")
    mods = base / "mods"
    mods.mkdir()
    shutil.copy(FIXTURES / "diff_helpers.py", mods / "diff_helpers.py")
    cache = base / "cache"
    first = _child(mods, cache, "save")
    assert first["input_matters"] and first["route"] == first["jit"]
    assert first["state"]["saves"] >= 1 and not first["state"]["reasons"], first["state"]
    again = _child(mods, cache, "save")  # the saved artifact answers an unchanged configuration
    assert again["route"] == first["jit"] and again["state"]["hits"] >= 2 and again["state"]["fallbacks"] == 0, again
    return base, first["jit"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_precompiled_answer_equals_the_jit_of_the_changed_configuration(saved, tmp_path, case):
    base, saved_jit = saved
    mods, cache = tmp_path / "mods", tmp_path / "cache"
    shutil.copytree(base / "mods", mods)
    shutil.copytree(base / "cache", cache)
    extra = {}
    if case == "source_edited":
        f = mods / "diff_helpers.py"
        f.write_text(f.read_text().replace("torch.tanh(a) * 1.0", "torch.tanh(a) * 1.25"))
    if case == "inductor_config_env":
        extra["TORCHINDUCTOR_FREEZING"] = "1"
    got = _child(mods, cache, case, extra)
    state, want = got["state"], CASES[case]
    print(
        f"\n[{case}] route {got['route'][:12]} jit {got['jit'][:12]} saved {saved_jit[:12]} hits {state['hits']} "
        f"loads {state['loads']} fallbacks {state['fallbacks']} reasons {state['reasons']}"
    )
    assert got["input_matters"]
    assert got["route"] == got["jit"], (case, state)  # never another configuration's bytes
    if case in CHANGES_OUTPUT:
        assert got["jit"] != saved_jit, f"{case}: the change does not change the jit's output (a vacuous case)"
    if want != "equal":  # the saved artifact must not answer: the jit did, with the reason named
        assert state["fallbacks"] >= 1 and any(want in r for r in state["reasons"].values()), (case, state)
