"""A workflow never chooses a filesystem path the server writes to or loads code/pickles from.

Attack shown before the fix, over HTTP only: ``POST /upload/image`` writes any bytes under ``input/``;
``/system_stats`` and ``/steadfast/compile_state`` revealed the base directory and the cache key; pointing
Optimize's ``compile_cache`` at the upload made inductor load the attacker's pickle. Now ``compile_cache``
is a *name* under the operator's root, refused at validation when it is anything else, and the root is
refused when it overlaps a folder clients can write.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
from comfy_server import ComfyServer, PromptFailed, PromptRejected
from recompile_workflows import build
from tiny_sd15 import CHECKPOINT_NAME as TINY_CKPT_NAME

from steadfast.core.compile.warm import cache as cc
from steadfast.core.compile.warm import cache_location as loc

pytestmark = pytest.mark.comfyui

ESCAPES = ["/tmp/steadfast-evil", "../../input/poison", "..", "../input", "a/b", "~", "poison/../..", "/"]


class _Payload:
    """Unpickling this creates a marker file: proof that the server ran the attacker's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def _plant_poison(server: ComfyServer, marker: Path, subfolder: str) -> list[str]:
    """Upload a poisoned 'cache' through the public API, where a cache for this environment would live."""
    key = cc.cache_key(cc.cache_key_fields("cpu"))
    payload = pickle.dumps(_Payload(marker))
    names = []
    for sub in (f"{subfolder}/{key}/fxgraph/aa", f"{subfolder}/default/{key}/fxgraph/aa", f"{subfolder}/{key}"):
        answer = server.upload("entry", payload, subfolder=sub)
        names.append(f"{answer['subfolder']}/{answer['name']}")
    return names


@pytest.fixture(scope="module")
def server(comfyui_path: Path, tiny_ckpt: Path) -> Iterator[ComfyServer]:
    with ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path) as srv:
        yield srv


@pytest.mark.parametrize("value", ESCAPES)
def test_a_path_as_compile_cache_is_rejected_before_anything_runs(
    server: ComfyServer, value: str, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    planted = _plant_poison(server, marker, "poison")
    assert all((server.base_dir / "input" / p).is_file() for p in planted)  # the upload really landed
    wf = build(backend="inductor", cache=value)
    with pytest.raises(PromptRejected) as info:
        server.run(wf)
    text = json.dumps(info.value.node_errors)
    assert "compile_cache must be a cache NAME" in text and "opt" in info.value.node_errors
    assert not marker.exists()
    assert not Path("/tmp/steadfast-evil").exists()


def test_compile_state_reveals_no_path_or_key(server: ComfyServer) -> None:
    server.run(build(backend="eager"))  # a compile record exists (eager: no inductor cache)
    raw = json.dumps(server.get("/steadfast/compile_state"))
    key = cc.cache_key(cc.cache_key_fields("cpu"))
    assert str(server.base_dir) not in raw and key not in raw and "/tmp" not in raw


def test_operator_root_inside_input_is_refused_and_poison_never_runs(
    comfyui_path: Path, tiny_ckpt: Path, tmp_path: Path
) -> None:
    """An operator who points ``$STEADFAST_COMPILE_CACHE`` into ``input/`` gets a clear error, not an RCE."""
    marker = tmp_path / "marker"
    probe = ComfyServer({TINY_CKPT_NAME: tiny_ckpt}, comfyui=comfyui_path)
    probe.base_dir = probe._make_base()
    root = probe.base_dir / "input" / "cc"
    probe.env = {loc.CACHE_ENV: str(root)}
    with probe as srv:
        _plant_poison(srv, marker, "cc")
        with pytest.raises(PromptFailed) as info:
            srv.run(build(backend="inductor", cache=""))
        msg = info.value.exception_message
        assert "overlaps a folder that HTTP clients can write" in msg and str(srv.base_dir) not in msg
        assert "refused" in srv.log_tail(200)
    assert not marker.exists()
