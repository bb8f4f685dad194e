"""core/paths.py: absolute paths in texts shown relative to known roots, routes and relative names left alone."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from steadfast.core import paths
from steadfast.core.recompile_watch import parse_recompile


def test_a_model_file_is_shown_relative_to_its_folder(tmp_path: Path) -> None:
    root = tmp_path / "ComfyUI" / "models" / "diffusers"
    bad = root / "corrupt_index" / "model_index.json"
    text = f"PipelineLoadError: {str(bad)!r} is not valid JSON"
    out = paths.redact(text, [(str(root), "models/diffusers")])
    assert out == "PipelineLoadError: 'models/diffusers/corrupt_index/model_index.json' is not valid JSON"
    assert str(tmp_path) not in out and paths.find_absolute_paths([out]) == []


def test_the_longest_root_wins_and_a_root_alone_is_its_label(tmp_path: Path) -> None:
    roots = [(str(tmp_path), "ComfyUI"), (str(tmp_path / "models" / "loras"), "models/loras")]
    assert paths.display_path(str(tmp_path / "models" / "loras" / "a.safetensors"), roots) == \
        "models/loras/a.safetensors"
    assert paths.display_path(str(tmp_path / "models" / "loras"), roots) == "models/loras"
    assert paths.display_path(str(tmp_path / "input" / "x.png"), roots) == "ComfyUI/input/x.png"


def test_source_files_show_as_module_paths_and_unknown_paths_lose_their_head(tmp_path: Path,
                                                                           monkeypatch) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    src = tmp_path / "comfy" / "ldm" / "modules" / "attention.py"
    assert paths.redact(f"forward in {src}:848") == "forward in comfy/ldm/modules/attention.py:848"
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    out = paths.redact(f"see {src}:848")
    assert out == "see .../modules/attention.py:848" and str(tmp_path) not in out


def test_routes_urls_and_relative_names_are_not_paths() -> None:
    text = ("GET /steadfast/compile_state after POST /free; http://127.0.0.1:8188/api/prompt; "
            "models/diffusers/sd15; bf16/fp16; 1/2")
    assert paths.redact(text) == text
    assert paths.find_absolute_paths([text]) == []


def test_windows_paths_are_redacted_too() -> None:
    out = paths.redact(r"cannot open C:\Users\alice\ComfyUI\models\loras\x.safetensors")
    assert "alice" not in out and out.endswith("loras/x.safetensors")


def test_redact_value_walks_json(tmp_path: Path) -> None:
    home = str(Path.home())
    value = {"records": [{"function": f"forward in {home}/x/y.py:1", "n": 3}], f"{tmp_path}/k": (1, "a/b")}
    out = paths.redact_value(value)
    assert home not in repr(out) and str(tmp_path) not in repr(out)
    assert out["records"][0]["n"] == 3 and list(out.values())[1] == (1, "a/b")


def test_a_recompile_record_names_no_install_path() -> None:
    torch_file = os.path.join(os.path.dirname(paths.__file__), "compile.py")  # under a sys.path entry in tests
    msg = f"Recompiling function forward in {torch_file}:848\n    triggered by the following guard failure(s):\n" \
          f"    - 0/0: tensor 'x' stride mismatch at index 0"
    event = parse_recompile(msg)
    assert paths.find_absolute_paths([event["function"], event["reason"]]) == []
    assert event["function"].startswith("forward in ") and event["function"].endswith("compile.py:848")
