"""The Hash node's verdict as a file: a small JSON document that travels where UI text does not.

ComfyUI's API clients, and the Comfy API v2 (``comfy-api-proxy``, Comfy Cloud, serverless), hand a client only the
outputs that have a file name; a node's UI text and plain values are dropped. The Hash node therefore also writes its
verdict into ComfyUI's output folder (subfolder :data:`SUBFOLDER`) and lists it as an output file, so any client can
download it and ``steadfast run`` reads the verdict from it (:mod:`headless.v2`).

The document (:data:`SCHEMA`, all JSON): ``schema``, ``hash`` (the primary digest: the IMAGE's when one is given,
else the LATENT's), ``kind`` ("image"/"latent"), ``dtype`` (of the hashed bytes: ``torch.uint8`` for an IMAGE
hashed as SaveImage writes it), ``source_dtype`` (the tensor's own dtype), ``shape`` (list of int), ``hashes``
(every digest the node computed: ``image``, ``image_raw``, ``latent``, None where absent), ``match``
("match"/"mismatch"/"unchecked"), ``expected`` (the expected hash or prefix, "" when none), ``explanation`` (text),
``record`` (the linked run record as a dict, or None), ``reference`` (the few-KB thumbnail the verdicts grade by,
:func:`core.record.verdict.thumbnail`) and ``verdict`` (the graded verdict against the pinned reference,
:meth:`core.record.verdict.Verdict.as_dict`, or None when nothing was checked).

No absolute server path goes into it: the node layer passes the document through the same redaction as every
client-facing text (``nodes/host/public_text.py``). This module imports nothing from ComfyUI.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["SCHEMA", "SUBFOLDER", "FILE_PREFIX", "build", "dumps", "parse"]

SCHEMA = "steadfast-verdict/1"
SUBFOLDER = "steadfast_verdicts"
FILE_PREFIX = "hash"

_REQUIRED = ("hash", "kind", "dtype", "shape", "match")


def build(
    *,
    hashes: Mapping[str, Any],
    kind: str,
    dtype: str,
    source_dtype: str,
    shape: tuple[int, ...] | list[int],
    match: str,
    expected: str,
    explanation: str,
    record: str | Mapping[str, Any] | None,
    reference: Mapping[str, Any] | None,
    verdict: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The verdict document of one Hash node run.

    Args:
        hashes: :meth:`core.record.hashing.HashResult.as_dict` (``primary``, ``image``, ``image_raw``, ``latent``,
            shapes).
        kind: "image" or "latent": what ``hash`` is the digest of.
        dtype: dtype of the hashed bytes (``"torch.uint8"`` for an IMAGE).
        source_dtype: the tensor's own dtype (e.g. ``"torch.float32"``).
        shape: the hashed tensor's shape ([B,H,W,C] for an IMAGE, the samples' for a LATENT).
        match: :attr:`core.record.hashing.HashCheck.status`.
        expected: the normalised expected hash or prefix ("" when none).
        explanation: the mismatch explanation ("" when none).
        record: the linked run record (its JSON text, or a dict), or None.
        reference: the output's thumbnail reference, or None.
        verdict: the graded verdict's dict, or None.
    Returns:
        the JSON-safe document (keys as in the module docstring).
    Raises:
        ValueError: ``kind`` is not "image"/"latent", ``hashes`` has no ``primary``, or ``record`` is text that is
            not a JSON object.
    """
    if kind not in ("image", "latent"):
        raise ValueError(f"kind must be 'image' or 'latent', got {kind!r}")
    if not hashes.get("primary"):
        raise ValueError("hashes has no 'primary' digest")
    rec: Any = record
    if isinstance(record, str):
        rec = json.loads(record) if record.strip() else None
        if rec is not None and not isinstance(rec, dict):
            raise ValueError("record must be a JSON object")
    return {
        "schema": SCHEMA,
        "hash": hashes["primary"],
        "kind": kind,
        "dtype": dtype,
        "source_dtype": source_dtype,
        "shape": [int(x) for x in shape],
        "hashes": {k: hashes.get(k) for k in ("image", "image_raw", "latent")},
        "match": match,
        "expected": expected,
        "explanation": explanation,
        "record": dict(rec) if rec is not None else None,
        "reference": dict(reference) if reference is not None else None,
        "verdict": dict(verdict) if verdict is not None else None,
    }


def dumps(doc: Mapping[str, Any]) -> str:
    """The document as the file's text (sorted keys, UTF-8 safe, one trailing newline)."""
    return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=True) + "\n"


def parse(data: bytes | str) -> dict[str, Any]:
    """A downloaded verdict file, checked.

    Args:
        data: the file's bytes or text.
    Returns:
        the document as a dict.
    Raises:
        ValueError: not JSON, not a Steadfast verdict (another ``schema``), or a required field
            (``hash``, ``kind``, ``dtype``, ``shape``, ``match``) missing.
    """
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ValueError(f"the verdict file is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"not a Steadfast verdict file (schema {got!r}, expected {SCHEMA!r})")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise ValueError(f"the verdict file lacks {', '.join(missing)}")
    return doc
