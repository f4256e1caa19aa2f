"""Entry framing of offloaded blocks, parsed fast: ``[length i32][entry id i64][payload]``
after a block's 128-byte header, up to the fill pattern (a negative length) or the
block's end (the layouts are in ``slts.offload.formats``).

``parse_frames`` walks the frames of one block inside one buffer and records where the
payloads are in a ``Runs`` table (a few ``array`` columns, no object per entry, so a
cache of parsed buffers costs the garbage collector nothing); ``Runs.payloads`` hands the
payloads of a range of ids out, made when asked for: a payload of up to
``COPY_BYTES_MAX`` (4 KiB) as a ``bytes`` copy, a larger one as a read-only
``memoryview`` slice of the buffer (no copy). Why two kinds: an object per entry is the
cost of a small payload, and a view is the dearer object (about 100 ns to make, and the
garbage collector tracks it: a read of 1,000 views held by its caller gets them promoted
and scanned by full collections), while a copy of a run of small payloads is made by one
``struct`` call in C, is not tracked, and keeps no block alive; a large payload is cheap
as a view and dear to copy. Every frame is checked: its entry
id is the one expected (no gap, no repeat) and it ends within the block. A run of frames
of one length (the common case: a producer's entries of one size) is checked without a
Python step per entry: the run's headers are gathered with strided slices of the buffer
and compared, in C, with the headers the run must have (its length, and the ids counting
up); the first that differs ends the run and is parsed one by one. Frames of varying
sizes fall back to one ``struct`` call per frame, and runs are then probed only now and
then, so a block of mixed sizes costs no more than the plain walk.

The writing side is one loop: ``frame_entries`` frames a run of the PIP-17 offloader's
entries as header and payload pieces for its next write (``frame_entries_python`` is the
reference; the compiled twin takes no Python step per entry).

The walk and the payloads have a compiled twin, ``slts.offload._framing`` (a small C
extension, built at install where a C compiler is at hand): a step per frame in C, and
every payload handed out as a ``Payload``, a read-only view that costs a small object (no
copy, no garbage-collector tracking: the two costs that make the pure-Python code copy
small payloads and view large ones). ``NATIVE`` is that module, or None where it is not
built (or ``SLTS_PURE_PYTHON=1`` is set); the Python code is the reference, and the tests
run every case through both and compare what they find.
"""

from __future__ import annotations

import bisect
import functools
import struct
import sys
from array import array
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

from slts.compiled import twin
from slts.errors import InvalidOffloadObject
from slts.offload import formats

if TYPE_CHECKING:
    from slts.offload.ledgers import Entry

_HEADER = formats.ENTRY_HEADER  # [length i32][entry id i64]
HEADER_BYTES = _HEADER.size
#: Fewest frames checked as a run (below it the plain walk is cheaper).
RUN_MIN = 8
#: Frames walked one by one after a run probe found fewer than ``RUN_MIN`` frames alike.
WALK_AFTER_MISS = 64


#: Outcomes of a walk over frames (``_walk``, and the compiled ``walk``): the entries end; the
#: next frame lies past the bytes at hand; the frame at the position is damaged.
WALK_DONE, WALK_MORE, WALK_DAMAGED = 0, 1, 2


def _native() -> ModuleType | None:
    compiled = twin("slts.offload._framing")  # optional: compiled at install
    if compiled is not None:
        assert (compiled.WALK_DONE, compiled.WALK_MORE, compiled.WALK_DAMAGED) == (
            WALK_DONE,
            WALK_MORE,
            WALK_DAMAGED,
        )
    return compiled


#: The compiled walk and copy (module doc), or None: the Python code does the work.
NATIVE = _native()

#: Payloads up to this size leave as ``bytes`` copies, larger ones as views (module doc).
COPY_BYTES_MAX = 4096
#: Most payloads copied by one ``struct`` call.
COPY_RUN = 1024


@functools.lru_cache(maxsize=64)
def _copier(length: int, gap: int, count: int) -> struct.Struct:
    """The ``struct`` layout of ``count`` payloads of ``length`` bytes, ``gap`` bytes apart
    (a run's stride less its payload): unpacked, each payload is one ``bytes`` object."""
    assert 0 < count <= COPY_RUN and 0 <= length <= COPY_BYTES_MAX and gap >= 0, (count, length, gap)
    return struct.Struct(f"{length}s{gap}x" * (count - 1) + f"{length}s")


