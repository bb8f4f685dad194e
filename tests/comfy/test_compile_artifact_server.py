"""A fleet's shared warm state over HTTP: a compile artifact exported from one ComfyUI's cache warm-starts a server
with an EMPTY cache root (``$STEADFAST_COMPILE_ARTIFACT``), bit-equal, answered by the precompiled blocks it carries
(an inductor cache hit where that route is off); refused artifacts
(unreadable, foreign) are listed in ``GET /steadfast/compile_state`` and do not stop the server.

One server, started twice: first with cache root A (and a broken artifact), cold compile of the tiny SD1.5 (inductor
regional, Warmup), then ``steadfast artifact export`` of A; then restarted with an empty cache root B and the
artifact (pinned) plus a foreign one; last, a server installed in another folder on the same artifact.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from comfy_server import ComfyServer
from recompile_workflows import go
from steadfast_workflows import compile_records, text
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME

from steadfast.core.compile.warm import artifact as art
from steadfast.headless.artifact_cli import main as artifact_main

pytestmark = [pytest.mark.comfyui, pytest.mark.slow]


def _foreign(src: Path, dst: Path) -> None:
    """``src`` with its manifest saying torch 2.99.0 (a file made on another torch)."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w:gz") as tout:
        for m in tin:
            data = tin.extractfile(m).read()
            if m.name == art.MANIFEST_MEMBER:
                body = json.loads(data)
                body["fields"]["torch"] = "2.99.0"
                data = json.dumps(body).encode()
                m.size = len(data)
            tout.addfile(m, io.BytesIO(data))


def test_artifact_warm_starts_a_server_with_an_empty_cache(
    comfyui_path: Path, tiny_ckpt: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.tar"
    broken.write_bytes(b"not a tar at all")
    env = {
        "STEADFAST_COMPILE_CACHE": str(tmp_path / "cache_a"),
        art.ARTIFACT_ENV: str(broken),
        art.UNPINNED_ENV: "1",
    }  # opted in: the file itself is then checked, and refused
    inductor = {"backend": "inductor", "warm": ""}
    with ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path, env=env) as srv:
        (refused,) = srv.get("/steadfast/compile_state")["artifacts"]  # the server started regardless
        assert refused["status"] == "refused" and "broken.tar" in refused["reason"]
        assert "not a readable tar" in refused["reason"] and str(tmp_path) not in refused["reason"]
        cold = go(srv, **inductor)
        cold_rec = max(compile_records(srv), key=lambda r: r["created"])
        assert cold_rec["cache_state"].get("fxgraph_cache_miss", 0) >= 1
        assert cold_rec["cache_state"].get("fxgraph_cache_hit", 0) == 0

        artifact = tmp_path / "warm.tar"
        assert (
            artifact_main(
                [
                    "export",
                    "--name",
                    "default",
                    "--cache-root",
                    str(tmp_path / "cache_a"),
                    "--device",
                    "cpu",
                    "-o",
                    str(artifact),
                ]
            )
            == 0
        )
        foreign = tmp_path / "foreign.tar"
        _foreign(artifact, foreign)
        digests = [art.file_sha256(artifact), art.file_sha256(foreign)]  # both pinned: the manifest refuses foreign
        srv.env.update(
            {
                "STEADFAST_COMPILE_CACHE": str(tmp_path / "cache_b"),
                art.ARTIFACT_ENV: os.pathsep.join([str(artifact), str(foreign)]),
                art.ARTIFACT_SHA_ENV: ",".join(digests),
            }
        )
        srv.restart()  # a new server: nothing compiled in memory, an empty cache root, the artifact
        imported, refused = srv.get("/steadfast/compile_state")["artifacts"]
        n = len(art.inspect_artifact(artifact)["members"])
        assert imported["status"] == "imported" and imported["file"] == "warm.tar" and imported["files"] == n
        assert imported["written"] == n and imported["sha256"] == digests[0] and imported["name"] == "default"
        assert refused["status"] == "refused" and "made for torch 2.99.0, this is" in refused["reason"]
        assert "key" not in imported and str(tmp_path) not in json.dumps([imported, refused])
        assert "Steadfast compile artifact warm.tar: imported" in srv.log_tail(400)

        warm = go(srv, **inductor)
        warm_rec = max(compile_records(srv), key=lambda r: r["created"])
        assert warm["hash"] == cold["hash"]  # the same bits as the server that compiled
        pre = warm_rec.get("precompiled") or {}
        assert pre.get("enabled"), pre  # on by default on both rows' torch (2.11, 2.14)
        # the precompiled blocks travelled in the artifact and answered: nothing traced
        assert pre["loads"] >= 1 and pre["hits"] >= 1 and pre["fallbacks"] == 0, pre
        assert pre["saves"] == 0 and warm_rec["graphs"] == 0, pre
        assert warm_rec["cache_state"].get("fxgraph_cache_miss", 0) == 0  # nothing compiled from scratch
        assert warm_rec["compile_cache"]["messages"] == []  # every file trusted
        assert f"warm state from compile artifact warm.tar ({n} files)" in text(warm["entry"], "opt")
        c, w = cold_rec["first_call_seconds"], warm_rec["first_call_seconds"]
        print(
            f"\n[compile artifact] tiny SD1.5 inductor regional, first call (Warmup): cold {c:.2f} s, "
            f"from the artifact on an empty cache root {w:.2f} s; {n} files, {artifact.stat().st_size} bytes"
        )

    # a replica installed in ANOTHER folder (ComfyUI names the pack's modules by that folder): nothing is compiled
    # from scratch and the bytes are the same; since issue 45 (item 5: keys, carried guards and the artifacts' module
    # names portable) the artifact's precompiled blocks answer this install too (on 2363d88 they were traced again)
    env = {
        "STEADFAST_COMPILE_CACHE": str(tmp_path / "cache_c"),
        art.ARTIFACT_ENV: str(artifact),
        art.ARTIFACT_SHA_ENV: digests[0],
    }
    with ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path, env=env) as other:
        moved = go(other, **inductor)
        rec = max(compile_records(other), key=lambda r: r["created"])
        assert moved["hash"] == cold["hash"]
        assert rec["cache_state"].get("fxgraph_cache_miss", 0) == 0
        pre = rec.get("precompiled") or {}
        if pre.get("enabled"):
            assert pre["hits"] >= 1 and pre["fallbacks"] == 0 and pre["saves"] == 0, pre
        else:
            assert rec["cache_state"].get("fxgraph_cache_hit", 0) >= 1
