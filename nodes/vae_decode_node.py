"""Steadfast VAE Decode: LATENT -> IMAGE, each item alone, so the image bits never depend on free memory."""

from __future__ import annotations

import comfy.utils
from comfy_api.v0_0_2 import io

from .patches.batch_invariance import decode_rows


class SteadfastVAEDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SteadfastVAEDecode",
            display_name="VAE Decode (Steadfast)",
            category="Steadfast",
            description="VAE Decode whose output bits depend only on the workflow: every item is decoded alone "
            "(ComfyUI's VAE Decode batches by free memory) with PyTorch SDPA attention in the VAE (its "
            "split attention slices by free memory). Item i equals a batch-1 decode, on a busy or a quiet "
            "machine. Slower than VAE Decode on large batches.",
            inputs=[
                io.Latent.Input("samples", tooltip="The latent to decode (any batch size)."),
                io.Vae.Input("vae", tooltip="The VAE to decode with (it is not modified)."),
            ],
            outputs=[io.Image.Output(display_name="IMAGE", tooltip="The decoded images, [batch, height, width, 3].")],
        )

    @classmethod
    def execute(cls, samples: dict, vae) -> io.NodeOutput:
        latent = samples["samples"]
        bar = comfy.utils.ProgressBar(latent.shape[0])
        return io.NodeOutput(decode_rows(vae, latent, on_item=lambda i: bar.update_absolute(i + 1)))
