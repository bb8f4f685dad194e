"""``steadfast run`` over the Comfy API v2: a self-hosted ``comfy-api-proxy``, Comfy Cloud or a serverless deployment.

The v2 contract (Comfy-Org's versioned job API) is spoken through its Python client, ``comfy-sdk``
(``comfy_sdk.Comfy``: submit with an idempotency key, poll to a terminal state, download outputs as assets). v2 keeps
only outputs with a file name, so the verdict is read from the file the Hash node writes
(:mod:`core.record.verdict_file`): the pack's tensor-level hash, not v2's asset hash (that one covers the encoded file,
PNG metadata included).

Every run is a fresh execution. v2 has no ``/free`` and ComfyUI answers an identical resubmission from its cache
(``outputs_reused: true``), so each submission gives every node one more input, :data:`NONCE_INPUT`, with a value
never used before: ComfyUI's cache key holds every input of a node (``comfy_execution/caching.py``), and a node
ignores an input it does not declare (``execution.get_input_data``), so nothing is served from the cache and no
node computes anything else. Where the surface reports ``outputs_reused`` (the self-hosted proxy does; the SDK's
typed ``Job`` drops the field, so it is read from the raw job), a run that reused outputs fails.

The bearer token comes from an environment variable (:data:`DEFAULT_TOKEN_ENV` unless ``--token-env`` names
another), never from the command line, and never appears in a report or an error: every message is passed through
:meth:`V2Server.scrub`.

A :class:`V2Server` is a server for :func:`headless.runner.run_all`: ``queue(prompt)`` submits a job, ``wait(id)``
answers a ``/history``-like entry built from the downloaded verdict files, so the runner compares and explains
v2 runs exactly as native ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from ..core.record import verdict_file
from .runner import HASH_NODE, RECORD_KEY, WorkflowError

__all__ = ["DEFAULT_TOKEN_ENV", "NONCE_INPUT", "V2Server", "V2RunError", "is_v2", "with_nonce", "token_from_env"]

EXPIRED_REPOLLS = 6
"""How many more times a job answered ``expired`` is polled (0.5 s apart) before that status counts.
``comfy-api-proxy`` 0.1.6 reads a job's state from ComfyUI's ``/history`` and then from its ``/queue``
(``_status_of``): a job that ComfyUI moves from running to its history between the two reads is in neither, and the
proxy answers ``expired`` ("known to the proxy, gone upstream"), a terminal status, for a job that succeeded. Polled
again, the history holds it."""

DEFAULT_TOKEN_ENV = "COMFY_API_KEY"
"""The variable the token is read from by default: the one ``comfy-sdk`` itself reads."""

NONCE_INPUT = "steadfast_fresh_run"
"""The input added to every node of a v2 submission, with a new value each time (see the module docstring)."""


class V2RunError(RuntimeError):
    """A v2 job that was refused, failed, reused cached outputs or listed no verdict file. The message says which,
    with the server's code, message and details (``node_errors``, the failing node); never the token."""

    @property
    def exception_message(self) -> str:
        return str(self)


