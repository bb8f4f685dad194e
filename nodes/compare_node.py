"""Steadfast Compare: are two IMAGEs (or LATENTs) bit-identical, and if not, by how much do they differ."""

from __future__ import annotations

from comfy_api.v0_0_2 import io

from ..core.record import compare, explain, verdict


class SteadfastCompare(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastCompare",
            display_name="Compare (Steadfast)",
            category="Steadfast",
            description="Bitwise equality, max and mean |difference|, % of differing values and pixels, PSNR, and a "
            "heatmap of where the two inputs differ. Connect two IMAGEs or two LATENTs.",
            is_output_node=True,
            inputs=[
                io.Image.Input("image_a", optional=True, tooltip="First IMAGE."),
                io.Image.Input("image_b", optional=True, tooltip="Second IMAGE (same shape as image_a)."),
                io.Latent.Input("latent_a", optional=True, tooltip="First LATENT (instead of images)."),
                io.Latent.Input("latent_b", optional=True, tooltip="Second LATENT (same shape as latent_a)."),
                io.String.Input(
                    "run_record_a",
                    optional=True,
                    force_input=True,
                    tooltip="Run record of the sampler that made the first input. With both records "
                    "linked, a difference caused by a recorded setting known to change bits "
                    "(compile, attention backend, threads, dtype, ...) is reported as "
                    "'different, as expected' (amber), not as a failure (red).",
                ),
                io.String.Input(
                    "run_record_b",
                    optional=True,
                    force_input=True,
                    tooltip="Run record of the sampler that made the second input.",
                ),
            ],
            outputs=[
                io.Boolean.Output(display_name="identical", tooltip="True when the bytes are identical."),
                io.String.Output(display_name="report", tooltip="The comparison as text."),
                io.Image.Output(
                    display_name="diff_heatmap",
                    tooltip="Black where equal, red to yellow where different (normalised).",
                ),
            ],
        )

    @classmethod
    def execute(
        cls,
        image_a=None,
        image_b=None,
        latent_a=None,
        latent_b=None,
        run_record_a: str | None = None,
        run_record_b: str | None = None,
    ) -> io.NodeOutput:
        if image_a is not None or image_b is not None:
            if image_a is None or image_b is None:
                raise ValueError("Compare: connect both image_a and image_b (or both latents)")
            a, b, kind = image_a, image_b, "image"
        elif latent_a is not None or latent_b is not None:
            if latent_a is None or latent_b is None:
                raise ValueError("Compare: connect both latent_a and latent_b (or both images)")
            a, b, kind = latent_a["samples"], latent_b["samples"], "latent"
        else:
            raise ValueError("Compare: nothing to compare - connect two IMAGEs or two LATENTs")
        report = compare.compare(a, b, kind=kind)
        heat = compare.diff_heatmap(a, b, kind=kind)
        details = report.as_dict()
        channels = a.shape[-1] if kind == "image" else a.shape[1]
        positions = a.numel() // max(int(channels), 1)  # pixels: (b,h,w) of an image, all but dim 1 of a latent
        details["n_pixels"] = positions
        details["n_pixels_differ"] = round(report.pct_pixels_differ * positions / 100.0)
        graded = verdict.grade_tensors(
            a, b, kind, identical=report.identical, record_a=run_record_a, record_b=run_record_b
        )
        details["verdict"] = graded.as_dict()
        if report.identical:
            text = report.as_text() + "\nverdict: " + graded.as_text()
        else:
            expected, why = explain.expected_difference(run_record_a, run_record_b)
            details["expected_to_differ"] = expected
            text = difference_report(
                report.as_text(), graded, why, f"{details['n_pixels_differ']} of {positions} pixels differ"
            )
        ui_out = {"text": [text], "steadfast_compare": [details]}
        return io.NodeOutput(report.identical, text, heat, ui=ui_out)


def difference_report(measured: str, graded: verdict.Verdict, why: str, pixels: str) -> str:
    """Compare's text when the bytes differ: the line that decides first, then what was measured, folded under it.

    Args:
        measured: :meth:`core.record.compare.CompareReport.as_text` (full-tensor figures, its own PSNR included).
        graded: the verdict, graded on the two thumbnails (:func:`core.record.verdict.grade_tensors`).
        why: :func:`core.record.explain.expected_difference`'s sentence (expected by the run records, or not).
        pixels: "N of M pixels differ".

    Returns:
        The text: the verdict with the PSNR that decides it (said to be the float16 thumbnails', as is the max |delta|
        beside it: a thumbnail's rounding can make it far larger than the full output's), the run records'
        explanation, then the full-tensor
        figures, indented, and one line with how many run-record fields differ and their names (not their values:
        those are in the two run records).
    """
    level = {
        "same_picture": "SAME PICTURE within tolerance (bytes differ)",
        "different_picture": "DIFFERENT PICTURE",
        "unknown": "BYTES DIFFER (no reference to grade by)",
    }.get(graded.level, graded.level)
    if graded.psnr is not None:
        head = (
            f"{level}: decided by PSNR {graded.psnr:.1f} dB between float16 thumbnails (area-averaged to at most "
            f"{verdict.THUMB_SIDE} px a side; same picture at >= {graded.threshold_db:g} dB), the thumbnails' max "
            f"|delta| {graded.max_abs:.3g} (the full output's own figures are below)"
        )
    else:
        head = f"{level}" + (f": {graded.why}" if graded.why else "")
    lines = [head, why, "measured on the full output (not what decides):"]
    lines += [f"  {line}" for line in measured.splitlines()] + [f"  {pixels}"]
    if graded.env_diffs:  # folded to a count and the fields' names: the values are in the two run records
        names = [d.split(": ", 1)[0] for d in graded.env_diffs]
        shown = ", ".join(names[:ENV_FIELDS]) + (
            f" and {len(names) - ENV_FIELDS} more" if len(names) > ENV_FIELDS else ""
        )
        lines.append(f"run records differ in {len(names)} field(s) ({shown}): see the two run records")
    return "\n".join(lines)


ENV_FIELDS = 6  # run-record fields named in the folded line; the explanation above names what decides
