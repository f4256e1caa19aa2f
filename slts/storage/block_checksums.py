"""Checksums of a chunk's blocks, so that every read can verify the bytes it returns.

A chunk record's ``checksum`` covers the whole chunk: only a read of the whole chunk
can check it. So a chunk also keeps the CRC32C of each of its *blocks* (as HDFS keeps one
per 512 bytes), in ``ChunkRecord.blocks``: packed big-endian ``(length u32, crc u32)``
pairs, in order, their lengths summing to the chunk's length. A read of any range reads
the blocks it touches whole, checks each, and returns its range.

Blocks are *extents*, not a fixed grid, which is what keeps the list cheap to maintain:

* a write cuts its bytes into blocks of ``block_bytes`` (``checksum_block_bytes``,
  64 KiB by default); an append first fills the chunk's last block up to
  ``block_bytes`` by continuing its CRC (no byte is read back), then cuts new blocks;
* a chunk built by concatenating others (defrag, natively on the server or by copy)
  gets its sources' lists one after the other: no byte is read back either.

So a block is at most ``block_bytes`` long and a read reads at most two partial blocks
more than it returns. Cost: 8 bytes of record per block (1,024 blocks, 8 KiB, for a
64 MiB chunk). Chunks written before blocks were kept (``blocks`` None) are verified as
before: by a read that covers them whole.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import struct
import sys
from array import array

import crc32c

from slts.errors import ChunkCorrupted

_PAIR = struct.Struct(">II")
PAIR_BYTES = _PAIR.size
#: Largest block: a block's length is a u32.
BLOCK_BYTES_MAX = (1 << 32) - 1


def compute(data: bytes | memoryview, block_bytes: int) -> bytes:
    """The block list of ``data`` cut into blocks of ``block_bytes``."""
    assert 0 < block_bytes <= BLOCK_BYTES_MAX, block_bytes
    view = memoryview(data)
    return b"".join(
        _PAIR.pack(len(piece), crc32c.crc32c(piece))
        for piece in (view[start : start + block_bytes] for start in range(0, len(view), block_bytes))
    )


def extend(blocks: bytes, appended: bytes, block_bytes: int) -> bytes:
    """The block list after ``appended`` is written at the end of a chunk whose list is
    ``blocks``: the last block grows up to ``block_bytes`` (its CRC continued), the rest
    is cut into new blocks."""
    if not appended:
        return blocks
    if blocks:
        length, crc = _PAIR.unpack_from(blocks, len(blocks) - PAIR_BYTES)
        room = block_bytes - length
        if room > 0:
            head = appended[:room]
            blocks = blocks[:-PAIR_BYTES] + _PAIR.pack(length + len(head), crc32c.crc32c(head, crc))
            appended = appended[len(head) :]
    return blocks + compute(appended, block_bytes)


def total_length(blocks: bytes) -> int:
    """The chunk length a block list covers."""
    return _ends(blocks)[-1] if blocks else 0


def check_list(blocks: object) -> bool:
    """Is ``blocks`` a well-formed block list (for record checks)?"""
    return isinstance(blocks, bytes) and len(blocks) % PAIR_BYTES == 0


@functools.lru_cache(maxsize=4096)
def _ends(blocks: bytes) -> tuple[int, ...]:
    """Each block's end offset in the chunk (bytes objects cache their hash: cheap to look up)."""
    lengths = [length for length, _ in _PAIR.iter_unpack(blocks)]
    return tuple(itertools.accumulate(lengths))


def covering(blocks: bytes, offset: int, length: int) -> tuple[int, int, int, int]:
    """(first block, end block, chunk offset of the first, chunk offset of the end) of
    the blocks that hold ``[offset, offset + length)``; ``length`` > 0."""
    ends = _ends(blocks)
    first = bisect.bisect_right(ends, offset)
    last = bisect.bisect_left(ends, offset + length)
    assert last < len(ends), (offset, length, ends[-1])
    return first, last + 1, ends[first - 1] if first else 0, ends[last]


def runs(blocks: bytes, first: int, end: int, run_bytes: int) -> list[tuple[int, int, int, int]]:
    """Blocks ``[first, end)`` cut into runs of consecutive blocks of at least
    ``run_bytes`` each (the last may be shorter): (first block, end block, chunk offset of
    the first, chunk offset of the end) per run, in order, together exactly the blocks."""
    assert 0 <= first < end and run_bytes > 0, (first, end, run_bytes)
    ends = _ends(blocks)
    cuts: list[tuple[int, int, int, int]] = []
    run_first, run_start = first, ends[first - 1] if first else 0
    for block in range(first, end):
        if ends[block] - run_start >= run_bytes or block == end - 1:
            cuts.append((run_first, block + 1, run_start, ends[block]))
            run_first, run_start = block + 1, ends[block]
    return cuts


def block_checksum(blocks: bytes, block: int) -> int:
    """The CRC32C the list records for block ``block``."""
    return _PAIR.unpack_from(blocks, block * PAIR_BYTES)[1]


def verify(blocks: bytes, first: int, end: int, data: bytes | memoryview, *, chunk: str, start: int) -> None:
    """Check ``data`` (the bytes of blocks ``[first, end)``, which begin at chunk offset
    ``start``) against the list. ``ChunkCorrupted`` naming the chunk and the offset of
    the first bad block. The blocks' checksums are computed and compared in C iteration
    (``map``, ``array``): no Python step per block."""
    ends = _ends(blocks)
    base = ends[first - 1] if first else 0
    one_block = end - first == 1 and ends[first] - base == len(data)  # a small read
    if one_block and crc32c.crc32c(data) == block_checksum(blocks, first):
        return
    view = memoryview(data)
    stops = list(map(operator.sub, ends[first:end], itertools.repeat(base)))
    assert stops, (first, end)
    if stops[-1] != len(view):  # the chunk is shorter than its blocks say
        raise ChunkCorrupted(
            f"chunk {chunk!r} holds {len(view)} bytes from offset {start} where its blocks hold"
            f" {stops[-1]}: its bytes are not the ones written",
            chunk=chunk,
            offset=start + min(len(view), stops[-1]),
        )
    got = array("I", map(crc32c.crc32c, map(view.__getitem__, map(slice, [0, *stops[:-1]], stops))))
    want = array("I", blocks[first * PAIR_BYTES + 4 : end * PAIR_BYTES : 1])
    if sys.byteorder == "little":
        want.byteswap()
    expected = want[::2]
    if got != expected:
        bad = next(index for index, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
        position = stops[bad - 1] if bad else 0
        raise ChunkCorrupted(
            f"chunk {chunk!r} fails the CRC32C of its block at offset {start + position} "
            f"({stops[bad] - position} bytes): its bytes are not the ones written",
            chunk=chunk,
            offset=start + position,
        )


def joined(lists: list[bytes | None]) -> bytes | None:
    """The block list of a chunk made of chunks with ``lists``, in order (None if one
    of them has none)."""
    if any(blocks is None for blocks in lists):
        return None
    return b"".join(lists)  # type: ignore[arg-type]
