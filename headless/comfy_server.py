"""Run a throw-away headless ComfyUI server with the Steadfast pack, for tests and scripts.

Only talks to ``127.0.0.1``; stdlib only (``urllib``), proxies from the environment are ignored.

Example::

    from comfy_server import ComfyServer
    with ComfyServer(checkpoints={"tiny.safetensors": path}) as srv:
        outputs = srv.run(prompt)          # API-format prompt dict -> {node_id: ui dict}
        png = srv.view(outputs["9"]["images"][0])

The server runs ``main.py`` of ComfyUI (``$COMFYUI_PATH`` or ``~/comfy/ComfyUI``) with the *current*
Python on a free port, CPU only, with an in-memory database, the API nodes disabled and a temporary base
directory holding ``custom_nodes/ComfyUI-Steadfast`` (a symlink to this repo), ``models/checkpoints`` and
``models/loras`` (more model files can be linked into a running server with :meth:`ComfyServer.link_models`).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parents[1]
PACK_DIR_NAME = "ComfyUI-Steadfast"

# Never route 127.0.0.1 through an http_proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ComfyServerError(RuntimeError):
    """Base class of this module's errors."""


class ServerStartError(ComfyServerError):
    """The server did not answer ``GET /system_stats`` in time or exited during start; message has the log tail."""


class ServerDied(ComfyServerError):
    """The server process exited while a request or a prompt was pending; message has the log tail."""


class PromptRejected(ComfyServerError):
    """``POST /prompt`` answered 400 (validation failed). ``.error`` and ``.node_errors`` are ComfyUI's dicts."""

    def __init__(self, error: Any, node_errors: Any) -> None:
        self.error = error
        self.node_errors = node_errors
        super().__init__(f"prompt rejected: {json.dumps(error)}; node_errors: {json.dumps(node_errors)}")


class PromptFailed(ComfyServerError):
    """A queued prompt finished with status ``error``.

    Attributes: ``prompt_id``, ``exception_message``, ``exception_type``, ``node_id``, ``node_type``,
    ``traceback`` (list of str) taken from the ``execution_error`` message, and the raw ``messages``.
    """

    def __init__(self, prompt_id: str, messages: list) -> None:
        self.prompt_id = prompt_id
        self.messages = messages
        err: dict[str, Any] = {}
        for event, data in messages:
            if event in ("execution_error", "execution_interrupted"):
                err = dict(data, event=event)
        self.exception_message: str = err.get("exception_message", err.get("event", "unknown error"))
        self.exception_type: str | None = err.get("exception_type")
        self.node_id: str | None = err.get("node_id")
        self.node_type: str | None = err.get("node_type")
        self.traceback: list[str] = list(err.get("traceback", []))
        where = f" in node {self.node_id} ({self.node_type})" if self.node_id else ""
        super().__init__(f"prompt {prompt_id} failed{where}: {self.exception_type}: {self.exception_message}")


def _die_with_parent() -> None:
    """Child-side (preexec): on Linux, SIGTERM the server if the process that started it dies without
    cleaning up (e.g. a test runner killed with SIGKILL). Best effort; a no-op elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def find_comfyui() -> Path | None:
    """ComfyUI checkout to use: ``$COMFYUI_PATH`` or ``~/comfy/ComfyUI``, or None if it has no ``main.py``."""
    root = Path(os.environ.get("COMFYUI_PATH", str(Path.home() / "comfy" / "ComfyUI"))).expanduser()
    return root.resolve() if (root / "main.py").is_file() else None


def comfyui_version(root: str | os.PathLike[str]) -> tuple[int, ...]:
    """``(major, minor)`` of the ComfyUI at ``root``, read from its generated ``comfyui_version.py``
    (``__version__ = "0.33.0"``). Raises OSError when the file is missing, ValueError when it has no version."""
    text = (Path(root) / "comfyui_version.py").read_text(encoding="utf-8")
    return tuple(int(x) for x in text.split('"')[1].split(".")[:2])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def cached_nodes(entry: Mapping[str, Any]) -> list[str]:
    """Node ids the prompt of a ``/history`` entry took from ComfyUI's cache (its ``execution_cached`` messages)."""
    messages = (entry.get("status") or {}).get("messages", [])
    return [n for event, data in messages if event == "execution_cached" for n in data.get("nodes", [])]


