"""The store's identity: what ties a metadata store to the chunk storage it describes.

Nothing else does: a container id is a small number every store has, so store A's
metadata folder opened over store B's chunk storage would start A's epoch on B, write
it into B's system journal, fence B's owner, and let the orphan reconciler take B's
chunks for A's garbage. So every store carries a random identity (a UUID, hex), kept
on both sides: in the metadata (``container`` table, key ``IDENTITY_KEY``) and as a
small object on the chunk storage (``names.identity_object``). ``settle`` compares them
before the container's epoch is written; a mismatch is ``StoreMismatch`` and nothing
has been written.

A store made before identities existed adopts one on its first owner start, in an order
that a crash at any point leaves resumable and never binds two stores together:

1. the metadata records the new identity as *pending* (a conditional commit: two
   starting owners agree on one);
2. the object is created on the chunk storage (exclusive create);
3. the metadata marks the identity *confirmed*.

States on open (metadata / chunk storage):

* confirmed X / X: the same store. Confirmed X / none or Y: ``StoreMismatch``.
* pending X / none: step 2 was not done yet: do it (an owner), or say nothing (read-only).
  Pending X / X: step 3 was not done yet: do it. Pending X / Y: ``StoreMismatch``.
* none / Y: a metadata folder that never saw this chunk storage (a new folder, or
  another store's): ``StoreMismatch``, pointing at ``slts restore``, which rebuilds the
  metadata from tier-2 and carries the identity over (``carry_over``).
* none / none: a new store, or one made before identities: adopt (steps 1-3).

Read-only instances check and never write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from slts.bindings.base import ChunkStorage
from slts.journal.system_names import identity_object

from slts.chunk_names import unique_hex
from slts.errors import ChunkExists, ChunkNotFound, MetadataCorrupted, StoreMismatch, VersionConflict
from slts.metadata.records import _EMPTY, Record
from slts.metadata.schema import CONTAINER
from slts.metadata.store import Expect, MetadataStore, Put

IDENTITY_KEY = b"identity"
_ATTEMPTS_MAX = 8
_IDENTITY_BYTES_MAX = 64


@dataclass(frozen=True, slots=True)
class IdentityRecord(Record):
    """The store's identity as the metadata records it (``pending`` until step 3)."""

    KIND: ClassVar[str] = "identity"

    store_id: str
    confirmed: bool
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def check(self) -> None:
        assert isinstance(self.store_id, str) and 0 < len(self.store_id) <= _IDENTITY_BYTES_MAX, self
        assert self.store_id.isascii() and self.store_id.isalnum(), self


def storage_identity(binding: ChunkStorage, container_id: int) -> str | None:
    """The identity recorded on the chunk storage (None: none recorded)."""
    name = identity_object(container_id)
    try:
        handle = binding.open_read(name)
        raw = binding.read(handle, 0, _IDENTITY_BYTES_MAX + 1)
    except ChunkNotFound:
        return None
    text = raw.decode("ascii", errors="replace")
    if not 0 < len(raw) <= _IDENTITY_BYTES_MAX or not (text.isascii() and text.isalnum()):
        raise MetadataCorrupted(f"the store identity object {name!r} is damaged ({raw[:20]!r})", chunk=name)
    return text


def settle(
    store: MetadataStore,
    binding: ChunkStorage,
    container_id: int,
    *,
    read_only: bool,
    new_id: Callable[[], str] = unique_hex,
) -> str | None:
    """Check that ``store`` and ``binding`` belong to the same store (see module doc),
    adopting an identity for a store that has none unless ``read_only``. Returns the
    identity (None: a read-only look at a store that has none yet). Raises
    ``StoreMismatch`` (nothing written), ``MetadataCorrupted``, ``ChunkStorageError``."""
    for _ in range(_ATTEMPTS_MAX):
        stored = store.get(CONTAINER, IDENTITY_KEY)
        recorded = IdentityRecord.decode(stored.value) if stored else None
        on_storage = storage_identity(binding, container_id)
        if recorded is None:
            if on_storage is not None:
                raise StoreMismatch(
                    f"this metadata store does not belong to the chunk storage {binding.url or binding!r} "
                    f"(container {container_id}, store {on_storage}); to rebuild the metadata of that store "
                    "from the chunk storage, use `slts restore`",
                    store=on_storage,
                )
            if read_only:
                return None
            try:
                store.commit([_put(IdentityRecord(new_id(), False))], [Expect(CONTAINER, IDENTITY_KEY, 0)])
            except VersionConflict:
                pass  # another owner started at the same moment: decide again
            continue
        if on_storage is not None and on_storage != recorded.store_id:
            raise StoreMismatch(
                f"this metadata store belongs to store {recorded.store_id}, but the chunk storage "
                f"{binding.url or binding!r} to store {on_storage} (container {container_id})",
                store=recorded.store_id,
            )
        if recorded.confirmed:
            if on_storage is None:
                raise StoreMismatch(
                    f"this metadata store belongs to store {recorded.store_id}, but the chunk storage "
                    f"{binding.url or binding!r} holds no store identity (container {container_id}): "
                    "another (or an emptied) chunk storage",
                    store=recorded.store_id,
                )
            return recorded.store_id
        if read_only:
            return on_storage
        if on_storage is None:
            try:
                binding.create(identity_object(container_id), recorded.store_id.encode("ascii"))
            except ChunkExists:
                pass  # created meanwhile: compare again
            continue
        assert stored is not None  # recorded was decoded from it
        try:
            store.commit(
                [_put(recorded.replace(confirmed=True))], [Expect(CONTAINER, IDENTITY_KEY, stored.version)]
            )
        except VersionConflict:
            continue
        return recorded.store_id
    raise StoreMismatch(f"container {container_id}: could not settle the store identity (start contention)")


def carry_over(binding: ChunkStorage, container_id: int, target: MetadataStore, sequence: int) -> str | None:
    """For a restore into ``target`` (at ``sequence``): record the chunk storage's identity
    as confirmed (the restored metadata describes that store), whatever the copy held.
    Returns it (None: the store has none yet)."""
    on_storage = storage_identity(binding, container_id)
    if on_storage is not None:
        target.replicate(sequence + 1, [_put(IdentityRecord(on_storage, True))])
    return on_storage


def _put(record: IdentityRecord) -> Put:
    return Put(CONTAINER, IDENTITY_KEY, record.encode())
