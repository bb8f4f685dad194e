"""Security of the persistent compile cache: a workflow picks a cache NAME, never a path.

Inductor and Triton unpickle and ``dlopen`` what they find in their cache directory; a workflow that could
point it at a folder HTTP clients write (``input/`` via ``POST /upload/image``) could run code in the server.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from steadfast.core.compile.warm import cache as cc
from steadfast.core.compile.warm import cache_location as loc

ESCAPES = [
    "/tmp/x",
    "/",
    "..",
    "../input",
    "../../input/evil",
    "a/b",
    "a\\\\b",
    "~",
    "~root",
    ".hidden",
    "name/..",
    "x..y",
    "-dash",
    "",
    " ",
    "a" * 65,
    "c:\\\\temp",
    "input/",
    "%2e%2e",
]


@pytest.mark.parametrize("value", [v for v in ESCAPES if v.strip()])
def test_paths_are_refused_as_names(value: str) -> None:
    with pytest.raises(loc.CacheRefused) as info:
        loc.check_name(value)
    msg = str(info.value)
    assert "NAME" in msg and "operator" in msg


def test_plain_names_default_and_off() -> None:
    assert loc.check_name("") == loc.check_name(None) == loc.check_name("  ") == "default"
    assert loc.check_name("flux-dev_1.0") == "flux-dev_1.0"
    assert loc.check_name("off") is None and loc.check_name("OFF") is None


def _forbidden(base: Path) -> tuple[Path, ...]:
    dirs = tuple(base / d for d in ("input", "output", "temp", "user" + os.sep + "default"))
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def test_cache_lives_under_root_and_name(tmp_path: Path) -> None:
    root = tmp_path / "user" / "steadfast" / "compile_cache"
    cache = cc.open_cache(root, "flux", device="cpu", forbidden=_forbidden(tmp_path))
    assert cache is not None and cache.path.parent == root / "flux" and (cache.path / cc.MANIFEST).is_file()
    public = repr(cache.as_dict())
    assert str(tmp_path) not in public and cache.key not in public
    assert cache.as_dict() == {"name": "flux", "source": "", "messages": []}
    assert (
        cache.redact(f"ImportError: {cache.path.resolve()}/ab/x.so: file too short")
        == "ImportError: <compile cache 'flux'>/ab/x.so: file too short"
    )
    # one redactor (core/paths.py): the cache's folders are its label, any other absolute path is hidden too
    aside, elsewhere = cache.root / f"{cache.key}.bad-1", tmp_path / "elsewhere" / "x.so"
    assert (
        cache.redact(f"moved {aside} ({elsewhere})")
        == f"moved <compile cache 'flux'>/{cache.key}.bad-1 (.../elsewhere/x.so)"
    )


@pytest.mark.parametrize("where", ["input", "output", "temp", "user/default", "input/deep/er"])
def test_root_inside_a_client_writable_folder_is_refused(tmp_path: Path, where: str) -> None:
    forbidden = _forbidden(tmp_path)
    root = tmp_path / where / "cc"
    with pytest.raises(loc.CacheRefused) as info:
        cc.open_cache(root, "default", device="cpu", forbidden=forbidden)
    assert str(tmp_path) not in str(info.value)
    assert not (root / "default").exists()  # nothing created where a client could have planted files


def test_root_containing_a_client_writable_folder_is_refused(tmp_path: Path) -> None:
    """Root = ComfyUI's base dir would make the name 'input' reach the upload folder."""
    with pytest.raises(loc.CacheRefused):
        cc.open_cache(tmp_path, "input", device="cpu", forbidden=_forbidden(tmp_path))


def test_symlinked_name_is_refused(tmp_path: Path) -> None:
    forbidden = _forbidden(tmp_path)
    root = tmp_path / "user" / "steadfast" / "compile_cache"
    root.mkdir(parents=True)
    (root / "evil").symlink_to(tmp_path / "input", target_is_directory=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "away").symlink_to(outside, target_is_directory=True)
    for name in ("evil", "away"):
        with pytest.raises(loc.CacheRefused):
            cc.open_cache(root, name, device="cpu", forbidden=forbidden)
    assert list(outside.iterdir()) == [] and list((tmp_path / "input").iterdir()) == []


def test_symlinked_root_into_input_is_refused(tmp_path: Path) -> None:
    forbidden = _forbidden(tmp_path)
    link = tmp_path / "user" / "steadfast"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(tmp_path / "input", target_is_directory=True)
    with pytest.raises(loc.CacheRefused):
        cc.open_cache(link / "compile_cache", "default", device="cpu", forbidden=forbidden)


def test_a_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "afile").write_text("not a folder")
    with pytest.raises(loc.CacheRefused):
        cc.open_cache(root, "afile", device="cpu")


def test_open_cache_refuses_a_path_as_name(tmp_path: Path) -> None:
    for name in ("../x", str(tmp_path), "a/b"):
        with pytest.raises(loc.CacheRefused):
            cc.open_cache(tmp_path / "root", name, device="cpu")
    assert not (tmp_path / "x").exists()


def test_client_writable_lists_comfyuis_client_folders(tmp_path):
    user = tmp_path / "user"
    (user / "alice").mkdir(parents=True)
    (user / "steadfast").mkdir()
    dirs = loc.client_writable(tmp_path / "in", tmp_path / "out", tmp_path / "tmp", user)
    assert set(dirs) == {
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        str(tmp_path / "tmp"),
        str(user / "default"),
        str(user / "alice"),
    }  # the pack's own folder under user is not a client's
    assert loc.client_writable("i", "o", "t", tmp_path / "nouser")[3] == str(tmp_path / "nouser" / "default")