def token_from_env(name: str) -> str | None:
    """The bearer token in the environment variable ``name`` (surrounding whitespace stripped), or None when unset or
    blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def with_nonce(prompt: Mapping[str, Any], nonce: str | None = None) -> dict[str, Any]:
    """A copy of ``prompt`` in which every node has :data:`NONCE_INPUT` set to ``nonce`` (a new UUID by default) and
    every Hash node ``verdict_file`` on (the verdict travels in that file).

    Args:
        prompt: an API-format workflow ``{node id: {"class_type", "inputs"}}``.
        nonce: the value (a fresh ``uuid4`` hex when None).
    Returns:
        the new prompt (``prompt`` is not changed).
    """
    nonce = nonce or uuid.uuid4().hex
    out = json.loads(json.dumps(dict(prompt)))
    for node in out.values():
        inputs = node.setdefault("inputs", {})
        inputs[NONCE_INPUT] = nonce
        if node.get("class_type") == HASH_NODE:
            inputs["verdict_file"] = True
    return out


@contextlib.contextmanager
def _sdk_env(url: str) -> Iterator[None]:
    """``COMFY_BASE_URL`` set to ``url`` and ``COMFY_API_KEY`` blank while a ``comfy_sdk.Comfy`` is built: the SDK
    reads its target from the environment, per construction (its documented way to point successive clients at
    different deployments); the key is always passed explicitly."""
    saved = {k: os.environ.get(k) for k in ("COMFY_BASE_URL", "COMFY_API_KEY")}
    os.environ["COMFY_BASE_URL"] = url
    os.environ["COMFY_API_KEY"] = ""
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def is_v2(url: str, timeout: float = 10.0) -> bool:
    """Whether ``url`` serves the Comfy API v2 (``GET <url>/api/v2/health`` answers 200 with a JSON object).

    Raises:
        WorkflowError: nothing answers at ``url`` (connection refused, DNS, timeout).
    """
    from urllib.parse import urlsplit

    import httpx

    loopback = urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")
    try:  # a proxy from the environment is used for a remote deployment, never for this machine
        resp = httpx.get(url.rstrip("/") + "/api/v2/health", timeout=timeout, trust_env=not loopback)
    except httpx.HTTPError as e:
        raise WorkflowError(f"cannot reach {url}: {type(e).__name__}: {e}") from None
    if resp.status_code != 200:
        return False
    try:
        return isinstance(resp.json(), dict)
    except ValueError:
        return False


class V2Server:
    """One Comfy API v2 deployment, driven with ``comfy-sdk``.

    Args:
        url: the deployment's base URL (``http://127.0.0.1:8189`` for a proxy; the SDK adds ``/api/v2``).
        token: the bearer token, or None (a self-hosted proxy without ``--token``).
        token_env: the name of the variable the token came from (for messages only).
        timeout: seconds per HTTP request.

    Raises:
        WorkflowError: ``comfy-sdk`` is not installed, or it refuses the URL or a missing key (Comfy Cloud).
    """

    api = "v2"

    def __init__(self, url: str, token: str | None = None, token_env: str = DEFAULT_TOKEN_ENV, timeout: float = 60.0):
        try:
            from comfy_low import ComfyLow
            from comfy_sdk import Comfy, ComfyError
        except ImportError:
            raise WorkflowError(
                "the Comfy API v2 needs comfy-sdk: pip install comfy-sdk (scripts/setup_env.sh installs it)"
            ) from None
        self.url = url.rstrip("/")
        self._token = token
        self.token_env = token_env
        try:
            with _sdk_env(self.url):
                self._client = Comfy(api_key=token, timeout=timeout, client_info="comfyui-steadfast")
        except (ComfyError, ValueError) as e:
            raise WorkflowError(self.scrub(f"Comfy API v2 at {self.url}: {e}")) from None
        self._low = ComfyLow(self.url, token, timeout=timeout, client_info="comfyui-steadfast")
        self._jobs: dict[str, tuple[Any, dict[str, Any]]] = {}

    @property
    def label(self) -> str:
        """How reports name this server (its URL; never the token)."""
        return f"v2 {self.url}"

    def scrub(self, text: str) -> str:
        """``text`` with the token, if it appears anywhere, replaced by ``***``."""
        return text.replace(self._token, "***") if self._token else text

    def close(self) -> None:
        self._client.close()
        self._low.close()

    def check(self) -> str:
        """Whether the deployment answers and takes the token: ``GET /api/v2/health``, then one authenticated
        ``GET /api/v2/jobs?limit=1``.

        Returns:
            a one-line description (URL, whether a token is sent and from which variable).
        Raises:
            WorkflowError: unreachable, or the token refused or missing (401/403), naming the variable.
        """
        import httpx

        try:
            health = self._low.raw_request("GET", "/health")
            jobs = self._low.raw_request("GET", "/jobs?limit=1")
        except httpx.HTTPError as e:
            raise WorkflowError(
                self.scrub(f"cannot reach Comfy API v2 at {self.url}: {type(e).__name__}: {e}")
            ) from None
        if health.status_code != 200:
            raise WorkflowError(f"Comfy API v2 at {self.url}: GET /api/v2/health answered {health.status_code}")
        if jobs.status_code in (401, 403):
            how = f"the token from ${self.token_env}" if self._token else f"no token (${self.token_env} is unset)"
            raise WorkflowError(
                f"Comfy API v2 at {self.url} refused {how}: HTTP {jobs.status_code} {self._error_text(jobs)}"
            )
        auth = f"token from ${self.token_env}" if self._token else "no token"
        return f"Comfy API v2 at {self.url} ({auth})"

    def _error_text(self, resp: Any) -> str:
        try:
            err = resp.json().get("error") or {}
            text = f"{err.get('code')}: {err.get('message')}"
        except (ValueError, AttributeError):
            text = resp.text[:300]
        return self.scrub(text)

    def _sdk_error(self, what: str, e: Exception) -> V2RunError:
        code = getattr(e, "code", None)
        status = getattr(e, "http_status", None)
        details = getattr(e, "details", None)
        head = f"{what}: {code or type(e).__name__}" + (f" (HTTP {status})" if status else "")
        text = f"{head}: {getattr(e, 'message', None) or e}"
        if details:
            text += "; details: " + json.dumps(details, sort_keys=True, default=str)
        return V2RunError(self.scrub(text))

    # ------------------------------------------------------------------ the runner's server interface
    def queue(self, prompt: Mapping[str, Any]) -> str:
        """Submit ``prompt`` as a new job (:func:`with_nonce`: a fresh execution); returns the job id.

        Raises:
            V2RunError: the deployment refused it (``invalid_workflow`` with ComfyUI's ``node_errors``,
                ``unauthorized`` ...), or could not be reached.
        """
        from comfy_sdk import ComfyError

        fresh = with_nonce(prompt)
        try:
            job = self._client.submit(self._client.workflows.from_json(fresh))
        except ComfyError as e:
            raise self._sdk_error("the job was refused", e) from None
        except Exception as e:  # noqa: BLE001 - a transport failure (httpx) is a failed run, reported
            raise V2RunError(self.scrub(f"submitting the job failed: {type(e).__name__}: {e}")) from None
        self._jobs[job.id] = (job, fresh)
        return job.id

    def wait(self, job_id: str, timeout: float = 1800.0) -> dict[str, Any]:
        """Poll the job to a terminal state and read its verdict files.

        Returns:
            a ``/history``-like entry: ``outputs`` ``{hash node: {"steadfast_hash": [item]}, sampler node:
            {"steadfast_run_record": [record]}}`` and ``fresh`` (how this run is known to be a fresh execution).
        Raises:
            V2RunError: the job failed (``node_execution_error``: message, node id, class type) or was canceled,
                reused cached outputs, or a Hash node listed no verdict file (or an unreadable one).
            TimeoutError: not terminal after ``timeout`` seconds.
        """
        from comfy_sdk import ComfyError

        job, prompt = self._jobs.pop(job_id)
        try:
            job.wait(timeout=timeout)
            for _ in range(EXPIRED_REPOLLS):  # the proxy's race between /history and /queue (EXPIRED_REPOLLS)
                if job.status != "expired":
                    break
                time.sleep(0.5)
                job.refresh()
        except ComfyError as e:
            raise self._sdk_error(f"polling job {job_id} failed", e) from None
        if job.status != "succeeded":
            err = job.error
            where = f" in node {err.node_id} ({err.class_type})" if err is not None and err.node_id else ""
            what = f"{err.code}: {err.message}" if err is not None else "no error given"
            if job.status == "expired":
                what += f" (still expired when polled {EXPIRED_REPOLLS} more times)"
            raise V2RunError(self.scrub(f"job {job_id} {job.status}{where}: {what}"))
        reused = self._outputs_reused(job_id)
        if reused:
            raise V2RunError(
                f"job {job_id} reused cached outputs (outputs_reused: true) although every node had a new "
                f"{NONCE_INPUT} input: not a fresh execution, so it proves nothing"
            )
        outputs: dict[str, dict[str, Any]] = {}
        hash_ids = [k for k, v in prompt.items() if v.get("class_type") == HASH_NODE]
        for nid in hash_ids:
            files = [o for o in job.get_outputs(nid) if o.name.endswith(".json")]
            if not files:
                raise V2RunError(
                    f"job {job_id} {job.status} but Hash node {nid} listed no verdict file: either it did not run "
                    "(ComfyUI runs only the outputs whose inputs validate, and a v2 job does not carry ComfyUI's "
                    "node_errors for the others: run the workflow once on that ComfyUI's native API to see them), "
                    "or the Steadfast pack on that server predates verdict files"
                )
            try:
                doc = verdict_file.parse(files[-1].to_bytes())
            except ValueError as e:
                raise V2RunError(f"job {job_id}: Hash node {nid}'s verdict file {files[-1].name}: {e}") from None
            except ComfyError as e:
                raise self._sdk_error(f"downloading Hash node {nid}'s verdict file", e) from None
            outputs.setdefault(nid, {})["steadfast_hash"] = [
                {
                    "hash": doc["hash"],
                    "match": doc.get("match", "unchecked"),
                    "explanation": doc.get("explanation", ""),
                    "record": doc.get("record"),
                    "reference": doc.get("reference"),
                    "verdict": doc.get("verdict"),
                    "dtype": doc["dtype"],
                    "shape": doc["shape"],
                }
            ]
            link = prompt[nid].get("inputs", {}).get("run_record")
            if doc.get("record") and isinstance(link, list) and len(link) == 2:
                outputs.setdefault(str(link[0]), {})[RECORD_KEY] = [doc["record"]]
        fresh = f"fresh execution (a new {NONCE_INPUT} on every node; the job answered outputs_reused: false)"
        if reused is None:
            fresh = f"fresh execution (a new {NONCE_INPUT} on every node; this surface does not report outputs_reused)"
        return {"outputs": outputs, "fresh": fresh, "job_id": job_id}

    def _outputs_reused(self, job_id: str) -> bool | None:
        """``outputs_reused`` of the raw job (the SDK's typed model drops it), or None where the surface has none."""
        try:
            raw = self._low.raw_request("GET", f"/jobs/{job_id}")
            value = raw.json().get("outputs_reused") if raw.status_code == 200 else None
        except Exception:  # noqa: BLE001 - an optional field: its absence is reported as such
            return None
        return value if isinstance(value, bool) else None

    def free(self, unload_models: bool = False, free_memory: bool = True) -> None:
        """Nothing to do: v2 has no ``/free``; every submission is fresh by :func:`with_nonce`.

        Raises:
            WorkflowError: ``unload_models`` asked (``--free-between``): v2 cannot unload models.
        """
        if unload_models:
            raise WorkflowError("--free-between needs ComfyUI's /free, which the Comfy API v2 does not have")

    def get(self, path: str) -> Any:
        """v2 has no native routes (``/object_info``): always raises WorkflowError."""
        raise WorkflowError(f"{self.label}: the Comfy API v2 has no native route {path}")
