"""core/compile/warm/artifact.py: a compile cache exported in one process warm-starts a fresh one (same bytes, an
inductor cache hit); tampered, foreign, traversing, linked or unpinned artifacts are refused and write nothing;
unrecorded files are not carried."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from steadfast.core import paths
from steadfast.core.compile.warm import artifact as art
from steadfast.core.compile.warm import cache as cc
from steadfast.core.compile.warm import cache_location as loc

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------
# Two fresh processes: one Linear+GELU block compiled by inductor (gcc) in the first, exported; the second imports
# the artifact into an empty cache root and runs the same compile.
# ---------------------------------------------------------------------------------------------
CHILD = r"""
import hashlib, importlib.util, json, os, sys, time
spec = importlib.util.spec_from_file_location("steadfast", sys.argv[1] + "/__init__.py",
                                              submodule_search_locations=[sys.argv[1]])
mod = importlib.util.module_from_spec(spec); sys.modules["steadfast"] = mod; spec.loader.exec_module(mod)
import torch
from steadfast.core import torch_compat
from steadfast.core.compile.warm import artifact as art
from steadfast.core.compile.warm import cache as cc

mode, root, path = sys.argv[2:5]
imported = None
if mode == "import":
    info = art.import_artifact(path, root, device="cpu")
    imported = {"files": info.files, "written": info.written, "name": info.name}

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x))

torch.manual_seed(0)
block = torch.compile(Block())
cache = cc.open_cache(root, "fleet", device="cpu")
outs = {}
with torch.inference_mode():
    for seed in (1, 2):
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(seed))
        y = cc.run_cached(cache, lambda: block(x))
        outs[seed] = hashlib.sha256(y.numpy().tobytes()).hexdigest()
sos = sorted(p.relative_to(cache.path).as_posix() for p in cache.path.rglob("*.so"))
exported = None
if mode == "export":
    info = art.export_artifact(cache, path)
    exported = {"files": info.files, "unrecorded": info.unrecorded, "sha256": info.sha256}
print("RESULT " + json.dumps({"counters": torch_compat.dynamo_counters(), "outs": outs, "sos": sos,
                              "messages": cache.messages, "imported": imported, "exported": exported}), flush=True)
os._exit(0)  # torch 2.11 may die at exit after compiled code ran (docs/compatibility.md, torch 2.11 exit row)
"""


def _child(mode: str, root: Path, path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (cc.INDUCTOR_ENV, cc.TRITON_ENV, loc.CACHE_ENV)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), mode, str(root), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_artifact_from_one_process_warm_starts_another(tmp_path):
    artifact = tmp_path / "warm.tar"
    made = _child("export", tmp_path / "one", artifact)
    assert made["counters"]["fxgraph_cache_miss"] == 1 and made["counters"]["fxgraph_cache_hit"] == 0
    assert made["exported"]["files"] >= 2 and made["exported"]["unrecorded"] == 0 and made["sos"]
    assert made["outs"]["1"] != made["outs"]["2"]  # the output depends on the input
    assert art.file_sha256(artifact) == made["exported"]["sha256"]

    warm = _child("import", tmp_path / "two", artifact)
    assert warm["imported"] == {
        "files": made["exported"]["files"],
        "written": made["exported"]["files"],
        "name": "fleet",
    }
    assert warm["outs"] == made["outs"]  # bit-equal to the cold compile
    assert warm["counters"]["fxgraph_cache_hit"] == 1 and warm["counters"]["fxgraph_cache_miss"] == 0
    assert warm["sos"] == made["sos"] and warm["messages"] == []  # no new kernel built, every file trusted
    again = art.import_artifact(artifact, tmp_path / "two", device="cpu")  # the next start, same root and env
    assert (again.files, again.written) == (made["exported"]["files"], 0)  # the warm run rewrote none of its files


# ---------------------------------------------------------------------------------------------
# Checks, on a cache with recorded files (no compile: the record is what inductor's watch would write)
# ---------------------------------------------------------------------------------------------
FILES = {"fxgraph/ab/entry": b"graph entry", "cd/kernel.so": b"\x7fELF kernel", "cd/kernel.py": b"code"}


def _recorded_cache(root: Path, name: str = "fleet") -> cc.CompileCache:
    cache = cc.open_cache(root, name, device="cpu")
    for rel, data in FILES.items():
        (cache.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache.path / rel).write_bytes(data)
    cache.adopt({}, {rel: art.file_sha256(cache.path / rel) for rel in FILES})
    return cache


def _tree(root: Path) -> dict[str, bytes]:
    return (
        {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        if root.exists()
        else {}
    )


@pytest.fixture
def made(tmp_path) -> Path:
    out = tmp_path / "warm.tar"
    info = art.export_artifact(_recorded_cache(tmp_path / "src"), out)
    assert info.files == len(FILES) and info.unrecorded == info.changed == 0
    return out


def _rewrite(src: Path, dst: Path, edit) -> None:
    """Copy the tar ``src`` to ``dst`` member by member, ``edit(info, data) -> (info, data) | None``."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tout:
        for m in tin:
            data = tin.extractfile(m).read() if m.isreg() else b""
            got = edit(m, data)
            if got is not None:
                info, data = got
                info.size = len(data) if info.isreg() else 0
                tout.addfile(info, io.BytesIO(data) if info.isreg() else None)


