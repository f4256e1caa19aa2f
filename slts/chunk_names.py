"""The unique part of every chunk name, shared by segment chunks and system-segment chunks.

A chunk name ends in ``E<epoch>.O<offset>.<random>``: the epoch of the instance that
created it, the segment offset where it starts and 128 random bits (``uuid4``), so a
name is never made twice and never reused (DESIGN.md §5 invariant 3).

``unique_source`` swaps the random part's source for the block it covers (the simulator
draws it from its seed, so a run replays with the same names); the default is ``uuid4``.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Iterator

_LEAF = re.compile(r"E(?P<epoch>[0-9]+)\.O(?P<offset>[0-9]+)\.[0-9a-f]{32}")
_HEX = re.compile(r"[0-9a-f]{32}")


def _uuid_hex() -> str:
    return uuid.uuid4().hex


_unique: Callable[[], str] = _uuid_hex


@contextlib.contextmanager
def unique_source(source: Callable[[], str]) -> Iterator[None]:
    """Inside the block, the random part of new chunk names is ``source()`` (32 lowercase
    hex digits, never repeated: the caller's promise, asserted on each use). Process-wide:
    for single-threaded, seeded runs (``slts simulate``), not for a live service."""
    global _unique  # noqa: PLW0603 - one process-wide seam, by design
    previous, _unique = _unique, source
    try:
        yield
    finally:
        _unique = previous


def unique_hex() -> str:
    """32 new hex digits from the current source (``uuid4`` unless ``unique_source``):
    the random part of chunk names, and of other names that must never repeat."""
    unique = _unique()
    assert _HEX.fullmatch(unique), unique
    return unique


def chunk_leaf(epoch: int, offset: int) -> str:
    """A new unique last name part for a chunk made by ``epoch`` starting at ``offset``."""
    assert epoch >= 1 and offset >= 0, (epoch, offset)
    return f"E{epoch}.O{offset}.{unique_hex()}"


def leaf_offset(name: str) -> int | None:
    """The start offset in a chunk name whose last part ``chunk_leaf`` made, or None."""
    match = _LEAF.fullmatch(name.rsplit("/", 1)[-1])
    return int(match["offset"]) if match else None


def leaf_epoch(name: str) -> int | None:
    """The epoch in a chunk name whose last part ``chunk_leaf`` made, or None for other names."""
    match = _LEAF.fullmatch(name.rsplit("/", 1)[-1])
    return int(match["epoch"]) if match else None