class ComfyClient:
    """HTTP client of a running ComfyUI (``url`` like ``http://127.0.0.1:8188``): JSON GET/POST, uploads,
    prompts queued and waited for, ``/free``. :class:`ComfyServer` is the same client for a server it starts.

    Raises ``urllib.error.URLError`` when the server cannot be reached; see the methods for the rest.
    """

    def __init__(self, url: str) -> None:
        self._url = url.rstrip("/")
        self.client_id = uuid.uuid4().hex

    @property
    def url(self) -> str:
        return self._url

    @property
    def label(self) -> str:
        """How reports name this server (its URL)."""
        return self.url

    def is_running(self) -> bool:
        return True

    def log_tail(self, lines: int = 60) -> str:
        return ""

    def _request(self, method: str, path: str, body: Any = None, timeout: float = 60.0) -> tuple[bytes, str]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        with _OPENER.open(req, timeout=timeout) as resp:
            return resp.read(), resp.headers.get("Content-Type", "")

    def get_bytes(self, path: str, params: Mapping[str, Any] | None = None, timeout: float = 60.0) -> bytes:
        """Raw body of ``GET path`` (``params`` are URL-encoded). Raises ``urllib.error.HTTPError`` on 4xx/5xx."""
        query = "?" + urllib.parse.urlencode(params) if params else ""
        return self._request("GET", path + query, timeout=timeout)[0]

    def get(self, path: str, params: Mapping[str, Any] | None = None, timeout: float = 60.0) -> Any:
        """``GET path`` decoded as JSON (e.g. ``get("/object_info/KSampler")``)."""
        return json.loads(self.get_bytes(path, params, timeout=timeout))

    def post(self, path: str, body: Any, timeout: float = 60.0) -> Any:
        """``POST path`` with a JSON body; returns the decoded JSON answer (None for an empty body)."""
        raw, _ = self._request("POST", path, body, timeout=timeout)
        return json.loads(raw) if raw.strip() else None

    def upload(self, filename: str, data: bytes, subfolder: str = "", kind: str = "input") -> Any:
        """``POST /upload/image`` as a browser form would (multipart); any bytes, as any client can send them.

        Returns ComfyUI's JSON answer (``{"name", "subfolder", "type"}``)."""
        boundary = uuid.uuid4().hex
        parts = [
            ("image", filename, data),
            ("subfolder", None, subfolder.encode()),
            ("type", None, kind.encode()),
            ("overwrite", None, b"true"),
        ]
        body = b""
        for name, fname, value in parts:
            disp = f'form-data; name="{name}"' + (f'; filename="{fname}"' if fname else "")
            body += f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + value + b"\r\n"
        body += f"--{boundary}--\r\n".encode()
        req = urllib.request.Request(self.url + "/upload/image", data=body, method="POST")
        req.add_header("Content-Type", f"multipart/form-data; boundary={boundary}")
        with _OPENER.open(req, timeout=60) as resp:
            return json.loads(resp.read())

    def view(self, image: Mapping[str, str]) -> bytes:
        """File bytes of one ``{"filename", "subfolder", "type"}`` entry of a node's ``images`` output."""
        params = {
            "filename": image["filename"],
            "subfolder": image.get("subfolder", ""),
            "type": image.get("type", "output"),
        }
        return self.get_bytes("/view", params)

    # ------------------------------------------------------------------ prompts
    def queue(self, prompt: Mapping[str, Any], extra_data: Mapping[str, Any] | None = None) -> str:
        """``POST /prompt`` an API-format graph; returns the prompt id.

        Raises :class:`PromptRejected` on 400, and also when ComfyUI accepted the prompt with ``node_errors``
        (it then runs only the outputs that validated).
        """
        body: dict[str, Any] = {"prompt": prompt, "client_id": self.client_id}
        if extra_data:
            body["extra_data"] = dict(extra_data)
        try:
            answer = self.post("/prompt", body)
        except urllib.error.HTTPError as exc:
            if exc.code == 400:
                raw = exc.read()
                try:
                    payload = json.loads(raw or b"{}")
                except ValueError:
                    payload = {"error": raw.decode("utf-8", "replace")}
                raise PromptRejected(payload.get("error"), payload.get("node_errors")) from None
            raise
        if answer.get("node_errors"):
            # ComfyUI answers 200 when at least one output node validates and runs only those: a workflow
            # whose Hash (or any other node) is invalid must not pass as a shorter, partial run.
            raise PromptRejected(
                {
                    "type": "partially_rejected",
                    "message": "ComfyUI queued only the outputs that validated "
                    f"(prompt {answer.get('prompt_id')}); "
                    "fix the nodes named in node_errors",
                },
                answer["node_errors"],
            )
        return str(answer["prompt_id"])

    def wait(self, prompt_id: str, timeout: float = 300.0, poll: float = 0.1) -> dict[str, Any]:
        """Poll ``GET /history/<prompt_id>`` until the prompt is done; returns its history entry
        (``{"prompt", "outputs", "status", "meta"}``).

        Raises :class:`PromptFailed` when its status is ``error``, :class:`ServerDied` if the server exits,
        ``TimeoutError`` after ``timeout`` seconds (both with the log tail).
        """
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_running():
                raise ServerDied(f"server exited while waiting for {prompt_id}; log tail:\n{self.log_tail()}")
            history = self.get(f"/history/{prompt_id}")
            if prompt_id in history:
                entry = history[prompt_id]
                status = entry.get("status") or {}
                if status.get("status_str") == "error":
                    raise PromptFailed(prompt_id, status.get("messages", []))
                return entry
            if time.monotonic() > deadline:
                raise TimeoutError(f"prompt {prompt_id} not done after {timeout:.0f} s; log tail:\n{self.log_tail()}")
            time.sleep(poll)

    def run(self, prompt: Mapping[str, Any], timeout: float = 300.0) -> dict[str, Any]:
        """Queue ``prompt``, wait for it and return its outputs ``{node_id: ui dict}``."""
        return self.wait(self.queue(prompt), timeout=timeout)["outputs"]

    def free(self, unload_models: bool = True, free_memory: bool = True, timeout: float = 300.0) -> None:
        """``POST /free`` and wait until the worker has applied it.

        ComfyUI's worker applies the flags after its current item. To be sure they are applied before the
        next prompt, a trivial stock prompt (``PrimitiveString -> PreviewAny``) is run afterwards: the worker
        handles the flags before popping anything queued after that prompt finished. With
        ``free_memory=True`` all node caches are dropped, so the next run re-executes every node.
        """
        self.post("/free", {"unload_models": unload_models, "free_memory": free_memory})
        marker = f"steadfast-free-{uuid.uuid4().hex}"
        self.run(
            {
                "1": {"class_type": "PrimitiveString", "inputs": {"value": marker}},
                "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
            },
            timeout=timeout,
        )