def _edit_manifest(src: Path, dst: Path, change) -> None:
    def edit(m, data):
        if m.name == art.MANIFEST_MEMBER:
            body = json.loads(data)
            change(body)
            data = json.dumps(body).encode()
        return m, data

    _rewrite(src, dst, edit)


def test_export_import_round_trip_records_and_keeps(made, tmp_path):
    body = art.inspect_artifact(made)
    assert body["name"] == "fleet" and set(body["members"]) == set(FILES)
    assert body["fields"]["device"].startswith("cpu")
    with tarfile.open(made) as tar:
        assert tar.getnames()[0] == art.MANIFEST_MEMBER
    info = art.import_artifact(made, tmp_path / "dst", device="cpu", expected_sha256=art.file_sha256(made))
    assert (info.files, info.written, info.name) == (len(FILES), len(FILES), "fleet")
    cache = cc.open_cache(tmp_path / "dst", "fleet", device="cpu")
    assert cache.messages == [] and {k: v for k, v in _tree(cache.path).items() if k in FILES} == FILES
    assert set(json.loads((cache.path / cc.FILES).read_text())) == set(FILES)  # trusted by open_cache
    again = art.import_artifact(made, tmp_path / "dst", device="cpu")  # same bytes already there: kept
    assert again.written == 0 and again.files == len(FILES)
    assert "key" not in info.as_dict() and str(tmp_path) not in json.dumps(info.as_dict())


def test_unrecorded_and_changed_files_are_not_exported(tmp_path):
    cache = _recorded_cache(tmp_path / "src")
    (cache.path / "zz").mkdir()
    (cache.path / "zz" / "planted.so").write_bytes(b"dropped in, never recorded")
    (cache.path / "cd" / "kernel.py").write_bytes(b"CODE")  # recorded, then changed
    info = art.export_artifact(cache.path, tmp_path / "a.tar", compress=False)  # a key folder path; a plain tar
    assert (info.files, info.unrecorded, info.changed, info.name) == (2, 1, 1, "fleet")
    assert set(art.inspect_artifact(tmp_path / "a.tar")["members"]) == {"fxgraph/ab/entry", "cd/kernel.so"}


def _refused(artifact: Path, root: Path, *words: str, **kw) -> str:
    with pytest.raises(art.ArtifactRefused) as e:
        art.import_artifact(artifact, root, device="cpu", **kw)
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    assert str(root) not in msg and str(artifact.parent) not in msg  # no absolute path
    cache_files = {k for k in _tree(root) if not k.endswith((cc.MANIFEST, cc.FILES))}
    assert cache_files == set(), cache_files  # nothing written in the target cache, staging removed
    return msg


