"""Every error SLTS raises on purpose, as one tree.

::

    SltsError
    ├── InvalidArgument (ValueError)          bad input; nothing was changed
    │   ├── InvalidName                       segment or chunk name not allowed
    │   ├── InvalidOffset (IndexError)        offset/length outside what the operation allows
    │   └── InvalidConfig                     a configuration value or URL is wrong
    │       ├── StoreNotFound (FileNotFoundError)   no store where one must already exist
    │       └── StoreMismatch                 the metadata and the chunk storage are two stores'
    ├── SegmentError                          the segment's state forbids the operation
    │   ├── SegmentNotFound (FileNotFoundError)
    │   ├── SegmentExists (FileExistsError)
    │   ├── SegmentSealed                     write to a sealed segment
    │   ├── SegmentNotSealed                  operation needs a sealed segment
    │   ├── SegmentTruncated                  read below the segment's start offset
    │   └── ConcatTooDeep                     a concat would nest index links past their limit
    ├── ChunkStorageError                     raised by a binding (``slts.bindings``)
    │   ├── ChunkNotFound (FileNotFoundError)
    │   ├── ChunkExists (FileExistsError)
    │   ├── ChunkInvalidOffset (IndexError)   write not at the chunk's end, read past it
    │   ├── ChunkReadOnly (PermissionError)
    │   ├── ChunkNameInvalid (ValueError)     the binding cannot store this name
    │   ├── ChunkCorrupted                    checksum mismatch: bytes are not the ones written
    │   ├── UnsupportedOperation (NotImplementedError)   capability flag is off
    │   └── StorageUnavailable                transient: retry may succeed (``retryable``)
    ├── MetadataError                         raised by a metadata store
    │   ├── VersionConflict                   a conditional commit lost: re-read and retry
    │   └── MetadataCorrupted                 a record failed its own checks on decode
    ├── WriteExpired (TimeoutError)           a write outlived ``gc_delay_s``; not applied (``retryable``)
    ├── RemoteLogError                        tiered log storage (``slts.remote``)
    │   ├── InvalidLogSegment (ValueError)    a log segment or index that does not parse or agree
    │   ├── RemoteSegmentNotFound (LookupError)   no remote log segment with that id
    │   ├── IllegalStateTransition            a remote segment's or partition's state may not change so
    │   └── RemoteOffsetOutOfRange (IndexError)   an offset below the earliest or above the latest remote one
    ├── OffloadError                          Pulsar-style ledger offload (``slts.offload``)
    │   ├── InvalidOffloadObject (ValueError) a data block or index object that does not parse
    │   ├── EntryTooLarge (InvalidArgument)   an entry larger than a block's payload
    │   ├── EntryOutOfOrder (InvalidArgument) an offered entry that does not follow the last one
    │   ├── OffloadNotFound (LookupError)     no offloaded ledger with that id and uid
    │   ├── EntryOutOfRange (IndexError)      a read outside [0, the ledger's last entry]
    │   └── OffloadHandleClosed (StorageClosed)   a read of an offloaded ledger's handle after its close
    ├── TransformError                        client-side compression and encryption (``slts.transforms``)
    │   └── KeyUnavailable (LookupError)      a key the data needs is missing or wrong (names its id)
    ├── Fenced                                a newer epoch owns the container
    ├── ReadOnlyInstance (PermissionError)    the instance was opened read-only
    ├── StorageClosed                         the instance (or store, binding) was closed
    └── InvariantViolated (AssertionError)    a bug caught before it returned wrong bytes

Rules: leaves inherit the matching builtin where the meaning matches, so callers that
think in builtins still work. Errors carry their context as attributes (``segment``,
``chunk``, ``offset``...). Bugs are ``AssertionError`` and are never caught; where a
bug would hand a caller wrong bytes (a read's length, its pieces), the check is an ``if``
that raises ``InvariantViolated``, so it holds under ``python -O`` too. Backend
exceptions are translated at one choke point per binding with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any


class SltsError(Exception):
    """Base of every error SLTS raises on purpose.

    Keyword arguments become attributes (context such as ``segment=`` or ``chunk=``)
    so that handlers need not parse messages.
    """

    retryable: bool = False

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context
        for key, value in context.items():
            setattr(self, key, value)


# --- bad input ---------------------------------------------------------------------------


class InvalidArgument(SltsError, ValueError):
    """An argument is malformed; the operation changed nothing."""


class InvalidName(InvalidArgument):
    """A segment name is empty, too long, contains NUL, ``..``, is absolute or reserved."""


class InvalidOffset(InvalidArgument, IndexError):
    """An offset or length is negative, not where the operation needs it, or past the end."""


class InvalidConfig(InvalidArgument):
    """A configuration value, or a storage URL, is not acceptable."""


class StoreNotFound(InvalidConfig, FileNotFoundError):
    """No metadata store (or chunk storage) where an existing one is required: a
    read-only look, a restore source. Nothing was created."""


class StoreMismatch(InvalidConfig):
    """The metadata store and the chunk storage carry different store identities (or
    one has none while the other has): they are not one store. Nothing was written."""


# --- segment state -----------------------------------------------------------------------


class SegmentError(SltsError):
    """The segment's state forbids the operation."""


class SegmentNotFound(SegmentError, FileNotFoundError):
    """No live segment has that name."""


class SegmentExists(SegmentError, FileExistsError):
    """A live segment already has that name."""


