"""The pack's version: the one source in code. Read downward only (the pack's root, ``nodes``, ``core``).

``pyproject.toml`` repeats it as ``[project] version``, because the Comfy Registry reads that field statically;
``tests/repo`` holds the two equal.
"""

from __future__ import annotations

__version__ = "0.1.0"
