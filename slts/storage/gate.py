"""The one place every chunk storage call of a container passes: metering and the limiter.

``ChunkedSegmentStorage`` wraps its binding in a ``GatedChunkStorage``: the engine, its GC,
the system journal and the metadata copy, defrag, the offloaders and the remote log all
hold this wrapper, so no caller meters or paces itself. Each call, in the traffic class its
caller set with ``slts.limiter.traffic_class`` (GC, defrag, offload, scrub set theirs; a call
outside any class is a tail write if it changes something and a read if it does not):

1. waits for the limiter, if there is one (``slts.limiter``). Bytes paid: the data of a
   read, write or create, the sources' lengths of a native concat (the storage moves them);
   every call is one request;
2. runs on the inner binding, timed;
3. is counted in the ``UsageMeter`` (``slts.usage``): its latency (limiter wait excluded:
   that is the limiter's throttled time), its bytes, the error it raised, and, for a
   binding that does not count its own requests, the one request ``CALL_KINDS`` gives it.
   A binding that does (S3) tells the meter each request it sends.

Opening a handle costs no request on any binding and passes straight through. Capability
flags and errors are the inner binding's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from slts.bindings.base import (
    ChunkAppend,
    ChunkHandle,
    ChunkInfo,
    ChunkStorage,
    ConcatSource,
    WrappedChunkStorage,
)
from slts.limiter import PriorityLimiter, TrafficClass, current_traffic_class
from slts.usage import CALL_KINDS, UsageMeter

T = TypeVar("T")
R = TypeVar("R", bytes, memoryview, int)


class GatedChunkStorage(WrappedChunkStorage):
    """``inner`` with every call metered into ``meter`` and, with a ``limiter``, paid for first."""

    def __init__(
        self, inner: ChunkStorage, meter: UsageMeter, limiter: PriorityLimiter | None = None
    ) -> None:
        assert not isinstance(inner, GatedChunkStorage), "one gate per chunk storage"
        super().__init__(inner)
        self.meter = meter
        self.limiter = limiter
        if inner.counts_own_requests:
            inner.observe_requests(meter.request)

    def detach(self) -> None:
        """Stop the inner binding's request reports to this gate's meter (when the
        binding outlives the instance that made the gate)."""
        if self.counts_own_requests:
            self.inner.observe_requests(None)

    def _through(
        self,
        name: str,
        changes: bool,
        action: Callable[[], T],
        *,
        paid: int = 0,
        sent: int = 0,
        copied: int = 0,
    ) -> T:
        traffic = current_traffic_class(TrafficClass.TAIL_WRITE if changes else TrafficClass.READ)
        if self.limiter is not None:
            self.limiter.acquire(traffic, paid)
        request = None if self.counts_own_requests else CALL_KINDS[name]
        start = time.perf_counter()
        try:
            result = action()
        except BaseException as error:
            self.meter.call(traffic, name, time.perf_counter() - start, request=request, error=error)
            raise
        received = len(result) if isinstance(result, bytes) else 0
        if isinstance(result, memoryview):  # ``read_view``
            received = result.nbytes
        self.meter.call(
            traffic,
            name,
            time.perf_counter() - start,
            request=request,
            sent=sent,
            received=received,
            copied=copied,
        )
        return result

    # -- hooks: ChunkStorage checked the arguments; the inner binding checks them again -----

    def _do_exists(self, name: str) -> bool:
        return self._through("exists", False, lambda: self.inner.exists(name))

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        return self._through(
            "create", True, lambda: self.inner.create(name, data), paid=len(data), sent=len(data)
        )

    def _do_delete(self, handle: ChunkHandle) -> None:
        self._through("delete", True, lambda: self.inner.delete(handle))

    def _do_open_read(self, name: str) -> ChunkHandle:
        return self.inner.open_read(name)  # a handle costs no request on any binding

    def _do_open_write(self, name: str) -> ChunkHandle:
        return self.inner.open_write(name)

    def _do_get_info(self, name: str) -> ChunkInfo:
        return self._through("get_info", False, lambda: self.inner.get_info(name))

    # Reads, the hot path: ``_through``'s steps written out, and the inner binding's hook
    # called directly (``read`` checked the same arguments a moment ago, in this object).
    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        return self._read(self.inner._do_read, handle, offset, length)  # noqa: SLF001

    def _do_read_view(self, handle: ChunkHandle, offset: int, length: int) -> memoryview:
        return self._read(self.inner._do_read_view, handle, offset, length)  # noqa: SLF001

    def _do_read_into(self, handle: ChunkHandle, offset: int, view: memoryview) -> int:
        return self._read_into(self.inner._do_read_into, handle, offset, view)  # noqa: SLF001

    def _do_read_into_verified_by_caller(self, handle: ChunkHandle, offset: int, view: memoryview) -> int:
        return self._read_into(self.inner._do_read_into_verified_by_caller, handle, offset, view)  # noqa: SLF001

    def _do_read_into_checked(self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes) -> int:
        return self._read(
            lambda handle, offset, _: self.inner._do_read_into_checked(handle, offset, view, blocks),  # noqa: SLF001
            handle,
            offset,
            len(view),
        )

    def _do_read_held_into_checked(
        self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes
    ) -> int | None:
        """The inner binding's held read, metered as a read when it served the bytes (a
        None costs nothing: the caller's read that follows is the one metered), and paid
        for after it (it sent no request: the limiter paces what the caller does next)."""
        traffic = current_traffic_class(TrafficClass.READ)
        start = time.perf_counter()
        try:
            done = self.inner._do_read_held_into_checked(handle, offset, view, blocks)  # noqa: SLF001
        except BaseException as error:
            self.meter.call(traffic, "read", time.perf_counter() - start, error=error)
            raise
        if done is not None:
            self.meter.read_call(traffic, time.perf_counter() - start, done, None)
            if self.limiter is not None:
                self.limiter.acquire(traffic, done)
        return done

    def _read_into(
        self,
        hook: Callable[[ChunkHandle, int, memoryview], int],
        handle: ChunkHandle,
        offset: int,
        view: memoryview,
    ) -> int:
        """A ``read_into`` hook of the inner binding, metered and limited as a read."""
        return self._read(lambda handle, offset, _: hook(handle, offset, view), handle, offset, len(view))

    def _read(
        self, hook: Callable[[ChunkHandle, int, int], R], handle: ChunkHandle, offset: int, length: int
    ) -> R:
        traffic = current_traffic_class(TrafficClass.READ)
        if self.limiter is not None:
            self.limiter.acquire(traffic, length)
        request = None if self.counts_own_requests else CALL_KINDS["read"]
        start = time.perf_counter()
        try:
            result = hook(handle, offset, length)
        except BaseException as error:
            self.meter.call(traffic, "read", time.perf_counter() - start, request=request, error=error)
            raise
        received = (
            result
            if isinstance(result, int)
            else result.nbytes
            if isinstance(result, memoryview)
            else len(result)
        )
        self.meter.read_call(traffic, time.perf_counter() - start, received, request)
        return result

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        return self._through(
            "write", True, lambda: self.inner.write(handle, offset, data), paid=len(data), sent=len(data)
        )

    def _do_write_together(self, appends: Sequence[ChunkAppend]) -> list[int | Exception]:
        """The inner binding's ``write_together`` hook (this object's ``write_together``
        checked the appends a moment ago), paid for as one call of all the bytes and
        metered as one ``write`` per append (each with the call's latency and its own
        error)."""
        traffic = current_traffic_class(TrafficClass.TAIL_WRITE)
        if self.limiter is not None:
            self.limiter.acquire(traffic, sum(len(append.data) for append in appends))
        request = None if self.counts_own_requests else CALL_KINDS["write"]
        start = time.perf_counter()
        try:
            results = self.inner._do_write_together(appends)  # noqa: SLF001
        except BaseException as error:
            for _ in appends:
                self.meter.call(traffic, "write", time.perf_counter() - start, request=request, error=error)
            raise
        seconds = time.perf_counter() - start
        for append, result in zip(appends, results, strict=True):
            failure = result if isinstance(result, Exception) else None
            sent = 0 if failure is not None else len(append.data)
            self.meter.call(traffic, "write", seconds, request=request, sent=sent, error=failure)
        return results

    def _do_list(self, prefix: str) -> Iterator[str]:
        return self._through("list", False, lambda: self.inner.list(prefix))

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        moved = sum(source.length for source in sources)
        through_client = self.inner.concat_bytes_through_client(sources)
        return self._through(
            "concat",
            True,
            lambda: self.inner.concat(target, sources),
            paid=moved,
            sent=through_client,
            copied=moved - through_client,
        )

    def _do_truncate(self, handle: ChunkHandle, length: int) -> None:
        self._through("truncate", True, lambda: self.inner.truncate(handle, length))

    def _do_set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        self._through("set_readonly", True, lambda: self.inner.set_readonly(handle, readonly))