def test_tampered_member_is_refused_and_writes_nothing(made, tmp_path):
    bad = tmp_path / "bad.tar"
    _rewrite(made, bad, lambda m, d: (m, bytes([d[0] ^ 1]) + d[1:]) if m.name == "cd/kernel.so" else (m, d))
    _refused(bad, tmp_path / "dst", "cd/kernel.so", "checksum")
    dropped = tmp_path / "dropped.tar"
    _rewrite(made, dropped, lambda m, d: None if m.name == "cd/kernel.py" else (m, d))
    _refused(dropped, tmp_path / "dst", "missing")


def test_foreign_artifact_is_refused_naming_the_field(made, tmp_path):
    foreign = tmp_path / "foreign.tar"
    _edit_manifest(made, foreign, lambda b: b["fields"].__setitem__("torch", "2.99.0"))
    msg = _refused(foreign, tmp_path / "dst", "made for torch 2.99.0, this is")
    assert cc.cache_key_fields("cpu")["torch"] in msg
    isa = tmp_path / "isa.tar"
    _edit_manifest(made, isa, lambda b: b["fields"].__setitem__("device", "cpu NOPE"))
    _refused(isa, tmp_path / "dst", "made for device cpu NOPE")
    rekeyed = tmp_path / "rekeyed.tar"
    _edit_manifest(made, rekeyed, lambda b: b.__setitem__("key", "torch0-cpu-x-000000000000"))
    _refused(rekeyed, tmp_path / "dst", "key")
    pack = tmp_path / "pack.tar"
    _edit_manifest(made, pack, lambda b: b.__setitem__("pack", "9.9.9"))
    _refused(pack, tmp_path / "dst", "Steadfast 9.9.9")


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink", "hardlink", "unlisted", "not_first"])
def test_path_traversal_links_and_unlisted_members_are_refused(made, tmp_path, kind):
    bad = tmp_path / f"{kind}.tar"

    def edit(m, data):
        if m.name != "cd/kernel.so":
            return m, data
        if kind == "dotdot":
            m.name = "cd/../../../escaped.so"
        elif kind == "absolute":
            m.name = str(tmp_path / "abs.so")
        elif kind in ("symlink", "hardlink"):
            m.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
            m.linkname = "/etc/passwd"
        elif kind == "unlisted":
            m.name = "cd/other.so"
        return m, data

    if kind == "not_first":
        with tarfile.open(made) as tin, tarfile.open(bad, "w") as tout:
            members = tin.getmembers()
            for m in [*members[1:], members[0]]:
                tout.addfile(m, tin.extractfile(m))
    else:
        _rewrite(made, bad, edit)
    _refused(bad, tmp_path / "dst", "not a Steadfast compile artifact" if kind == "not_first" else "member")
    assert not (tmp_path / "escaped.so").exists() and not (tmp_path / "abs.so").exists()


def test_wrong_pinned_digest_is_refused_before_anything(made, tmp_path):
    _refused(made, tmp_path / "dst", "not the pinned", expected_sha256="0" * 64)
    assert not (tmp_path / "dst").exists()


def test_clash_with_existing_bytes_refuses_and_keeps_the_cache(made, tmp_path):
    existing = _recorded_cache(tmp_path / "dst")
    (existing.path / "cd" / "kernel.so").write_bytes(b"\x7fELF other kernel")
    existing.adopt({}, {"cd/kernel.so": art.file_sha256(existing.path / "cd" / "kernel.so")})
    before = _tree(existing.path)
    with pytest.raises(art.ArtifactRefused, match="already holds other bytes"):
        art.import_artifact(made, tmp_path / "dst", device="cpu")
    assert _tree(existing.path) == before and not list(existing.root.glob(".artifact-staging-*"))


