"""Steadfast Hash: SHA-256 of an IMAGE (as the uint8 pixels SaveImage writes) and/or a LATENT."""

from __future__ import annotations

from comfy_api.v0_0_2 import io

from ..core.record import explain, hashing, verdict


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
        return io.NodeOutput(result.primary, ui=ui_out)


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
