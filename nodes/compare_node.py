"""Steadfast Compare: are two IMAGEs (or LATENTs) bit-identical, and if not, by how much do they differ."""
from __future__ import annotations

from comfy_api.v0_0_2 import io

from ..core import compare, explain, verdict


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
                io.String.Input("run_record_a", optional=True, force_input=True,
                                tooltip="Run record of the sampler that made the first input. With both records "
                                        "linked, a difference caused by a recorded setting known to change bits "
                                        "(compile, attention backend, threads, dtype, ...) is reported as "
                                        "'different, as expected' (amber), not as a failure (red)."),
                io.String.Input("run_record_b", optional=True, force_input=True,
                                tooltip="Run record of the sampler that made the second input."),
            ],
            outputs=[io.Boolean.Output(display_name="identical", tooltip="True when the bytes are identical."),
                     io.String.Output(display_name="report", tooltip="The comparison as text."),
                     io.Image.Output(display_name="diff_heatmap",
                                     tooltip="Black where equal, red to yellow where different (normalised).")],
        )

    @classmethod
    def execute(cls, image_a=None, image_b=None, latent_a=None, latent_b=None, run_record_a: str | None = None,
                run_record_b: str | None = None) -> io.NodeOutput:
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
        text = report.as_text()
        graded = verdict.grade_tensors(a, b, kind, identical=report.identical, record_a=run_record_a,
                                       record_b=run_record_b)
        details["verdict"] = graded.as_dict()
        text += "\nverdict: " + graded.as_text()
        if not report.identical:
            text += f"\n{details['n_pixels_differ']} of {positions} pixels differ"
            expected, why = explain.expected_difference(run_record_a, run_record_b)
            details["expected_to_differ"] = expected
            text += "\n" + why
        ui_out = {"text": [text], "steadfast_compare": [details]}
        return io.NodeOutput(report.identical, text, heat, ui=ui_out)
