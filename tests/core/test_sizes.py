"""Warmup's ``sizes`` input: parsing, the validation text, and the one rule for the sizes both Warmup nodes warm."""

from __future__ import annotations

import pytest

from steadfast.core.sizes import check_sizes, parse_sizes, warm_targets


def test_parse_sizes_keeps_order_and_drops_duplicates() -> None:
    assert parse_sizes("512x512, 768X512;640\u00d7448 512*512") == [(512, 512), (768, 512), (640, 448)]
    assert parse_sizes("") == [] and parse_sizes(None) == [] and parse_sizes("  ") == []


@pytest.mark.parametrize("text, message", [("512x", "is not WIDTHxHEIGHT"), ("4x64", "4 is outside")])
def test_bad_sizes_name_the_item(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_sizes(text)
    assert message in check_sizes(text) and repr(text) in check_sizes(text)
    assert check_sizes("64x64") is True


def test_warm_targets_put_the_node_size_first_once() -> None:
    """The node's own size first, then the listed sizes not already there, in order (both Warmup nodes)."""
    assert warm_targets(512, 512, "") == [(512, 512)]
    assert warm_targets(512, 512, "768x512, 512x512, 768x512") == [(512, 512), (768, 512)]
    assert warm_targets(640, 448, "512x512") == [(640, 448), (512, 512)]
    with pytest.raises(ValueError, match="not WIDTHxHEIGHT"):
        warm_targets(512, 512, "big")
