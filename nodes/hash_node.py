"""Steadfast Hash: SHA-256 of an IMAGE (as the uint8 pixels SaveImage writes) and/or a LATENT."""
from __future__ import annotations

from comfy_api.latest import io

from ..core import hashing


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
                io.Image.Input("image", optional=True,
                               tooltip="IMAGE to hash, as the 8-bit pixels SaveImage would write."),
                io.Latent.Input("latent", optional=True, tooltip="LATENT to hash (its float tensor, exact bytes)."),
                io.String.Input("expected", default="", optional=True,
                                tooltip="Known hash to check against (full 64 hex, or a prefix of at least 12). "
                                        "Empty = just report."),
                io.Boolean.Input("fail_on_mismatch", default=False, optional=True,
                                 tooltip="Raise an error when the hash differs from 'expected', failing the prompt."),
                io.Boolean.Input("raw_float", default=False, optional=True,
                                 tooltip="Also hash the IMAGE's raw float32 values (stricter than 8-bit pixels)."),
            ],
            outputs=[io.String.Output(display_name="hash",
                                      tooltip="The image hash if an image is connected, else the latent hash.")],
        )

    @classmethod
    def validate_inputs(cls, expected: str = "", fail_on_mismatch: bool = False) -> bool | str:
        # ComfyUI drops an output node that fails validation and still runs the other outputs. A check
        # that must fail the prompt (fail_on_mismatch) is therefore not rejected here: execute() raises.
        if fail_on_mismatch is True:
            return True
        e = (expected or "").strip().lower()
        if e and (len(e) < hashing.MIN_PREFIX or len(e) > 64 or any(c not in "0123456789abcdef" for c in e)):
            return (f"expected must be a hex SHA-256 (64 characters) or a prefix of at least "
                    f"{hashing.MIN_PREFIX} characters, got {expected!r}")
        return True

    @classmethod
    def execute(cls, image=None, latent=None, expected: str = "", fail_on_mismatch: bool = False,
                raw_float: bool = False) -> io.NodeOutput:
        result = hashing.hash_inputs(image=image, latent=latent, raw_float=raw_float)
        check = hashing.check_expected(result.primary, expected)
        text = result.as_text() + ("\n" + check.as_text() if check.checked else "")
        ui_out = {"text": [text], "steadfast_hash": [{"hash": result.primary, "match": check.status}]}
        if fail_on_mismatch and check.checked and not check.match:
            raise HashMismatchError(check.as_text())
        return io.NodeOutput(result.primary, ui=ui_out)
