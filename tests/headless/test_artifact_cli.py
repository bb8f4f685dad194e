"""``steadfast artifact export|import|inspect``: exit codes 0 / 2 and what they print."""

from __future__ import annotations

import json

from steadfast.core.compile.warm import artifact as art
from steadfast.core.compile.warm import cache as cc
from steadfast.headless.cli import main


def _cache(root, name="fleet", preset_options=None):
    cache = cc.open_cache(root, name, device="cpu", inductor_options=preset_options)
    (cache.path / "ab").mkdir()
    (cache.path / "ab" / "k.so").write_bytes(b"\x7fELF kernel")
    cache.adopt({}, {"ab/k.so": art.file_sha256(cache.path / "ab" / "k.so")})
    return cache


def test_export_inspect_import(tmp_path, capsys):
    _cache(tmp_path / "src")
    out = tmp_path / "warm.tar"
    assert (
        main(
            [
                "artifact",
                "export",
                "--name",
                "fleet",
                "--cache-root",
                str(tmp_path / "src"),
                "--device",
                "cpu",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    digest = art.file_sha256(out)
    assert f"sha256 {digest}" in printed and "1 files" in printed
    assert main(["artifact", "inspect", str(out)]) == 0
    assert "cache name 'fleet'" in capsys.readouterr().out
    assert main(["artifact", "inspect", "--json", str(out)]) == 0
    assert list(json.loads(capsys.readouterr().out)["members"]) == ["ab/k.so"]

    dst = tmp_path / "dst"
    assert main(["artifact", "import", str(out), "--cache-root", str(dst), "--sha256", "0" * 64]) == 2
    assert "not the pinned" in capsys.readouterr().err and not dst.exists()
    assert main(["artifact", "import", str(out), "--cache-root", str(dst), "--sha256", digest]) == 0
    assert "1 files (1 new)" in capsys.readouterr().out
    key = cc.cache_key(cc.cache_key_fields("cpu"))
    assert (dst / "fleet" / key / "ab" / "k.so").read_bytes() == b"\x7fELF kernel"


def test_export_without_a_folder_for_this_machine_lists_what_there_is(tmp_path, capsys):
    made = _cache(tmp_path, preset_options={"epilogue_fusion": False})  # another preset's folder only
    args = [
        "artifact",
        "export",
        "--name",
        "fleet",
        "--cache-root",
        str(tmp_path),
        "--device",
        "cpu",
        "-o",
        str(tmp_path / "a.tar"),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no folder for this machine" in err and f"--key {made.key}" in err and "epilogue_fusion" in err
    assert main([*args, "--key", made.key]) == 0 and (tmp_path / "a.tar").is_file()
    assert main(["artifact", "export", "--name", "nope", "--cache-root", str(tmp_path), "-o", "x.tar"]) == 2
    assert "no compile cache named 'nope'" in capsys.readouterr().err


def test_import_refuses_a_root_clients_can_write_in_the_comfyui_it_finds(tmp_path, capsys, monkeypatch):
    made = _cache(tmp_path / "src")
    out = tmp_path / "a.tar"
    assert (
        main(
            [
                "artifact",
                "export",
                "--name",
                "fleet",
                "--cache-root",
                str(tmp_path / "src"),
                "--key",
                made.key,
                "-o",
                str(out),
            ]
        )
        == 0
    )
    comfy = tmp_path / "ComfyUI"
    (comfy / "user" / "alice").mkdir(parents=True)
    (comfy / "main.py").write_text("")
    monkeypatch.setenv("COMFYUI_PATH", str(comfy))
    capsys.readouterr()
    for root in (comfy / "input" / "cc", comfy / "user" / "alice" / "cc"):  # /upload and /userdata write there
        assert main(["artifact", "import", str(out), "--cache-root", str(root)]) == 2
        assert not root.exists() or not any(root.rglob("*.so")), root
    assert "refused" in capsys.readouterr().err.lower()
    assert main(["artifact", "import", str(out), "--cache-root", str(comfy / "user" / "steadfast" / "cc")]) == 0
