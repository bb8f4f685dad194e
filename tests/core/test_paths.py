"""core/paths.py: absolute paths in texts shown relative to known roots, routes and relative names left alone."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from steadfast.core import paths
from steadfast.core.compile.recompiles import parse_recompile


def test_a_model_file_is_shown_relative_to_its_folder(tmp_path: Path) -> None:
    root = tmp_path / "ComfyUI" / "models" / "diffusers"
    bad = root / "corrupt_index" / "model_index.json"
    text = f"PipelineLoadError: {str(bad)!r} is not valid JSON"
    out = paths.redact(text, [(str(root), "models/diffusers")])
    assert out == "PipelineLoadError: 'models/diffusers/corrupt_index/model_index.json' is not valid JSON"
    assert str(tmp_path) not in out and paths.find_absolute_paths([out]) == []


def test_the_longest_root_wins_and_a_root_alone_is_its_label(tmp_path: Path) -> None:
    roots = [(str(tmp_path), "ComfyUI"), (str(tmp_path / "models" / "loras"), "models/loras")]
    assert (
        paths.display_path(str(tmp_path / "models" / "loras" / "a.safetensors"), roots) == "models/loras/a.safetensors"
    )
    assert paths.display_path(str(tmp_path / "models" / "loras"), roots) == "models/loras"
    assert paths.display_path(str(tmp_path / "input" / "x.png"), roots) == "ComfyUI/input/x.png"


def test_source_files_show_as_module_paths_and_unknown_paths_lose_their_head(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    src = tmp_path / "comfy" / "ldm" / "modules" / "attention.py"
    assert paths.redact(f"forward in {src}:848") == "forward in comfy/ldm/modules/attention.py:848"
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    out = paths.redact(f"see {src}:848")
    assert out == "see .../modules/attention.py:848" and str(tmp_path) not in out


def test_routes_urls_and_relative_names_are_not_paths() -> None:
    text = (
        "GET /steadfast/compile_state after POST /free; http://127.0.0.1:8188/api/prompt; "
        "models/diffusers/sd15; bf16/fp16; 1/2"
    )
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
    msg = (
        f"Recompiling function forward in {torch_file}:848\n    triggered by the following guard failure(s):\n"
        f"    - 0/0: tensor 'x' stride mismatch at index 0"
    )
    event = parse_recompile(msg)
    assert paths.find_absolute_paths([event["function"], event["reason"]]) == []
    assert event["function"].startswith("forward in ") and event["function"].endswith("compile.py:848")


def test_posix_roots_with_spaces_are_replaced_whole() -> None:
    """Measured before: ``/home/John Smith/ComfyUI/models/loras/x.safetensors`` came out as
    ``.../home/John Smith/...``: the pattern stopped at the space."""
    roots = [("/home/John Smith/ComfyUI/models/loras", "models/loras"), ("/home/John Smith/ComfyUI", "ComfyUI")]
    text = (
        "FileNotFoundError: '/home/John Smith/ComfyUI/models/loras/x.safetensors' is missing; "
        "logs in /home/John Smith/ComfyUI/user/comfyui.log, install /home/John Smith/ComfyUI"
    )
    out = paths.redact(text, roots)
    assert out == (
        "FileNotFoundError: 'models/loras/x.safetensors' is missing; logs in ComfyUI/user/comfyui.log, install ComfyUI"
    ), out
    assert "John" not in out and "Smith" not in out


def test_windows_roots_with_spaces_backslashes_and_drive_letters() -> None:
    """Windows user folders often hold spaces; a path can come with either separator, in another case, or
    with doubled backslashes (an exception's repr of the path)."""
    roots = [
        (r"C:\Users\John Smith\ComfyUI\models\loras", "models/loras"),
        (r"C:\Users\John Smith\ComfyUI", "ComfyUI"),
    ]
    text = (
        r"cannot open C:\Users\John Smith\ComfyUI\models\loras\x.safetensors; "
        r"FileNotFoundError: 'c:\\users\\john smith\\comfyui\\input\\a.png'; "
        r"see C:/Users/John Smith/ComfyUI/output"
    )
    out = paths.redact(text, roots)
    assert out == (
        "cannot open models/loras/x.safetensors; FileNotFoundError: 'ComfyUI/input/a.png'; see ComfyUI/output"
    ), out
    assert "John" not in out and "Smith" not in out and "\\" not in out


def test_a_windows_path_with_spaces_under_no_known_root_loses_its_head() -> None:
    out = paths.redact(r"cannot open C:\Users\John Smith\Documents\x.png now")
    assert out == "cannot open .../Documents/x.png now", out


def test_the_home_folder_is_a_known_root(monkeypatch) -> None:
    """A path under the server user's home folder (the user name, possibly with a space) shows as ``~/...``."""
    monkeypatch.setenv("HOME", "/home/John Smith")
    monkeypatch.setattr(paths, "_code_roots", lambda: [])
    out = paths.redact("loading /home/John Smith/venv/lib/x.py:12 and '/home/John Smith/My Models/a.ckpt'")
    assert out == "loading ~/venv/lib/x.py:12 and '~/My Models/a.ckpt'", out


def test_a_root_is_not_replaced_inside_a_longer_name() -> None:
    roots = [("/srv/Comfy", "ComfyUI")]
    out = paths.redact("/srv/ComfyUI2/models/a.ckpt and /x/srv/Comfy/b and /srv/Comfy/c", roots)
    assert out.count("ComfyUI/") == 1 and out.endswith(" and ComfyUI/c"), out  # only the last one is under it
    assert "ComfyUI/I2" not in out and "/x/ComfyUI" not in out and "xComfyUI" not in out, out
