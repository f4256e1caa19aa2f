"""A streaming block being filled: one ledger's consecutive entries, framed as they are
offered, so that the writer of a segment has no work per entry left.

Why framed on offer: the offering thread and the segment's writer thread share one
interpreter; every step the writer takes per entry (taking it out of a buffer, framing it)
holds the interpreter lock the offers need, and stretches both. Framed on offer, a block
costs its writer one ``join`` (in C), one SLTS write and one commit.

A block begins with an entry (whatever its size) and takes the next ones while they fit
in ``block_bytes`` of header and frames; it is written padded with the fill pattern to at
least ``block_bytes`` (``formats.streaming_block_size``).
"""

from __future__ import annotations

from slts.offload import formats

_FRAME = formats.ENTRY_HEADER.pack  # (payload length, entry id): no checks, this runs per entry


class PendingBlock:
    """Entries ``first..last`` of ledger ``ledger_id``, framed (``pieces``); ``used``:
    header and frames so far, ``payload``: their payloads' bytes."""

    __slots__ = ("count", "first", "last", "ledger_id", "payload", "pieces", "used")

    def __init__(self, ledger_id: int, first: int, data: bytes) -> None:
        """A block beginning with entry ``first`` of ``ledger_id`` (a first entry always fits)."""
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

    def encode(self, block_bytes: int) -> tuple[formats.StreamingBlockHeader, bytes]:
        """The block's header and bytes: header, frames, the fill pattern up to its size."""
        size = formats.streaming_block_size(block_bytes, self.count, self.payload)
        header = formats.StreamingBlockHeader(size, self.first, self.ledger_id)
        assert self.used == formats.HEADER_SIZE + formats.ENTRY_HEADER_SIZE * self.count + self.payload
        return header, b"".join([header.encode(), *self.pieces, formats.padding(size - self.used)])
