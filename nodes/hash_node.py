"""Steadfast Hash: SHA-256 of an IMAGE (as the uint8 pixels SaveImage writes) and/or a LATENT.

With ``verdict_file`` on (the default) the node also writes its verdict as a small JSON file into ComfyUI's output
folder (``output/steadfast_verdicts/``, :mod:`core.record.verdict_file`) and lists it as an output file
(``ui["files"]``, as ComfyUI's own Save Text does), so API clients and the Comfy API v2 can download it.
"""

from __future__ import annotations

import os
from typing import Any

import torch

import folder_paths
from comfy_api.v0_0_2 import io

from ..core.record import explain, hashing, verdict
from ..core.record import verdict_file as vfile
from .host.public_text import public_value


class HashMismatchError(RuntimeError):
    """Raised by the Hash node when ``fail_on_mismatch`` is on and the hash differs from ``expected``."""


class SteadfastHash(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastHash",
            display_name="Hash (Steadfast)",
            category="Steadfast",
            description="SHA-256 over the exact bytes (dtype and shape included). Paste a known hash into 'expected' "
            "and the workflow checks itself; with fail_on_mismatch a headless run fails loudly.",
            is_output_node=True,
            inputs=[
                io.Image.Input(
                    "image", optional=True, tooltip="IMAGE to hash, as the 8-bit pixels SaveImage would write."
                ),
                io.Latent.Input("latent", optional=True, tooltip="LATENT to hash (its float tensor, exact bytes)."),
                io.String.Input(
                    "expected",
                    default="",
                    optional=True,
                    tooltip="Known hash to check against (full 64 hex, or a prefix of at least 12). "
                    "Empty = just report.",
                ),
                io.Boolean.Input(
                    "fail_on_mismatch",
                    default=False,
                    optional=True,
                    tooltip="Raise an error when the hash differs from 'expected', failing the prompt.",
                ),
                io.Boolean.Input(
                    "raw_float",
                    default=False,
                    optional=True,
                    tooltip="Also hash the IMAGE's raw float32 values (stricter than 8-bit pixels).",
                ),
                io.String.Input(
                    "run_record",
                    optional=True,
                    force_input=True,
                    tooltip="Link Seeded Sampler's run_record here: on a mismatch every recorded field "
                    "that differs from expected_record is listed.",
                ),
                io.String.Input(
                    "expected_record",
                    default="",
                    multiline=True,
                    optional=True,
                    tooltip="The reference run's record (JSON), e.g. pinned from a run with the node's "
                    "'Pin hash and record' menu entry. Empty = no explanation.",
                ),
                io.String.Input(
                    "expected_reference",
                    default="",
                    multiline=True,
                    optional=True,
                    tooltip="The reference run's output summary (JSON, a few KB per item; pinned with "
                    "the hash): its shape, a thumbnail of the first 4 items, the SHA-256 of the "
                    "rest. When the bytes differ it grades the output: same picture within "
                    "tolerance (PSNR, max |delta|), different picture (another shape too), or "
                    "ungraded (a later item differs; it has no thumbnail).",
                ),
                io.Boolean.Input(
                    "verdict_file",
                    default=True,
                    optional=True,
                    tooltip="Also write the hash, dtype, shape, run record and verdict as a small JSON file in "
                    "ComfyUI's output folder (steadfast_verdicts/), listed as this node's output file so API "
                    "clients and the Comfy API v2 can download it (steadfast run reads the verdict there). "
                    "No server path goes into it.",
                ),
            ],
            outputs=[
                io.String.Output(
                    display_name="hash", tooltip="The image hash if an image is connected, else the latent hash."
                )
            ],
        )

    @classmethod
    def validate_inputs(cls, expected: str = "") -> bool | str:
        # `expected` only: ComfyUI marks every argument of validate_inputs as at fault when it fails (0.8.0 and
        # 0.33.0 execution.py), so the JSON inputs (filled by Pin) are checked in execute(), naming themselves.
        # A malformed `expected` is refused whatever fail_on_mismatch says: the prompt's answer then carries the
        # error in node_errors (headless/comfy_server.py refuses such a prompt as a whole).
        try:
            hashing.hash_reference(expected)
        except ValueError as e:
            return str(e)
        return True

    @classmethod
    def execute(
        cls,
        image=None,
        latent=None,
        expected: str = "",
        fail_on_mismatch: bool = False,
        raw_float: bool = False,
        run_record: str | None = None,
        expected_record: str = "",
        expected_reference: str = "",
        verdict_file: bool = True,
    ) -> io.NodeOutput:
        check_json_inputs(expected_record, expected_reference)
        result = hashing.hash_inputs(image=image, latent=latent, raw_float=raw_float)
        check = hashing.check_expected(result.primary, expected)
        why = mismatch_explanation(check, run_record, expected_record)
        thumb = (
            verdict.thumbnail(image, "image")
            if image is not None
            else verdict.thumbnail(latent["samples"] if isinstance(latent, dict) else latent, "latent")
            if latent is not None
            else None
        )
        graded = None
        if check.checked:
            graded = verdict.grade(
                result.primary,
                expected,
                thumb,
                verdict.parse_reference(expected_reference),
                record_now=run_record,
                record_ref=(expected_record or "").strip() or None,
            )
        text = result.as_text() + ("\n" + check.as_text() if check.checked else "") + (f"\n{why}" if why else "")
        if graded is not None and not check.match:
            text += "\nverdict: " + graded.as_text(env=False)  # the explanation above lists the fields
        ui_out = {
            "text": [text],
            "steadfast_hash": [
                {
                    "hash": result.primary,
                    "match": check.status,
                    "explanation": why,
                    "record": run_record or "",
                    "reference": thumb,
                    "verdict": graded.as_dict() if graded else None,
                }
            ],
        }
        if fail_on_mismatch and check.checked and not check.match:
            raise HashMismatchError(check.as_text() + (f"\n{why}" if why else ""))
        if verdict_file:
            doc = verdict_document(image, latent, result, check, why, run_record, thumb, graded)
            ui_out["files"] = [write_verdict_file(doc)]
        return io.NodeOutput(result.primary, ui=ui_out)