class ComfyServer(ComfyClient):
    """A ComfyUI server subprocess with its own temporary base directory (context manager).

    Args:
        checkpoints: ``{file name: path}`` symlinked into ``models/checkpoints/`` (names as nodes see them).
        loras: ``{file name: path}`` symlinked into ``models/loras/`` (for ``LoraLoader*`` nodes).
        extra_args: appended to the ``main.py`` command line (e.g. ``["--cache-none"]``).
        comfyui: ComfyUI checkout (default :func:`find_comfyui`); ``FileNotFoundError`` if there is none.
        python: interpreter (default ``sys.executable``).
        load_pack: symlink this repo as ``custom_nodes/ComfyUI-Steadfast``.
        startup_timeout: seconds to wait for ``GET /system_stats``.
        keep_base: keep the base directory after :meth:`close` (it is printed in errors; handy for debugging).
        env: extra environment variables for the server process (e.g. an operator's ``STEADFAST_COMPILE_CACHE``).
        node_packs: ``{folder name: path}`` of extra custom node packs symlinked into ``custom_nodes/``
            (e.g. a test-only pack).
        cpu: start ComfyUI with ``--cpu`` (the default: tests and ``steadfast run`` sample on the CPU); ``False``
            lets ComfyUI pick its device (a GPU where there is one: the GPU protocol and the ``gpu`` tests).

    Environment: ``STEADFAST_FRONT_END_ROOT``, a web root passed as ``--front-end-root`` (for a machine without
    ``comfyui-frontend-package``, where ComfyUI would exit at start).

    Attributes after :meth:`start`: ``base_dir``, ``port``, ``url``, ``log_path``, ``process``.
    """

    def __init__(
        self,
        checkpoints: Mapping[str, str | os.PathLike[str]] | None = None,
        *,
        loras: Mapping[str, str | os.PathLike[str]] | None = None,
        extra_args: Sequence[str] = (),
        comfyui: str | os.PathLike[str] | None = None,
        python: str | None = None,
        load_pack: bool = True,
        startup_timeout: float = 120.0,
        keep_base: bool = False,
        env: Mapping[str, str] | None = None,
        node_packs: Mapping[str, str | os.PathLike[str]] | None = None,
        cpu: bool = True,
    ) -> None:
        root = Path(comfyui).expanduser().resolve() if comfyui is not None else find_comfyui()
        if root is None or not (root / "main.py").is_file():
            raise FileNotFoundError(f"ComfyUI main.py not found (COMFYUI_PATH / ~/comfy/ComfyUI; got {root})")
        self.comfyui = root
        self.checkpoints = {name: Path(p).expanduser().resolve() for name, p in (checkpoints or {}).items()}
        self.loras = {name: Path(p).expanduser().resolve() for name, p in (loras or {}).items()}
        self.extra_args = list(extra_args)
        self.python = python or sys.executable
        self.load_pack = load_pack
        self.startup_timeout = startup_timeout
        self.keep_base = keep_base
        self.env = dict(env or {})
        self.node_packs = {name: Path(p).expanduser().resolve() for name, p in (node_packs or {}).items()}
        self.cpu = cpu
        self.client_id = uuid.uuid4().hex
        self.base_dir: Path | None = None
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        if self.port is None:
            raise ComfyServerError("server not started")
        return f"http://{HOST}:{self.port}"

    @property
    def label(self) -> str:
        return f"local {self.url}"

    @property
    def log_path(self) -> Path:
        if self.base_dir is None:
            raise ComfyServerError("server not started")
        return self.base_dir / "comfyui.log"

    def _make_base(self) -> Path:
        base = Path(tempfile.mkdtemp(prefix="steadfast-comfy-"))
        (base / "custom_nodes").mkdir()
        if self.load_pack:
            (base / "custom_nodes" / PACK_DIR_NAME).symlink_to(REPO_ROOT, target_is_directory=True)
        for name, path in self.node_packs.items():
            (base / "custom_nodes" / name).symlink_to(path, target_is_directory=True)
        self._link(base, "checkpoints", self.checkpoints)
        self._link(base, "loras", self.loras)
        for sub in ("input", "output", "temp", "user"):
            (base / sub).mkdir()
        return base

    @staticmethod
    def _link(base: Path, folder: str, files: Mapping[str, Path]) -> None:
        target = base / "models" / folder
        target.mkdir(parents=True, exist_ok=True)
        for name, path in files.items():
            if not (path.is_file() or (folder == "diffusers" and path.is_dir())):
                raise FileNotFoundError(f"{folder} file {name!r}: {path} does not exist")
            link = target / name
            if link.is_symlink() and link.resolve() == path:
                continue
            link.symlink_to(path, target_is_directory=path.is_dir())

    def link_models(self, folder: str, files: Mapping[str, str | os.PathLike[str]]) -> None:
        """Symlink ``{file name: path}`` into ``models/<folder>/`` (e.g. ``"loras"``), also while running.

        For ``folder="diffusers"`` the paths are pipeline folders (``save_pretrained`` layout).

        ComfyUI re-lists a model folder when its modification time changes, so the next prompt sees the
        new names. Raises ``FileNotFoundError`` for a missing file, ``FileExistsError`` for a name already
        linked to another file, :class:`ComfyServerError` before :meth:`start`.
        """
        if self.base_dir is None:
            raise ComfyServerError("server not started")
        resolved = {name: Path(p).expanduser().resolve() for name, p in files.items()}
        self._link(self.base_dir, folder, resolved)
        if folder == "checkpoints":
            self.checkpoints.update(resolved)
        elif folder == "loras":
            self.loras.update(resolved)

    def command(self) -> list[str]:
        """The ``main.py`` command line (needs :attr:`base_dir` and :attr:`port`)."""
        return [
            self.python,
            str(self.comfyui / "main.py"),
            *(["--cpu"] if self.cpu else []),
            "--listen",
            HOST,
            "--port",
            str(self.port),
            "--base-directory",
            str(self.base_dir),
            "--disable-api-nodes",
            "--disable-auto-launch",
            "--database-url",
            "sqlite:///:memory:",
            *self.extra_args,
            *self._front_end_args(),
        ]

    def _front_end_args(self) -> list[str]:
        """``--front-end-root $STEADFAST_FRONT_END_ROOT`` when that is set and ``extra_args`` names no root: ComfyUI
        exits at start without ``comfyui-frontend-package`` (the GPU protocol's device image lacks it)."""
        root = os.environ.get("STEADFAST_FRONT_END_ROOT")
        return ["--front-end-root", root] if root and "--front-end-root" not in self.extra_args else []

    def start(self) -> ComfyServer:
        """Start the server and wait until it answers. Raises :class:`ServerStartError` (with the log tail)."""
        if self.process is not None and self.process.poll() is None:
            return self
        if self.base_dir is None:
            self.base_dir = self._make_base()
        last_error: Exception | None = None
        for _attempt in range(3):  # a port taken between free_port() and bind() is retried
            self.port = free_port()
            try:
                self._spawn_and_wait()
                return self
            except ServerStartError as exc:
                last_error = exc
                if "address already in use" not in self.log_tail(50).lower():
                    break
        assert last_error is not None
        raise last_error

    def _spawn_and_wait(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self._log_file = open(self.log_path, "ab")
        self._log_file.write(f"$ {' '.join(self.command())}\n".encode())
        self._log_file.flush()
        self.process = subprocess.Popen(
            self.command(),
            cwd=str(self.comfyui),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                rc = self.process.returncode
                self._reap()
                raise ServerStartError(f"ComfyUI exited with code {rc} during start; log tail:\n{self.log_tail()}")
            try:
                self.get("/system_stats", timeout=2.0)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.25)
        self.stop()
        raise ServerStartError(
            f"ComfyUI did not answer GET /system_stats within {self.startup_timeout:.0f} s; "
            f"log tail:\n{self.log_tail()}"
        )

    def stop(self, grace: float = 10.0) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL after ``grace`` s) and wait for it."""
        proc = self.process
        if proc is not None:
            if proc.poll() is None:
                for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                    try:
                        os.killpg(proc.pid, sig)  # start_new_session: pgid == pid
                    except ProcessLookupError:
                        break
                    try:
                        proc.wait(timeout=wait)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            # Children that outlived the leader would keep the group: make sure it is gone.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._reap()

    def _reap(self) -> None:
        if self.process is not None:
            try:
                self.process.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                pass
        self.process = None
        atexit.unregister(self.stop)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def restart(self) -> ComfyServer:
        """Stop and start again with the same base directory (outputs kept; caches and models are not)."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """:meth:`stop` and remove the base directory (unless ``keep_base``)."""
        self.stop()
        if self.base_dir is not None and not self.keep_base:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> ComfyServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        """Last ``lines`` lines of the server log ('' before start)."""
        if self.base_dir is None or not self.log_path.is_file():
            return ""
        text = self.log_path.read_bytes()[-200_000:].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def import_failures(self) -> list[str]:
        """Paths ComfyUI logged as ``(IMPORT FAILED)`` custom-node modules (core ``comfy_extras`` failures are
        logged differently and not included). Use ``PACK_DIR_NAME in path`` to see whether this pack loaded."""
        if self.base_dir is None or not self.log_path.is_file():
            return []
        marker = "(IMPORT FAILED):"
        text = self.log_path.read_text("utf-8", "replace")
        return [line.split(marker, 1)[1].strip() for line in text.splitlines() if marker in line]


def main(argv: list[str] | None = None) -> int:
    """``python headless/comfy_server.py [--ckpt PATH ...] [-- extra main.py args]``: serve until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description="Run a temporary headless ComfyUI with the Steadfast pack.")
    parser.add_argument("--ckpt", action="append", default=[], help="checkpoint file to expose (repeatable)")
    parser.add_argument("extra", nargs="*", help="extra main.py arguments (after --)")
    ns = parser.parse_args(argv)
    with ComfyServer({Path(p).name: p for p in ns.ckpt}, extra_args=ns.extra) as srv:
        print(f"ComfyUI at {srv.url} (base {srv.base_dir}, log {srv.log_path}); Ctrl-C to stop", flush=True)
        try:
            while srv.is_running():
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
