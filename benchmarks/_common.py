"""Shared helpers for the benchmark scripts (not part of the node pack; never imported by ComfyUI).

* :func:`import_pack` - import ComfyUI in-process (CPU) via ``headless/tiny_sd15.import_comfy`` and the
  repo root as the package ``steadfast`` (``scripts/_steadfast_import.py``), so the benchmarks run the
  pack's own code paths.
* :func:`machine_info` / :func:`print_header` - CPU model, cores, torch / python / ComfyUI versions, date.
* :func:`markdown_table`, :func:`summarize` - output formatting and min / median statistics.

The benchmarks print ratios measured side by side in one run; they are not tests and assert nothing
about speed.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# headless/: tiny_sd15, imported before the pack (it sets up ComfyUI); scripts/: _steadfast_import
PATHS = (ROOT / "headless", ROOT / "scripts")


def _scripts_on_path() -> None:
    for folder in PATHS:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def tiny_sd15_module() -> Any:
    """``headless/tiny_sd15.py`` as a top-level module (imported before ComfyUI and the pack)."""
    _scripts_on_path()
    import tiny_sd15

    return tiny_sd15


TINY_CKPT = "steadfast_tiny_sd15.safetensors"


def tiny_prompt_base(side: int, batch: int = 1, ckpt: str = TINY_CKPT) -> dict[str, Any]:
    """Nodes "1"-"4" of an API-format prompt on the tiny checkpoint: loader, positive "a lighthouse at dusk" and
    empty negative CLIPTextEncode, EmptyLatentImage ``side`` x ``side`` (pixels), ``batch`` items."""
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse at dusk", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": side, "height": side, "batch_size": batch}},
    }


def optimize_node(model: list, **inputs: Any) -> dict[str, Any]:
    """An API-format ``SteadfastOptimizeModel`` node on ``model`` (a link, ``[node id, output]``): regional
    ``torch.compile`` with inductor, SDPA ``auto``, no QKV fusion, no channels-last, mode ``default``, dynamic
    ``auto``, no fullgraph. ``inputs`` replace or add widgets (``compile_cache="off"``, ``quantize=...``); the
    optional ones left out take the node's defaults."""
    base = {
        "model": model,
        "qkv_fusion": False,
        "channels_last": False,
        "attention": "auto",
        "compile": "regional",
        "backend": "inductor",
        "mode": "default",
        "dynamic": "auto",
        "fullgraph": False,
    }
    return {"class_type": "SteadfastOptimizeModel", "inputs": {**base, **inputs}}


def import_pack(cpu: bool = True) -> Any:
    """Import ComfyUI in-process (``args.cpu = True`` unless ``cpu=False``), then the repo root as package
    ``steadfast``.

    Order matters: ComfyUI's CPU flag must be set before ``comfy.model_management`` is imported, and the
    pack's ``__init__`` imports ``comfy_api`` (so ComfyUI must be on ``sys.path`` first); the pack sets
    ``CUBLAS_WORKSPACE_CONFIG``, so import it before any CUDA work. Returns the ``steadfast`` package.
    Raises ``FileNotFoundError`` without a ComfyUI checkout (``COMFYUI_PATH``, default ``~/comfy/ComfyUI``).
    """
    tiny_sd15_module().import_comfy(cpu)
    from _steadfast_import import import_steadfast  # scripts/ is on sys.path now

    return import_steadfast()