def verdict_document(
    image: torch.Tensor | None,
    latent: Any,
    result: hashing.HashResult,
    check: hashing.HashCheck,
    why: str,
    run_record: str | None,
    thumb: dict[str, Any] | None,
    graded: verdict.Verdict | None,
) -> dict[str, Any]:
    """The verdict document of this run (:func:`core.record.verdict_file.build`), redacted for clients.

    Args:
        image: the hashed IMAGE ``[B,H,W,C]`` (float), or None.
        latent: the hashed LATENT (dict with ``samples``, or a tensor), or None.
        result / check / why / run_record / thumb / graded: what :meth:`SteadfastHash.execute` computed.
    Returns:
        the document, every string passed through :func:`nodes.host.public_text.public_value`.
    """
    if image is not None:
        kind, dtype, source, shape = "image", str(torch.uint8), str(image.dtype), result.image_shape
    else:
        samples = latent["samples"] if isinstance(latent, dict) else latent
        kind, dtype, source, shape = "latent", str(samples.dtype), str(samples.dtype), result.latent_shape
    doc = vfile.build(
        hashes=result.as_dict(),
        kind=kind,
        dtype=dtype,
        source_dtype=source,
        shape=tuple(shape or ()),
        match=check.status,
        expected=check.expected,
        explanation=why,
        record=run_record,
        reference=thumb,
        verdict=graded.as_dict() if graded else None,
    )
    return public_value(doc)


def write_verdict_file(doc: dict[str, Any]) -> dict[str, str]:
    """Write ``doc`` as ``output/steadfast_verdicts/hash_<counter>_.json`` (ComfyUI's numbering, as SaveImage's).

    Args:
        doc: a verdict document (:func:`verdict_document`).
    Returns:
        the output-file entry ComfyUI lists: ``{"filename", "subfolder", "type": "output"}``.
    Raises:
        OSError: the output folder cannot be written.
    """
    out_dir = folder_paths.get_output_directory()
    prefix = f"{vfile.SUBFOLDER}/{vfile.FILE_PREFIX}"
    folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(prefix, out_dir)
    filename = f"{name}_{counter:05}_.json"
    path = os.path.join(folder, filename)
    with open(path, "x", encoding="utf-8") as fh:  # never overwrite another run's verdict
        fh.write(vfile.dumps(doc))
    return {"filename": filename, "subfolder": subfolder, "type": "output"}


def check_json_inputs(expected_record: str, expected_reference: str) -> None:
    """Refuse a malformed ``expected_record`` / ``expected_reference`` before anything is hashed.

    Raises:
        ValueError: naming the input and why (:func:`core.record.explain.parse_record`,
            :func:`core.record.verdict.parse_reference`).
    """
    try:
        verdict.parse_reference(expected_reference)
    except ValueError as e:
        raise ValueError(f"expected_reference: {e}") from None
    if (expected_record or "").strip():
        try:
            explain.parse_record(expected_record)
        except ValueError as e:
            raise ValueError(f"expected_record: {e}") from None


def mismatch_explanation(check: hashing.HashCheck, run_record: str | None, expected_record: str) -> str:
    """On a mismatch: the recorded fields that differ (:func:`core.record.explain.explain`), or what is missing to
    say."""
    if not check.checked or check.match:
        return ""
    if not (expected_record or "").strip():
        return "no expected_record given: nothing to explain the mismatch with"
    if not run_record:
        return "link Seeded Sampler's run_record to this node to explain the mismatch"
    return explain.explain(expected_record, run_record).as_text()
