"""A streaming block being filled: one ledger's consecutive entries, framed as they are
offered, so that the writer of a segment has no work per entry left.

Why framed on offer: the offering thread and the segment's writer thread share one
interpreter; every step the writer takes per entry (taking it out of a buffer, framing it)
holds the interpreter lock the offers need, and stretches both. Framed on offer, a block
costs its writer one SLTS write and one commit.

A block begins with an entry (whatever its size) and takes the next ones while they fit
in ``block_bytes`` of header and frames; it is written padded with the fill pattern to at
least ``block_bytes`` (``formats.streaming_block_size``).

Two implementations, one behaviour: ``PendingBlock`` here (the reference: the frames kept
as pieces, joined once when the block is written) and the compiled ``Block`` of
``slts.offload._framing`` (each frame copied at once into the bytes object that is
written: no per-entry Python work, no join), which ``new_block`` picks where it is built
(``framing.NATIVE``).
"""

from __future__ import annotations

from typing import Protocol

from slts.offload import formats, framing

_FRAME = formats.ENTRY_HEADER.pack  # (payload length, entry id): no checks, this runs per entry


class FillingBlock(Protocol):
    """What both implementations have: the block's ledger, first and last entry ids, how
    many entries and payload bytes, ``used`` (header and frames so far), ``add`` and
    ``finish``."""

    @property
    def ledger_id(self) -> int: ...
    @property
    def first(self) -> int: ...
    @property
    def last(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def payload(self) -> int: ...
    @property
    def used(self) -> int: ...
    def add(self, ledger_id: int, entry_id: int, data: bytes, block_bytes: int, /) -> bool: ...
    def finish(self, header: bytes, fill: bytes, /) -> bytes: ...


class PendingBlock:
    """Entries ``first..last`` of ledger ``ledger_id``, framed (``pieces``); ``used``:
    header and frames so far, ``payload``: their payloads' bytes."""

    __slots__ = ("count", "first", "last", "ledger_id", "payload", "pieces", "used")

    def __init__(self, ledger_id: int, first: int, data: bytes, block_bytes: int) -> None:
        """A block beginning with entry ``first`` of ``ledger_id`` (a first entry always
        fits; ``block_bytes`` is what the compiled twin reserves)."""
        self.ledger_id = ledger_id
        self.first = first
        self.last = first
        self.count = 1
        self.payload = len(data)
        self.used = formats.HEADER_SIZE + formats.ENTRY_HEADER_SIZE + len(data)
        self.pieces: list[bytes] = [_FRAME(len(data), first), data]

    def add(self, ledger_id: int, entry_id: int, data: bytes, block_bytes: int) -> bool:
        """Frame the entry into the block if it belongs here: the next of the block's
        ledger, with room for it. Returns whether it was taken."""
        size = len(data)
        used = self.used + formats.ENTRY_HEADER_SIZE + size
        if ledger_id != self.ledger_id or entry_id != self.last + 1 or used > block_bytes:
            return False
        self.pieces += (_FRAME(size, entry_id), data)
        self.used = used
        self.payload += size
        self.count += 1
        self.last = entry_id
        return True

    def finish(self, header: bytes, fill: bytes) -> bytes:
        """The block's bytes: ``header`` (128 bytes), the frames, ``fill``."""
        assert len(header) == formats.HEADER_SIZE, len(header)
        return b"".join([header, *self.pieces, fill])


def new_block(ledger_id: int, first: int, data: bytes, block_bytes: int) -> FillingBlock:
    """A block beginning with entry ``first`` of ``ledger_id``, compiled where built."""
    native = framing.NATIVE
    if native is not None:
        block: FillingBlock = native.Block(ledger_id, first, data, block_bytes)
        return block
    return PendingBlock(ledger_id, first, data, block_bytes)


def encode(block: FillingBlock, block_bytes: int) -> tuple[formats.StreamingBlockHeader, bytes]:
    """The block's header and bytes: header, frames, the fill pattern up to its size.
    The block is spent: it is written once."""
    size = formats.streaming_block_size(block_bytes, block.count, block.payload)
    header = formats.StreamingBlockHeader(size, block.first, block.ledger_id)
    assert block.used == formats.HEADER_SIZE + formats.ENTRY_HEADER_SIZE * block.count + block.payload
    data = block.finish(header.encode(), formats.padding(size - block.used))
    assert len(data) == size, (len(data), size)
    return header, data
