"""``steadfast run``: run a workflow headless on one or more ComfyUI servers and check that its bits hold.

The workflow is an API-format JSON file or a PNG saved by ComfyUI (its embedded ``prompt`` text chunk).
Each run's :data:`HASH_NODE` outputs (hash, expected, match) and Seeded Sampler run records are collected;
hashes are compared across runs and servers; any difference is explained field by field
(:func:`core.record.explain.explain` on the run records). ``pin`` writes a copy of the workflow with the observed
hashes (and run records) filled into its Hash nodes, so it carries its own proof.

Servers are duck-typed: anything with ``label``, ``queue(prompt) -> id``, ``wait(id) -> history entry``,
``free()``, ``get(path)`` and, for ``--restart``, ``restart()`` (``headless.comfy_server.ComfyServer``); a server
whose ``api`` is ``"v2"`` (:class:`headless.v2.V2Server`, the Comfy API v2) has no ``/object_info`` to check node
types against and makes each run fresh itself. Every run must be a fresh execution: a run in which ComfyUI served a
node from its cache is a failed run (a cached answer proves nothing), and the report says how each run was fresh.
This module imports nothing from ComfyUI.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..core.record import verdict
from ..core.record.explain import explain
from .comfy_server import cached_nodes

__all__ = [
    "HASH_NODE",
    "SAMPLER_NODES",
    "WorkflowError",
    "load_workflow",
    "hash_nodes",
    "missing_node_types",
    "RunResult",
    "Report",
    "collect",
    "compare",
    "pin",
    "run_all",
]

HASH_NODE = "SteadfastHash"
SAMPLER_NODES = ("SteadfastSeededSampler", "SteadfastPipelineSampler")
RECORD_KEY = "steadfast_run_record"


class WorkflowError(ValueError):
    """A workflow that cannot be run or checked (the message says which file and why)."""


class Server(Protocol):
    label: str

    def queue(self, prompt: Mapping[str, Any]) -> str: ...
    def wait(self, prompt_id: str, timeout: float = ...) -> dict[str, Any]: ...
    def free(self, unload_models: bool = ..., free_memory: bool = ...) -> None: ...
    def get(self, path: str) -> Any: ...


def load_workflow(path: str | Path) -> dict[str, Any]:
    """The API-format prompt in ``path`` (``.json``, or a ComfyUI ``.png`` with a ``prompt`` text chunk).

    Raises WorkflowError: missing file, unreadable JSON, a UI-format workflow (nodes/links: export it with
    "Export (API)"), a PNG without an embedded prompt."""
    p = Path(path)
    if not p.is_file():
        raise WorkflowError(f"workflow file not found: {p}")
    if p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n":
        from PIL import Image

        with Image.open(p) as img:
            text = (getattr(img, "text", None) or img.info).get("prompt")
        if not text:
            raise WorkflowError(
                f"{p.name}: this PNG has no embedded ComfyUI prompt (saved by SaveImage with "
                f"metadata? some sites strip it)"
            )
        source = f"{p.name} (embedded prompt)"
    else:
        text, source = p.read_text(encoding="utf-8"), p.name
    try:
        prompt = json.loads(text)
    except ValueError as e:
        raise WorkflowError(f"{source}: not JSON ({e})") from None
    if isinstance(prompt, dict) and "nodes" in prompt and "links" in prompt:
        raise WorkflowError(f"{source}: this is a UI-format workflow; in ComfyUI use Workflow -> Export (API)")
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), dict):
        prompt = prompt["prompt"]  # a POST /prompt body
    if not isinstance(prompt, dict) or not all(isinstance(v, dict) and "class_type" in v for v in prompt.values()):
        raise WorkflowError(f"{source}: not an API-format workflow (expected {{node_id: {{class_type, inputs}}}})")
    return prompt


def hash_nodes(prompt: Mapping[str, Any]) -> list[str]:
    """Ids of the Hash nodes. Raises WorkflowError when there is none (nothing to check)."""
    ids = sorted((k for k, v in prompt.items() if v.get("class_type") == HASH_NODE), key=str)
    if not ids:
        raise WorkflowError(
            f"the workflow has no {HASH_NODE} node: add Hash (Steadfast) after what should be "
            f"reproducible (a LATENT or an IMAGE)"
        )
    return ids


def missing_node_types(prompt: Mapping[str, Any], object_info: Mapping[str, Any]) -> list[str]:
    """Node types used by ``prompt`` that the server does not know (``GET /object_info``)."""
    return sorted({v["class_type"] for v in prompt.values()} - set(object_info))


def upstream(prompt: Mapping[str, Any], node: str, class_types: Sequence[str]) -> list[str]:
    """Ids of the nodes of ``class_types`` that feed ``node`` (directly or not), nearest first."""
    seen, order, todo = {node}, [], [node]
    while todo:
        cur = todo.pop(0)
        for value in prompt.get(cur, {}).get("inputs", {}).values():
            if isinstance(value, list) and len(value) == 2 and str(value[0]) in prompt and str(value[0]) not in seen:
                nid = str(value[0])
                seen.add(nid)
                todo.append(nid)
                if prompt[nid].get("class_type") in class_types:
                    order.append(nid)
    return order


@dataclasses.dataclass
class RunResult:
    """One run on one server: ``hashes`` {hash node: digest}, ``checks`` {hash node: match status},
    ``records`` {sampler node: run record}, ``references`` {hash node: thumbnail}, ``verdicts`` {hash node: the
    node's own verdict against its pinned reference}, ``error`` (text) when the prompt failed, ``fresh``: how the
    run is known to be a fresh execution (no node served from ComfyUI's cache)."""

    server: str
    run: str
    hashes: dict[str, str] = dataclasses.field(default_factory=dict)
    checks: dict[str, str] = dataclasses.field(default_factory=dict)
    records: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    references: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    verdicts: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    error: str | None = None
    fresh: str | None = None


def collect(server: str, run: str, entry: Mapping[str, Any]) -> RunResult:
    """A :class:`RunResult` from a ``/history`` entry (its ``outputs``; ``fresh`` when the server said how the run was
    fresh, as :class:`headless.v2.V2Server` does). A native entry in which a node came from ComfyUI's cache is a failed
    run."""
    out = RunResult(server, run, fresh=entry.get("fresh"))
    if out.fresh is None:
        cached = cached_nodes(entry)
        if cached:
            names = ", ".join(sorted(cached, key=lambda n: (len(n), n)))
            out.error = f"not a fresh execution: node(s) {names} came from ComfyUI's cache, so this run proves nothing"
            return out
        out.fresh = "fresh execution (node caches dropped before the run; ComfyUI served no node from its cache)"
    for nid, ui in (entry.get("outputs") or {}).items():
        for item in ui.get("steadfast_hash") or []:
            out.hashes[str(nid)] = item["hash"]
            out.checks[str(nid)] = item.get("match", "unchecked")
            if item.get("reference"):
                out.references[str(nid)] = item["reference"]
            if item.get("verdict"):
                out.verdicts[str(nid)] = item["verdict"]
        for record in ui.get(RECORD_KEY) or []:
            out.records[str(nid)] = record
    return out


@dataclasses.dataclass
class Report:
    """All runs, and per Hash node the distinct digests, the failed ``expected`` checks and explanations."""

    prompt: dict[str, Any]
    results: list[RunResult]
    distinct: dict[str, list[str]]
    failures: list[str]
    explanations: list[str]
    grades: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and all(len(v) == 1 for v in self.distinct.values())

    @property
    def level(self) -> str:
        """The worst graded verdict: "identical", "same_picture", "different_picture", "ungraded" (bytes differ in
        batch items the reference has no thumbnail for), "unknown" (bytes differ, nothing to grade by) or "failed"
        (a run failed)."""
        if any(r.error for r in self.results) or any("gave no output" in f for f in self.failures):
            return "failed"
        levels = {g["level"] for g in self.grades}
        if self.ok and not levels - {"identical"}:
            return "identical"
        for worst in ("different_picture", "unknown", "ungraded", "same_picture"):
            if worst in levels:
                return worst
        return "unknown" if not self.ok else "identical"

    @property
    def exit_code(self) -> int:
        """0 identical bytes, 3 same picture within tolerance, 1 different picture / items not graded / nothing to
        grade by / a failed run (:data:`core.record.verdict.EXIT_CODES`)."""
        return 1 if self.level == "failed" else verdict.EXIT_CODES[self.level]

    def table(self) -> str:
        nodes = sorted(self.distinct, key=str)
        head = f"{'server':<30} {'run':<20} " + " ".join(f"{'hash ' + n:<20}" for n in nodes)
        rows = [head]
        for r in self.results:
            cells = [(r.hashes.get(n, "-")[:16] + (" !" if r.checks.get(n) == "mismatch" else "")) for n in nodes]
            rows.append(
                f"{r.server[:30]:<30} {r.run[:20]:<20} "
                + " ".join(f"{c:<20}" for c in cells)
                + (f"  ERROR: {r.error[:120]}" if r.error else "")
            )
        return "\n".join(rows)

    def as_text(self) -> str:
        lines = [self.table(), ""]
        for server, how in dict.fromkeys((r.server, r.fresh) for r in self.results if r.fresh):
            lines.append(f"{server}: every run a {how}")
        lines += self.explanations
        lines += [
            f"Hash node {g['node']}: {g['against']} -> {g['run']}: {g['text']}"
            for g in self.grades
            if g["level"] != "identical"
        ]
        level = self.level
        lines += [("bytes differ: " if level == "same_picture" else "FAIL: ") + f for f in self.failures]
        lines.append(
            {
                "identical": "PASS: every run gave the same bytes",
                "same_picture": "SAME PICTURE: the bytes differ but every output is the same picture within "
                "tolerance (exit 3)",
                "different_picture": "FAIL: DIFFERENT PICTURE (see above)",
                "ungraded": "FAIL: the bytes differ in batch items the reference has no thumbnail for "
                f"(it keeps {verdict.MAX_ITEMS}): they were not graded (hash fewer items per "
                "Hash node, or compare the outputs with Compare)",
                "unknown": "FAIL: the bytes differ and there is no reference to grade them by (pin one: "
                "--pin writes expected_reference)",
                "failed": "FAIL: a run failed or a check could not be made (see above)",
            }[level]
        )
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verdict": self.level,
            "exit_code": self.exit_code,
            "distinct": self.distinct,
            "failures": self.failures,
            "explanations": self.explanations,
            "grades": self.grades,
            "runs": [dataclasses.asdict(r) for r in self.results],
        }


def compare(prompt: Mapping[str, Any], results: Sequence[RunResult]) -> Report:
    """Compare every Hash node's digest across ``results``; explain each difference from the run records."""
    nodes = hash_nodes(prompt)
    ok_runs = [r for r in results if r.error is None]
    distinct = {n: list(dict.fromkeys(r.hashes[n] for r in ok_runs if n in r.hashes)) for n in nodes}
    failures = [f"{r.server} {r.run}: {r.error}" for r in results if r.error]
    failures += [
        f"{r.server} {r.run}: Hash node {n} does not match its expected hash"
        for r in ok_runs
        for n, s in r.checks.items()
        if s == "mismatch"
    ]
    failures += [f"Hash node {n} gave no output (not executed?)" for n, v in distinct.items() if not v and ok_runs]
    explanations: list[str] = []
    if ok_runs:
        ref = ok_runs[0]
        for n in nodes:
            samplers = upstream(prompt, n, SAMPLER_NODES)
            for r in ok_runs[1:]:
                if n not in r.hashes or r.hashes[n] == ref.hashes.get(n):
                    continue
                head = f"Hash node {n}: {ref.server} {ref.run} -> {r.server} {r.run} differ"
                recs = [(s, ref.records.get(s), r.records.get(s)) for s in samplers]
                recs = [(s, a, b) for s, a, b in recs if a is not None and b is not None]
                if not recs:
                    explanations.append(head + " (no Seeded Sampler run record upstream to explain it)")
                for s, a, b in recs:
                    explanations.append(f"{head}; run record of sampler {s}:\n" + explain(a, b).as_text())
    return Report(dict(prompt), list(results), distinct, failures, explanations, _grades(prompt, ok_runs))


def _grades(prompt: Mapping[str, Any], ok_runs: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Per Hash node: each run graded against the first run (thumbnails, :mod:`core.record.verdict`), and each run's
    own verdict against the reference pinned in the workflow."""
    out: list[dict[str, Any]] = []
    if not ok_runs:
        return out
    ref = ok_runs[0]
    for n in hash_nodes(prompt):
        samplers = upstream(prompt, n, SAMPLER_NODES)
        for r in ok_runs:
            if r.checks.get(n) == "mismatch":
                v = verdict.Verdict.from_dict(r.verdicts[n]) if r.verdicts.get(n) else verdict.Verdict("unknown")
                out.append(
                    {
                        "node": n,
                        "run": f"{r.server} {r.run}",
                        "against": "pinned reference",
                        "level": v.level,
                        "text": v.as_text().replace("\n", "\n    "),
                        "verdict": v.as_dict(),
                    }
                )
            elif r.checks.get(n) == "match":
                out.append(
                    {
                        "node": n,
                        "run": f"{r.server} {r.run}",
                        "against": "pinned reference",
                        "level": "identical",
                        "text": "identical bytes",
                        "verdict": None,
                    }
                )
            if r is ref or n not in r.hashes or n not in ref.hashes:
                continue
            s = next((s for s in samplers if s in r.records and s in ref.records), None)
            v = verdict.grade(
                r.hashes[n],
                ref.hashes[n],
                r.references.get(n),
                ref.references.get(n),
                record_now=r.records.get(s) if s else None,
                record_ref=ref.records.get(s) if s else None,
            )
            out.append(
                {
                    "node": n,
                    "run": f"{r.server} {r.run}",
                    "against": f"{ref.server} {ref.run}",
                    "level": v.level,
                    "text": v.as_text().replace("\n", "\n    "),
                    "verdict": v.as_dict(),
                }
            )
    return out


def pin(prompt: Mapping[str, Any], result: RunResult) -> dict[str, Any]:
    """A copy of ``prompt`` with each Hash node's ``expected`` set to the digest observed in ``result`` and,
    where the node takes it, ``expected_record`` set to the run record of the nearest upstream sampler."""
    out = copy.deepcopy(dict(prompt))
    for n in hash_nodes(out):
        if n not in result.hashes:
            continue
        inputs = out[n].setdefault("inputs", {})
        inputs["expected"] = result.hashes[n]
        if n in result.references:
            inputs["expected_reference"] = json.dumps(result.references[n], sort_keys=True)
        samplers = [s for s in upstream(out, n, SAMPLER_NODES) if s in result.records]
        if samplers:
            inputs["expected_record"] = json.dumps(result.records[samplers[0]], sort_keys=True)
    return out


def _run_once(server: Server, prompt: Mapping[str, Any], run: str, timeout: float) -> RunResult:
    try:
        entry = server.wait(server.queue(prompt), timeout=timeout)
    except Exception as e:  # noqa: BLE001 - a failed prompt is a result (reported), not a crash
        failed = RunResult(server.label, run, error=f"{type(e).__name__}: {getattr(e, 'exception_message', e)}")
        return failed
    return collect(server.label, run, entry)


def run_all(
    prompt: Mapping[str, Any],
    servers: Iterable[Server],
    *,
    runs: int = 2,
    free_between: bool = False,
    restart: bool = False,
    timeout: float = 1800.0,
    log: Callable[[str], None] = print,
) -> Report:
    """Run ``prompt`` ``runs`` times on every server and :func:`compare` the results.

    Each run starts with ComfyUI's node cache dropped (``POST /free`` with ``free_memory``), so every node
    recomputes; ``free_between`` also unloads the models between runs; ``restart`` adds one run after
    ``restart()``.

    Raises WorkflowError before running anything when the workflow has no Hash node, ``runs`` < 1, or a server
    lacks one of its node types (named)."""
    hash_nodes(prompt)
    if runs < 1:
        raise WorkflowError(f"--runs must be at least 1, got {runs}")
    servers = list(servers)
    for s in servers:
        if getattr(s, "api", "native") == "v2":
            continue  # no /object_info: a node type the server lacks comes back as invalid_workflow, named
        missing = missing_node_types(prompt, s.get("/object_info"))
        if missing:
            raise WorkflowError(
                f"server {s.label} does not know node type(s) {', '.join(missing)} "
                f"(custom node pack missing or failed to import there)"
            )
    results: list[RunResult] = []
    for s in servers:
        for i in range(runs):
            unload = bool(i and free_between)
            s.free(unload_models=unload, free_memory=True)  # every node recomputes: a cached answer proves nothing
            label = f"run {i + 1}" + (" after unload" if unload else "")
            results.append(_run_once(s, prompt, label, timeout))
            log(
                f"{s.label} {label}: "
                + (results[-1].error or ", ".join(f"{n} {h[:16]}" for n, h in sorted(results[-1].hashes.items())))
            )
        if restart:
            s.restart()  # type: ignore[attr-defined]
            results.append(_run_once(s, prompt, "after restart", timeout))
            log(
                f"{s.label} after restart: "
                + (results[-1].error or ", ".join(f"{n} {h[:16]}" for n, h in sorted(results[-1].hashes.items())))
            )
    return compare(prompt, results)
