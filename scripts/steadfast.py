"""Run the ``steadfast`` command from a checkout: ``python scripts/steadfast.py verify --tiny sd`` or
``... run WORKFLOW``.

Registers the repository root as the package ``steadfast`` (:mod:`_steadfast_import`) and calls
``steadfast.headless.cli.main`` (``run`` and ``verify``); installed packs get the ``steadfast`` console script instead.
"""

from __future__ import annotations

import sys

from _steadfast_import import import_steadfast  # scripts/ is sys.path[0] when this file runs

if __name__ == "__main__":
    import_steadfast()
    from steadfast.headless.cli import main

    sys.exit(main())
