"""The bytes every Spark defrag test writes: a function of (segment, offset) only, so
that any process (the test, the live writer child) can tell what a segment of a given
length must hold. No test dependency here: the child imports it as a plain module."""

from __future__ import annotations

import random

PIECE_BYTES_MIN, PIECE_BYTES_MAX = 40, 400


def piece(segment: str, offset: int) -> bytes:
    """The bytes of the write that starts at ``offset`` of ``segment``."""
    rng = random.Random(f"{segment}@{offset}")
    return rng.randbytes(rng.randint(PIECE_BYTES_MIN, PIECE_BYTES_MAX))


def expected(segment: str, length: int) -> bytes:
    """What ``segment`` holds from offset 0 when its writes (all ``piece``) reach ``length``."""
    data = bytearray()
    while len(data) < length:
        data += piece(segment, len(data))
    assert len(data) == length, f"{segment}: {length} is not the end of a write"
    return bytes(data)
