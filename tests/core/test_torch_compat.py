"""core/torch_compat/ is the only door to torch's private APIs, and each of its functions does what it says.

The grep test reads every Python file of ``core/`` and ``nodes/``: only ``core/torch_compat/`` may contain the
text ``torch._`` (so ``torch.__version__`` is spelled ``torch.version.__version__`` elsewhere). The other tests
fake a missing API with ``monkeypatch`` (restored after each test) and check the error names it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import types
from pathlib import Path

import pytest
import torch

from steadfast.core import torch_compat as tc

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "core" / "torch_compat"


def files_naming_private_torch(folders: tuple[str, ...] = ("core", "nodes")) -> dict[str, list[int]]:
    """``{relative path: [line numbers]}`` of the files under ``folders`` that contain ``torch._``."""
    hits: dict[str, list[int]] = {}
    for folder in folders:
        for f in sorted((ROOT / folder).rglob("*.py")):
            lines = [i for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if "torch._" in line]
            if lines:
                hits[str(f.relative_to(ROOT))] = lines
    return hits


def test_only_torch_compat_names_private_torch() -> None:
    hits = files_naming_private_torch()
    assert "core/torch_compat/dynamo.py" in hits  # the scanner finds the pattern where it must be
    others = {f: lines for f, lines in hits.items() if not f.startswith("core/torch_compat/")}
    assert others == {}, f"private torch APIs outside core/torch_compat/ (file: lines): {others}"


def test_missing_api_error_names_api_version_and_purpose(monkeypatch) -> None:
    monkeypatch.delattr(torch._C, "_get_fp32_precision_getter")
    assert tc.has_fp32_precision_api() is False
    with pytest.raises(
        tc.TorchAPIMissing,
        match=r"reading fp32 precision needs torch\._C\._get_fp32_precision_getter"
        r", which torch 2\.\d+",
    ):
        tc.get_fp32_precision("cuda", "matmul")


def test_recompile_limit_reads_either_name_or_fails(monkeypatch) -> None:
    assert tc.recompile_limit() == torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=3):
        assert tc.recompile_limit() == 3
    monkeypatch.setattr(torch._dynamo, "config", types.SimpleNamespace(cache_size_limit=5))
    assert tc.recompile_limit() == 5  # the pre-2.7 name
    monkeypatch.setattr(torch._dynamo, "config", types.SimpleNamespace())
    with pytest.raises(tc.TorchAPIMissing, match="recompile_limit"):
        tc.recompile_limit()


def test_specialize_int_is_scoped_and_restored_on_errors() -> None:
    cfg = torch._dynamo.config
    before = cfg.specialize_int
    assert before is False  # torch's default
    with tc.specialize_int():
        assert cfg.specialize_int is True
        with tc.specialize_int():  # nests
            assert cfg.specialize_int is True
        assert cfg.specialize_int is True
    assert cfg.specialize_int is before
    with pytest.raises(KeyError):
        with tc.specialize_int():
            raise KeyError("boom")
    assert cfg.specialize_int is before


def test_while_compiling_holds_the_patches_only_while_a_call_compiles() -> None:
    """The patches reach the compile (the backend sees specialize_int True), a call that compiles nothing enters
    none (no config write, so torch's config hash stays valid), and a compile outside the block is left alone. A
    ``torch._dynamo.reset()`` (which drops Dynamo's compile callbacks) in between changes nothing."""
    with tc.while_compiling([tc.specialize_int]):
        pass  # registers the callbacks; the reset below drops them
    torch._dynamo.reset()
    seen: list[bool] = []
    entered: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        seen.append(torch._dynamo.config.specialize_int)
        return gm.forward

    @contextlib.contextmanager
    def counted():
        entered.append(1)
        with tc.specialize_int():
            yield

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 3 - 1

    compiled = torch.compile(f, backend=backend, dynamic=False)
    with tc.while_compiling([counted]):
        out = compiled(torch.ones(3))
    assert seen == [True] and len(entered) == 1
    assert torch._dynamo.config.specialize_int is False  # restored when the compile ended
    clean = torch._dynamo.config.get_hash()
    with tc.while_compiling([counted]):
        again = compiled(torch.ones(3))  # no compile: no context, no config write
    assert len(entered) == 1 and seen == [True]
    assert torch.equal(out, again)
    assert torch._dynamo.config.get_hash() == clean
    with tc.while_compiling([counted]):
        compiled(torch.ones(5))  # a recompile inside the block: the patches again
    assert seen == [True, True] and len(entered) == 2
    torch.compile(lambda x: x + 2, backend=backend, dynamic=False)(torch.ones(2))  # outside: untouched
    assert seen == [True, True, False] and len(entered) == 2
    torch._dynamo.reset()


def test_counters_and_cache_entries_follow_a_compile() -> None:
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    before = tc.dynamo_counters()
    assert {"unique_graphs", "calls_captured", "fxgraph_cache_hit", "autograd_cache_miss"} <= set(before)
    assert tc.cache_entry_count(f.__code__) == 0
    torch.compile(f, backend="eager", dynamic=False)(torch.ones(3))
    assert tc.dynamo_counters()["unique_graphs"] == before["unique_graphs"] + 1
    assert tc.cache_entry_count(f.__code__) == 1
    torch.compile(f, backend="eager", dynamic=False)(torch.ones(4))  # a new static shape: a second entry
    assert tc.cache_entry_count(f.__code__) == 2
    with pytest.raises(TypeError, match="code object"):
        tc.cache_entry_count(f)
    torch._dynamo.reset()


def test_global_state_tracks_a_flag() -> None:
    assert tc.dynamo_global_state()["grad_mode"] is True
    with torch.no_grad():
        assert tc.dynamo_global_state()["grad_mode"] is False
    assert "autocast_state" in tc.dynamo_global_state()


def test_guard_filter_and_mode_options() -> None:
    assert tc.supports_guard_filter_fn() is True  # torch 2.13/2.14
    assert tc.inductor_mode_options("default") == {}
    assert tc.inductor_mode_options("max-autotune-no-cudagraphs")["max_autotune"] is True
    with pytest.raises(ValueError, match="Unrecognized mode"):
        tc.inductor_mode_options("no-such-mode")


def test_is_compile_error() -> None:
    from torch._dynamo.exc import FailOnRecompileLimitHit, Unsupported

    assert tc.is_compile_error(Unsupported("graph break"))
    assert tc.is_compile_error(FailOnRecompileLimitHit("limit"))
    assert not tc.is_compile_error(ValueError("user error"))
    assert not tc.is_compile_error(RuntimeError("shape mismatch"))


def test_inductor_deterministic_reads_only_when_loaded(monkeypatch) -> None:
    import torch._inductor.config as cfg

    assert tc.inductor_deterministic() is bool(cfg.deterministic)
    previous = cfg.deterministic
    try:
        assert tc.set_inductor_deterministic(not previous) is True and cfg.deterministic is (not previous)
        assert tc.set_inductor_deterministic(not previous) is False  # already that value: nothing written
    finally:
        cfg.deterministic = previous
    with monkeypatch.context() as m:  # as in a process that never loaded inductor (nothing may import it here:
        m.delitem(sys.modules, "torch._inductor.config")  # a second config module would outlive the test)
        assert tc.inductor_deterministic() is None
        assert tc.set_inductor_deterministic(True) is False
    assert sys.modules["torch._inductor.config"] is cfg
    assert tc.inductor_deterministic(load=True) is bool(previous)  # load=True imports (here: finds) it


def test_fp32_precision_round_trip() -> None:
    assert tc.has_fp32_precision_api()
    before = tc.get_fp32_precision("mkldnn", "matmul")
    other = "ieee" if before != "ieee" else "none"
    try:
        tc.set_fp32_precision("mkldnn", "matmul", other)
        assert tc.get_fp32_precision("mkldnn", "matmul") == other
    finally:
        tc.set_fp32_precision("mkldnn", "matmul", before)
    assert tc.get_fp32_precision("mkldnn", "matmul") == before


def test_clear_inductor_caches_only_when_loaded(monkeypatch) -> None:
    import torch._inductor.utils  # noqa: F401

    assert tc.clear_inductor_caches() is True
    monkeypatch.delitem(sys.modules, "torch._inductor.utils")
    assert tc.clear_inductor_caches() is False


def _logging_state() -> tuple:
    from torch._logging import _internal as tlog

    logger = logging.getLogger(tc.RECOMPILES_LOGGER)
    return (
        dict(tlog.log_state.log_qname_to_level),
        set(tlog.log_state.artifact_names),
        logger.propagate,
        logger.level,
        list(logger.handlers),
        list(logging.getLogger(tc.CONVERT_FRAME_LOGGER).handlers),
    )


@pytest.fixture
def default_torch_logging(monkeypatch):
    """torch's logging state at its default for one test (no artifact, no level), put back as it was after it.

    Earlier tests may have left the process-wide registry's tap installed (the ``recompiles`` artifact on):
    it is removed first (the registry's next tracked call installs it again)."""
    from torch._logging import _internal as tlog

    from steadfast.core.compile.registry import REGISTRY

    REGISTRY.close()
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    levels, artifacts = dict(tlog.log_state.log_qname_to_level), set(tlog.log_state.artifact_names)
    torch._logging.set_logs()
    yield
    if not levels and not artifacts:
        torch._logging.set_logs()
    else:
        tlog.log_state.clear()
        tlog.log_state.log_qname_to_level.update(levels)
        tlog.log_state.artifact_names.update(artifacts)
        tlog._init_logs()


def test_log_tap_forwards_messages_and_is_removed_exactly(default_torch_logging) -> None:
    from torch._logging import _internal as tlog

    before = _logging_state()
    assert before[0] == {} and before[1] == set()
    seen: dict[str, list[str]] = {"recompile": [], "limit": []}
    tap = tc.install_recompile_log_tap(seen["recompile"].append, seen["limit"].append)
    assert tap.changed_state and "enabled by Steadfast" in tap.note
    assert "recompiles" in tlog.log_state.artifact_names and logging.getLogger(tc.RECOMPILES_LOGGER).propagate is False
    logging.getLogger(tc.RECOMPILES_LOGGER).debug("Recompiling function %s", "forward")
    logging.getLogger(tc.CONVERT_FRAME_LOGGER).warning("torch._dynamo hit config.recompile_limit (8)")
    logging.getLogger(tc.CONVERT_FRAME_LOGGER).warning("an unrelated convert_frame message")
    assert seen == {
        "recompile": ["Recompiling function forward"],
        "limit": ["torch._dynamo hit config.recompile_limit (8)"],
    }
    tc.remove_recompile_log_tap(tap)
    assert _logging_state() == before
    tc.remove_recompile_log_tap(tap)  # a second removal changes nothing
    assert _logging_state() == before
    logging.getLogger(tc.RECOMPILES_LOGGER).debug("after removal")
    assert len(seen["recompile"]) == 1


def test_log_tap_keeps_the_users_other_settings(default_torch_logging) -> None:
    from torch._logging import _internal as tlog

    torch._logging.set_logs(dynamo=logging.INFO)  # a user's own setting, not the default
    before = _logging_state()
    tap = tc.install_recompile_log_tap(lambda m: None, lambda m: None)
    try:
        assert tap.changed_state and "recompiles" in tlog.log_state.artifact_names
        assert tlog.log_state.log_qname_to_level == before[0]  # the user's level is kept
    finally:
        tc.remove_recompile_log_tap(tap)
    assert _logging_state() == before


def test_log_tap_respects_torch_logs(default_torch_logging, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_LOGS", "+dynamo")  # torch ignores set_logs then: the tap must not touch the state
    before = _logging_state()
    tap = tc.install_recompile_log_tap(lambda m: None, lambda m: None)
    try:
        assert not tap.changed_state and "NOT captured" in tap.note
        assert logging.getLogger(tc.RECOMPILES_LOGGER).propagate is False
    finally:
        tc.remove_recompile_log_tap(tap)
    assert _logging_state() == before


def test_a_failing_callback_is_reported_not_raised(default_torch_logging, capsys) -> None:
    def broken(message: str) -> None:
        raise ValueError("callback bug")

    tap = tc.install_recompile_log_tap(broken, broken)
    try:
        logging.getLogger(tc.RECOMPILES_LOGGER).debug("Recompiling function forward")
    finally:
        tc.remove_recompile_log_tap(tap)
    assert "callback bug" in capsys.readouterr().err  # logging's handleError prints the traceback


def test_compile_events_count_each_compiled_frame_and_unregister() -> None:
    """One callback per frame Dynamo compiles (a recompile for a new shape is another); none after the block."""
    import torch

    from steadfast.core import torch_compat

    seen: list[int] = []

    def f(x):
        return torch.sin(x) + 1

    compiled = torch.compile(f, backend="eager", dynamic=False)
    with torch_compat.compile_events(lambda: seen.append(1)):
        compiled(torch.ones(3))
        compiled(torch.ones(3))  # cached: no compile
        compiled(torch.ones(2, 2))  # another shape: a recompile
    assert len(seen) == 2
    compiled(torch.ones(5))  # compiles again, but the callback is gone
    assert len(seen) == 2


def test_compile_events_report_each_phase_and_unpatch() -> None:
    """``on_phase`` hears the phases each compile starts, in order (an eager backend: Dynamo's trace, the backend,
    the guards); blocks nest; after the last one the event logger is as before and nothing more is heard."""
    import torch
    from torch._dynamo.utils import get_chromium_event_logger

    from steadfast.core import torch_compat

    logger = get_chromium_event_logger()
    before = dict(logger.__dict__)
    phases: list[str] = []
    inner: list[str] = []
    compiled = torch.compile(lambda x: torch.cos(x) * 2, backend="eager", dynamic=False)
    with torch_compat.compile_events(lambda: phases.append("done"), phases.append):
        compiled(torch.ones(3))
        with torch_compat.compile_events(lambda: None, inner.append):
            compiled(torch.ones(4))
        compiled(torch.ones(3))  # cached: no compile
    assert phases == ["entire_frame_compile", "backend_compile", "build_guards", "done"] * 2, phases
    assert inner == ["entire_frame_compile", "backend_compile", "build_guards"], inner
    assert set(phases) <= {*torch_compat.COMPILE_PHASES, "done"}
    assert logger.__dict__ == before
    compiled(torch.ones(6))
    assert len(phases) == 8


_ISA_CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from _steadfast_import import import_steadfast
import_steadfast()
import steadfast.core.torch_compat as tc
import torch._inductor.config as config
from torch._inductor import cpu_vec_isa
t0 = time.perf_counter()
load_before = cpu_vec_isa.VecISA._avx_py_load
with tc.trusted_cpu_isa():
    trusted = config.cpp.vec_isa_ok
    with tc.fast_isa_probe_child() as fast:  # nested: reports the outer block's patch
        child = cpu_vec_isa.VecISA._avx_py_load
    isas = [str(i) for i in cpu_vec_isa.valid_vec_isa_list()]
    pick = str(cpu_vec_isa.pick_vec_isa())
seconds = time.perf_counter() - t0
import hashlib, torch
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(4, 32, 3, padding=1), torch.nn.GroupNorm(8, 32), torch.nn.SiLU(),
                          torch.nn.Conv2d(32, 4, 3, padding=1)).eval()
x = torch.randn(2, 4, 16, 16)
with tc.trusted_cpu_isa(), torch.no_grad():
    out = torch.compile(net)(x)
    eager = net(x)
print(json.dumps({"trusted": trusted, "after": config.cpp.vec_isa_ok, "fast": fast,
                  "child_imports_torch": child.strip().startswith("import torch"),
                  "restored": cpu_vec_isa.VecISA._avx_py_load is load_before,
                  "torch_probes_in_process": hasattr(cpu_vec_isa.VecISA, "_build_probe_env"),
                  "isas": isas, "pick": pick, "seconds": seconds,
                  "out": hashlib.sha256(out.numpy().tobytes()).hexdigest(), "depends_on_input": not torch.equal(
                      out[0], out[1]), "close_to_eager": torch.allclose(out, eager, atol=1e-4)}))
"""


def _isa_child(tmp_path: Path, probe: bool) -> dict:
    import json
    import os
    import subprocess

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / ("probe" if probe else "trust"))}
    env.pop(tc.PROBE_CPU_ISA_ENV, None)
    if probe:
        env[tc.PROBE_CPU_ISA_ENV] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _ISA_CHILD, str(ROOT / "scripts")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.torch_version  # torch 2.11 and 2.14 probe differently
def test_trusted_cpu_isa_gives_the_probed_isa_list_without_building(tmp_path: Path) -> None:
    """Fresh processes, empty cache folders: trusting the CPU's flags picks the ISA inductor's probes pick."""
    trusted, probed = _isa_child(tmp_path, probe=False), _isa_child(tmp_path, probe=True)
    assert trusted["trusted"] is True and trusted["after"] is None  # scoped: torch's default (None) after
    assert probed["trusted"] is None  # STEADFAST_PROBE_CPU_ISA=1: inductor probes as by default
    # torch 2.11's probe child imports torch (2.2 s each); the pack's child does not, and is gone after the block
    assert not trusted["child_imports_torch"] and trusted["restored"] and probed["restored"]
    assert probed["fast"] is (not probed["torch_probes_in_process"] and sys.platform == "linux")
    assert trusted["isas"] == probed["isas"] and trusted["pick"] == probed["pick"]
    # the same generated code: a compiled conv/norm net gives the same bytes either way (and is a real computation)
    assert trusted["out"] == probed["out"] and trusted["depends_on_input"] and trusted["close_to_eager"]
    # the base probe of every ISA is skipped; inductor still builds its sub-feature probes (VNNI, BF16, AMX)
    built = {k: len(list((tmp_path / k).rglob("*.so"))) for k in ("trust", "probe")}
    if len(probed["isas"]) > 1:
        assert built["trust"] < built["probe"], built
    print(
        f"ISA list {probed['isas']}: {built} test programs built, {trusted['seconds']:.1f} s vs "
        f"{probed['seconds']:.1f} s"
    )


def test_orig_module_unwraps_only_a_compiled_module() -> None:
    m = torch.nn.Linear(2, 2)
    compiled = torch.compile(m, backend="eager")  # lazy: nothing is compiled here
    assert tc.orig_module(compiled) is m and tc.orig_module(m) is m and tc.orig_module(None) is None


def test_compiled_call_of_an_in_place_compile_and_its_replacement(monkeypatch) -> None:
    m = torch.nn.Linear(2, 2)
    assert tc.has_compiled_call() and tc.compiled_call(m) is None  # not compiled in place
    m.compile(backend="eager")
    compiled = tc.compiled_call(m)
    assert callable(compiled)
    calls = []

    def call(*args, **kwargs):
        calls.append(args[0].shape)
        return compiled(*args, **kwargs)

    tc.set_compiled_call(m, call)
    assert tc.compiled_call(m) is call
    x = torch.ones(1, 2)
    assert torch.equal(m(x), torch.nn.functional.linear(x, m.weight, m.bias)) and calls == [(1, 2)]
    monkeypatch.delattr(torch.nn.Module, "_compiled_call_impl")
    assert tc.has_compiled_call() is False
    with pytest.raises(tc.TorchAPIMissing, match=r"needs torch\.nn\.Module\._compiled_call_impl, which torch 2\.\d+"):
        tc.set_compiled_call(torch.nn.Linear(2, 2), call)


_HEADER_CHILD = r"""
import contextlib, hashlib, json, os, sys
sys.path.insert(0, sys.argv[1])
from _steadfast_import import import_steadfast
import_steadfast()
import steadfast.core.torch_compat as tc
import torch
from torch._inductor import codecache
calls = []
plain = tc.inductor._plain_header
def counting(header, cmd, **kw):
    calls.append(header)
    return plain(header, cmd, **kw)
tc.inductor._plain_header = counting  # built_kernel_loads installs whatever the module holds at entry
original = codecache._precompile_header
# where torch's own path writes its .gch (a folder of this test's, so that a new one can be seen)
codecache._HEADER_DIR = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "probe_headers")
codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1), torch.nn.GroupNorm(4, 16), torch.nn.SiLU(),
                          torch.nn.Conv2d(16, 4, 3, padding=1)).eval()
