"""Hash and Compare show the graded verdict's new outcomes over HTTP (core/record/verdict.py, issue 25): a batch of 6
whose 5th item differs from the pinned reference is "ungraded" on the Hash node (items past the 4 thumbnails are
compared by their bytes, never called the same picture), Compare grades every item (item 5 is a different
picture). (Compare refuses two outputs of different shapes with an error; the Hash node's "shape differs" verdict
is tests/core/test_verdict.py.)"""

from __future__ import annotations

import json

import pytest
from comfy_server import ComfyServer
from steadfast_workflows import add, compare_of, hash_of, run, text, ui, workflow

pytestmark = pytest.mark.comfyui


def _batch_of_6_and_item_5_inverted() -> tuple[dict, str, str]:
    """determinism_check at batch 6 (1 step); ``A`` its decoded batch, ``B`` the same with item 5 inverted
    (ComfyUI's ImageFromBatch / ImageInvert / ImageBatch). Returns the workflow and the ids of A and B."""
    wf = workflow("determinism_check", steps=1)
    wf["4"]["inputs"]["batch_size"] = 6
    for n in ("7", "9", "10", "11", "12"):
        del wf[n]
    a = "8"
    first4 = add(wf, "ImageFromBatch", image=[a, 0], batch_index=0, length=4)
    fifth = add(wf, "ImageInvert", image=[add(wf, "ImageFromBatch", image=[a, 0], batch_index=4, length=1), 0])
    sixth = add(wf, "ImageFromBatch", image=[a, 0], batch_index=5, length=1)
    b = add(
        wf, "ImageBatch", image1=[add(wf, "ImageBatch", image1=[first4, 0], image2=[fifth, 0]), 0], image2=[sixth, 0]
    )
    return wf, a, b


def test_hash_shows_ungraded_and_compare_grades_every_item(comfy_server: ComfyServer) -> None:
    wf, a, b = _batch_of_6_and_item_5_inverted()
    ha = add(wf, "SteadfastHash", image=[a, 0])
    first = run(comfy_server, wf)
    ref_hash, ref_thumb = hash_of(first, ha), ui(first, ha)["steadfast_hash"][0]["reference"]
    assert ref_thumb["shape"][0] == 6 and len(ref_thumb["item_digests"]) == 2, ref_thumb["shape"]

    hb = add(wf, "SteadfastHash", image=[b, 0], expected=ref_hash, expected_reference=json.dumps(ref_thumb))
    cmp_ab = add(wf, "SteadfastCompare", image_a=[a, 0], image_b=[b, 0])
    entry = run(comfy_server, wf)
    v = ui(entry, hb)["steadfast_hash"][0]["verdict"]
    assert v["level"] == "ungraded" and v["exit_code"] == 1, v
    shown = text(entry, hb)
    assert "UNGRADED" in shown and "first: item 5" in shown and "SAME PICTURE" not in shown, shown
    graded = compare_of(entry, cmp_ab)["verdict"]
    assert graded["level"] == "different_picture" and "worst: item 5 of 6" in graded["why"], graded
