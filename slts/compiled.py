"""Where a compiled twin is loaded (docs/architecture.md, "Compiled accelerators").

``twin(module)`` imports the optional C extension ``module`` and returns it, or None where
it was not built (no C compiler at install) or ``SLTS_PURE_PYTHON=1`` asks for the
pure-Python reference everywhere (how the tests compare the two).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def twin(module: str) -> ModuleType | None:
    """The compiled module ``module`` (a dotted name), or None (module doc)."""
    if os.environ.get("SLTS_PURE_PYTHON") == "1":
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
