"""What the Comfy registry's tools check, kept honest here: LICENSE + pyproject fields, no exec/eval anywhere in
the tree (`comfy node validate`, ruff S102/S307), the JS extension namespaced, what `comfy node pack` ships."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _tracked(pattern: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]


def test_license_and_registry_fields() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert meta["project"]["license"] == {"file": "LICENSE"}
    comfy = meta["tool"]["comfy"]
    assert re.fullmatch(r">=\d+\.\d+\.\d+", comfy["requires-comfyui"])
    assert comfy["Icon"].endswith("docs/icon.svg") and (ROOT / "docs" / "icon.svg").is_file()
    classifiers = meta["project"]["classifiers"]
    assert any(c.startswith("Operating System :: ") for c in classifiers)
    assert any(c.startswith("Environment :: GPU :: ") for c in classifiers)


def test_no_exec_or_eval_anywhere() -> None:
    files = _tracked("*.py") or sorted(ROOT.rglob("*.py"))
    offenders = []
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval"):
                offenders.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.func.id}")
    assert len(files) > 30 and offenders == []


def test_js_extensions_are_namespaced() -> None:
    names = re.findall(r"registerExtension\(\{\s*name:\s*\"([^\"]+)\"", (ROOT / "js" / "steadfast.js").read_text())
    assert names and all(n.startswith("comfyui-steadfast.") for n in names)


def test_comfyignore_leaves_out_tests_benchmarks_scripts() -> None:
    ignored = (ROOT / ".comfyignore").read_text().split()
    for folder in ("tests/", "benchmarks/", "scripts/", ".ci/"):
        assert folder in ignored
