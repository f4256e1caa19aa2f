"""SLTS: long-term (tier-2) storage for stream engines.

Public names are loaded lazily (PEP 562) so that importing ``slts.bindings`` or
``slts.journal`` never drags in the engine, and the layers stay acyclic:
foundations (errors, config, records) -> bindings, journal -> engine -> tools.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "open": ("slts.storage.factory", "open"),
    "SegmentHandle": ("slts.storage.types", "SegmentHandle"),
    "ChunkedSegmentStorage": ("slts.storage.chunked", "ChunkedSegmentStorage"),
    "StorageConfig": ("slts.config", "StorageConfig"),
    "SegmentInfo": ("slts.storage.types", "SegmentInfo"),
}

__all__ = [
    "ChunkedSegmentStorage",
    "SegmentHandle",
    "SegmentInfo",
    "StorageConfig",
    "__version__",
    "open",
]
assert sorted(__all__) == sorted([*_LAZY, "__version__"]), "__all__ names every lazy attribute"


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'slts' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value
