"""The chunk storage contract every binding implements (after PDP-34's ChunkStorage).

A *chunk* is one file or object on the chunk storage holding exactly the user's bytes,
with no header or footer. Bindings know nothing of segments, metadata or epochs; they
store named byte strings and answer honestly.

Guarantees every binding gives (the conformance suite in ``tests/conformance`` checks
each of them):

* **Exclusive, atomic create.** ``create(name, data)`` either makes a chunk holding
  exactly ``data`` or raises ``ChunkExists``; readers never see a partial chunk.
* **Durable on return.** When ``create``, ``write`` or ``concat`` returns, the bytes
  survive a crash of the process (and, where the medium allows, of the machine).
* **Append only at the end.** ``write(handle, offset, data)`` needs ``offset`` equal to
  the chunk's current length, else ``ChunkInvalidOffset``. Without ``supports_append``
  only an empty chunk may be written, at offset 0; any other write raises
  ``ChunkInvalidOffset`` (not ``UnsupportedOperation``).
* **Read-only means read-only.** ``write`` and ``truncate`` through a read-only handle
  or on a read-only chunk raise ``ChunkReadOnly``; ``delete`` works on read-only chunks
  (the collector deletes sealed data).
* **Names** are non-empty, valid Unicode (no lone surrogates), without NUL, at most
  ``CHUNK_NAME_BYTES_MAX`` UTF-8 bytes; every binding stores every such name.
* **Reads are exact.** ``read`` returns ``min(length, chunk_length - offset)`` bytes;
  ``offset == chunk_length`` gives ``b""``; ``offset > chunk_length`` raises.
  ``read_view`` returns the same bytes as a read-only ``memoryview``: a view of bytes
  read (every binding), or of the chunk's stored bytes themselves (the filesystem
  binding maps the file): bytes below a chunk's length never change while it exists,
  so the view's bytes never change either, even after the chunk is deleted.
* **One error vocabulary.** Backend failures leave a binding only as the typed errors
  of ``slts.errors`` (``ChunkNotFound``, ``ChunkExists``, ``ChunkInvalidOffset``,
  ``StorageUnavailable``...), translated at one place per binding.
* **Thread safety.** Every method may be called from many threads at once.

Optional operations are announced by capability flags; calling one whose flag is off
raises ``UnsupportedOperation``. Callers branch on the flag, never on the class.
"""

from __future__ import annotations

import abc
import builtins
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from slts.errors import (
    ChunkInvalidOffset,
    ChunkNameInvalid,
    ChunkReadOnly,
    InvalidArgument,
    SltsError,
    UnsupportedOperation,
)

from . import checked_reads

#: Longest chunk name (UTF-8 bytes) any binding must accept.
CHUNK_NAME_BYTES_MAX = 1024


@dataclass(frozen=True, slots=True)
class ChunkHandle:
    """A reference to an existing chunk, obtained from ``create``/``open_read``/``open_write``."""

    name: str
    readonly: bool


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """What the chunk storage says about a chunk. ``length`` is its length *on storage*,
    which the engine never adopts as a segment length (see DESIGN.md §5)."""

    name: str
    length: int


class ChunkAppend(NamedTuple):
    """One append of ``write_together``: ``data`` at ``offset`` of ``handle``'s chunk."""

    handle: ChunkHandle
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ConcatSource:
    """``length`` bytes of chunk ``name`` starting at ``offset``, as one piece of a concat."""

    name: str
    offset: int
    length: int


#: The kinds of requests a storage bills, as object stores name them: ``MULTIPART`` is
#: CreateMultipartUpload, UploadPart, CompleteMultipartUpload and AbortMultipartUpload;
#: ``COPY`` is a server-side copy (UploadPartCopy).
REQUEST_KINDS: tuple[str, ...] = ("PUT", "GET", "HEAD", "LIST", "DELETE", "COPY", "MULTIPART")

#: Told the kind of each request a binding sends (``ChunkStorage.observe_requests``).
RequestObserver = Callable[[str], None]


