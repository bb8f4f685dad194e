"""The GPU protocol's ``pytest_gpu`` section runs the files listed in ``GPU_TEST_FILES``: every file holding a
``@pytest.mark.gpu`` test must be listed there, or its tests would never run on a lent GPU."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _listed() -> list[str]:
    tree = ast.parse((ROOT / "benchmarks" / "gpu_protocol.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "GPU_TEST_FILES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("benchmarks/gpu_protocol.py defines no GPU_TEST_FILES")


def test_every_gpu_marked_test_file_is_run_by_the_protocol():
    marked = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in p.read_text(encoding="utf-8") and p.name != Path(__file__).name
    )
    assert marked, "no @pytest.mark.gpu test found: the protocol's pytest_gpu section would run nothing"
    assert sorted(_listed()) == marked
