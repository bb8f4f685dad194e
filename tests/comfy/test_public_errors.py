"""No absolute server path reaches a client: hostile and broken inputs over HTTP, then the compile state.

Every error path below is walked on a real ComfyUI server: corrupt, empty and half-copied pipeline folders,
hostile pipeline names, garbage and non-LoRA ``.safetensors`` files, cache names that are paths. For each,
the client-visible text (validation ``node_errors``, the execution error's message) is searched for an
absolute path of this machine (the server's base folder, ComfyUI's install, the home folder, or any
``/existing-folder/...``). ComfyUI's own ``traceback`` field lists its source files; that is ComfyUI's, not
the pack's, and is not checked. Then ``GET /steadfast/compile_state`` after a recompile: the record names
the recompiled function by its file in ComfyUI (``forward in comfy/...py:LINE``), not the install path.
ComfyUI names an error's type ``module.Class`` and a custom node's module by its folder's path: the pack's
exception types come back as ``steadfast.core....Error``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from comfy_server import ComfyServer, PromptFailed, PromptRejected
from recompile_workflows import build, go
from steadfast_workflows import run, text

from steadfast.core.paths import find_absolute_paths

pytestmark = pytest.mark.comfyui

SD = "steadfast-public-sd"


def _leaks(server: ComfyServer, *texts: str) -> list[str]:
    """Absolute paths of this machine in ``texts``, plus any known root found verbatim."""
    roots = {str(server.base_dir), str(server.base_dir.resolve()), str(server.comfyui), str(Path.home())}
    found = find_absolute_paths(texts)
    found += [r for r in roots for t in texts if r in t]
    return found


@pytest.fixture(scope="module")
def server(comfy_server: ComfyServer, tmp_path_factory: pytest.TempPathFactory) -> ComfyServer:
    """The session server with one good tiny pipeline, broken pipeline folders and broken LoRA files."""
    from steadfast.headless import tiny_pipelines as tiny

    root = tmp_path_factory.mktemp("public")
    sd = tiny.build_tiny_sd(root / "sd", seed=0)
    corrupt = root / "corrupt_index"
    corrupt.mkdir()
    (corrupt / "model_index.json").write_text("{not json", encoding="utf-8")
    no_index = root / "no_index"
    no_index.mkdir()
    (no_index / "readme.txt").write_text("x", encoding="utf-8")
    no_class = root / "no_class"
    no_class.mkdir()
    (no_class / "model_index.json").write_text("{}", encoding="utf-8")
    half = shutil.copytree(sd, root / "half", ignore=shutil.ignore_patterns("unet"))
    bad_config = shutil.copytree(sd, root / "bad_config")
    (bad_config / "unet" / "config.json").write_text("{broken", encoding="utf-8")
    comfy_server.link_models(
        "diffusers",
        {
            SD: sd,
            "corrupt_index": corrupt,
            "no_index": no_index,
            "no_class": no_class,
            "half": half,
            "bad_config": bad_config,
        },
    )
    garbage = root / "garbage.safetensors"
    garbage.write_bytes(os.urandom(256))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    not_lora = root / "not_lora.safetensors"
    not_lora.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    listy = root / "listy.safetensors"
    listy.write_bytes(struct.pack("<Q", 2) + b"[]")
    comfy_server.link_models(
        "loras", {"garbage.safetensors": garbage, "not_lora.safetensors": not_lora, "listy.safetensors": listy}
    )
    return comfy_server


def _load(name: str) -> dict[str, Any]:
    """The loader, its report shown by ComfyUI's Preview Any (an output node, so the loader runs)."""
    return {
        "1": {"class_type": "SteadfastLoadDiffusersPipeline", "inputs": {"pipeline_name": name, "dtype": "fp32"}},
        "9": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}},
    }


def _lora(lora: str) -> dict[str, Any]:
    wf = _load(SD)
    wf["2"] = {
        "class_type": "SteadfastPipelineLoRA",
        "inputs": {"pipeline": ["1", 0], "lora_name": lora, "max_rank": 64},
    }
    wf["9"]["inputs"]["source"] = ["2", 1]
    return wf


def _client_texts(server: ComfyServer, wf: dict[str, Any]) -> list[str]:
    """What the client is told when ``wf`` is queued; it must fail at one of the pack's nodes."""
    try:
        server.run(wf)
    except PromptRejected as e:
        assert set(e.node_errors or {}) & set(wf), f"rejected for another reason: {e}"
        return [json.dumps(e.error), json.dumps(e.node_errors)]
    except PromptFailed as e:
        assert e.node_id in wf and (e.node_type or "").startswith("Steadfast"), str(e)
        return [e.exception_message, e.exception_type or ""]
    raise AssertionError("the workflow ran instead of failing")


