"""Fixtures for tests that drive a real ComfyUI (server subprocess) with the tiny SD1.5 checkpoint.

Without a ComfyUI checkout these tests are skipped, loudly (skip reason + warning naming COMFYUI_PATH).
``headless/`` (the server harness and the tiny checkpoint builder, stdlib + torch only) is put on ``sys.path``
here, so tests can ``import comfy_server`` and ``import tiny_sd15`` without importing the pack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "headless"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import tiny_sd15  # noqa: E402
from comfy_server import ComfyServer, find_comfyui  # noqa: E402

TINY_CKPT_NAME = tiny_sd15.CHECKPOINT_NAME  # "steadfast_tiny_sd15.safetensors"

COMFYUI_MISSING = (
    "ComfyUI NOT FOUND - ComfyUI integration tests SKIPPED. Set COMFYUI_PATH to a ComfyUI checkout "
    "(default ~/comfy/ComfyUI; it must contain main.py) or run `bash scripts/setup_env.sh` (see README)."
)


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; repeated here so this folder works on its own.
    config.addinivalue_line("markers", "comfyui: needs a real ComfyUI at $COMFYUI_PATH (default ~/comfy/ComfyUI)")
    config.addinivalue_line("markers", "slow: compiles with inductor (gcc) or runs a ComfyUI server")


@pytest.fixture(scope="session")
def comfyui_path() -> Path:
    """The ComfyUI checkout (``comfy_server.find_comfyui()``); skips with a loud reason when absent."""
    path = find_comfyui()
    if path is None:
        warnings.warn(COMFYUI_MISSING, stacklevel=1)
        pytest.skip(COMFYUI_MISSING)
    return path


@pytest.fixture(scope="session")
def tiny_ckpt(comfyui_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny SD1.5-architecture checkpoint (seed 0), from the user cache (built there once per
    ``BUILDER_VERSION``; a pytest temp dir if the cache is not writable). Built in a child process so this
    test process never imports ``comfy``."""
    cache = tiny_sd15.default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        writable = os.access(cache, os.W_OK)
    except OSError:
        writable = False
    if not writable:
        cache = tmp_path_factory.mktemp("tiny_sd15")
    try:
        return tiny_sd15.cached_tiny_sd15(cache, in_subprocess=True)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(
            f"building the tiny checkpoint failed:\n{exc.stdout[-4000:]}\n{exc.stderr[-4000:]}"
        ) from exc


@pytest.fixture(scope="session")
def comfy_server(comfyui_path: Path, tiny_ckpt: Path) -> Iterator[ComfyServer]:
    """One ComfyUI server for the session, with this pack loaded and the tiny checkpoint available as
    ``steadfast_tiny_sd15.safetensors``, and the test-only node pack ``squeeze_pack`` (nodes that make ComfyUI
    see little free memory). Stopped (process group killed) at session end.

    ``--cache-classic``: ComfyUI 0.33's default output cache is RAM-pressure caching (``--cache-ram``): when the
    machine's available RAM drops below 10% of its total (2-10 GB), it evicts the outputs of the prompt that just
    ran, the MODEL objects with them, and the compile records held weakly for those objects go too. Whether a
    test then sees a cached node or a compile record would depend on what else the machine is doing (the
    full suite, other processes); ComfyUI 0.8.0's default, the classic cache, does not look at free RAM."""
    with ComfyServer(
        {TINY_CKPT_NAME: tiny_ckpt},
        comfyui=comfyui_path,
        extra_args=["--cache-classic"],
        node_packs={"steadfast_test_squeeze": Path(__file__).parent / "squeeze_pack"},
    ) as server:
        yield server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keep each phase's report on the item (``item.rep_call``...) so fixtures can act on a failure."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def artifacts_dir() -> Path:
    """Where tests leave files for a person to look at after a failure (``STEADFAST_ARTIFACTS``, default
    ``test-artifacts/`` in the repository, ignored by git). A fixture: ``from conftest import ...`` would find
    whichever ``conftest`` module the run imported first (tests/core has one too)."""
    path = Path(os.environ.get("STEADFAST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def run_child(comfyui_path: Path, tiny_ckpt: Path) -> Callable[[str], dict[str, Any]]:
    """Run an in-process child script of this folder (``<name> REPO_ROOT CKPT``, ComfyUI imported there, never in
    this process) and return the JSON of its ``RESULT `` line; a failing child fails with its stderr's tail."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "COMFYUI_PATH": str(comfyui_path)}

    def run(name: str) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).with_name(name)), str(root), str(tiny_ckpt)],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        return json.loads(line[len("RESULT ") :])

    return run
