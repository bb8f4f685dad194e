"""Each core package's face (its ``__init__``) hands on names that exist, lazily: importing the pack (whose
``__init__`` imports ``core.determinism.cublas`` and ``.portable``) loads no other module of those packages."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["steadfast.core.determinism", "steadfast.core.compile", "steadfast.core.record"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_face_name_resolves_and_unknown_names_fail(package: str) -> None:
    pkg = importlib.import_module(package)
    assert pkg.__all__, f"{package} hands on no names"
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None, f"{package}.{name}"
    with pytest.raises(AttributeError, match="no attribute"):
        pkg.not_a_name_of_this_package  # noqa: B018


def test_faces_load_nothing_until_a_name_is_used() -> None:
    code = (
        "import sys; sys.path.insert(0, 'scripts'); from _steadfast_import import import_steadfast; "
        "import_steadfast(); import steadfast.core.determinism, steadfast.core.compile, steadfast.core.record; "
        "print(sorted(m for m in sys.modules if m.startswith('steadfast.core.') and m.count('.') == 3)); "
        "steadfast.core.determinism.seeded_noise; print('steadfast.core.determinism.noise' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded, after = out.stdout.strip().splitlines()
    assert loaded == str(["steadfast.core.determinism.cublas", "steadfast.core.determinism.portable"]), out.stdout
    assert after == "True", "using a face name imports its module"
