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
* **One error vocabulary.** Backend failures leave a binding only as the typed errors
  of ``slts.errors`` (``ChunkNotFound``, ``ChunkExists``, ``ChunkInvalidOffset``,
  ``StorageUnavailable``...), translated at one place per binding.
* **Thread safety.** Every method may be called from many threads at once.

Optional operations are announced by capability flags; calling one whose flag is off
raises ``UnsupportedOperation``. Callers branch on the flag, never on the class.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from slts.errors import ChunkInvalidOffset, ChunkNameInvalid, UnsupportedOperation

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


@dataclass(frozen=True, slots=True)
class ConcatSource:
    """``length`` bytes of chunk ``name`` starting at ``offset``, as one piece of a concat."""

    name: str
    offset: int
    length: int


class ChunkStorage(abc.ABC):
    """Abstract chunk storage. Subclasses implement the ``_do_*`` hooks or override methods.

    The public methods validate arguments once, here, so that every binding rejects the
    same bad input with the same error.
    """

    #: The binding can append to an existing chunk (``write`` at its end).
    supports_append: bool = False
    #: ``concat`` builds a new chunk from ranges of others on the storage side.
    supports_concat: bool = False
    #: ``truncate`` shortens a chunk in place.
    supports_truncate: bool = False
    #: ``set_readonly`` is available.
    supports_readonly: bool = False

    #: The URL this binding was built from; executors rebuild the binding from it.
    url: str = ""

    # -- required -------------------------------------------------------------------------

    @abc.abstractmethod
    def exists(self, name: str) -> bool:
        """True if a chunk named ``name`` exists."""

    @abc.abstractmethod
    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        """Create chunk ``name`` holding exactly ``data``, atomically and durably.

        Raises ``ChunkExists`` if the name is taken (even by a half-written chunk),
        ``ChunkNameInvalid`` if the binding cannot store the name.
        Returns a writable handle.
        """

    @abc.abstractmethod
    def delete(self, handle: ChunkHandle) -> None:
        """Delete the chunk. Raises ``ChunkNotFound`` if it does not exist."""

    @abc.abstractmethod
    def open_read(self, name: str) -> ChunkHandle:
        """A read-only handle to an existing chunk; ``ChunkNotFound`` otherwise."""

    @abc.abstractmethod
    def open_write(self, name: str) -> ChunkHandle:
        """A writable handle to an existing chunk; ``ChunkNotFound`` or ``ChunkReadOnly``."""

    @abc.abstractmethod
    def get_info(self, name: str) -> ChunkInfo:
        """Name and current length on storage; ``ChunkNotFound`` if missing."""

    @abc.abstractmethod
    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` clipped at the chunk's end (see module doc)."""

    @abc.abstractmethod
    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        """Append ``data`` at ``offset`` (== current length), durably; returns ``len(data)``."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """Names of the chunks that start with ``prefix``, in ascending order."""

    # -- optional ---------------------------------------------------------------------------

    def concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        """Create chunk ``target`` whose bytes are the given source ranges, in order.

        Sources are left untouched. Exclusive and durable like ``create``. Raises
        ``ChunkExists`` for an existing target, ``ChunkNotFound`` for a missing source,
        ``ChunkInvalidOffset`` for a range past a source's end.
        """
        raise UnsupportedOperation(f"{type(self).__name__} has no native concat", binding=self.url)

    def concat_bytes_through_client(self, sources: Sequence[ConcatSource]) -> int:
        """How many bytes a ``concat`` of ``sources`` would read and send through this
        process (the rest the storage copies itself). 0 unless a binding says otherwise."""
        return 0

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        """Shorten the chunk to ``length`` bytes (``length`` <= current length)."""
        raise UnsupportedOperation(f"{type(self).__name__} cannot truncate", binding=self.url)

    def set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        """Make the chunk read-only (or writable again)."""
        raise UnsupportedOperation(f"{type(self).__name__} cannot change read-only state", binding=self.url)

    def close(self) -> None:  # noqa: B027 - a binding without resources need not override it
        """Release resources. Idempotent."""

    def __enter__(self) -> ChunkStorage:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


# -- argument checks shared by every binding ---------------------------------------------------


def check_name(name: str) -> str:
    """Return ``name`` if a binding must accept it, else raise ``ChunkNameInvalid``."""
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
    """Reject negative or non-integer offsets and lengths with ``ChunkInvalidOffset``."""
    if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0:
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
