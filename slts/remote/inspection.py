"""Checks of a local segment's files before they are copied (placeholder: see rsm)."""

from __future__ import annotations

import os

from slts.remote.rsm import InspectedLog, LogSegmentData, RemoteStorageManager

__all__ = ["InspectedLog", "inspect_segment"]


def inspect_segment(data: LogSegmentData, *, label: str, size_bytes: int | None = None) -> InspectedLog:
    """Check every file of ``data``; see ``RemoteStorageManager.inspect``."""
    del size_bytes
    return RemoteStorageManager.inspect(None, data, label=label or os.fspath(data.log))  # type: ignore[arg-type]
