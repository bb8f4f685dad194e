"""The verdict document (core/record/verdict_file.py): built from what the Hash node computed, written and read back,
and every malformed file refused with a reason."""

from __future__ import annotations

import json

import pytest
import torch

from steadfast.core.record import hashing, verdict, verdict_file


def _doc(**over):
    img = torch.rand(2, 8, 8, 3, generator=torch.Generator().manual_seed(0))
    res = hashing.hash_inputs(image=img)
    args = dict(
        hashes=res.as_dict(),
        kind="image",
        dtype=str(torch.uint8),
        source_dtype=str(img.dtype),
        shape=res.image_shape,
        match="unchecked",
        expected="",
        explanation="",
        record=json.dumps({"seeds": [1], "sampler_name": "euler"}),
        reference=verdict.thumbnail(img, "image"),
        verdict=None,
    )
    args.update(over)
    return res, verdict_file.build(**args)


def test_round_trip_keeps_hash_dtype_shape_record() -> None:
    res, doc = _doc()
    back = verdict_file.parse(verdict_file.dumps(doc).encode())
    assert back == json.loads(json.dumps(doc))
    assert back["schema"] == verdict_file.SCHEMA and back["hash"] == res.primary == res.image
    assert (back["dtype"], back["source_dtype"], back["shape"]) == ("torch.uint8", "torch.float32", [2, 8, 8, 3])
    assert back["record"] == {"seeds": [1], "sampler_name": "euler"}
    assert back["hashes"]["latent"] is None and back["reference"]["shape"] == [2, 8, 8, 3]


def test_an_empty_record_is_none() -> None:
    _, doc = _doc(record="")
    assert doc["record"] is None


@pytest.mark.parametrize(
    ("over", "message"),
    [({"kind": "video"}, "kind must be"), ({"record": "[1, 2]"}, "record must be a JSON object")],
)
def test_build_refuses(over: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _doc(**over)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (b"[1]", "not a Steadfast verdict file"),
        (json.dumps({"schema": "other/1", "hash": "a"}).encode(), "schema 'other/1'"),
        (json.dumps({"schema": verdict_file.SCHEMA, "hash": "a"}).encode(), "lacks kind, dtype, shape, match"),
    ],
)
def test_parse_refuses(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verdict_file.parse(data)
