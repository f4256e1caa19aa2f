"""The unique part of every chunk name, shared by segment chunks and system-segment chunks.

A chunk name ends in ``E<epoch>.O<offset>.<random>``: the epoch of the instance that
created it, the segment offset where it starts and 128 random bits (``uuid4``), so a
name is never made twice and never reused (DESIGN.md §5 invariant 3).
"""

from __future__ import annotations

import re
import uuid

_LEAF = re.compile(r"E(?P<epoch>[0-9]+)\.O(?P<offset>[0-9]+)\.[0-9a-f]{32}")


def chunk_leaf(epoch: int, offset: int) -> str:
    """A new unique last name part for a chunk made by ``epoch`` starting at ``offset``."""
    assert epoch >= 1 and offset >= 0, (epoch, offset)
    return f"E{epoch}.O{offset}.{uuid.uuid4().hex}"


def leaf_epoch(name: str) -> int | None:
    """The epoch in a chunk name whose last part ``chunk_leaf`` made, or None for other names."""
    match = _LEAF.fullmatch(name.rsplit("/", 1)[-1])
    return int(match["epoch"]) if match else None
