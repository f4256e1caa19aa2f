"""Read-ahead for sequential readers: the chunk bytes that follow a read, fetched in the
background while the caller consumes what it asked for.

``ChunkedSegmentStorage`` holds one ``ReadAhead`` per instance (when
``read_ahead_bytes`` > 0 and the binding has ``high_latency_reads``, or
``read_ahead_low_latency`` is on) and calls it at three points of its read path:

1. ``follow`` (under the segment's layout lock, with the segment's record): notes the
   read. A read that starts where an earlier read of the segment ended continues that
   *stream*; for a stream the answer is the segment range to read ahead now (a ``Plan``),
   up to the stream's share of the budget past the read, never past the recorded length;
2. the engine resolves the plan's range to chunk pieces under the same lock, and
   ``prefetch`` cuts them into *parts* of at most ``part_bytes`` (at multiples of it in
   chunk offsets, so a large chunk becomes several ranged reads, fetched in parallel):
   the stream's *pending* parts, replacing any it had. Pending parts are submitted to
   ``threads`` background threads, in order, as far as the budget allows, and again
   whenever a read releases parts. A part the binding holds locally (``held``: a disk
   cache) is passed over: the stream's frontier moves past it with nothing fetched or
   counted, so a stream over cached bytes plans each range once, not at every read;
3. ``take`` (for every piece a read needs, before it reads the chunk storage): the piece's
   bytes, if parts cover it (waiting for parts still in flight), else None and the reader
   fetches the piece itself. A part read to its end is released at once.

Invariants (asserted; cited by ``tests/storage/test_read_ahead.py``):

1. **Never stale.** A part holds bytes ``[offset, offset + length)`` of one chunk, read
   below the chunk's recorded length at the time of the plan, and is found only by chunk
   name and range. A chunk's bytes below a length recorded in the metadata never change
   (chunk names are never reused; an append only adds bytes past the recorded length;
   no operation rewrites a chunk), so whatever truncate, concat or defrag do to the
   layout afterwards, a part's bytes are still that chunk's bytes; a read uses them only
   if its own layout names that chunk and range.
2. **Verified.** A part is fetched by the engine's own checked fetch (block checksums:
   every block the part touches); a piece that is a whole chunk without block checksums
   is checked against the chunk's CRC32C by the engine when it takes it.
3. **Bounded.** The bytes of all parts, buffered or in flight (evicted ones included
   until their fetch ends), never exceed ``bytes_max``; streams are at most
   ``STREAMS_MAX``; a stream gets at most an equal share of the budget among the streams
   holding parts.
4. **Errors stay with their reader.** A failed part is dropped and never raised to
   anyone; a read that needs its bytes fetches them itself and reports its own error.
5. **No thread outlives ``close``.** ``close`` cancels queued parts and joins the
   threads; after it nothing is submitted.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from slts.errors import SltsError

_log = logging.getLogger(__name__)

#: Most streams (segment, next offset) remembered; the least recently read is forgotten
#: first, with its parts.
STREAMS_MAX = 64


class Piece(Protocol):
    """What read-ahead needs of the engine's read pieces: a range of one chunk."""

    @property
    def chunk(self) -> str: ...
    @property
    def chunk_offset(self) -> int: ...
    @property
    def length(self) -> int: ...


P = TypeVar("P", bound=Piece)


@dataclass(frozen=True, slots=True)
class ReadAheadStatistics:
    """Counters since the instance started, and the bytes held now (a frozen snapshot)."""

    parts: int  # parts submitted
    part_bytes: int  # their bytes
    hits: int  # pieces served from parts
    hit_bytes: int
    failures: int  # parts whose fetch failed (dropped; never raised)
    local_parts: int  # parts passed over: the binding held them locally (never fetched)
    unused_bytes: int  # bytes of parts dropped before a read took them to their end
    held_bytes: int  # parts' bytes now, buffered or in flight
    held_bytes_peak: int
    streams: int  # streams remembered now


class _Stream:
    """Reads of one segment that continue each other: the next read is expected at
    ``position``; parts are submitted up to ``frontier``, ``pending`` ones follow it."""

    __slots__ = ("context", "fetch", "frontier", "held", "parts", "pending", "position", "segment")

    def __init__(self, segment: str, position: int) -> None:
        self.segment = segment
        self.position = position
        self.frontier = position
        self.parts: list[_Part] = []  # submitted, in segment order
        self.held = 0  # bytes of ``parts``
        #: (piece, chunk offset, length, held locally) of the parts to submit (or pass
        #: over, if held) next, from ``frontier`` on.
        self.pending: deque[tuple[Any, int, int, bool]] = deque()
        self.fetch: Callable[[Any, int, int], bytes] | None = None
        self.context: contextvars.Context | None = None  # of the reader that planned them


