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

from _thread import LockType
from collections.abc import Callable
from typing import NamedTuple, Protocol

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


class OfferLimits(NamedTuple):
    """A segment's limits, fixed while it is written: the buffer's and a block's size, the
    segment's size and ages (``assigned_s``: when it was opened, on the offloader's clock)."""

    buffer_bytes: int
    block_bytes: int
    max_segment_bytes: int
    assigned_s: float
    max_age_s: float
    min_age_s: float


#: What ``OfferBuffer.offer`` did, as bits: the entry was taken; a full block went to the
#: writer; the segment reached its size (it closes). Or, nothing taken: the buffer is full;
#: the segment is closing (or too old); the entry does not follow the last one; bad input.
#: And with an entry taken: the offering thread should pause (``PAUSE_EVERY``).
TAKEN, HANDED, ROLLOVER, FULL, CLOSED, UNORDERED, INVALID, PAUSE = 1, 2, 4, 8, 16, 32, 64, 128
#: While the writer writes (``OfferBuffer.writing``), every this many offers taken answer
#: ``PAUSE`` too: the offering thread then gives up the interpreter for a moment. The writer
#: needs it back after each of its I/O calls, and an offering thread that never waits would
#: make each of them wait out the interpreter's switch interval (5 ms). A pause costs about
#: 50 us (a zero sleep's timer slack), 256 offers about 100 us.
PAUSE_EVERY = 256
_ID_MAX = (1 << 63) - 1


class OfferBuffer:
    """The entries offered to a streaming segment that its writer has not taken yet: the
    full blocks (oldest first), the block being filled, and the counts PIP-76 keeps as
    Pulsar does (``buffered``: the payload held; ``segment_bytes``: the payload offered to
    the segment). The handle calls it under its lock; the compiled ``Offers`` of
    ``slts.offload._framing`` is its twin (``new_offer_buffer`` picks), which does an offer
    in one C call with no Python work."""

    __slots__ = (
        "_begin",
        "_filling",
        "_full",
        "_limits",
        "_taken_writing",
        "buffered",
        "closing",
        "last",
        "segment_bytes",
        "writing",
    )

    def __init__(
        self,
        begin: tuple[int, int],
        last: tuple[int, int] | None,
        segment_bytes: int,
        limits: OfferLimits,
        closing: bool,
    ) -> None:
        self._begin = begin
        self._limits = limits
        self.last = last
        self.segment_bytes = segment_bytes
        self.closing = closing
        #: The writer is writing (it sets this): see ``PAUSE_EVERY``.
        self.writing = False
        self._taken_writing = 0
        self.buffered = 0
        self._full: list[FillingBlock] = []
        self._filling: FillingBlock | None = None

    def offer(self, ledger_id: int, entry_id: int, data: bytes, now: float) -> int:
        """Take the entry if it may be taken (the bits above say what happened): ids are
        ints (not bools) in [0, 2**63-1] and ``data`` bytes of at most 2**31-1 (checked:
        other values are ``INVALID``); the segment is neither closing nor ``max_age_s``
        old at ``now``; the entry follows the last one (the next of its ledger, entry 0 of
        a later ledger, or the segment's begin first); the buffer holds less than
        ``buffer_bytes``."""
        if type(ledger_id) is not int or type(entry_id) is not int:  # (one test in the common case)
            if any(isinstance(i, bool) or not isinstance(i, int) for i in (ledger_id, entry_id)):
                return INVALID
            ledger_id, entry_id = int(ledger_id), int(entry_id)
        if (
            not (0 <= ledger_id <= _ID_MAX and 0 <= entry_id <= _ID_MAX)
            or not isinstance(data, bytes)
            or len(data) > formats.INT32_MAX
        ):
            return INVALID
        limits = self._limits
        age = now - limits.assigned_s
        if self.closing or age >= limits.max_age_s:
            return CLOSED
        last = self.last
        if not (
            (ledger_id, entry_id) == self._begin
            if last is None
            else (ledger_id == last[0] and entry_id == last[1] + 1) or (ledger_id > last[0] and entry_id == 0)
        ):
            return UNORDERED
        if self.buffered >= limits.buffer_bytes:
            return FULL
        outcome = TAKEN
        block = self._filling
        if block is None or not block.add(ledger_id, entry_id, data, limits.block_bytes):
            if block is not None:
                self._full.append(block)
                outcome |= HANDED
            self._filling = PendingBlock(ledger_id, entry_id, data, limits.block_bytes)
        size = len(data)
        self.buffered += size
        self.segment_bytes += size
        self.last = (ledger_id, entry_id)
        if self.segment_bytes >= limits.max_segment_bytes and age >= limits.min_age_s:
            outcome |= ROLLOVER
        if self.writing:
            self._taken_writing += 1
            if self._taken_writing % PAUSE_EVERY == 0:
                outcome |= PAUSE
        return outcome

    @property
    def has_full(self) -> bool:
        """Whether a full block waits for the writer."""
        return bool(self._full)

    @property
    def has_filling(self) -> bool:
        """Whether a block is being filled."""
        return self._filling is not None

    def take(self, batch_bytes: int, filling: bool) -> list[FillingBlock]:
        """The blocks for the writer's next write, in order: the full ones that fit in
        ``batch_bytes`` of header and frames (at least one), then, if ``filling`` and none
        is left full, the block being filled if it fits too."""
        blocks: list[FillingBlock] = []
        size = 0

        def fits(block: FillingBlock) -> bool:
            return not blocks or size + block.used <= batch_bytes

        while self._full and fits(self._full[0]):
            blocks.append(self._full.pop(0))
            size += blocks[-1].used
        block = self._filling
        if filling and not self._full and block is not None and fits(block):
            blocks.append(block)
            self._filling = None
        self.buffered -= sum(block.payload for block in blocks)
        return blocks


