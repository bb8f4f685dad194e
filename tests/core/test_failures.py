"""core/failures.py and its users: interrupts and out-of-memory errors reach ComfyUI unchanged.

The pipeline loader used to rewrap any ``pipe.to(device)`` failure, CUDA OOM included, as ``PipelineLoadError``
(so ComfyUI's OOM handling, unload all models + the tip, never ran), and the compile registry recorded an
interrupt as an error of the compiled model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_modules import Tiny, block_paths

from steadfast.core import failures
from steadfast.core.compile.options import CompileOptions
from steadfast.core.compile.swap import swap_in
from steadfast.core.pipelines import load

COMFY_MM = "comfy.model_management"


def _comfy_interrupt(base: type[BaseException]) -> BaseException:
    """An exception like ComfyUI's ``InterruptProcessingException`` (BaseException in 0.33, Exception in 0.8.0),
    under its module name; core never imports ComfyUI."""
    cls = type("InterruptProcessingException", (base,), {"__module__": COMFY_MM})
    return cls()


def _failures() -> dict[str, BaseException]:
    return {
        "oom": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        "keyboard": KeyboardInterrupt(),
        "comfy_interrupt_033": _comfy_interrupt(BaseException),
        "comfy_interrupt_080": _comfy_interrupt(Exception),
        "accelerator_oom": RuntimeError("CUDA error: out of memory"),
    }


def test_the_classification() -> None:
    f = _failures()
    assert failures.is_oom(f["oom"]) and failures.is_oom(f["accelerator_oom"])
    assert all(failures.is_interrupt(f[k]) for k in ("keyboard", "comfy_interrupt_033", "comfy_interrupt_080"))
    assert all(failures.passes_through(e) for e in f.values())
    for other in (ValueError("bad"), RuntimeError("shape mismatch"), OSError("no such file")):
        assert not failures.passes_through(other), other
    assert not failures.is_interrupt(torch.OutOfMemoryError("x"))


@pytest.fixture
def pipeline_folder(tmp_path: Path) -> Path:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "FakePipeline"}), encoding="utf-8")
    return tmp_path


class _FakePipe:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def to(self, device):
        raise self.exc


@pytest.mark.parametrize("name", list(_failures()))
def test_loader_lets_oom_and_interrupts_through(monkeypatch, pipeline_folder: Path, name: str) -> None:
    """``pipe.to(device)`` and ``from_pretrained`` failing with OOM or an interrupt: the same object comes out."""
    import diffusers

    exc = _failures()[name]
    monkeypatch.setattr(diffusers.DiffusionPipeline, "from_pretrained", lambda *a, **k: _FakePipe(exc))
    with pytest.raises(BaseException) as info:
        load.load_pipeline(pipeline_folder, device="cuda")
    assert info.value is exc and not isinstance(info.value, load.PipelineLoadError)

    def failing(*a, **k):
        raise exc

    monkeypatch.setattr(diffusers.DiffusionPipeline, "from_pretrained", failing)
    with pytest.raises(BaseException) as info:
        load.load_pipeline(pipeline_folder)
    assert info.value is exc


def test_loader_still_wraps_other_failures(monkeypatch, pipeline_folder: Path) -> None:
    import diffusers

    monkeypatch.setattr(
        diffusers.DiffusionPipeline,
        "from_pretrained",
        lambda *a, **k: _FakePipe(RuntimeError("Torch not compiled with CUDA enabled")),
    )
    with pytest.raises(load.PipelineLoadError, match="cannot move the pipeline to 'cuda'.*CUDA enabled"):
        load.load_pipeline(pipeline_folder, device="cuda")


class _Raising(torch.nn.Module):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def forward(self, x):
        raise self.exc


@pytest.mark.parametrize("name", list(_failures()))
def test_registry_reraises_unchanged_and_records_no_interrupt(reg, name: str) -> None:
    """An interrupt inside a tracked call is re-raised as is and not kept in ``stats.errors``; an OOM is re-raised
    as is (it is a failure of the call, recorded as one), never turned into a FullgraphBreakError."""
    exc = _failures()[name]
    m = Tiny(n=2)
    options = CompileOptions(backend="eager", fullgraph=True)
    rec, _ = reg.get_or_create(m, options, block_paths(m))
    with pytest.raises(BaseException) as info:
        with reg.track(rec, shape=(1, 4, 8)), swap_in(m, rec.compiled):
            _Raising(exc)(torch.zeros(1))
    assert info.value is exc
    if failures.is_interrupt(exc):
        assert rec.stats.errors == [], rec.stats.errors
    else:
        assert len(rec.stats.errors) == 1 and "out of memory" in rec.stats.errors[0]["error"].lower()
    assert rec.stats.status == "cold"  # an interrupted first call does not make the record warm


def test_registry_still_records_an_error(reg) -> None:
    m = Tiny(n=2)
    rec, _ = reg.get_or_create(m, CompileOptions(backend="eager"), block_paths(m))
    with pytest.raises(ValueError):
        with reg.track(rec, shape=(1, 4, 8)):
            raise ValueError("bad input")
    assert rec.stats.errors and "ValueError: bad input" in rec.stats.errors[0]["error"]
