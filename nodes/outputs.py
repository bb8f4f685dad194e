"""What the samplers hand back the same way: the output, the run record as JSON text (the ``run_record`` output),
and the node's UI (the record's summary line, and the record itself for the frontend's report box and Compare).
"""

from __future__ import annotations

import json
from typing import Any

from comfy_api.v0_0_2 import io

from ..core.record.run_record import RunRecord

__all__ = ["with_run_record"]


def with_run_record(value: Any, record: RunRecord) -> io.NodeOutput:
    """``NodeOutput(value, record JSON)`` with ``ui``: ``text`` (:meth:`RunRecord.summary_text`) and
    ``steadfast_run_record`` (the record as the JSON round trip gives it back: what ``js/steadfast.js`` reads).

    Args:
        value: the node's first output (a LATENT dict, or an IMAGE tensor).
        record: the run record of the run that made ``value``.
    """
    text = record.as_json()  # the record was validated when built: the UI copy is the text parsed back, once
    return io.NodeOutput(value, text, ui={"text": [record.summary_text()], "steadfast_run_record": [json.loads(text)]})