class SegmentSealed(SegmentError):
    """The segment is sealed: it accepts no writes until unsealed."""


class SegmentNotSealed(SegmentError):
    """The operation needs a sealed segment."""


class SegmentTruncated(SegmentError, IndexError):
    """The requested bytes lie below the segment's start offset and are gone."""


class ConcatTooDeep(SegmentError):
    """A concat would nest the target's index links deeper than a lookup follows
    (``slts.metadata.index.LINK_DEPTH_MAX``): refused, nothing changed."""


# --- chunk storage (bindings) --------------------------------------------------------------


class ChunkStorageError(SltsError):
    """A chunk storage binding failed. ``retryable`` says whether trying again may help."""


class ChunkNotFound(ChunkStorageError, FileNotFoundError):
    """The chunk does not exist on the chunk storage."""


class ChunkExists(ChunkStorageError, FileExistsError):
    """A chunk with that name exists already (creates are exclusive)."""


class ChunkInvalidOffset(ChunkStorageError, IndexError):
    """A write not at the chunk's current end, or a read starting past it."""


class ChunkReadOnly(ChunkStorageError, PermissionError):
    """The chunk, or the handle, is read-only."""


class ChunkNameInvalid(ChunkStorageError, ValueError):
    """The binding cannot store a chunk under this name."""


class ChunkCorrupted(ChunkStorageError):
    """The chunk's bytes do not match its recorded checksum or length."""


class UnsupportedOperation(ChunkStorageError, NotImplementedError):
    """The binding does not offer this optional operation (its capability flag is off)."""


class StorageUnavailable(ChunkStorageError):
    """The chunk storage could not be reached or answered with a transient failure."""

    retryable = True


# --- metadata store ----------------------------------------------------------------------


class MetadataError(SltsError):
    """A metadata store failed."""


class VersionConflict(MetadataError):
    """A conditional commit found a record at another version than expected.

    Nothing of the commit was applied. Re-read and decide again.
    """


class MetadataCorrupted(MetadataError):
    """A stored record failed its own validation when decoded."""


# --- ownership and life cycle --------------------------------------------------------------


class WriteExpired(SltsError, TimeoutError):
    """A write took longer than ``gc_delay_s`` from registering its new chunks to
    committing them, so the garbage collector took them for a dead writer's leftovers.

    The write was not applied: nothing of it is readable, the segment's length is
    unchanged, and its chunks are queued for collection. Writing the same bytes at the
    same offset again may succeed.
    """

    retryable = True


class RemoteLogError(SltsError):
    """Tiered log storage (``slts.remote``): errors of remote log segments and their metadata."""


class InvalidLogSegment(RemoteLogError, InvalidArgument):
    """A log segment, index or checkpoint that does not parse or disagrees with its log;
    the error names the partition, segment and byte position or offset. Nothing changed."""


class RemoteSegmentNotFound(RemoteLogError, LookupError):
    """No remote log segment (or partition) with that id is known."""


class IllegalStateTransition(RemoteLogError):
    """The state change is not one of the legal transitions; the state did not change."""


class RemoteOffsetOutOfRange(RemoteLogError, IndexError):
    """The offset is below the partition's earliest or above its latest remote offset."""


class OffloadError(SltsError):
    """Pulsar-style offload (``slts.offload``): errors of offloaded ledgers and their objects."""


class InvalidOffloadObject(OffloadError, ValueError):
    """A data block or index object whose bytes do not parse (wrong magic, impossible
    length, truncated); the error names the object and the byte offset."""


class EntryTooLarge(OffloadError, InvalidArgument):
    """An entry does not fit in one block's payload (Pulsar writes a block of padding and
    loses the rest of the ledger; SLTS refuses the offload). Nothing stored changed."""


class EntryOutOfOrder(OffloadError, InvalidArgument):
    """An entry offered to a streaming offload that does not follow the last one offered
    (a duplicate, a gap, or a ledger going back). Nothing was taken."""


class OffloadNotFound(OffloadError, LookupError):
    """No offloaded ledger with that ledger id and uid (never offloaded, or deleted)."""


class EntryOutOfRange(OffloadError, IndexError):
    """A read of entries outside ``[0, last entry id]`` of the ledger."""


# --- client-side transforms --------------------------------------------------------------


class TransformError(SltsError):
    """Client-side compression or encryption (``slts.transforms``) could not be applied."""


class KeyUnavailable(TransformError, LookupError):
    """A key the data needs is missing from the key ring, or is not the key that wrapped it
    (``key_id`` names it; key material never appears in the error)."""


class Fenced(SltsError):
    """A newer epoch owns the container: this instance may change nothing any more."""


class ReadOnlyInstance(SltsError, PermissionError):
    """The instance was opened read-only (it does not own the container) and changes nothing."""


class StorageClosed(SltsError):
    """The object was closed; no further operation is accepted."""


class OffloadHandleClosed(OffloadError, StorageClosed):
    """A read through an offloaded ledger's read handle after the handle was closed
    (Pulsar's handles refuse such reads too); open a new handle to read again."""


class InvariantViolated(SltsError, AssertionError):
    """An invariant the engine checks on every call failed (a bug, never bad input): the
    operation raised instead of returning what broke it, e.g. a read whose bytes are not
    the length asked for. Raised by an explicit check, so ``python -O`` keeps it."""
