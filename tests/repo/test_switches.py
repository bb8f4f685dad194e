"""Every ``STEADFAST_*`` environment switch is declared once, in core/switches.py (issue 45 item 7): no name used in
the repository without a declaration, no declaration used nowhere, no pack module reading one by its spelled name,
and docs/architecture.md's table generated from the declarations."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"STEADFAST_[A-Z0-9_]*[A-Z0-9]")


def _switches():
    spec = importlib.util.spec_from_file_location("steadfast_switches_under_test", ROOT / "core" / "switches.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)  # standard library only: loaded by path, as a fresh checkout has it
    return module


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    return [ROOT / f for f in out.stdout.split() if (ROOT / f).is_file()]


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def test_every_name_used_is_declared_and_every_declared_one_is_used() -> None:
    sw = _switches()
    declared = {s.name for s in sw.SWITCHES}
    assert len(declared) == len(sw.SWITCHES), "a switch is declared twice"
    home = ROOT / "core" / "switches.py"
    used: dict[str, set[str]] = {}
    for path in _tracked():
        text = _text(path)
        if text is None or path == home:
            continue
        for name in NAME.findall(text):
            used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert used, "no STEADFAST_ name found: the scan reads nothing"
    undeclared = {n: sorted(f)[:3] for n, f in used.items() if n not in declared}
    assert not undeclared, f"declare these in core/switches.py: {undeclared}"
    unused = sorted(declared - set(used))
    assert not unused, f"declared in core/switches.py and used nowhere: {unused}"


def test_pack_modules_read_switches_through_core_switches() -> None:
    """A module of the shipped tree that imports the package (a relative import) reads a switch through
    ``core.switches``; a name spelled as a whole string there is a second declaration. Modules loaded on their own
    (no relative import: ``headless/comfy_server.py``, ``headless/tiny_sd15.py``) cannot import it and may spell the
    names they read, which the test above still requires to be declared."""
    spelled = []
    for path in _tracked():
        rel = path.relative_to(ROOT)
        if path.suffix != ".py" or rel.parts[0] not in ("core", "nodes", "headless"):
            continue
        if rel == Path("core/switches.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.ImportFrom) and n.level > 0 for n in ast.walk(tree)):
            continue
        spelled += [
            f"{rel}:{n.lineno} {n.value}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value)
        ]
    assert not spelled, f"read these through core.switches: {spelled}"


def test_the_architecture_table_is_generated_from_the_declarations() -> None:
    table = _switches().markdown_table()
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert table in doc, "docs/architecture.md's switch table is stale: paste core.switches.markdown_table()"


def test_a_switch_reads_on_off_and_unset() -> None:
    sw = _switches()
    s = sw.PRECOMPILED
    assert s.on({s.name: " Yes "}) and not s.off({s.name: "yes"})
    assert s.off({s.name: "0"}) and not s.on({s.name: "0"})
    assert not s.on({}) and not s.off({}) and s.text({}) == ""
