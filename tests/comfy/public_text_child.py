"""Child process of test_public_errors.py: ``nodes/host/public_text.guard_node`` on toy nodes, with ComfyUI importable
(``COMFYUI_PATH`` on ``sys.path``) but no server. Prints one JSON line of what each case raised and logged."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, os.environ["COMFYUI_PATH"])
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from _steadfast_import import import_steadfast  # noqa: E402

sys.argv = [sys.argv[0], "--cpu"]  # ComfyUI's command line: no GPU here
import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()
import_steadfast()
import torch  # noqa: E402

import comfy.model_management as mm  # noqa: E402
import folder_paths  # noqa: E402

from steadfast.nodes.host.public_text import guard_node  # noqa: E402

secret = os.path.join(folder_paths.models_dir, "loras", "John Smith's lora.safetensors")
records: list[str] = []


class _Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        records.append(record.getMessage())


logging.getLogger("steadfast").addHandler(_Keep())
logging.getLogger("steadfast").setLevel(logging.INFO)


def make(exc: BaseException, is_async: bool) -> type:
    if is_async:

        class Node:
            @classmethod
            async def execute(cls, x=1):
                await asyncio.sleep(0)
                raise exc
    else:

        class Node:
            @classmethod
            def execute(cls, x=1):
                raise exc

    return guard_node(Node)


cases = {
    "value_error": lambda: ValueError(f"cannot open {secret!r}"),
    "oom": lambda: torch.OutOfMemoryError(f"CUDA out of memory while loading {secret}"),
    "interrupt": lambda: mm.InterruptProcessingException(),
    "keyboard": lambda: KeyboardInterrupt(secret),
}
out = {"secret": secret, "cases": {}}
for is_async in (False, True):
    for name, factory in cases.items():
        exc = factory()
        before_type = type(exc)
        records.clear()
        node = make(exc, is_async)
        coroutine = False
        try:
            result = node.execute(x=2)
            coroutine = asyncio.iscoroutine(result)
            if coroutine:
                asyncio.run(result)
            raised = None
        except BaseException as e:  # noqa: BLE001 - recorded for the test
            raised = e
        out["cases"][f"{name}{'_async' if is_async else ''}"] = {
            "coroutine": coroutine,
            "same_object": raised is exc,
            "same_type": raised is not None and type(raised) is before_type,
            "isinstance": raised is not None and isinstance(raised, before_type),
            "text": str(raised),
            "logged": list(records),
        }
print(json.dumps(out))