class Runs:
    """Where the payloads of consecutive entries lie in one buffer, as runs: run ``k``
    holds ``counts[k]`` entries from id ``ids[k]``, entry ``i`` of it ``lengths[k]``
    bytes at ``starts[k] + i * strides[k]``. A run of length -1 is an entry whose payload
    is not in the buffer (``extra``: one cut by a range's end, completed from the next)."""

    __slots__ = ("counts", "extra", "ids", "lengths", "starts", "strides")

    def __init__(self) -> None:
        self.ids = array("q")
        self.counts = array("q")
        self.starts = array("q")
        self.strides = array("q")
        self.lengths = array("q")
        self.extra: dict[int, Entry] = {}

    def __len__(self) -> int:
        return self.counts[-1] + self.ids[-1] - self.ids[0] if self.ids else 0

    @property
    def first(self) -> int:
        """The first entry id (the table is not empty)."""
        return self.ids[0]

    def add(self, first: int, count: int, start: int, stride: int, length: int) -> None:
        """Entries ``first..first+count-1`` (following the last ones), ``length`` bytes
        each at ``start``, ``start + stride``..."""
        assert not self.ids or first == self.ids[-1] + self.counts[-1], (first, self.ids[-1:])
        self.ids.append(first)
        self.counts.append(count)
        self.starts.append(start)
        self.strides.append(stride)
        self.lengths.append(length)

    def add_packed(self, packed: bytes) -> None:
        """The runs of the compiled walk: native int64 quintuples (first id, count, start,
        stride, length), following the last ones."""
        table = array("q")
        table.frombytes(packed)
        assert len(table) % 5 == 0 and (not self.ids or table[0] == self.ids[-1] + self.counts[-1])
        self.ids += table[0::5]
        self.counts += table[1::5]
        self.starts += table[2::5]
        self.strides += table[3::5]
        self.lengths += table[4::5]

    def add_extra(self, entry: int, payload: Entry) -> None:
        """Entry ``entry`` (following the last ones), whose payload is ``payload``."""
        self.add(entry, 1, 0, 0, -1)
        self.extra[entry] = payload

    def payloads(self, view: memoryview, first: int, last: int, out: list[Entry]) -> int:
        """Append the payloads of entries ``first..last`` held here (up to the table's last
        one) to ``out``, cut from ``view``: with ``NATIVE`` as ``Payload`` views, else those
        of at most ``COPY_BYTES_MAX`` bytes as ``bytes`` copies and larger ones as slices of
        ``view`` (module doc); return the id after the last appended."""
        ids, counts, starts, strides, lengths = self.ids, self.counts, self.starts, self.strides, self.lengths
        run = bisect.bisect_right(ids, first) - 1
        assert run >= 0, (first, ids[:1])
        entry = first
        while entry <= last and run < len(ids):
            run_first, length = ids[run], lengths[run]
            until = min(last, run_first + counts[run] - 1)
            stride = strides[run]
            at = starts[run] + (entry - run_first) * stride
            count = until - entry + 1
            if length < 0:
                out.append(self.extra[entry])
            elif NATIVE is not None:  # zero-copy Payloads, every size
                NATIVE.views(view, at, stride, length, count, out)
            elif length > COPY_BYTES_MAX:
                out += [view[a : a + length] for a in range(at, at + count * stride, stride)]
            elif count < RUN_MIN:  # a few: one copy each (a layout per count and length would not pay)
                out += [view[a : a + length].tobytes() for a in range(at, at + count * stride, stride)]
            else:  # copies, in C: up to COPY_RUN payloads a call
                while count:
                    step = min(count, COPY_RUN)
                    out += _copier(length, stride - length, step).unpack_from(view, at)
                    at, count = at + step * stride, count - step
            entry = until + 1
            run += 1
        return entry


class Frames(NamedTuple):
    """What ``parse_frames`` found: how many frames (``found``, added to the ``Runs`` given), the
    buffer position after the last whole frame, and whether the block's entries end
    there (the count reached, the fill pattern, or the block's end) rather than at the
    end of the bytes at hand. ``error``: the frame at ``position`` is damaged (the
    frames before it are sound); ``checked()`` raises it."""

    found: int
    position: int
    done: bool
    error: InvalidOffloadObject | None = None

    def checked(self) -> Frames:
        """These frames, or ``InvalidOffloadObject`` if the walk found damage."""
        if self.error is not None:
            raise self.error
        return self


