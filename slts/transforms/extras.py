"""The optional libraries the transforms need, imported on first use: without them the
rest of SLTS works, and asking for a transform is a typed error that names the extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from slts.errors import InvalidConfig

EXTRA = "transforms"


def require(module: str) -> ModuleType:
    """``module`` imported, or ``InvalidConfig`` naming the pip extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InvalidConfig(
            f"client-side compression and encryption need {module.split('.')[0]!r}"
            f" (pip install 'slts[{EXTRA}]'): {exc}"
        ) from exc
