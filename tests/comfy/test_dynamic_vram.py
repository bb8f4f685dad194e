"""Dynamic VRAM as a first-class mode (issue 24 items 1, 4, 5, 6), on the CPU through an in-process child.

ComfyUI builds ``ModelPatcherDynamic`` only for a GPU load device, so ``dynamic_vram_child.py`` gives the tiny
checkpoint's ModelPatcher a subclass whose ``is_dynamic()`` is True (what the pack reads) and runs Optimize Model,
quantize's patch check and the model digest on it. What needs a real Dynamic VRAM load (LoRA applied at cast time,
aimdo) is in ``test_gpu_correctness.py``. On ComfyUI 0.8.0 (no Dynamic VRAM) the plain paths are checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]


@pytest.fixture(scope="module")
def result(run_child: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    return run_child("dynamic_vram_child.py")


def _needs_dynamic(result: dict[str, Any]) -> None:
    if not result["has_dynamic"]:
        pytest.skip("this ComfyUI has no Dynamic VRAM (ModelPatcher.is_dynamic): nothing to emulate")


def test_qkv_fusion_and_channels_last_say_not_applied_and_leave_weights(result: dict[str, Any]) -> None:
    """Item 5: under Dynamic VRAM the record says "not applied", nothing is patched, the mapped weights stay."""
    _needs_dynamic(result)
    assert result["dyn_options"] == {
        "qkv_fusion": "not applied: Dynamic VRAM",
        "channels_last": "not applied: Dynamic VRAM",
    }
    assert "qkv_fusion: not applied: Dynamic VRAM" in result["dyn_report"]
    assert "channels_last: not applied: Dynamic VRAM" in result["dyn_report"]
    assert result["dyn_object_patches"] == 0 and result["dyn_callbacks"] == []
    assert result["dyn_is_dynamic"] is True and result["params_untouched"] is True


def test_quantize_is_refused_under_dynamic_vram(result: dict[str, Any]) -> None:
    """Item 1: quantize would be built from unpatched weights (LoRA dropped): refused, naming the ways out."""
    _needs_dynamic(result)
    assert "under Dynamic VRAM" in result["dyn_quantize"] and "--disable-dynamic-vram" in result["dyn_quantize"]


def test_quantize_refuses_layers_comfyui_left_unpatched(result: dict[str, Any]) -> None:
    """Item 1 (legacy lowvram too): a quantized layer with weight patches that ComfyUI did not apply (not
    ``comfy_patched_weights``) is named, so the run is refused instead of quantizing without the LoRA."""
    assert len(result["unpatched_before_load"]) == 1 and result["unpatched_before_load"][0].endswith(".weight")
    assert result["unpatched_after_load"] == []


def test_compile_uses_the_non_dynamic_clone(result: dict[str, Any]) -> None:
    """Item 6: compile follows core's TorchCompileModel (``model.clone(disable_dynamic=True)``): a non-dynamic copy
    (its own BaseModel, rebuilt from ``cached_patcher_init``), on which QKV fusion applies again."""
    _needs_dynamic(result)
    assert result["compiled_clone_dynamic"] is False and result["compiled_clone_same_module"] is False
    assert "model.clone(disable_dynamic=True)" in result["compiled_report"]
    assert isinstance(result["compiled_qkv"], int) and result["compiled_qkv"] > 0


def test_comfy_compiler_refuses_patched_forwards_naming_its_switch(result: dict[str, Any]) -> None:
    """Item 6: where ComfyUI has --disable-comfy-compiler and Dynamic VRAM is on (emulated: 0.33.0 has neither the
    switch nor a GPU here), compile is refused naming the switch; an attention pin alone is allowed."""
    _needs_dynamic(result)
    assert result["compiler_state"] == "absent"  # ComfyUI 0.33.0 has no such switch
    assert result["compiler_on_state"] == "on" and result["compiler_disabled_state"] == "disabled"
    assert "--disable-comfy-compiler" in result["compiler_on_compile"]
    assert result["compiler_on_attention_only"] == "accepted"


def test_model_digest_is_base_plus_patches_however_loaded(result: dict[str, Any]) -> None:
    """Item 4: the digest is the base weights' plus the patches'. A LoRA not written into the Parameters (Dynamic
    VRAM) and the same LoRA written in (legacy) give the same digest; the strength changes only the patch part, and
    the base is hashed once (cached)."""
    plain, unapplied = result["digest_plain"], result["digest_patched_unapplied"]
    applied, half = result["digest_patched_applied"], result["digest_half"]
    assert result["param_changed_by_patch"] is True  # the legacy patch did write the Parameter
    assert unapplied["digest"] == applied["digest"] != plain["digest"]
    assert plain["base_digest"] == unapplied["base_digest"] == applied["base_digest"] == half["base_digest"]
    assert half["patches_digest"] != applied["patches_digest"] and half["digest"] != applied["digest"]
    assert plain["cached"] is False and half["cached"] is True
    assert plain["patched_keys"] == 0 and applied["patched_keys"] == 1


def test_without_dynamic_vram_compile_clones_plainly(result: dict[str, Any]) -> None:
    """ComfyUI 0.8.0 (no ``is_dynamic``, no ``clone(disable_dynamic=...)``): compile keeps the plain clone and QKV
    fusion applies; the Comfy Compiler is absent."""
    if result["has_dynamic"]:
        pytest.skip("this ComfyUI has Dynamic VRAM: the emulated cases above apply")
    assert isinstance(result["plain_qkv"], int) and result["plain_qkv"] > 0
    assert "Dynamic VRAM" not in result["plain_report"] and result["compiler_state"] == "absent"


def test_optimize_executed_again_reuses_the_non_dynamic_copy(result: dict[str, Any]) -> None:
    """Issue 35 (the 2.7x under Dynamic VRAM): ComfyUI executes Optimize Model again whenever another prompt has
    evicted its output (and the LoRA loader before it too, which returns a new patcher), and each execution built a
    new non-dynamic copy, loading the checkpoint's weights again. Now one copy per Dynamic VRAM base module is kept
    and every execution compiles a clone of it: one load and one module for two plain and two LoRA executions, the
    same bytes as the copy built the old way (with a LoRA before or after Optimize too, the LoRA unpatched again when
    the plain MODEL runs next, and with patches added to the input MODEL in place between two executions: each takes
    the MODEL as it is then), and once the node's output is gone ComfyUI's loaded-model list still holds the module
    by a non-dynamic patcher of it (its memory stays accounted for and unloadable). The copy is a bare patcher
    (none of the patches of the MODEL it was first built for, which is freed once its output is gone) and is freed
    with the Dynamic VRAM module."""
    _needs_dynamic(result)
    assert result["reexec_reloads"] == 1
    assert result["reexec_same_module"] is True and result["reexec_module_is_dynamic_ones"] is False
    assert result["reexec_dynamic"] == [False, False, False, False]
    assert result["reexec_kept_is_bare"] is True and result["reexec_lora_patcher_freed"] is True
    assert result["reexec_input_dependent"] is True
    assert result["reexec_equal"] is True, result["reexec_max_abs_vs_old"]
    assert result["reexec_patch_after_changes"] is True and result["reexec_unpatched_again"] is True
    assert result["reexec_lora_equal_old"] is True, result["reexec_lora_max_abs_vs_old"]
    assert result["reexec_lora_changes"] is True
    assert result["reexec_current_patches"] is True and result["reexec_current_same_module"] is True
    assert result["reexec_tracked_by"] == ["non-dynamic, same module"]
    assert result["reexec_freed_with_its_model"] is True


def test_a_model_that_cannot_be_rebuilt_is_refused_naming_the_ways_out(result: dict[str, Any]) -> None:
    """A Dynamic VRAM MODEL from a loader that registered no ``cached_patcher_init`` cannot give the non-dynamic copy
    compile needs: Optimize Model refuses with a message naming a core loader, ``--disable-dynamic-vram`` and compile
    off (ComfyUI's own error names none of them)."""
    _needs_dynamic(result)
    msg = result["no_rebuild_recipe"]
    assert "cached_patcher_init" in msg and "--disable-dynamic-vram" in msg and "compile" in msg and "off" in msg, msg
