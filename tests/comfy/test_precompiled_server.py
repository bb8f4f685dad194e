"""Precompiled regional blocks in ComfyUI, in FRESH server processes: the tiny SD1.5 with a LoRA, regional inductor
compile, the persistent compile cache (default name), Warmup.

The first server process runs the jit and saves the artifacts; after a restart the blocks are answered by them
(on by default, both rows) with the same bytes as the jit-run, and a LoRA strength changed after the load (weights,
inputs of the artifact, changed in place) gives the jit's bytes for that strength. An artifact not recorded by the
pack is never loaded: the fallback and its reason are in the compile state and the run record. Torch 2.11 loads
SD1.5's artifacts only with :func:`core.torch_compat.portable_guard_state` in force while saving.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from comfy_server import ComfyServer
from recompile_workflows import (
    PRECOMPILED_CASES,
    TINY_CKPT_NAME,
    build,
    go,
    judge_precompiled,
    precompiled_against_jit,
    server_with_lora,
)
from steadfast_workflows import compile_records, record_of
from steadfast_workflows import run as run_prompt

pytestmark = pytest.mark.comfyui

LORA = "steadfast_precompiled_lora.safetensors"


def _record(server) -> dict[str, Any]:
    return max(compile_records(server), key=lambda r: r["created"])


def _variant_ids(cache_root: Path) -> set[str]:
    """The ids (12 hex, as ``answered`` names them) of every variant recorded under a compile cache folder."""
    ids = set()
    for record in cache_root.glob("**/precompiled/*.json"):
        ids |= {v["id"][:12] for v in json.loads(record.read_text())["variants"]}
    return ids


def _artifacts(server) -> list[Path]:
    root = server.base_dir / "user" / "steadfast" / "compile_cache" / "default"
    return sorted(p for p in root.glob("*/precompiled/*.pt2") if ".bad-" not in p.parts[-3])


def test_precompiled_warm_start_is_bit_equal_and_fallbacks_are_visible(
    comfyui_path: Path, tiny_ckpt: Path, tmp_path: Path
) -> None:
    run = {"backend": "inductor", "warm": ""}
    with server_with_lora(comfyui_path, tiny_ckpt, tmp_path, LORA) as s:
        cold = go(s, **run, lora=(LORA, 1.0))
        cold_state = _record(s)["precompiled"]
        jit_half = go(s, **run, lora=(LORA, 0.5))  # the saving process: its own artifacts answer after the save
        assert cold_state["enabled"] and cold_state["saves"] >= 1, json.dumps(cold_state)
        # it read its saves back as a warm-started process would, and they answered its later steps
        assert cold_state["loads"] >= 1 and cold_state["hits"] > 0 and cold_state["fallbacks"] == 0, cold_state
        assert jit_half["hash"] != cold["hash"] and len(_artifacts(s)) == cold_state["saves"]
        s.restart()
        warm = go(s, **run, lora=(LORA, 1.0))
        warm_rec = _record(s)
        half = go(s, **run, lora=(LORA, 0.5))
        state = _record(s)["precompiled"]
        assert warm["hash"] == cold["hash"] and half["hash"] == jit_half["hash"]  # the jit's bytes, both strengths
        assert warm["compile"]["precompiled"]["enabled"] is True  # in the run record too
        assert warm_rec["graphs"] == 0 and state["loads"] == cold_state["saves"] and state["fallbacks"] == 0
        assert state["hits"] > warm_rec["precompiled"]["hits"] > 0  # the LoRA run hit the artifacts too
        checks = {v["checks"] for v in state["answered"].values()}
        assert checks == {"one guard tree"}, state["answered"]  # torch's guards and the pack's: one tree per answer
        print(
            f"\n[precompiled, tiny SD1.5, ComfyUI] first call (Warmup) after the restart "
            f"{warm_rec['first_call_seconds']:.2f} s; the cold process saved {cold_state['save_seconds']:.2f} s "
            f"of artifacts, the warm one loaded them in {state['load_seconds']:.2f} s"
        )

        # an artifact that the pack did not record (dropped in, or its record edited): never loaded
        art = _artifacts(s)[0]
        files = art.parents[1] / "steadfast_files.json"
        recorded = json.loads(files.read_text())
        for rel in [k for k in recorded if k.startswith("precompiled/")]:
            del recorded[rel]
        files.write_text(json.dumps(recorded))
        s.restart()
        again = go(s, **run, lora=(LORA, 1.0))
        state = _record(s)["precompiled"]
        assert again["hash"] == cold["hash"] and state["loads"] == state["hits"] == 0
        reasons = again["compile"]["precompiled"]["reasons"]
        assert reasons and all("not written while Steadfast watched" in r for r in reasons.values())


@pytest.mark.parametrize("case", ["fp8 weights", "reduce-overhead"])
def test_precompiled_cases_of_issue_35_on_the_cpu(
    comfyui_path: Path, tiny_ckpt: Path, tmp_path: Path, case: str
) -> None:
    """Issue 35's cases of the precompiled route that a CPU server can run (the GPU protocol's ``precompiled_route``
    section runs all four on CUDA): fp8 weights (``--fp8_e4m3fn-unet``) and ``mode=reduce-overhead``. A restart of
    the same install is answered by the artifacts the first process saved (hits, nothing traced, no fallback) with
    the bytes of that process's jit and of a ``$STEADFAST_PRECOMPILED=0`` process, and another seed changes them.
    ComfyUI's defaults and a LoRA are the first test's; ``--novram`` cannot be combined with ``--cpu``."""
    r = precompiled_against_jit(comfyui_path, tiny_ckpt, tmp_path, cpu=True, **PRECOMPILED_CASES[case])
    status, detail = judge_precompiled(r)
    assert status == "pass", detail
    assert r["saved"]["state"]["saves"] >= 1 and r["jit"]["state"]["enabled"] is False, detail
    print(f"\n[precompiled, {case}] {detail}")


def test_judge_precompiled_grades_bytes_hits_and_reasons() -> None:
    """The verdict the GPU protocol's ``precompiled_route`` section gives (no server): other bytes fail whatever the
    hits; a jit answer passes only as "refused" and only with a reason; an output that ignores the seed fails."""

    def result(loaded_hash="a", hits=12, graphs=0, reasons=None, other="b") -> dict[str, Any]:
        state = {"saves": 0, "loads": 2, "hits": hits, "fallbacks": 0, "reasons": reasons or {}}
        return {
            "saved": {"hash": "a", "state": {"saves": 2, "reasons": {}}, "graphs": 1},
            "loaded": {"hash": loaded_hash, "state": state, "graphs": graphs},
            "jit": {"hash": "a", "state": {"enabled": False}, "graphs": 1},
            "other_seed": {"hash": other, "state": state, "graphs": 0},
        }

    assert judge_precompiled(result())[0] == "pass"
    assert judge_precompiled(result(loaded_hash="z"))[0] == "fail"
    assert judge_precompiled(result(other="a"))[0] == "fail"
    assert judge_precompiled(result(hits=0, graphs=1))[0] == "fail"
    refused = judge_precompiled(result(hits=0, graphs=1, reasons={"k": "a hook on the block"}))
    assert refused[0] == "refused" and "a hook on the block" in refused[1]


SQUEEZE_PACK = {"steadfast_test_squeeze": Path(__file__).parent / "squeeze_pack"}
#: The free memory ComfyUI sees while sampling in the server case (MiB): the test-only squeeze node reports this
#: constant instead of the machine's, so ComfyUI's cond batching and its CPU attention chunking (sub-quadratic,
#: which reads the free memory inside every attention call) take the same branches in every process. Large: the
#: branches of a machine with plenty of memory.
PINNED_FREE_MB = 1 << 20


def _pinned_run(server, **kw: Any) -> dict[str, Any]:
    """:func:`recompile_workflows.go` with the squeeze node (``PINNED_FREE_MB``) between Optimize and the sampler."""
    wf = build(**kw)
    wf["sq"] = {"class_type": "TestSqueezeFreeMemoryModel", "inputs": {"model": ["opt", 0], "free_mb": PINNED_FREE_MB}}
    wf["samp"]["inputs"]["model"] = ["sq", 0]
    record = record_of(run_prompt(server, wf, timeout=600), "samp")
    return {"record": record, "compile": record["fingerprint"]["compile"], "hash": record["output_sha256"]}


def test_servers_sharing_one_cache_folder_answer_with_their_own_configurations_bytes(
    comfyui_path: Path, tiny_ckpt: Path, tmp_path: Path
) -> None:
    """Three servers share one compile cache folder ($STEADFAST_COMPILE_CACHE) and differ only by an attention flag.
    A (``--use-pytorch-cross-attention``) compiles and saves; B (no flag: ComfyUI's sub-quadratic attention on CPU)
    is warm-started from the same folder and must give the hash of the jit of its own configuration (the third
    server, ``STEADFAST_PRECOMPILED=0``), never A's, also after a restart. (Issue 34 saw B give A's hash on another
    machine; this test passes on 019f4a9 too, where B's key already differed: the in-process differential test is
    the one that failed there.)

    ComfyUI's free memory is pinned (:data:`PINNED_FREE_MB`): without that, these hashes compare processes whose
    cond batching and attention chunking follow the machine's free memory at that moment (measured here with the
    same node at 1, 10-25 and 60+ MiB: three different hashes). Unpinned, CI on 2026-11-27 saw the jit server and
    B disagree on row 1, and an earlier run saw the jit server's own hash change on row 2; neither was reproduced
    here (7 unpinned servers gave one hash), and free memory is the one input found that moves these bits. The
    pinned function is
    traceable, so B's blocks trace in one graph and B saves its own artifacts; they, never A's, answer B's
    restart."""
    env = {"STEADFAST_COMPILE_CACHE": str(tmp_path / "shared")}
    run = {"backend": "inductor", "attention": "comfy"}  # ComfyUI's own attention: the global the flag picks
    ckpt = {TINY_CKPT_NAME: tiny_ckpt}
    with ComfyServer(
        ckpt, comfyui=comfyui_path, env=env, node_packs=SQUEEZE_PACK, extra_args=["--use-pytorch-cross-attention"]
    ) as a:
        a_hash = _pinned_run(a, **run)["hash"]
        assert _record(a)["precompiled"]["saves"] >= 1, json.dumps(_record(a))
    a_variants = _variant_ids(tmp_path / "shared")
    with ComfyServer(
        ckpt, comfyui=comfyui_path, env={**env, "STEADFAST_PRECOMPILED": "0"}, node_packs=SQUEEZE_PACK
    ) as jit:
        jit_run = _pinned_run(jit, **run)
        jit_hash = jit_run["hash"]
    assert jit_hash != a_hash  # the flag changes the bytes: the case is not vacuous
    with ComfyServer(ckpt, comfyui=comfyui_path, env=env, node_packs=SQUEEZE_PACK) as b:
        b_run = _pinned_run(b, **run)
        b_state = _record(b)["precompiled"]
        why = json.dumps({"b": [b_state, b_run["compile"]], "jit": jit_run["compile"]})
        assert b_run["hash"] == jit_hash, why  # never A's bytes
        assert a_variants and not set(b_state["answered"]) & a_variants, why  # A's artifacts never answered B
        assert b_state["saves"] >= 1, why  # B saved its own (its later steps may be answered by them)
        b.restart()
        again = _pinned_run(b, **run)
        state = _record(b)["precompiled"]
        assert again["hash"] == jit_hash, json.dumps([state, again["compile"]])
        print(
            f"\n[shared cache, attention flag] A {a_hash[:12]}, jit of B {jit_hash[:12]}, "
            f"B warm {b_run['hash'][:12]}, B restarted {again['hash'][:12]}; B saved {b_state['saves']}, "
            f"its restart: {state['hits']} hit(s), {state['fallbacks']} fallback(s), reasons "
            f"{again['compile']['precompiled'].get('reasons')}"
        )


PATCH_PACK = {"steadfast_test_patch": Path(__file__).parent / "patch_pack"}


def test_a_pack_patching_a_comfyui_class_never_gets_or_gives_another_servers_bytes(
    comfyui_path: Path, tiny_ckpt: Path, tmp_path: Path
) -> None:
    """Issue 45: another node pack replaces ``comfy.ldm.modules.attention.CrossAttention.forward`` on the class
    (``tests/comfy/patch_pack``). Servers with and without it share one compile cache folder. Both ways:

    * A (no patch) compiles and saves; P (the patch) is warm-started from the same folder and must give the hash of
      a jit of its own configuration in a fresh server with an empty cache, never A's (on 2363d88 P answered with
      A's bytes from A's artifacts, with no fallback);
    * after P has saved its own variant into the folder, A restarted still gives its own bytes, from its own
      artifacts (a patched process never writes into the record an unpatched one answers from).

    ComfyUI's free memory is pinned (:data:`PINNED_FREE_MB`), as in the attention-flag case."""
    shared = {"STEADFAST_COMPILE_CACHE": str(tmp_path / "shared")}
    run = {"backend": "inductor", "attention": "comfy"}
    ckpt = {TINY_CKPT_NAME: tiny_ckpt}
    patched = {**SQUEEZE_PACK, **PATCH_PACK}
    with ComfyServer(ckpt, comfyui=comfyui_path, env=shared, node_packs=SQUEEZE_PACK) as a:
        a_hash = _pinned_run(a, **run)["hash"]
        assert _record(a)["precompiled"]["saves"] >= 1, json.dumps(_record(a))
    a_variants = _variant_ids(tmp_path / "shared")
    fresh = {"STEADFAST_COMPILE_CACHE": str(tmp_path / "fresh"), "STEADFAST_PRECOMPILED": "0"}
    with ComfyServer(ckpt, comfyui=comfyui_path, env=fresh, node_packs=patched) as jit:
        jit_hash = _pinned_run(jit, **run)["hash"]
    assert jit_hash != a_hash  # the patch changes the bytes: the case is not vacuous
    with ComfyServer(ckpt, comfyui=comfyui_path, env=shared, node_packs=patched) as p:
        p_run = _pinned_run(p, **run)
        p_state = _record(p)["precompiled"]
        assert p_run["hash"] == jit_hash, json.dumps([p_state, p_run["compile"]])  # never A's bytes
        # A's artifacts of the blocks with attention did not answer (their traced CrossAttention.forward differs);
        # P saved its own variant of them (blocks without attention may be answered by A's: the same code)
        assert p_state["saves"] >= 1 and any(
            "CrossAttention.forward runs other code" in r for r in p_state["reasons"].values()
        ), json.dumps(p_state)
    with ComfyServer(ckpt, comfyui=comfyui_path, env=shared, node_packs=SQUEEZE_PACK) as again:
        a_run = _pinned_run(again, **run)
        state = _record(again)["precompiled"]
        assert a_run["hash"] == a_hash and state["hits"] > 0, json.dumps(state)  # its own artifacts answered
        assert set(state["answered"]) <= a_variants, json.dumps(state)  # A's variants only, never P's
        print(
            f"\n[shared cache, a pack patching CrossAttention.forward] A {a_hash[:12]}, jit of P {jit_hash[:12]}, "
            f"P {p_run['hash'][:12]} (saved {p_state['saves']}, reasons {p_state['reasons']}), A restarted "
            f"{a_run['hash'][:12]} ({state['hits']} hits, answered by {state['answered']})"
        )


