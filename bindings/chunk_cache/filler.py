"""Background fills of the chunk cache, bounded in threads and in bytes.

A read that missed the cache hands the bytes it received to ``Filler.submit``; a pool of
``threads`` threads writes them to the cache while the reader goes on (``threads=0``: the
reader writes them itself before it goes on, and no thread is started: the simulator's
runs, whose thread schedule must be no input). A fill is
refused (``submit`` returns False: the bytes are simply not cached) when the bytes
waiting or being written would exceed ``bytes_max``: a slow disk never makes a read wait
and never makes memory grow.

Invariants (asserted; ``tests/chunk_cache/test_cache.py``):

1. ``0 <= pending_bytes <= bytes_max`` at all times.
2. Every accepted fill's ``done`` callback runs exactly once, whether it ran, failed or
   was cancelled by ``close``; after ``close`` nothing is accepted and no thread is left.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

_log = logging.getLogger(__name__)


class Filler:
    """A bounded pool for cache fills (see the module doc). Thread-safe."""

    def __init__(self, threads: int, bytes_max: int) -> None:
        assert threads >= 0 and bytes_max > 0, (threads, bytes_max)
        self.bytes_max = bytes_max
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="slts-chunk-cache", initializer=_lower_priority)
            if threads
            else None
        )
        self.pending_bytes = 0
        self._closed = False

    def submit(self, size: int, work: Callable[[], None], done: Callable[[], None]) -> bool:
        """Run ``work()`` in the background, then ``done()`` (also if ``work`` raised or
        was cancelled), counting ``size`` bytes until then; False (and nothing runs) when
        that would pass ``bytes_max`` or the filler is closed."""
        assert size > 0, size
        with self._lock:
            if self._closed or self.pending_bytes + size > self.bytes_max:
                return False
            self.pending_bytes += size
            if self._pool is not None:
                future = self._pool.submit(work)
        if self._pool is None:  # inline: the caller's thread does the fill now
            future = Future()
            try:
                work()
            except Exception as error:  # noqa: BLE001 - reported as a pool thread's would be, below
                future.set_exception(error)
            else:
                future.set_result(None)

        def finished(result: Future[None]) -> None:
            try:
                if not result.cancelled() and result.exception() is not None:
                    _log.warning("chunk cache fill failed: %r", result.exception())
                done()
            finally:
                with self._lock:
                    self.pending_bytes -= size
                    assert 0 <= self.pending_bytes <= self.bytes_max, self.pending_bytes
                    if not self.pending_bytes:
                        self._idle.notify_all()

        future.add_done_callback(finished)
        return True

    def drain(self) -> None:
        """Wait until every fill accepted so far has ended (and its ``done`` ran)."""
        with self._idle:
            self._idle.wait_for(lambda: self.pending_bytes == 0)

    def close(self) -> None:
        """Cancel the fills not started, wait for the running ones. Idempotent."""
        with self._lock:
            self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        assert self.pending_bytes == 0, self.pending_bytes


#: The niceness of fill threads (Linux schedules threads one by one): a fill yields the
#: CPU to readers, to the engine's read-ahead and to everything else the machine runs;
#: if it falls behind, later fills are dropped (``bytes_max``) rather than slow a read.
FILL_NICENESS = 19


def _lower_priority() -> None:
    """In each fill thread as it starts: its own niceness to ``FILL_NICENESS`` (a no-op
    where threads cannot be reniced one by one)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), FILL_NICENESS)
    except (AttributeError, OSError):
        pass
