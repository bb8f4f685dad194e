"""``lora_file_rank`` reads only the safetensors header; a malformed header is an error naming the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from steadfast.core.pipelines.handle import lora_file_rank
from steadfast.core.pipelines.lora import LoraLoadError


def _write(path: Path, header) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    return path


def test_rank_is_the_largest_down_projection(tmp_path: Path) -> None:
    entry = {"dtype": "F32", "data_offsets": [0, 0]}
    f = _write(
        tmp_path / "ok.safetensors",
        {
            "__metadata__": {"format": "pt"},
            "a.lora_down.weight": {**entry, "shape": [4, 8]},
            "b.lora_A.weight": {**entry, "shape": [16, 8]},
            "b.lora_B.weight": {**entry, "shape": [8, 16]},
        },
    )
    assert lora_file_rank(f) == 16


@pytest.mark.parametrize(
    "header, message",
    [
        ({"x.lora_down.weight": "not a dict"}, "header entries ['x.lora_down.weight'] are not tensor descriptions"),
        ([1, 2], "its header is a JSON list, not an object"),
    ],
)
def test_malformed_header_names_the_file(tmp_path: Path, header, message: str) -> None:
    f = _write(tmp_path / "broken-lora.safetensors", header)
    with pytest.raises(LoraLoadError) as info:
        lora_file_rank(f)
    assert "broken-lora.safetensors" in str(info.value) and message in str(info.value)