def test_a_replica_with_the_pack_in_another_folder_uses_the_artifacts(
    comfyui_path: Path, tiny_ckpt: Path, tmp_path: Path
) -> None:
    """Issue 45 item 5: ComfyUI imports a node pack under its absolute folder path, so the pack's own functions (the
    SDPA override Optimize puts in ``transformer_options``) were named by the install folder in the key, and a fleet
    replica with the pack elsewhere missed every artifact (hits 0; its bytes were right). Two servers, each with its
    own ComfyUI base folder (another absolute path of the pack), share one compile cache folder: the second is
    answered by the first's artifacts, with the first's bytes, nothing traced."""
    shared = {"STEADFAST_COMPILE_CACHE": str(tmp_path / "shared")}
    run = {"backend": "inductor", "attention": "math"}  # the pack's own SDPA override, under a code key
    ckpt = {TINY_CKPT_NAME: tiny_ckpt}
    with ComfyServer(ckpt, comfyui=comfyui_path, env=shared, node_packs=SQUEEZE_PACK) as first:
        first_run = _pinned_run(first, **run)
        saved = _record(first)["precompiled"]
        first_dir = first.base_dir
        assert saved["saves"] >= 1, json.dumps(saved)
    with ComfyServer(ckpt, comfyui=comfyui_path, env=shared, node_packs=SQUEEZE_PACK) as replica:
        assert replica.base_dir != first_dir  # the pack is imported under another absolute path
        again = _pinned_run(replica, **run)
        record = _record(replica)
        state = record["precompiled"]
        assert again["hash"] == first_run["hash"], json.dumps(state)
        assert state["hits"] > 0 and state["loads"] >= 1 and state["fallbacks"] == 0, json.dumps(state)
        assert state["saves"] == 0, json.dumps(state)  # the first's artifacts answered: none of its own
        print(
            f"\n[another install folder] first {first_run['hash'][:12]} ({saved['saves']} saved), replica "
            f"{again['hash'][:12]}: {state['hits']} hits, {state['loads']} loads, {state['fallbacks']} fallbacks"
        )