class ChunkStorage(abc.ABC):
    """Abstract chunk storage, as a template method: public methods check, hooks act.

    The public methods (``exists``, ``create``, ... ``set_readonly``) are concrete and
    final in spirit: each validates its arguments once, here, so that every binding
    rejects the same bad input with the same error, and then calls the protected hook of
    the same name with a ``_do_`` prefix (``_do_exists``, ``_do_create``, ...). A binding
    implements the hooks; they receive arguments that passed these checks:

    * names (``exists``, ``create``, ``open_*``, ``get_info``, concat target and sources)
      pass ``check_name``, else ``ChunkNameInvalid``;
    * a handle is a ``ChunkHandle`` whose name passes ``check_name``, else
      ``InvalidArgument`` (resp. ``ChunkNameInvalid``);
    * ``data`` (``create``, ``write``) is converted to ``bytes`` once (``as_bytes``; any
      bytes-like object is taken and copied), anything else raises ``InvalidArgument``;
    * offsets and lengths (``read``, ``write``, ``truncate``) pass ``check_range``, concat
      sources ``check_concat_sources``, else ``ChunkInvalidOffset``;
    * ``write`` and ``truncate`` through a read-only handle raise ``ChunkReadOnly``
      before any hook runs (a read-only *chunk* is the hook's to detect);
    * an optional operation whose capability flag is off raises ``UnsupportedOperation``
      before anything else is checked; the optional hooks raise it too by default;
    * ``list`` with a prefix no valid name can start with (``names_can_start_with``)
      returns an empty iterator without calling ``_do_list``.

    What depends on the backend (a path limit, key rules, a read-only chunk, the chunk's
    length) stays in the hooks. A subclass may still override a public method to wrap it
    (count, log, kill): calling ``super()`` keeps the checks and reaches the hook.
    """

    #: The binding can append to an existing chunk (``write`` at its end).
    supports_append: bool = False
    #: ``concat`` builds a new chunk from ranges of others on the storage side.
    supports_concat: bool = False
    #: ``truncate`` shortens a chunk in place.
    supports_truncate: bool = False
    #: ``set_readonly`` is available.
    supports_readonly: bool = False
    #: Not a capability but a hint: every read is a round trip to a remote service with a
    #: high first-byte latency (an object store), so the engine reads ahead for sequential
    #: readers by default (``StorageConfig.read_ahead_bytes``).
    high_latency_reads: bool = False
    #: Another hint: ``read_view`` answers with views of the stored bytes themselves (the
    #: filesystem maps its files): holding a large view costs the process no memory.
    maps_reads: bool = False
    #: Another hint: ``holds`` may answer True (a local copy of some chunks' bytes: a
    #: chunk cache). Where it is False the engine never asks ``holds`` on its read path.
    holds_locally: bool = False
    #: Another hint: ``read_into_checked`` checks the blocks in the same pass as its copy,
    #: on two cores (local files read by ``checked_reads``' compiled twin), so the engine
    #: leaves its verified reads to it rather than read and check the bytes itself.
    checks_as_it_reads: bool = False

    #: The URL this binding was built from; executors rebuild the binding from it.
    url: str = ""
    #: The binding reports each request it sends to its storage (``observe_requests``);
    #: otherwise a caller that meters requests counts one per call.
    counts_own_requests: bool = False

    def observe_requests(self, observer: RequestObserver | None) -> None:
        """Call ``observer(kind)`` for every request this binding sends from now on, retries
        included (each one is billed), in the caller's thread; ``kind`` is one of
        ``REQUEST_KINDS``. Only bindings with ``counts_own_requests`` ever call it; None
        stops the calls."""
        self._request_observer = observer

    _request_observer: RequestObserver | None = None

    # -- required -------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        """True if a chunk named ``name`` exists."""
        return self._do_exists(check_name(name))

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        """Create chunk ``name`` holding exactly ``data``, atomically and durably.

        Raises ``ChunkExists`` if the name is taken (even by a half-written chunk),
        ``ChunkNameInvalid`` if the binding cannot store the name, ``InvalidArgument``
        if ``data`` is not bytes-like. Returns a writable handle.
        """
        check_name(name)
        return self._do_create(name, as_bytes(data))

    def delete(self, handle: ChunkHandle) -> None:
        """Delete the chunk (read-only ones too). Raises ``ChunkNotFound`` if it does not exist."""
        self._do_delete(check_handle(handle))

    def open_read(self, name: str) -> ChunkHandle:
        """A read-only handle to an existing chunk; ``ChunkNotFound`` otherwise."""
        return self._do_open_read(check_name(name))

    def open_write(self, name: str) -> ChunkHandle:
        """A writable handle to an existing chunk; ``ChunkNotFound`` or ``ChunkReadOnly``."""
        return self._do_open_write(check_name(name))

    def get_info(self, name: str) -> ChunkInfo:
        """Name and current length on storage; ``ChunkNotFound`` if missing."""
        return self._do_get_info(check_name(name))

    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` clipped at the chunk's end (see module doc).

        ``ChunkInvalidOffset`` for a negative or non-integer argument or ``offset`` past
        the end; ``ChunkNotFound``.
        """
        check_range(check_handle(handle).name, offset, length)
        return self._do_read(handle, offset, length)

    def read_into(
        self, handle: ChunkHandle, offset: int, view: memoryview, *, verified_by_caller: bool = False
    ) -> int:
        """``read``'s bytes ``[offset, offset+len(view))`` written into ``view`` (a writable
        memoryview of bytes), clipped at the chunk's end; returns how many were written
        (fewer than ``len(view)`` only at the chunk's end). Same errors as ``read``;
        ``InvalidArgument`` if ``view`` is not a writable byte view (or a flag that is not a
        bool). Where the storage can, the bytes land in ``view`` without an intermediate
        copy (filesystem: ``preadv``).

        ``verified_by_caller``: the caller checks every byte against checksums of its own
        before it uses any, and calls ``distrust`` on the range if they fail. A binding
        that serves the read from a local copy it checks itself (the chunk cache) may
        then skip its own check (one checksum pass, not two); every other binding ignores
        the flag. The bytes of such a read may be wrong: only the caller's check makes
        them right."""
        if not isinstance(view, memoryview) or view.readonly or view.itemsize != 1 or view.ndim != 1:
            raise InvalidArgument(
                f"read_into needs a writable one-dimensional byte memoryview, got {view!r:.80}"
            )
        if type(verified_by_caller) is not bool:
            raise InvalidArgument(f"verified_by_caller must be a bool, got {verified_by_caller!r:.40}")
        check_range(check_handle(handle).name, offset, len(view))
        if verified_by_caller:
            done = self._do_read_into_verified_by_caller(handle, offset, view)
        else:
            done = self._do_read_into(handle, offset, view)
        assert 0 <= done <= len(view), (done, len(view))
        return done

    def read_into_checked(self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes) -> int:
        """``read_into``'s bytes, every block of the range checked against its CRC32C.

        ``blocks`` lists the blocks that ``[offset, offset + len(view))`` is made of, in
        order: packed big-endian ``(length u32, crc32c u32)`` pairs whose lengths sum to
        ``len(view)``. Returns how many bytes were read, fewer than ``len(view)`` only at
        the chunk's end; a block cut short there is not checked (the caller knows the
        chunk's length and reports it). ``ChunkCorrupted`` naming the chunk and the offset
        of the first block read whole that fails its CRC32C. Same errors as
        ``read_into``; ``InvalidArgument`` for a list that is not one of these. On an
        error ``view`` may hold some bytes: only a return makes them usable.

        Where a binding holds a checked local copy (the chunk cache), a copy that fails
        is dropped and the range read again from the storage, then checked. By default
        the bytes are read with ``read_into`` and checked here; ``checks_as_it_reads``
        bindings check as they copy."""
        _check_checked_read("read_into_checked", handle, offset, view, blocks)
        done = self._do_read_into_checked(handle, offset, view, blocks)
        assert 0 <= done <= len(view), (done, len(view))
        return done

    def read_held_into_checked(
        self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes
    ) -> int | None:
        """``read_into_checked``'s bytes if the binding holds every one of them locally now
        (``holds_locally``: a chunk cache): read and checked without a request to the
        storage, and ``len(view)`` returned. None where it does not hold them all, or its
        copy failed the check (and was dropped): ``view`` then holds nothing usable,
        nothing was counted as a miss, and the caller reads with ``read_into_checked``.

        The read path's one question for held bytes (rather than ``holds`` then a read,
        which looks the range up twice). None by default, and from wrappers that do
        something of their own to reads (a fault injector: its faults reach the read the
        caller then makes). Same argument errors as ``read_into_checked``."""
        _check_checked_read("read_held_into_checked", handle, offset, view, blocks)
        done = self._do_read_held_into_checked(handle, offset, view, blocks)
        assert done is None or done == len(view), (done, len(view))
        return done

    def _do_read_held_into_checked(
        self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes
    ) -> int | None:
        """``read_held_into_checked`` with checked arguments: nothing is held by default."""
        return None

    def _do_read_into_checked(self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes) -> int:
        """``read_into_checked`` with checked arguments: by default ``_do_read_into``,
        then the blocks read whole checked here."""
        done = self._do_read_into(handle, offset, view)
        bad = checked_reads.first_bad(view[:done], blocks)
        if bad >= 0:
            raise checked_reads.corrupted(handle.name, offset, blocks, bad)
        return done

    def _do_read_into_verified_by_caller(self, handle: ChunkHandle, offset: int, view: memoryview) -> int:
        """``read_into`` with ``verified_by_caller``: by default the same read as without
        it (a binding that keeps no checked local copy has no check to skip). A wrapper
        only forwards the flag if it does nothing of its own to reads (a fault injector
        keeps this default, so its faults reach these reads too)."""
        return self._do_read_into(handle, offset, view)

    def distrust(self, name: str, offset: int, length: int) -> bool:
        """Bytes ``[offset, offset+length)`` of chunk ``name``, read with
        ``verified_by_caller``, failed the caller's checksums: a binding that served them
        from a local copy drops that copy and returns True (read again: the storage
        answers this time); False where nothing was dropped (the storage's own bytes are
        wrong: a retry would read the same). Never an error for a chunk it does not know;
        ``ChunkNameInvalid``/``ChunkInvalidOffset`` for bad arguments."""
        check_range(check_name(name), offset, length)
        return self._do_distrust(name, offset, length)

    def _do_distrust(self, name: str, offset: int, length: int) -> bool:
        """``distrust`` with checked arguments: no local copy, nothing to drop."""
        return False

    def holds(self, name: str, offset: int, length: int) -> bool:
        """A hint: whether chunk ``name``'s bytes ``[offset, offset+length)`` can be read
        now without a request to the storage (a local cache holds them: the engine does
        not read them ahead). False by default; never an error for a chunk it does not
        know. ``ChunkNameInvalid``/``ChunkInvalidOffset`` for bad arguments."""
        check_range(check_name(name), offset, length)
        return self._do_holds(name, offset, length)

    def _do_holds(self, name: str, offset: int, length: int) -> bool:
        """``holds`` with checked arguments: no binding holds anything locally by default."""
        return False

    def read_view(self, handle: ChunkHandle, offset: int, length: int) -> memoryview:
        """``read``'s bytes as a read-only ``memoryview``, without a copy where the
        binding can (see module doc); same errors as ``read``. A view may keep resources
        of the chunk (a mapping, its file) alive until it and its slices are released."""
        check_range(check_handle(handle).name, offset, length)
        view = self._do_read_view(handle, offset, length)
        assert view.readonly, handle.name
        return view

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        """Append ``data`` at ``offset`` (== current length), durably; returns ``len(data)``.

        ``InvalidArgument`` for data that is not bytes-like, ``ChunkInvalidOffset`` for a bad
        offset (nothing written), ``ChunkReadOnly`` for a read-only handle or chunk,
        ``ChunkNotFound``.
        """
        check_handle(handle)
        payload = as_bytes(data)
        check_range(handle.name, offset, len(payload))
        check_writable(handle, self.url)
        return self._do_write(handle, offset, payload)

    def write_together(self, appends: Sequence[ChunkAppend]) -> builtins.list[int | Exception]:
        """Each append of ``appends`` as ``write`` would do it, their syncs shared where
        the binding can (the filesystem's are issued together): one result per append,
        in order, ``len(data)`` or the typed error ``write`` would have raised for it
        (that append changed nothing). Every append that succeeded is durable on return.

        The appends must name distinct chunks (``InvalidArgument``, nothing written);
        an append's bad handle, offset or data is that append's error alone.
        """
        if not isinstance(appends, Sequence) or not all(isinstance(a, ChunkAppend) for a in appends):
            raise InvalidArgument(f"write_together takes a sequence of ChunkAppend, got {appends!r:.80}")
        names = [a.handle.name for a in appends if isinstance(a.handle, ChunkHandle)]
        if len(set(names)) != len(names):
            raise InvalidArgument("write_together's appends must name distinct chunks")
        checked: builtins.list[ChunkAppend] = []
        outcomes: builtins.list[int | Exception | None] = []
        for append in appends:
            try:
                check_handle(append.handle)
                payload = as_bytes(append.data)
                check_range(append.handle.name, append.offset, len(payload))
                check_writable(append.handle, self.url)
            except SltsError as error:
                outcomes.append(error)
                continue
            checked.append(ChunkAppend(append.handle, append.offset, payload))
            outcomes.append(None)
        done = iter(self._do_write_together(checked) if checked else ())
        results = [next(done) if outcome is None else outcome for outcome in outcomes]
        assert next(done, None) is None, "one result per checked append"
        return results

    def list(self, prefix: str = "") -> Iterator[str]:
        """Names of the chunks that start with ``prefix``, in ascending order (nothing
        for a prefix no valid name can start with)."""
        if not names_can_start_with(prefix):
            return iter(())
        return self._do_list(prefix)

    # -- optional ---------------------------------------------------------------------------

    def concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        """Create chunk ``target`` whose bytes are the given source ranges, in order.

        Sources are left untouched. Exclusive and durable like ``create``. Raises
        ``UnsupportedOperation`` without ``supports_concat``, ``ChunkExists`` for an
        existing target, ``ChunkNotFound`` for a missing source, ``ChunkInvalidOffset``
        for no sources or a range past a source's end.
        """
        if not self.supports_concat:
            raise self._unsupported("has no native concat")
        check_name(target)
        check_concat_sources(sources)
        return self._do_concat(target, sources)

    def concat_bytes_through_client(self, sources: Sequence[ConcatSource]) -> int:
        """How many bytes a ``concat`` of ``sources`` would read and send through this
        process (the rest the storage copies itself). 0 unless a binding says otherwise."""
        return 0

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        """Shorten the chunk to ``length`` bytes (``length`` <= current length).

        ``UnsupportedOperation`` without ``supports_truncate``; ``ChunkInvalidOffset``,
        ``ChunkReadOnly`` (read-only handle or chunk), ``ChunkNotFound``.
        """
        if not self.supports_truncate:
            raise self._unsupported("cannot truncate")
        check_range(check_handle(handle).name, 0, length)
        check_writable(handle, self.url)
        self._do_truncate(handle, length)

    def set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        """Make the chunk read-only (or writable again). ``UnsupportedOperation`` without
        ``supports_readonly``; ``ChunkNotFound``."""
        if not self.supports_readonly:
            raise self._unsupported("cannot change read-only state")
        self._do_set_readonly(check_handle(handle), readonly)

    def around_caches(self) -> ChunkStorage:
        """This binding with every local copy of chunk bytes taken out of its reads (a
        chunk cache): what answers is the storage itself. For reads that must prove what
        the storage holds, such as the check of the metadata's durable copy (a copy on
        local disk proves nothing about the loss of the machine), and for one-pass scans
        that would only push a cache's working set out. ``self`` where nothing is cached;
        the result shares this binding's resources (closing it is closing this one)."""
        return self

    def close(self) -> None:  # noqa: B027 - a binding without resources need not override it
        """Release resources. Idempotent."""

    def __enter__(self) -> ChunkStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- hooks: what a binding implements (arguments already checked, see the class doc) ---

    @abc.abstractmethod
    def _do_exists(self, name: str) -> bool:
        """``exists`` on a valid name."""

    @abc.abstractmethod
    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        """``create`` on a valid name; ``data`` is ``bytes``."""

    @abc.abstractmethod
    def _do_delete(self, handle: ChunkHandle) -> None:
        """``delete`` of a ``ChunkHandle``."""

    @abc.abstractmethod
    def _do_open_read(self, name: str) -> ChunkHandle:
        """``open_read`` on a valid name."""

    @abc.abstractmethod
    def _do_open_write(self, name: str) -> ChunkHandle:
        """``open_write`` on a valid name (the hook checks the chunk's read-only state)."""

    @abc.abstractmethod
    def _do_get_info(self, name: str) -> ChunkInfo:
        """``get_info`` on a valid name."""

    @abc.abstractmethod
    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        """``read`` with integers ``offset, length >= 0`` (the hook checks the chunk's end)."""

    def _do_read_view(self, handle: ChunkHandle, offset: int, length: int) -> memoryview:
        """``read_view`` with integers ``offset, length >= 0``: by default a view of ``_do_read``'s bytes."""
        return memoryview(self._do_read(handle, offset, length))

    def _do_read_into(self, handle: ChunkHandle, offset: int, view: memoryview) -> int:
        """``read_into`` with an integer ``offset >= 0`` and a writable byte view: by
        default ``_do_read``'s bytes copied into it."""
        data = self._do_read(handle, offset, len(view))
        view[: len(data)] = data
        return len(data)

    @abc.abstractmethod
    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        """``write`` through a writable handle, ``offset >= 0``, ``data`` as ``bytes``.

        The hook checks the offset against the chunk's length, the chunk's read-only
        state and ``supports_append``."""

    def _do_write_together(self, appends: Sequence[ChunkAppend]) -> builtins.list[int | Exception]:
        """``write_together`` with checked appends to distinct chunks: by default one
        ``_do_write`` after the other, each durable on its own."""
        results: builtins.list[int | Exception] = []
        for append in appends:
            try:
                results.append(self._do_write(append.handle, append.offset, append.data))
            except SltsError as error:
                results.append(error)
        return results

    @abc.abstractmethod
    def _do_list(self, prefix: str) -> Iterator[str]:
        """``list`` for a prefix some valid name can start with."""

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        """``concat`` with ``supports_concat`` on, a valid target and at least one valid source."""
        raise self._unsupported("has no native concat")

    def _do_truncate(self, handle: ChunkHandle, length: int) -> None:
        """``truncate`` with ``supports_truncate`` on, through a writable handle, ``length >= 0``."""
        raise self._unsupported("cannot truncate")

    def _do_set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        """``set_readonly`` with ``supports_readonly`` on."""
        raise self._unsupported("cannot change read-only state")

    def _unsupported(self, what: str) -> UnsupportedOperation:
        return UnsupportedOperation(f"{type(self).__name__} {what}", binding=self.url)


class WrappedChunkStorage(ChunkStorage):
    """A binding that wraps another (fault injection, metering and rate limiting): the
    inner binding's URL, capability flags, request observer, ``close`` and
    ``concat_bytes_through_client``.
    Subclasses implement the ``_do_*`` hooks, calling ``inner`` (which checks its
    arguments again)."""

    def __init__(self, inner: ChunkStorage) -> None:
        self.inner = inner
        self.url = inner.url
        self.supports_append = inner.supports_append
        self.supports_concat = inner.supports_concat
        self.supports_truncate = inner.supports_truncate
        self.supports_readonly = inner.supports_readonly
        self.high_latency_reads = inner.high_latency_reads
        self.maps_reads = inner.maps_reads
        self.holds_locally = inner.holds_locally
        self.checks_as_it_reads = inner.checks_as_it_reads
        self.counts_own_requests = inner.counts_own_requests

    def observe_requests(self, observer: RequestObserver | None) -> None:
        self.inner.observe_requests(observer)

    def around_caches(self) -> ChunkStorage:
        """``self`` if nothing below caches; else this wrapper around the inner binding's
        ``around_caches`` (a shallow copy: faults, meters and limits are this wrapper's,
        the capability flags the new inner binding's)."""
        inner = self.inner.around_caches()
        if inner is self.inner:
            return self
        around = copy.copy(self)
        WrappedChunkStorage.__init__(around, inner)
        return around

    def _do_holds(self, name: str, offset: int, length: int) -> bool:
        return self.inner.holds(name, offset, length)

    def _do_distrust(self, name: str, offset: int, length: int) -> bool:
        return self.inner.distrust(name, offset, length)

    def concat_bytes_through_client(self, sources: Sequence[ConcatSource]) -> int:
        return self.inner.concat_bytes_through_client(sources)

    def close(self) -> None:
        self.inner.close()


# -- argument checks shared by every binding ---------------------------------------------------


def _check_checked_read(what: str, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes) -> None:
    """``read_into_checked``'s argument checks (``what``: the method, for the message)."""
    if not isinstance(view, memoryview) or view.readonly or view.itemsize != 1 or view.ndim != 1:
        raise InvalidArgument(f"{what} needs a writable one-dimensional byte memoryview, got {view!r:.80}")
    covered = checked_reads.covered(blocks)
    if covered != len(view):
        raise InvalidArgument(
            f"{what} needs the (length, crc32c) pairs of {len(view)} bytes, got"
            f" {blocks!r:.40}" + ("" if covered is None else f" covering {covered}")
        )
    check_range(check_handle(handle).name, offset, len(view))


def check_name(name: str) -> str:
    """Return ``name`` if a binding must accept it, else raise ``ChunkNameInvalid``."""
    if type(name) is str and name.isascii() and 0 < len(name) <= CHUNK_NAME_BYTES_MAX and "\x00" not in name:
        return name  # the common case, without encoding it (ASCII: one byte a character)
    if not isinstance(name, str) or not name:
        raise ChunkNameInvalid(f"chunk name must be a non-empty string, got {name!r}", chunk=name)
    if "\x00" in name:
        raise ChunkNameInvalid(f"chunk name contains NUL: {name!r}", chunk=name)
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates: no object store or HDFS takes them
        raise ChunkNameInvalid(f"chunk name is not valid Unicode text: {name!r}", chunk=name) from exc
    if len(encoded) > CHUNK_NAME_BYTES_MAX:
        raise ChunkNameInvalid(
            f"chunk name is longer than {CHUNK_NAME_BYTES_MAX} bytes", chunk=name[:80] + "..."
        )
    return name


def names_can_start_with(prefix: str) -> bool:
    """False if no valid chunk name starts with ``prefix`` (``list`` then returns nothing
    without asking the storage): a non-string, a NUL, lone surrogates or too many bytes."""
    if not isinstance(prefix, str) or "\x00" in prefix:
        return False
    try:
        return len(prefix.encode("utf-8")) <= CHUNK_NAME_BYTES_MAX
    except UnicodeEncodeError:
        return False


def check_range(name: str, offset: int, length: int) -> None:
    """Reject negative or non-integer (``bool`` included) offsets and lengths with
    ``ChunkInvalidOffset``."""
    if not (type(offset) is int and type(length) is int and offset >= 0 and length >= 0) and not (
        isinstance(offset, int)
        and isinstance(length, int)  # int subclasses (not bool) are fine
        and not isinstance(offset, bool)
        and not isinstance(length, bool)
        and offset >= 0
        and length >= 0
    ):
        raise ChunkInvalidOffset(
            f"chunk {name!r}: offset and length must be integers >= 0, got {offset!r}, {length!r}",
            chunk=name,
            offset=offset,
        )


def check_concat_sources(sources: Sequence[ConcatSource]) -> None:
    """Every concat needs at least one source with a valid range."""
    if not sources:
        raise ChunkInvalidOffset("concat needs at least one source")
    for source in sources:
        check_name(source.name)
        check_range(source.name, source.offset, source.length)


def check_handle(handle: ChunkHandle) -> ChunkHandle:
    """Return ``handle`` if it is a ``ChunkHandle`` with a valid name; else raise
    ``InvalidArgument`` (not a handle) or ``ChunkNameInvalid`` (a hand-built one)."""
    if not isinstance(handle, ChunkHandle):
        raise InvalidArgument(f"expected a ChunkHandle, got {type(handle).__name__}: {handle!r:.80}")
    check_name(handle.name)
    return handle


def check_writable(handle: ChunkHandle, binding: str) -> None:
    """Refuse a change through a read-only handle with ``ChunkReadOnly``."""
    if handle.readonly:
        raise ChunkReadOnly(f"handle to {handle.name!r} is read-only", chunk=handle.name, binding=binding)


def as_bytes(data: bytes) -> bytes:
    """``data`` as ``bytes``: itself if it is ``bytes``, else a copy of any bytes-like object
    (``bytearray``, ``memoryview``...: the caller may reuse its buffer). ``InvalidArgument``
    for anything else (``str``, ``int``, ``None``, a list of ints, a released memoryview)."""
    if type(data) is bytes:
        return data
    try:
        view = memoryview(data)
        with view:
            return view.tobytes()
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"chunk data must be bytes-like, got {type(data).__name__}: {exc}") from None
