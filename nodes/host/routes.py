"""HTTP route ``GET /steadfast/compile_state`` (also under ``/api/``): the compile registry as JSON, with
every path shown relative to ComfyUI's folders (the route needs no login), plus ``artifacts`` (the compile artifacts
imported or refused at start, ``$STEADFAST_COMPILE_ARTIFACT``) and ``warm_start`` (whether the compile stack was
imported at start, :mod:`core.compile.warm.preload`)."""

from __future__ import annotations

import logging

from ...core.compile.registry import REGISTRY
from ...core.compile.warm import preload
from ...core.compile.warm.artifact import loaded_artifacts
from .public_text import public_value

log = logging.getLogger("steadfast")
_registered = False


def register_routes() -> bool:
    """Add our routes to the running ComfyUI server; returns False when there is none (e.g. in-process use)."""
    global _registered
    if _registered:
        return True
    try:
        from aiohttp import web

        from server import PromptServer  # ComfyUI's server module (top-level in ComfyUI)
    except ImportError:
        return False
    instance = getattr(PromptServer, "instance", None)
    if instance is None:
        return False

    @instance.routes.get("/steadfast/compile_state")
    async def compile_state(request):
        state = {**REGISTRY.as_json(), "artifacts": loaded_artifacts(), "warm_start": preload.state()}
        return web.json_response(public_value(state))  # no install path reaches a client

    _registered = True
    return True