def cpu_model() -> str:
    """``model name`` from ``/proc/cpuinfo`` (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def comfyui_version() -> str:
    """``__version__`` of the ComfyUI checkout that :func:`import_pack` uses ("unknown" if absent)."""
    root = Path(os.environ.get("COMFYUI_PATH", str(Path.home() / "comfy" / "ComfyUI"))).expanduser()
    try:
        text = (root / "comfyui_version.py").read_text()  # generated: __version__ = "0.8.0"
    except OSError:
        return "unknown"
    match = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.MULTILINE)
    return match.group(1) if match else "unknown"


def machine_info() -> dict[str, Any]:
    """Where the numbers come from: CPU model, cores, ISA torch uses, thread count, versions, UTC date."""
    import torch

    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "comfyui": comfyui_version(),
        "loadavg_at_start": loadavg(),
        "cpu_pressure_at_start": cpu_pressure(),
    }


def loadavg() -> str:
    """1 / 5 / 15 minute load averages from ``/proc/loadavg`` ("n/a" elsewhere). Other processes on the
    machine (load above the core count) inflate wall times; the benchmarks interleave to share that."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def cpu_pressure() -> str:
    """Linux PSI ``some`` line of ``/proc/pressure/cpu``: the share of time (percent, 10 s / 60 s / 300 s
    averages) in which at least one runnable task waited for a CPU ("n/a" without PSI). Near 100 means
    the cores were oversubscribed and wall times are inflated."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "n/a"
    fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
    return f"some avg10={fields.get('avg10')} avg60={fields.get('avg60')} avg300={fields.get('avg300')}"


def executed_seconds(entry: dict[str, Any]) -> float:
    """Seconds between the server's own ``execution_start`` and ``execution_success`` timestamps of a ``/history``
    entry: what the server spent on the prompt, without the client's polling and the queue. Raises KeyError when
    the entry has no such messages (a failed prompt)."""
    stamps = {
        name: data.get("timestamp")
        for name, data in (entry.get("status") or {}).get("messages", [])
        if isinstance(data, dict)
    }
    return (stamps["execution_success"] - stamps["execution_start"]) / 1000.0


def seeded_generator(tag: str, device: Any, seed: int, key: str) -> Any:
    """A ``torch.Generator`` on ``device`` seeded by sha256(``tag|seed|key``): one stream per weight or input,
    independent of creation order."""
    import hashlib

    import torch

    digest = hashlib.sha256(f"{tag}|{seed}|{key}".encode()).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def seeded_comfy_model(
    config_class: str, config: dict[str, Any], device: Any, dtype: Any, seed: int, tag: str, ones_suffix: str
) -> Any:
    """A ``ModelPatcher`` around the ComfyUI model of ``comfy.supported_models.<config_class>`` built from
    ``config`` on ``device`` in ``dtype``, its weights filled in place (ComfyUI's layers leave them uninitialised):
    matrices and kernels ~ N(0, 1/fan_in), 1-D parameters named ``*<ones_suffix>`` (norm scales) 1, the other 1-D
    ones ~ N(0, 0.02^2); each from :func:`seeded_generator` (``tag``, ``seed``, the parameter's name). Raises
    ``RuntimeError`` when the model holds buffers (they would stay uninitialised). Needs ComfyUI imported."""
    import torch

    import comfy.model_patcher
    import comfy.supported_models

    model_config = getattr(comfy.supported_models, config_class)(dict(config))
    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model({}, device=device)
    dm = model.diffusion_model
    buffers = [n for n, b in dm.named_buffers() if b is not None]
    if buffers:
        raise RuntimeError(f"{config_class} has buffers that would stay uninitialised: {buffers[:5]}")
    with torch.no_grad():
        for name, p in dm.named_parameters():
            g = seeded_generator(tag, p.device, seed, name)
            if p.dim() >= 2:
                p.copy_(
                    torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
                    .div_(p[0].numel() ** 0.5)
                    .to(p.dtype)
                )
            elif name.endswith(ones_suffix):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32).mul_(0.02).to(p.dtype))
    model.eval()
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=torch.device("cpu"))


def print_header(title: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Print ``title`` and :func:`machine_info` (plus ``extra``) as a markdown bullet list; return the dict."""
    info = machine_info()
    if extra:
        info.update(extra)
    print(f"## {title}\n")
    for k, v in info.items():
        print(f"- {k}: {v}")
    print(flush=True)
    return info


def summarize(times: Sequence[float]) -> tuple[float, float]:
    """``(min, median)`` of wall times in seconds. Raises ``ValueError`` for an empty sequence."""
    if not times:
        raise ValueError("no timings")
    return min(times), statistics.median(times)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; cells are ``str()``-ed."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_s(x: float | None, digits: int = 3) -> str:
    """Seconds with ``digits`` decimals, or "-" for None."""
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_d(x: float) -> str:
    """A max |d| value: "0" when exactly zero, else 2 significant digits in e-notation."""
    return "0" if x == 0 else f"{x:.2e}"


def others_share_now(window_s: float = 2.0) -> float | None:
    """Share of all cores that other processes used during ``window_s`` seconds of sleep (None without /proc)."""

    with OthersMeter() as m:
        time.sleep(window_s)
    return m.share


def wait_for_quiet(max_wait_s: float, threshold: float = 0.05, window_s: float = 2.0) -> str:
    """Wait (at most ``max_wait_s`` seconds) until other processes use less than ``threshold`` of the cores.

    Polls :func:`others_share_now` (``window_s`` sleeps). For shared machines, where other processes'
    load makes two-thread OpenMP runs many times slower. Returns a short note (seconds waited, last
    share); returns "" at once when ``max_wait_s <= 0``. Never raises.
    """
    if max_wait_s <= 0:
        return ""

    t0 = time.monotonic()
    while True:
        share = others_share_now(window_s)
        waited = time.monotonic() - t0
        if share is None:
            return "no /proc/stat; did not wait"
        if share < threshold or waited >= max_wait_s:
            state = "quiet" if share < threshold else "still busy, went on"
            return f"waited {waited:.0f} s for others' CPU use < {threshold:.0%} ({state}: {share:.0%})"


def _cpu_busy_s() -> float | None:
    """Machine-wide busy CPU seconds so far (all cores; everything but idle and iowait, steal included)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        ticks = [int(x) for x in fields[1:]]
    except (OSError, IndexError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    busy = sum(ticks[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is inside user)
    return busy / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds (user + system, including reaped children) of process ``root`` (default: this one)
    and all its live descendants, e.g. inductor's compile workers and the compilers they ran."""
    root = os.getpid() if root is None else root
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
        # fields[1] = ppid; fields[11:15] = utime stime cutime cstime (clock ticks)
        stats[int(entry.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


class OthersMeter:
    """Context manager: how much CPU *other* processes used during the block, as a share of all cores.

    ``share`` = (machine-wide busy CPU seconds from ``/proc/stat`` - CPU seconds of this process and its
    descendants) / (wall seconds x cores), clipped to [0, 1]; None where ``/proc`` is unavailable. 0 means
    the benchmark had the machine to itself; 0.5 on 2 cores means others kept one core busy on average.
    """

    def __init__(self) -> None:
        self.share: float | None = None

    def __enter__(self) -> OthersMeter:

        self._t0, self._b0 = time.perf_counter(), _cpu_busy_s()
        self._c0 = _tree_cpu_s() if self._b0 is not None else 0.0
        return self

    def __exit__(self, *exc: Any) -> None:

        wall = time.perf_counter() - self._t0
        b1 = _cpu_busy_s()
        if wall <= 0 or self._b0 is None or b1 is None:
            return
        mine = _tree_cpu_s() - self._c0
        self.share = min(1.0, max(0.0, (b1 - self._b0 - mine) / (wall * (os.cpu_count() or 1))))


def print_footer(t_start: float) -> None:
    """The last line of every benchmark: load average, CPU pressure and total wall time since ``t_start``."""
    print(
        f"load average at end: {loadavg()}; CPU pressure at end: {cpu_pressure()}; "
        f"total wall time: {time.perf_counter() - t_start:.0f} s"
    )