def test_load_from_env_lists_imports_and_refusals(made, tmp_path, monkeypatch):
    env = {
        art.ARTIFACT_ENV: os.pathsep.join([str(made), str(tmp_path / "missing.tar")]),
        art.ARTIFACT_SHA_ENV: f"{art.file_sha256(made)},{'0' * 64}",
    }
    monkeypatch.setattr(art, "_LOADED", [])
    out = art.load_from_env(tmp_path / "dst", device="cpu", environ=env)
    assert [e["status"] for e in out] == ["imported", "refused"] and out[0]["files"] == len(FILES)
    assert "missing.tar" in out[1]["reason"] and str(tmp_path) not in json.dumps(out)
    assert (
        art.loaded_artifacts() == out
        and art.cache_note("fleet") == f"warm state from compile artifact warm.tar ({len(FILES)} files)"
        and art.cache_note("default") is None
    )
    wrong = art.load_from_env(tmp_path / "dst", device="cpu", environ={**env, art.ARTIFACT_SHA_ENV: "0" * 64})
    assert [e["status"] for e in wrong] == ["refused", "refused"] and "2 artifact" in wrong[0]["reason"]
    off = art.load_from_env(
        None,
        device="cpu",
        root_note="disabled",
        environ={art.ARTIFACT_ENV: str(made), art.ARTIFACT_SHA_ENV: art.file_sha256(made)},
    )
    assert off[0]["status"] == "refused" and "compile cache is off (disabled)" in off[0]["reason"]


def test_an_unpinned_artifact_is_refused_unless_the_operator_opts_in(made, tmp_path, monkeypatch):
    monkeypatch.setattr(art, "_LOADED", [])
    dst = tmp_path / "dst"
    unpinned = art.load_from_env(dst, device="cpu", environ={art.ARTIFACT_ENV: str(made)})
    assert unpinned[0]["status"] == "refused" and art.UNPINNED_ENV in unpinned[0]["reason"] and not dst.exists()
    two = os.pathsep.join([str(made), str(made)])
    empty = art.load_from_env(
        dst, device="cpu", environ={art.ARTIFACT_ENV: two, art.ARTIFACT_SHA_ENV: f",{art.file_sha256(made)}"}
    )
    assert empty[0]["status"] == "refused" and "is empty" in empty[0]["reason"]  # an empty entry is an error
    opted = art.load_from_env(dst, device="cpu", environ={art.ARTIFACT_ENV: str(made), art.UNPINNED_ENV: "1"})
    assert opted[0]["status"] == "imported" and opted[0]["files"] == len(FILES)


def test_a_world_writable_artifact_or_cache_root_is_warned_about(made, tmp_path, caplog):
    import logging

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # no sticky bit: anyone may replace what is in it
    copy = shared / "warm.tar"
    copy.write_bytes(made.read_bytes())
    with caplog.at_level(logging.WARNING, logger="steadfast.compile_cache"):
        out = art.load_from_env(
            shared / "root",
            device="cpu",
            environ={art.ARTIFACT_ENV: str(copy), art.ARTIFACT_SHA_ENV: art.file_sha256(copy)},
        )
    assert out[0]["status"] == "imported"
    assert any("artifact's folder is world-writable" in r.getMessage() for r in caplog.records), caplog.text
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # /tmp-like: not warned about
    assert paths.world_writable(sticky) is None and paths.world_writable(shared) is not None


def test_inspect_refuses_an_extended_header_over_its_budget(tmp_path):
    big = tmp_path / "big.tar"
    with tarfile.open(big, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(art.MANIFEST_MEMBER)
        info.pax_headers = {"comment": "x" * (art.MAX_HEADER_BYTES + 10)}
        data = b"{}"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(art.ArtifactRefused, match="extended tar header"):
        art.inspect_artifact(big)


def test_an_artifact_over_the_size_cap_is_refused_before_a_member_is_read(made, tmp_path, monkeypatch):
    total = sum(size for size, _ in art.inspect_artifact(made)["members"].values())
    monkeypatch.setenv(art.MAX_BYTES_ENV, str(total - 1))
    _refused(made, tmp_path / "dst", "lists", str(total), art.MAX_BYTES_ENV)
    monkeypatch.setenv(art.MAX_BYTES_ENV, "0")
    _refused(made, tmp_path / "dst", art.MAX_BYTES_ENV, "positive")
    monkeypatch.setenv(art.MAX_BYTES_ENV, str(total))  # at the cap: imported
    assert art.import_artifact(made, tmp_path / "dst", device="cpu").files > 0
