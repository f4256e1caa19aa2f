"""Data keys of a store's encrypted chunks: which key-encryption keys wrap them, and their
re-wrapping under the key ring's active key after a rotation (docs/security.md, "Rotation").

``rewrap`` changes chunk records only, never stored bytes: each data key wrapped by another
key is unwrapped and wrapped again by the active one. Fenced like every change (a
conditional commit per batch of records, through the instance's ownership: a newer owner
makes it raise ``Fenced``; a record that changed meanwhile is re-read and retried).
Resumable: a record already under the active key is left alone, so a rewrap may be stopped
and run again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from slts.errors import InvalidConfig, VersionConflict
from slts.metadata.records import ChunkRecord
from slts.metadata.schema import CHUNKS
from slts.metadata.store import Expect, Put, scan_all
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import KeyRing, WrappedKey

#: Chunk records one rewrap commit changes.
BATCH_DEFAULT = 256


@dataclass(frozen=True, slots=True)
class RewrapReport:
    """What a rewrap did: chunk records with data keys seen, those changed, the data keys
    re-wrapped, and the active key they are wrapped by now."""

    chunks_seen: int
    chunks_changed: int
    keys_rewrapped: int
    active: str


def key_usage(storage: ChunkedSegmentStorage) -> Counter[str]:
    """How many data keys each key-encryption key wraps in the store (chunk records)."""
    usage: Counter[str] = Counter()
    with storage.context.store.snapshot() as view:
        for _, stored in scan_all(view, CHUNKS):
            for key in ChunkRecord.decode(stored.value).data_keys or ():
                usage[key[0]] += 1
    return usage


def rewrap(
    storage: ChunkedSegmentStorage,
    key_ring: KeyRing,
    *,
    batch: int = BATCH_DEFAULT,
    progress: Callable[[int], None] | None = None,
) -> RewrapReport:
    """Re-wrap every data key of ``storage``'s chunk records that another key wraps under
    ``key_ring``'s active key (module doc). ``KeyUnavailable`` (naming the key) if a data
    key's key is not in the ring: nothing of that batch changes. ``progress`` gets the
    records seen so far after each batch."""
    if storage.read_only:
        raise InvalidConfig("rewrap changes records: open the store read-write")
    active = key_ring.active_id()
    seen = changed = rewrapped = 0
    start = b""
    while True:
        with storage.context.store.snapshot() as view:
            page = view.scan(CHUNKS, start, None, limit=batch)
        if not page:
            break
        start = page[-1][0] + b"\x00"
        keys = [key for key, _ in page]
        for _ in range(3):
            try:
                done = _rewrap_batch(storage, key_ring, active, keys)
                break
            except VersionConflict:  # a record of the batch changed meanwhile: read them again
                continue
        else:
            raise VersionConflict("rewrap: the chunk records of a batch kept changing; run it again")
        seen += done[0]
        changed += done[1]
        rewrapped += done[2]
        if progress is not None:
            progress(seen)
    return RewrapReport(seen, changed, rewrapped, active)


def _rewrap_batch(
    storage: ChunkedSegmentStorage, key_ring: KeyRing, active: str, keys: list[bytes]
) -> tuple[int, int, int]:
    """Rewrap the records at ``keys`` as they are now, in one conditional commit."""
    ops: list[Put] = []
    expect: list[Expect] = []
    seen = rewrapped = 0
    with storage.context.store.snapshot() as view:
        rows = [(key, view.get(CHUNKS, key)) for key in keys]
    for key, stored in rows:
        if stored is None:
            continue  # gone since the page was read (GC)
        record = ChunkRecord.decode(stored.value)
        if not record.data_keys:
            continue
        seen += 1
        if all(wrapped[0] == active for wrapped in record.data_keys):
            continue
        fresh = []
        for key_id, blob, origin in record.data_keys:
            if key_id == active:
                fresh.append((key_id, blob, origin))
                continue
            data_key = key_ring.unwrap(WrappedKey(key_id, blob))
            wrapped = key_ring.wrap(data_key, active)
            fresh.append((wrapped.key_id, wrapped.blob, origin))
            rewrapped += 1
        ops.append(Put(CHUNKS, key, record.replace(data_keys=tuple(fresh)).encode()))
        expect.append(Expect(CHUNKS, key, stored.version))
    if ops:
        storage.context.ownership.commit(ops, expect)
    return seen, len(ops), rewrapped