def parse_frames(
    view: memoryview,
    position: int,
    limit: int,
    block_end: int,
    first: int,
    count: int | None,
    runs: Runs,
    *,
    name: str,
    base: int,
) -> Frames:
    """Add to ``runs`` the frames from buffer position ``position`` on, ids from ``first``: at most
    ``count`` of them (``None``: up to the fill pattern or the block's end), reading bytes
    below ``limit`` only (the end of what ``view`` holds of the block; a frame that goes
    past it stops the walk, ``done`` false). ``block_end`` is the block's end in buffer
    positions (it may lie past ``limit``); ``base`` is the object offset of buffer
    position 0 (for errors). Damage stops the walk with ``error`` set (an
    ``InvalidOffloadObject``): a frame with another id than expected, a frame past the
    block's end, fewer frames than ``count`` before the block ends, or a frame where the
    block should have ended after ``count``."""
    assert 0 <= position <= limit <= len(view), (position, limit, len(view))
    limit = min(limit, block_end)
    if NATIVE is not None:
        packed, found, position, outcome = NATIVE.walk(
            view, position, limit, block_end, first, count if count is not None else -1
        )
        if packed:
            runs.add_packed(packed)
    else:
        found, position, outcome = _walk(view, position, limit, block_end, first, count, runs)
    expected = first + found
    if outcome == WALK_MORE:
        return Frames(found, position, False)
    if outcome == WALK_DAMAGED:
        length, entry_id = _HEADER.unpack_from(view, position)
        return _damaged(
            found,
            position,
            InvalidOffloadObject(
                f"offload object {name!r} at byte {base + position}: entry {entry_id} of {length}"
                f" bytes where entry {expected} was expected within the block ending at byte"
                f" {base + block_end}",
                object=name,
                offset=base + position,
            ),
        )
    if count is not None and found < count:
        return _damaged(
            found,
            position,
            InvalidOffloadObject(
                f"offload object {name!r} at byte {base + position}: the block ends after entry"
                f" {expected - 1}, its index or record says it holds entries up to {first + count - 1}",
                object=name,
                offset=base + position,
            ),
        )
    if count is not None and position + HEADER_BYTES <= limit and _HEADER.unpack_from(view, position)[0] >= 0:
        return _damaged(
            found,
            position,
            InvalidOffloadObject(
                f"offload object {name!r} at byte {base + position}: a frame after entry {expected - 1},"
                " the last its index or record gives the block",
                object=name,
                offset=base + position,
            ),
        )
    return Frames(found, position, True)


def _walk(
    view: memoryview, position: int, limit: int, block_end: int, first: int, count: int | None, runs: Runs
) -> tuple[int, int, int]:
    """The walk of ``parse_frames`` (``limit`` at most ``block_end``), in Python: add the
    frames from ``position`` to ``runs``; return how many, the position after them and the
    outcome (``WALK_DONE``, ``WALK_MORE``, or ``WALK_DAMAGED`` for the frame at the
    position). The compiled ``walk`` answers the same."""
    expected = first
    remaining = count if count is not None else -1
    walk = 0  # frames to walk one by one before the next run probe
    probe = RUN_MIN * 8
    while remaining:
        if position + HEADER_BYTES > limit:
            if limit < block_end and position + HEADER_BYTES <= block_end:
                return expected - first, position, WALK_MORE  # the header is in the next bytes
            break  # the block ends here
        length, entry_id = _HEADER.unpack_from(view, position)
        if length < 0:  # the fill pattern
            break
        end = position + HEADER_BYTES + length
        if entry_id != expected or end > block_end:
            return expected - first, position, WALK_DAMAGED
        if end > limit:
            return expected - first, position, WALK_MORE
        stride = HEADER_BYTES + length
        fits = (limit - position) // stride
        candidates = fits if remaining < 0 else min(fits, remaining)
        taken = 1
        if walk:
            walk -= 1
        elif candidates >= RUN_MIN:
            taken = _alike(view, position, stride, length, expected, min(candidates, probe))
            if taken < RUN_MIN:
                walk, probe = WALK_AFTER_MISS, RUN_MIN * 8
            elif taken == min(candidates, probe):
                probe *= 4
        runs.add(expected, taken, position + HEADER_BYTES, stride, length)
        position += taken * stride
        expected += taken
        remaining -= taken
    return expected - first, position, WALK_DONE


def _damaged(count: int, position: int, error: InvalidOffloadObject) -> Frames:
    return Frames(count, position, False, error)


