"""Types of the compiled twin of ``slts.offload.framing``'s hot loops (``_framing.c``)."""

from _thread import LockType
from collections.abc import Callable, Sequence
from typing import Final, SupportsIndex, final, overload

WALK_DONE: Final[int]
WALK_MORE: Final[int]
WALK_DAMAGED: Final[int]

@final
class Payload:
    """An entry's payload: a read-only, zero-copy view of the bytes it was read with
    (bytes-like; equal to and hashed as its bytes; pickled as bytes)."""

    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, key: SupportsIndex, /) -> int: ...
    @overload
    def __getitem__(self, key: slice, /) -> bytes: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    def tobytes(self) -> bytes: ...

def walk(
    buffer: bytes | memoryview, position: int, limit: int, block_end: int, first: int, remaining: int, /
) -> tuple[bytes, int, int, int]: ...
def views(
    buffer: bytes | memoryview,
    at: int,
    stride: int,
    length: int,
    count: int,
    out: list[bytes | memoryview | Payload],
    /,
) -> None: ...
def frame_entries(
    pieces: list[bytes | memoryview | Payload],
    first_entry_id: int,
    payloads: Sequence[bytes | memoryview | Payload],
    start: int,
    room: int,
    enough: int,
    /,
) -> tuple[int, int]: ...

@final
class Block:
    """A streaming block being filled (``slts.offload.pending.PendingBlock``'s twin; it has
    ``pending.FillingBlock``'s members, read-only)."""

    ledger_id: Final[int]
    first: Final[int]
    last: Final[int]
    count: Final[int]
    payload: Final[int]
    used: Final[int]
    def __init__(self, ledger_id: int, first: int, data: bytes, block_bytes: int) -> None: ...
    def add(self, ledger_id: int, entry_id: int, data: bytes, block_bytes: int, /) -> bool: ...
    def finish(self, header: bytes, fill: bytes, /) -> bytes: ...

@final
class Offers:
    """The entries offered to a streaming segment, not yet taken by its writer
    (``slts.offload.pending.OfferBuffer``'s twin: the same members)."""

    closing: bool
    writing: bool
    last: Final[tuple[int, int] | None]
    buffered: Final[int]
    segment_bytes: Final[int]
    has_full: Final[bool]
    has_filling: Final[bool]
    def __init__(
        self,
        begin: tuple[int, int],
        last: tuple[int, int] | None,
        segment_bytes: int,
        limits: tuple[int, int, int, float, float, float],
        closing: bool,
    ) -> None: ...
    def offer(self, ledger_id: object, entry_id: object, data: object, now: float, /) -> int: ...
    def take(self, batch_bytes: int, filling: bool, /) -> list[Block]: ...

class OfferGate:
    """A streaming handle's ``offer_entry`` in one call (``slts.offload.pending.OfferGate``'s
    twin): under ``lock``, offer to ``offers`` at ``clock()``; ``ok`` if simply taken, else
    ``locked(outcome, ledger_id, entry_id, data)`` under the lock, then ``after(outcome)``."""

    def __init__(
        self,
        lock: LockType,
        offers: Offers,
        clock: Callable[[], float],
        ok: object,
        locked: Callable[[int, int, int, bytes], object],
        after: Callable[[int], None],
    ) -> None: ...
    def __call__(self, ledger_id: int, entry_id: int, data: bytes) -> object: ...