CASES = {
    "corrupt model_index.json": _load("corrupt_index"),
    "folder without model_index.json": _load("no_index"),
    "model_index.json without _class_name": _load("no_class"),
    "component folder missing": _load("half"),
    "component config broken": _load("bad_config"),
    "pipeline name not in the list": _load("missing"),
    "pipeline name is an absolute path": _load("/etc"),
    "pipeline name escapes the folder": _load("../../custom_nodes"),
    "garbage LoRA file": _lora("garbage.safetensors"),
    "safetensors without LoRA weights": _lora("not_lora.safetensors"),
    "safetensors header not an object": _lora("listy.safetensors"),
    "LoRA name not in the list": _lora("../../../etc/passwd"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_errors_name_no_absolute_path(server: ComfyServer, case: str) -> None:
    texts = _client_texts(server, CASES[case])
    assert not _leaks(server, *texts), f"{case}: {texts}"


def test_a_broken_pipeline_is_named_relative_to_the_models_folder(server: ComfyServer) -> None:
    """The message still says which file is wrong, as ComfyUI's model folder would name it."""
    with pytest.raises(PromptFailed) as info:
        server.run(_load("corrupt_index"))
    msg = info.value.exception_message
    assert "models/diffusers/corrupt_index/model_index.json" in msg and "not valid JSON" in msg, msg
    with pytest.raises(PromptFailed) as info:
        server.run(_lora("garbage.safetensors"))
    assert "models/loras/garbage.safetensors" in info.value.exception_message, info.value.exception_message


def test_loader_report_names_the_pipeline_not_its_path(server: ComfyServer) -> None:
    entry = run(server, _load(SD))
    report = text(entry, "9")  # the loader's report output, shown by Preview Any
    assert f"models/diffusers/{SD}" in report and not _leaks(server, report), report


@pytest.mark.parametrize("value", ["/tmp/steadfast-evil", "../../input/poison"])
def test_compile_cache_path_rejection_names_no_path(server: ComfyServer, value: str) -> None:
    """The client's own value may come back; no path of the server's may."""
    texts = [t.replace(value, "<value>") for t in _client_texts(server, build(backend="inductor", cache=value))]
    assert "compile_cache" in texts[1] and not _leaks(server, *texts), texts


def test_compile_state_recompile_records_name_module_paths(server: ComfyServer) -> None:
    """A size change with dynamic=false recompiles; the record says where, without the install path."""
    go(server, dynamic="false", width=64, height=64, seed=5)
    go(server, dynamic="false", width=64, height=72, seed=5)
    state = server.get("/steadfast/compile_state")
    raw = json.dumps(state)
    functions = [e.get("function", "") for r in state["records"] for e in r.get("recompiles", [])]
    assert any(re.search(r" in (ComfyUI/)?comfy/\S+\.py:\d+$", f) for f in functions), functions
    assert not _leaks(server, raw), _leaks(server, raw)


def test_the_server_log_keeps_the_full_path(server: ComfyServer) -> None:
    """The client's message is rewritten; the operator's log still names the file: the wrapper logs the original
    text (``steadfast`` logger) just before ComfyUI logs the rewritten exception and its traceback."""
    bad = Path(server.base_dir) / "models" / "diffusers" / "corrupt_index" / "model_index.json"
    with pytest.raises(PromptFailed) as info:
        server.run(_load("corrupt_index"))
    assert str(bad) not in info.value.exception_message
    log = server.log_tail(400)
    original = [line for line in log.splitlines() if "the client sees this error without absolute paths" in line]
    assert original and str(bad) in original[-1], (str(bad), original[-3:])
    assert "!!! Exception during processing !!!" in log  # ComfyUI's own line follows, rewritten


def test_comfyuis_traceback_field_carries_source_paths(server: ComfyServer) -> None:
    """What the README says the pack does not control: ComfyUI's ``execution_error`` message has a
    ``traceback`` field (``traceback.format_tb``: each frame's source file, absolute) next to the pack's
    rewritten ``exception_message``. ComfyUI 0.33 has no switch to leave it out."""
    with pytest.raises(PromptFailed) as info:
        server.run(_load("corrupt_index"))
    assert not _leaks(server, info.value.exception_message)
    frames = "".join(info.value.traceback)
    assert 'File "/' in frames and find_absolute_paths([frames]), frames[:500]


def test_guard_node_keeps_interrupts_and_oom_and_supports_async(comfyui_path: Path) -> None:
    """nodes/host/public_text.guard_node on toy nodes in a child process (ComfyUI importable, no server): a
    ValueError is rewritten in place (same object and type) and its original text logged; OOM, ComfyUI's
    InterruptProcessingException and KeyboardInterrupt pass untouched (ComfyUI acts on their type); an
    ``async def execute`` stays a coroutine function and is rewritten when awaited."""
    import subprocess
    import sys

    env = {**os.environ, "COMFYUI_PATH": str(comfyui_path), "PYTHONDONTWRITEBYTECODE": "1"}
    child = Path(__file__).parent / "public_text_child.py"
    proc = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    secret, cases = out["secret"], out["cases"]
    for suffix in ("", "_async"):
        err = cases["value_error" + suffix]
        assert err["coroutine"] == (suffix == "_async") and err["same_object"] and err["isinstance"], err
        assert secret not in err["text"] and "models/loras/John Smith's lora.safetensors" in err["text"], err
        assert len(err["logged"]) == 1 and secret in err["logged"][0], err
        for name in ("oom", "interrupt", "keyboard"):
            c = cases[name + suffix]
            assert c["same_object"] and c["same_type"] and c["logged"] == [], (name + suffix, c)
        assert secret in cases["oom" + suffix]["text"]  # untouched: ComfyUI's is_oom reads type and text