def _alike(view: memoryview, position: int, stride: int, length: int, first: int, count: int) -> int:
    """How many of the ``count`` frames every ``stride`` bytes from ``position`` have the
    header (``length``, ``first + i``), counted from the first (which has it). The
    headers are gathered with strided slices (4-byte words when the stride allows it),
    compared with the expected ones, and the first difference found from the big-endian
    XOR of the two byte strings."""
    if stride % 4:
        return _alike_bytes(view, position, stride, length, first, count)
    low = first & 0xFFFFFFFF
    count = min(count, (1 << 32) - low)  # the ids' high word is the same all along the run
    span = view[position : position + (count - 1) * stride + HEADER_BYTES]
    words = span.cast("I")
    step = stride // 4
    wants = (
        length.to_bytes(4, "big") * count,
        (first >> 32).to_bytes(4, "big") * count,
        _counting_words(low, count),
    )
    return _first_difference([words[field::step].tobytes() for field in range(3)], wants, 4, count)


def _alike_bytes(view: memoryview, position: int, stride: int, length: int, first: int, count: int) -> int:
    """``_alike`` for a stride that is not a whole number of words: byte by byte."""
    span = view[position : position + (count - 1) * stride + HEADER_BYTES]
    ids = array("q", range(first, first + count))
    if sys.byteorder == "little":
        ids.byteswap()
    id_bytes = memoryview(ids).cast("B")
    header = length.to_bytes(4, "big")
    wants = [header[field : field + 1] * count for field in range(4)]
    wants += [id_bytes[field::8].tobytes() for field in range(8)]
    return _first_difference([span[field::stride].tobytes() for field in range(12)], wants, 1, count)


def _first_difference(gots: list[bytes], wants: Sequence[bytes], unit: int, count: int) -> int:
    """The index of the first frame where a gathered field (``unit`` bytes per frame)
    differs from the expected one; ``count`` if none does."""
    taken = count
    for got, want in zip(gots, wants, strict=True):
        if got != want:
            differ = int.from_bytes(got, "big") ^ int.from_bytes(want, "big")
            taken = min(taken, (len(got) - 1 - (differ.bit_length() - 1) // 8) // unit)
    assert taken >= 1, (unit, count)
    return taken


_WORD_ONE = (1).to_bytes(4, "big")


def _counting_words(start: int, count: int) -> bytes:
    """The big-endian 32-bit words ``start, start + 1, ...`` (``count`` of them, all below
    2**32), built with big-integer arithmetic in C rather than a Python step per word:
    ``start * ones + ramp``, with ``ones`` the words 1, 1, ..., 1 and ``ramp`` the words
    0, 1, ..., count - 1 (cut from the cached ramp of the next power of two: no word
    carries into the next, as every sum is below 2**32)."""
    ramp = int.from_bytes(_ramp(1 << (count - 1).bit_length())[: 4 * count], "big")
    ones = int.from_bytes(_WORD_ONE * count, "big")
    return (start * ones + ramp).to_bytes(4 * count, "big")


@functools.lru_cache(maxsize=32)
def _ramp(count: int) -> bytes:
    """The big-endian words 0, 1, ..., count - 1: ``(ones - count) / (2**32 - 1)``."""
    ones = int.from_bytes(_WORD_ONE * count, "big")
    return ((ones - count) // 0xFFFFFFFF).to_bytes(4 * count, "big")


def frame_entries_python(
    pieces: list[Entry], first_entry_id: int, payloads: Sequence[Entry], start: int, room: int, enough: int
) -> tuple[int, int]:
    """Frame ``payloads[start:]`` into ``pieces``, ids from ``first_entry_id``: each frame as
    two pieces, its 12-byte header and the payload itself (the write joins them once), while
    the next frame fits in what is left of ``room`` bytes; stop after the frame that brings
    the bytes framed by this call to ``enough``. Returns (frames, bytes framed). A
    payload's length is its ``len()``.

    The PIP-17 offloader's per-entry loop (``slts.offload.offloader``); ``frame_entries`` is
    the compiled twin where it is built. ``ValueError`` for a negative id or start, a
    ``room`` outside 0..2**31-1 (so a payload that fits has a length an i32 holds) or an
    ``enough`` below 1; nothing is framed then."""
    if first_entry_id < 0 or start < 0 or not 0 <= room <= formats.INT32_MAX or enough < 1:
        raise ValueError(
            f"frame_entries: first entry id {first_entry_id}, start {start}, room {room} (at most 2**31-1),"
            f" enough {enough} (at least 1)"
        )
    taken = framed = 0
    for index in range(start, len(payloads)):
        payload = payloads[index]
        length = len(payload)
        if HEADER_BYTES + length > room - framed:
            break
        pieces.append(formats.entry_header(first_entry_id + taken, length))
        pieces.append(payload)
        taken += 1
        framed += HEADER_BYTES + length
        if framed >= enough:
            break
    return taken, framed


#: The offloader's framing loop: the compiled twin where it is built, else the Python one.
frame_entries = NATIVE.frame_entries if NATIVE is not None else frame_entries_python