def new_offer_buffer(
    begin: tuple[int, int],
    last: tuple[int, int] | None,
    segment_bytes: int,
    limits: OfferLimits,
    closing: bool,
) -> OfferBuffer:
    """An offer buffer, compiled where built (``framing.NATIVE``)."""
    native = framing.NATIVE
    if native is not None:
        buffer: OfferBuffer = native.Offers(begin, last, segment_bytes, limits, closing)
        return buffer
    return OfferBuffer(begin, last, segment_bytes, limits, closing)


class OfferGate:
    """A streaming handle's ``offer_entry`` as one call (Pulsar's ``offerEntry``): under
    ``lock``, ``offers.offer(ledger_id, entry_id, data, clock())``; an entry simply taken
    answers ``ok`` at once. Any other outcome goes to ``locked(outcome, ledger_id,
    entry_id, data)``, still under the lock: its answer (not None) is the refusal to
    return, or it raises; None means taken, and then ``after(outcome)`` runs once the lock
    is released (the writer's turn) and ``ok`` is the answer.

    The compiled ``OfferGate`` of ``slts.offload._framing`` is its twin (``new_offer_gate``
    picks): the common case, an entry taken, then runs no Python code at all, which is most
    of what an offer cost (an offer is called per entry)."""

    __slots__ = ("_after", "_clock", "_lock", "_locked", "_offers", "_ok")

    def __init__(
        self,
        lock: LockType,
        offers: OfferBuffer,
        clock: Callable[[], float],
        ok: object,
        locked: Callable[[int, int, int, bytes], object],
        after: Callable[[int], None],
    ) -> None:
        self._lock = lock
        self._offers = offers
        self._clock = clock
        self._ok = ok
        self._locked = locked
        self._after = after

    def __call__(self, ledger_id: int, entry_id: int, data: bytes) -> object:
        with self._lock:
            outcome = self._offers.offer(ledger_id, entry_id, data, self._clock())
            if outcome == TAKEN:
                return self._ok
            answer = self._locked(outcome, ledger_id, entry_id, data)
        if answer is not None:
            return answer
        self._after(outcome)
        return self._ok


def new_offer_gate(
    lock: LockType,
    offers: OfferBuffer,
    clock: Callable[[], float],
    ok: object,
    locked: Callable[[int, int, int, bytes], object],
    after: Callable[[int], None],
) -> Callable[[int, int, bytes], object]:
    """An offer gate (``OfferGate``), compiled where built and ``offers`` is compiled too."""
    native = framing.NATIVE
    if native is not None and isinstance(offers, native.Offers):
        gate: Callable[[int, int, bytes], object] = native.OfferGate(lock, offers, clock, ok, locked, after)
        return gate
    return OfferGate(lock, offers, clock, ok, locked, after)
