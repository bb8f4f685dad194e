"""The README's Quick start names the file a newcomer drags into the canvas: each template's UI workflow (in
``example_workflows/``), never its API twin (``example_workflows/api/``), which dragged into the canvas gives the
samplers ``control after generate: randomize`` and turns the determinism check's second Run red (issue 46)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _quick_start_bullets() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("- **")]


def test_quick_start_names_every_ui_template_and_no_api_twin() -> None:
    bullets = _quick_start_bullets()
    assert bullets, "no template bullets found in the README's Quick start"
    named = []
    for line in bullets:
        files = re.findall(r"\(`([^`]+\.json)`\)", line)
        assert len(files) == 1, f"a Quick start bullet names no single template file: {line}"
        assert "api/" not in files[0], f"the Quick start names an API twin to drag: {line}"
        named.append(files[0])
    for name in named:
        wf = json.loads((ROOT / "example_workflows" / name).read_text(encoding="utf-8"))
        assert "nodes" in wf and "links" in wf, f"{name} is not a UI workflow (the file a user drags)"
    templates = sorted(p.name for p in (ROOT / "example_workflows").glob("*.json"))
    assert sorted(named) == templates
