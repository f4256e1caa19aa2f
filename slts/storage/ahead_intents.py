"""Intents registered one write ahead, for bindings without append (object stores).

On S3 every write creates a new chunk, so a write costs two metadata commits: the GC
intent for the chunk (before the object exists, so that it can never leak), then the
layout that makes it readable. The intent of a segment's *next* chunk can ride in the
current write's layout commit instead: its name is known then (it starts at the new
length). The next write finds it here, creates that chunk under it and commits once.

Safety is the intent's, unchanged: the entry is durable before the chunk exists (it was
committed with the previous write), and the layout commit deletes it expecting it
unchanged, so GC and the writer still exclude each other. An intent that is never used
(the segment is sealed, deleted or taken over; the instance stops) names a chunk that
does not exist; GC drops it after ``gc_delay_s`` like any stale intent. An intent older
than half of ``gc_delay_s`` is not used (GC may be about to claim it; the write then
registers its own).

Thread-safety: the table has its own lock; a segment's entry is taken and offered under
that segment's change lock, so one write at a time uses it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from slts.metadata.store import Put

#: At most this many segments keep an intent ahead (the oldest is forgotten: GC drops it).
AHEAD_SEGMENTS_MAX = 4096


@dataclass(frozen=True, slots=True)
class AheadIntent:
    """A committed intent for the chunk ``name`` that starts at ``start``."""

    name: str
    start: int
    entry: Put  # the GC queue entry as committed
    version: int  # the sequence of the commit that wrote it
    queued_ms: int


class AheadIntents:
    """The intents registered ahead, one per segment (see the module doc)."""

    def __init__(self, max_age_ms: int, capacity: int = AHEAD_SEGMENTS_MAX) -> None:
        assert capacity >= 1 and max_age_ms >= 0
        self._max_age_ms = max_age_ms
        self._capacity = capacity
        self._lock = threading.Lock()
        self._by_segment: OrderedDict[str, AheadIntent] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_segment)

    def take(self, segment: str, start: int, now_ms: int) -> AheadIntent | None:
        """The segment's intent if it is for a chunk starting at ``start`` and young
        enough to use; the entry is removed either way."""
        with self._lock:
            ahead = self._by_segment.pop(segment, None)
        if ahead is None or ahead.start != start or now_ms - ahead.queued_ms > self._max_age_ms:
            return None
        return ahead

    def offer(self, segment: str, ahead: AheadIntent) -> None:
        """Keep ``ahead`` for the segment's next write."""
        with self._lock:
            self._by_segment[segment] = ahead
            self._by_segment.move_to_end(segment)
            while len(self._by_segment) > self._capacity:
                self._by_segment.popitem(last=False)
