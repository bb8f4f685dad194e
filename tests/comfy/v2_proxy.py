"""A ``comfy-api-proxy`` (the Comfy API v2 in front of a ComfyUI) as a test subprocess, on 127.0.0.1 only.

Not a test module. The proxy is installed from PyPI by ``scripts/setup_env.sh`` (pinned); without it the v2 tests
skip, naming the set-up step.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from comfy_server import HOST, free_port

PROXY_MISSING = (
    "comfy-api-proxy NOT INSTALLED - Comfy API v2 tests SKIPPED. scripts/setup_env.sh installs it "
    "(pip install comfy-api-proxy==0.1.6 comfy-sdk==0.5.0)"
)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def proxy_installed() -> bool:
    """Whether both the proxy and the SDK ``steadfast run`` speaks v2 with are importable."""
    return all(importlib.util.find_spec(m) is not None for m in ("comfy_api_proxy", "comfy_sdk"))


class ApiProxy:
    """``python -m comfy_api_proxy.cli run --comfyui URL --host 127.0.0.1 --port P [--token T]`` (context manager).

    The token goes on the proxy's own command line: that is how ``comfy-api-proxy`` takes it (it reads no
    environment variable for it); ``steadfast run`` reads its side from the environment.
    """

    def __init__(self, comfyui_url: str, token: str | None = None, startup_timeout: float = 60.0) -> None:
        self.comfyui_url = comfyui_url
        self.token = token
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="steadfast-v2-proxy-", suffix=".log", delete=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(Path(self._log.name).read_text("utf-8", "replace").splitlines()[-n:])

    def __enter__(self) -> ApiProxy:
        cmd = [sys.executable, "-m", "comfy_api_proxy.cli", "run", "--comfyui", self.comfyui_url]
        cmd += ["--host", HOST, "--port", str(self.port)] + (["--token", self.token] if self.token else [])
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": tempfile.mkdtemp(prefix="steadfast-v2-")}
        self.process = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"comfy-api-proxy exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with _OPENER.open(self.url + "/api/v2/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"comfy-api-proxy did not answer in {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
        self._log.close()