x = torch.randn(2, 4, 8, 8)
with tc.trusted_cpu_isa(), torch.no_grad(), (tc.built_kernel_loads() if sys.argv[2] == "plain"
                                             else contextlib.nullcontext(False)) as patched:
    inside = codecache._precompile_header is counting
    with tc.built_kernel_loads() as nested:  # nested blocks: the outer one's patch stays
        pass
    still = codecache._precompile_header is counting
    out = torch.compile(net)(x)
    eager = net(x)
headers = sorted(os.listdir(tc.inductor._plain_header_dir())) if os.path.isdir(tc.inductor._plain_header_dir()) else []
from pathlib import Path
gch = sorted(str(p) for p in Path(codecache._HEADER_DIR).rglob("*.gch"))
print(json.dumps({"patched": patched, "inside": inside, "nested": nested, "still": still,
                  "restored": codecache._precompile_header is original, "calls": len(calls),
                  "stray": [h for h in headers if not h.endswith(".h")], "gch": gch,
                  "out": hashlib.sha256(out.numpy().tobytes()).hexdigest(),
                  "depends_on_input": not torch.equal(out[0], out[1]),
                  "close_to_eager": torch.allclose(out, eager, atol=1e-4)}))
"""


def _header_child(cache: Path, mode: str) -> dict:
    import json
    import os
    import subprocess

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", _HEADER_CHILD, str(ROOT / "scripts"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.torch_version  # the patch point must exist on both rows' torch
def test_built_kernel_loads_skip_the_header_and_give_the_same_bytes(tmp_path: Path) -> None:
    """Inductor's precompiled header vs the pack's plain one: a compile into an empty cache (the kernel library is
    built with ``-include`` of the plain header), then a load of the built library in a fresh process, give the
    bytes of torch's own path, and the stand-in really ran (the patch point exists in this torch)."""
    torch_path = _header_child(tmp_path / "pch", "pch")
    built = _header_child(tmp_path / "plain", "plain")  # nothing built yet: compiles without the .gch
    loaded = _header_child(tmp_path / "plain", "plain")  # a fresh process, the library built: a load
    assert torch_path["patched"] is False and torch_path["calls"] == 0
    assert torch_path["gch"], "torch's own path built no .gch in the cache: the check below would prove nothing"
    for r in (built, loaded):
        assert r["patched"] and r["inside"] and r["nested"] and r["still"] and r["restored"]
        assert r["calls"] >= 1 and r["gch"] == [] and r["stray"] == []  # the stand-in never builds a .gch
        assert r["out"] == torch_path["out"]
    assert torch_path["depends_on_input"] and torch_path["close_to_eager"]


def test_a_shared_patch_applies_once_and_undoes_at_the_last_exit() -> None:
    import threading

    calls: list[str] = []

    def apply():
        calls.append("apply")
        return lambda: calls.append("undo")

    patch = tc.base._SharedPatch()
    with patch.hold(apply) as outer:
        with patch.hold(apply) as inner:  # nested: the outer entry's patch
            pass
        entered, leave = threading.Event(), threading.Event()

        def other() -> None:  # another thread overlapping the block
            with patch.hold(apply):
                entered.set()
                leave.wait(10)

        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(10)
    assert calls == ["apply"] and outer and inner  # the other thread still holds it
    leave.set()
    t.join(10)
    assert calls == ["apply", "undo"]
    with pytest.raises(RuntimeError), patch.hold(apply):  # an error inside still undoes
        raise RuntimeError("x")
    assert calls == ["apply", "undo", "apply", "undo"]
    with patch.hold(lambda: None) as held:  # a patch that did not apply: nothing to undo
        assert held is False
    assert calls[-1] == "undo" and len(calls) == 4
