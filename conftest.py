"""pytest only (never imported by ComfyUI, not shipped: .comfyignore): the repository root's package set-up is
skipped.

The root has an ``__init__.py`` (it is the custom-node package), so pytest collects it as a ``Package`` and, before
the first test, imports that file to look for ``setup_module`` (it has none). A checkout named as the README clones
it, ``ComfyUI-Steadfast``, is no Python identifier: pytest then imports the file as a top-level module ``__init__``,
its relative imports fail and every test errors. The tests import the root as the package ``steadfast`` themselves
(``tests/conftest.py``). A conftest cannot change how its own folder is collected (pytest asks the parent folder's
plugins), so the root package's ``setup`` is replaced, on that one node, by a no-op.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


def _no_package_setup() -> None:
    """The root ``__init__.py`` defines no ``setup_module``/``teardown_module``: nothing to run."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for node in item.listchain():
            if isinstance(node, pytest.Package) and Path(node.path).resolve() == ROOT:
                node.setup = _no_package_setup  # this node only
                return