class _Part:
    """Bytes ``[offset, offset + length)`` of ``chunk``, ending at ``segment_end`` in the
    stream's segment; ``future`` gives them (or the fetch's error)."""

    __slots__ = ("chunk", "future", "length", "listed", "offset", "segment_end", "state", "stream")

    def __init__(self, chunk: str, offset: int, length: int, segment_end: int, stream: _Stream) -> None:
        self.chunk = chunk
        self.offset = offset
        self.length = length
        self.segment_end = segment_end
        self.stream = stream
        self.future: Future[bytes] | None = None
        #: queued -> running -> done; "dropped": it left the tables before its fetch ended.
        self.state = "queued"
        self.listed = True  # in its stream's parts and in ``_by_chunk``

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class Plan:
    """Segment range ``[start, end)`` to read ahead for ``stream`` (``ReadAhead.follow``)."""

    stream: _Stream
    start: int
    end: int


def split(offset: int, length: int, part_bytes: int) -> list[tuple[int, int]]:
    """``[offset, offset + length)`` of a chunk cut at the multiples of ``part_bytes``:
    (offset, length) pairs, in order, covering it exactly."""
    assert part_bytes > 0 and offset >= 0 and length >= 0, (offset, length, part_bytes)
    parts = []
    end = offset + length
    while offset < end:
        cut = min(end, (offset // part_bytes + 1) * part_bytes)
        parts.append((offset, cut - offset))
        offset = cut
    return parts


class ReadAhead:
    """The read-ahead of one instance (see the module doc). Thread-safe."""

    def __init__(self, bytes_max: int, part_bytes: int, threads: int) -> None:
        assert 0 < part_bytes <= bytes_max and threads > 0, (part_bytes, bytes_max, threads)
        self.bytes_max = bytes_max
        self.part_bytes = part_bytes
        self._threads = threads
        self._lock = threading.Lock()
        self._streams: OrderedDict[tuple[str, int], _Stream] = OrderedDict()  # least recent first
        self._by_chunk: dict[str, list[_Part]] = {}
        self._held = 0
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self._counts = dict.fromkeys(
            (
                "parts",
                "part_bytes",
                "hits",
                "hit_bytes",
                "failures",
                "local_parts",
                "unused_bytes",
                "held_bytes_peak",
            ),
            0,
        )

    # -- the read path's three calls -------------------------------------------------------------

    def follow(self, segment: str, offset: int, length: int, segment_length: int) -> Plan | None:
        """Note a read of ``[offset, offset + length)`` of ``segment`` (whose recorded
        length is ``segment_length``). If it continues an earlier read, the range to read
        ahead now, else None. Call it with the layout the read resolves (under its lock)."""
        end = offset + length
        assert offset >= 0 and end <= segment_length, (offset, length, segment_length)
        if length == 0:
            return None
        with self._lock:
            if self._closed:
                return None
            stream = self._streams.pop((segment, offset), None)
            if stream is None:
                if (segment, end) in self._streams:  # e.g. a read again: keep the stream there
                    self._streams.move_to_end((segment, end))
                    return None
                stream = _Stream(segment, end)
                sequential = False
            else:
                for part in [part for part in stream.parts if part.segment_end <= offset]:
                    self._drop(part)  # passed over
                sequential = True
            stream.position = end
            if stream.frontier < end:  # the read went past what was planned: plan anew
                stream.frontier = end
                stream.pending.clear()
            replaced = self._streams.pop((segment, end), None)
            if replaced is not None:  # another stream at the same place: one is enough
                self._forget(replaced)
            self._streams[(segment, end)] = stream
            while len(self._streams) > STREAMS_MAX:
                _, forgotten = self._streams.popitem(last=False)
                self._forget(forgotten)
            if not sequential:
                return None
            self._fill(stream)  # what the parts passed over held
            holding = sum(1 for other in self._streams.values() if other.held and other is not stream)
            share = self.bytes_max // (holding + 1)
            start = stream.frontier
            stop = min(end + share, segment_length)
            if stop - start < min(self.part_bytes, segment_length - start) or stop <= start:
                return None  # less than a part to add: wait until there is
            return Plan(stream, start, stop)

    def passed(self, segment: str, offset: int, length: int) -> None:
        """Note a read of ``[offset, offset + length)`` of ``segment`` served without
        read-ahead (bytes a binding holds locally): a stream at ``offset`` moves to the
        read's end, dropping the parts it passed, and submits what they held in its
        budget; nothing is planned. So a sequential reader that reads through held bytes
        keeps its stream, and its first read past them plans at once (``follow``) rather
        than start a new stream there."""
        end = offset + length
        with self._lock:
            stream = self._streams.pop((segment, offset), None) if not self._closed else None
            if stream is None:
                return
            for part in [part for part in stream.parts if part.segment_end <= end]:
                self._drop(part)
            stream.position = end
            if stream.frontier < end:
                stream.frontier = end
                stream.pending.clear()
            replaced = self._streams.pop((segment, end), None)
            if replaced is not None:
                self._forget(replaced)
            self._streams[(segment, end)] = stream
            self._fill(stream)

    def prefetch(
        self,
        plan: Plan,
        pieces: Sequence[P],
        fetch: Callable[[P, int, int], bytes],
        held: Callable[[str, int, int], bool] | None = None,
    ) -> None:
        """Make the parts of ``pieces`` (the chunk pieces of ``plan``'s range, in order) the
        stream's pending parts and submit what the budget allows; ``fetch(piece, offset,
        length)`` reads and checks bytes ``[offset, offset + length)`` of the piece's
        chunk, in the context (traffic class) of the caller. Parts that ``held(chunk,
        offset, length)`` says are at hand locally (a binding's disk cache) are passed
        over, not fetched: a read takes them from there as fast as from a part, and the
        frontier moves past them, so the next reads do not plan them again."""
        assert sum(piece.length for piece in pieces) == plan.end - plan.start, (plan, pieces)
        with self._lock:
            stream = plan.stream
            if self._closed or stream.frontier != plan.start:
                return  # closed, or another read of the stream planned meanwhile
            if self._streams.get((stream.segment, stream.position)) is not stream:
                return  # forgotten meanwhile
            stream.pending = deque(
                (piece, offset, length, held is not None and held(piece.chunk, offset, length))
                for piece in pieces
                for offset, length in split(piece.chunk_offset, piece.length, self.part_bytes)
            )
            stream.fetch = fetch
            stream.context = contextvars.copy_context()
            self._fill(stream)

    def take(self, chunk: str, offset: int, length: int) -> bytes | None:
        """Bytes ``[offset, offset + length)`` of ``chunk`` if parts cover them (waiting
        for parts in flight), else None (a part failed, was cancelled, or none covers
        them): the caller then reads them itself. A part read to its end is released."""
        assert length > 0, length
        end = offset + length
        with self._lock:
            candidates = self._by_chunk.get(chunk)
            if not candidates:
                return None
            # (part, first, stop): the part gives bytes [first, stop) of the chunk. Parts
            # of one chunk may overlap (two streams cut it at different ends), so each
            # gives only what the parts before it in the chain did not.
            chain: list[tuple[_Part, int, int]] = []
            position = offset
            while position < end:
                part = next((p for p in candidates if p.offset <= position < p.end), None)
                if part is None:
                    return None
                stop = min(end, part.end)
                chain.append((part, position, stop))
                position = stop
        pieces = []
        for part, first, stop in chain:
            assert part.future is not None
            try:
                data = part.future.result()
            except (SltsError, CancelledError):  # the part's error: the reader reads itself
                return None
            low, high = first - part.offset, stop - part.offset
            pieces.append(data if low == 0 and high == part.length else data[low:high])
        with self._lock:
            for part, _, _ in chain:
                if part.end <= end:
                    self._drop(part, used=True)
                    self._fill(part.stream)  # what it held may go to the parts that follow
            self._counts["hits"] += 1
            self._counts["hit_bytes"] += length
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        assert len(data) == length, (chunk, offset, length, len(data))
        return data

    # -- life cycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Drop every part, cancel the queued ones and join the threads. Idempotent."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            for stream in self._streams.values():
                self._forget(stream)
            self._streams.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            assert self._held == 0 and not self._by_chunk, (self._held, self._by_chunk)

    def statistics(self) -> ReadAheadStatistics:
        with self._lock:
            return ReadAheadStatistics(
                held_bytes=self._held,
                streams=len(self._streams),
                **self._counts,
            )

    # -- inside (lock held unless said otherwise) ----------------------------------------------

    def _run(self, part: _Part, piece: P, fetch: Callable[[P, int, int], bytes]) -> bytes:
        """A pool thread: fetch the part. Its failure stays in its future (``take``
        ignores it) and the part leaves the tables at once."""
        with self._lock:
            if part.state == "dropped":  # dropped as a thread took it: not worth fetching
                self._unhold(part)
                part.state = "done"
                raise CancelledError
            part.state = "running"
        try:
            data = fetch(piece, part.offset, part.length)
            assert len(data) == part.length, (len(data), part.length)
            return data
        except BaseException as exc:
            _log.debug("read-ahead of %r [%d, +%d) failed: %s", part.chunk, part.offset, part.length, exc)
            with self._lock:
                self._counts["failures"] += 1
                self._drop(part)
            raise
        finally:
            with self._lock:
                if part.state == "dropped":  # left the tables meanwhile: its bytes go now
                    self._unhold(part)
                part.state = "done"

    def _fill(self, stream: _Stream) -> None:
        """Submit the stream's pending parts, in order, while the budget has room."""
        if self._closed or not stream.pending:
            return
        if self._streams.get((stream.segment, stream.position)) is not stream:
            stream.pending.clear()  # forgotten
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="slts-read-ahead")
        assert stream.fetch is not None and stream.context is not None
        while stream.pending:
            piece, offset, length, local = stream.pending[0]
            if local:  # the binding holds it: a read takes it from there; nothing to fetch
                stream.pending.popleft()
                stream.frontier += length
                self._counts["local_parts"] += 1
                continue
            if not self._admit(stream, length):
                return
            stream.pending.popleft()
            stream.frontier += length
            part = _Part(piece.chunk, offset, length, stream.frontier, stream)
            stream.parts.append(part)
            self._by_chunk.setdefault(part.chunk, []).append(part)
            # A context runs in one thread at a time: a copy per part.
            part.future = self._pool.submit(stream.context.copy().run, self._run, part, piece, stream.fetch)
            self._counts["parts"] += 1
            self._counts["part_bytes"] += length

    def _admit(self, stream: _Stream, length: int) -> bool:
        """Count ``length`` more bytes for ``stream`` if the budget has them, after taking
        back bytes from streams holding more than an equal share (their farthest parts
        first); False if it still has not."""
        if self._held + length > self.bytes_max:
            holders = [other for other in self._streams.values() if other.held and other is not stream]
            fair = self.bytes_max // (len(holders) + 1)
            for other in holders:
                while other.held > fair and other.parts and self._held + length > self.bytes_max:
                    self._drop(other.parts[-1])
        if self._held + length > self.bytes_max:
            return False
        self._held += length
        stream.held += length
        self._counts["held_bytes_peak"] = max(self._counts["held_bytes_peak"], self._held)
        assert stream.held <= self._held <= self.bytes_max, (stream.held, self._held)
        return True

    def _forget(self, stream: _Stream) -> None:
        """Drop every part of ``stream`` and what it had pending."""
        stream.pending.clear()
        for part in list(stream.parts):
            self._drop(part)

    def _drop(self, part: _Part, *, used: bool = False) -> None:
        """Take ``part`` out of the tables (a no-op if it left them already; ``used``: a
        read took it to its end). Its bytes stop counting now, unless its fetch may be
        running: then when the fetch ends (``_run``)."""
        if not part.listed:
            return
        part.listed = False
        stream = part.stream
        stream.parts.remove(part)
        stream.held -= part.length
        siblings = self._by_chunk[part.chunk]
        siblings.remove(part)
        if not siblings:
            del self._by_chunk[part.chunk]
        if not used:
            self._counts["unused_bytes"] += part.length
        assert part.future is not None
        if part.state == "queued" and part.future.cancel():
            self._unhold(part)  # never started, never will
        elif part.state in ("queued", "running"):
            part.state = "dropped"  # a thread has it: ``_run`` releases its bytes
        else:
            assert part.state == "done", part.state
            self._unhold(part)

    def _unhold(self, part: _Part) -> None:
        self._held -= part.length
        assert self._held >= 0, self._held
