"""Test-only ComfyUI nodes that make ComfyUI *see* little free memory (loaded only by the test server).

ComfyUI decides from ``comfy.model_management.get_free_memory()`` how many conds go into one model call
(``comfy/samplers.py``), how attention is chunked (sub-quadratic / split attention) and how many items the
VAE decodes at once (``comfy/sd.py``). A busy GPU shared with other processes reports little free memory;
these nodes reproduce that on demand, for the duration of one sampling call or one decode, and restore
the function afterwards. They exist to prove the hazard is real and that Steadfast's sampling is immune.
``TestLatentDtype`` casts a LATENT (the sampler matrix's half-precision rows).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import comfy.model_management
from comfy.patcher_extension import WrappersMP

KEY = "steadfast_test.squeeze"


@contextlib.contextmanager
def squeezed(free_mb: int):
    """``comfy.model_management.get_free_memory`` reports ``free_mb`` MiB (for both of its answers)."""
    free = int(free_mb) * 2**20

    def get_free_memory(dev=None, torch_free_too=False):
        return (free, free) if torch_free_too else free

    with mock.patch.object(comfy.model_management, "get_free_memory", get_free_memory):
        yield


class TestSqueezeFreeMemoryModel:
    """MODEL -> MODEL that samples while ComfyUI sees only ``free_mb`` MiB of free memory."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("MODEL",),
                "free_mb": (
                    "INT",
                    {
                        "default": 1,
                        "min": 0,
                        "max": 1 << 20,
                        "tooltip": "Free memory ComfyUI sees while sampling (MiB).",
                    },
                ),
            }
        }

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "squeeze"
    CATEGORY = "testing"

    def squeeze(self, model, free_mb: int):
        m = model.clone()

        def wrapper(executor, *args, **kwargs):
            with squeezed(free_mb):
                return executor(*args, **kwargs)

        m.remove_wrappers_with_key(WrappersMP.OUTER_SAMPLE, KEY)
        m.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, KEY, wrapper)
        return (m,)


class TestSqueezedVAEDecode:
    """Stock ``VAEDecode`` while ComfyUI sees only ``free_mb`` MiB of free memory."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "samples": ("LATENT",),
                "vae": ("VAE",),
                "free_mb": (
                    "INT",
                    {
                        "default": 1,
                        "min": 0,
                        "max": 1 << 20,
                        "tooltip": "Free memory ComfyUI sees while decoding (MiB).",
                    },
                ),
                "decoder": (["VAEDecode", "SteadfastVAEDecode"], {"tooltip": "The node to run."}),
            }
        }

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    CATEGORY = "testing"

    def decode(self, samples, vae, free_mb: int, decoder: str = "VAEDecode"):
        import nodes

        cls = nodes.NODE_CLASS_MAPPINGS[decoder]
        with squeezed(free_mb):
            if decoder == "VAEDecode":
                return cls().decode(vae, samples)
            return (cls.execute(samples=samples, vae=vae).result[0],)


class TestLatentDtype:
    """LATENT -> LATENT with its samples cast to ``dtype`` (a half-precision LATENT, as some nodes make)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "samples": ("LATENT",),
                "dtype": (["float16", "bfloat16", "float32"], {"tooltip": "The samples' dtype."}),
            }
        }

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "cast"
    CATEGORY = "testing"

    def cast(self, samples, dtype: str):
        import torch

        return ({**samples, "samples": samples["samples"].to(getattr(torch, dtype))},)


NODE_CLASS_MAPPINGS = {
    "TestSqueezeFreeMemoryModel": TestSqueezeFreeMemoryModel,
    "TestSqueezedVAEDecode": TestSqueezedVAEDecode,
    "TestLatentDtype": TestLatentDtype,
}
