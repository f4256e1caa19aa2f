"""The container's epoch lease, and the one gate every metadata change goes through.

Starting an instance records its epoch in the container record; the epoch must be
greater than any recorded before (``Fenced`` otherwise). From then on every commit of
this instance also expects the container record at the version this instance wrote.
When a newer instance starts it rewrites that record, so every later commit of the
older instance fails; ``commit`` turns that failure into ``Fenced`` and the instance
stays fenced for good (DESIGN.md §5 invariant 4; PDP-34 "Segment Store Failover").
``discard_changes`` trims the store's change log under the same expectation, so a fenced
instance's copy on tier-2 trims nothing either. Nothing else of an owner writes to the
store (docs/architecture.md, "Ownership and fencing", lists every path).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from slts.errors import Fenced, InvalidArgument, InvalidConfig, ReadOnlyInstance, VersionConflict
from slts.metadata.records import ContainerRecord
from slts.metadata.schema import CONTAINER, CONTAINER_KEY
from slts.metadata.store import CommitOp, Expect, MetadataStore, Put, Versioned

_START_ATTEMPTS_MAX = 8
#: Largest epoch (and container id): chunk names and segment ids carry them.
EPOCH_MAX = (1 << 31) - 1


class Ownership:
    """Holds the lease of ``container_id`` for one epoch."""

    read_only = False

    def __init__(
        self,
        store: MetadataStore,
        container_id: int,
        epoch: int | None,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self.container_id = container_id
        self._lock = threading.Lock()
        self.fenced = False
        for _ in range(_START_ATTEMPTS_MAX):
            current, recorded = _container_record(store, container_id)
            recorded_epoch = recorded.epoch if recorded else 0
            chosen = recorded_epoch + 1 if epoch is None else epoch
            if chosen > EPOCH_MAX:  # checked before the commit: a rejected epoch fences nobody
                raise InvalidArgument(
                    f"container {container_id}: epoch {chosen} is past the largest, {EPOCH_MAX}"
                )
            if chosen <= recorded_epoch:
                raise Fenced(
                    f"container {container_id} was started with epoch {recorded_epoch}; "
                    f"epoch {chosen} is not newer",
                    container=container_id,
                    epoch=chosen,
                )
            record = ContainerRecord(container_id, chosen, int(clock() * 1000))
            try:
                self.version = store.commit(
                    [Put(CONTAINER, CONTAINER_KEY, record.encode())],
                    [Expect(CONTAINER, CONTAINER_KEY, current.version if current else 0)],
                )
            except VersionConflict:
                continue  # another instance started at the same moment: decide again
            self.epoch = chosen
            return
        raise Fenced(f"container {container_id}: could not record an epoch (start contention)")

    def check(self) -> None:
        """Raise ``Fenced`` if a newer epoch has taken the container (reads the store)."""
        if self.fenced:
            raise self._fenced_error(None)
        with self._store.snapshot() as view:
            current = view.get(CONTAINER, CONTAINER_KEY)
        if current is None or current.version != self.version:
            self.fenced = True
            owner = ContainerRecord.decode(current.value).epoch if current else None
            raise self._fenced_error(owner)

    def _fenced_error(self, owner_epoch: int | None) -> Fenced:
        owner = f" (now owned by epoch {owner_epoch})" if owner_epoch is not None else ""
        return Fenced(
            f"container {self.container_id}: epoch {self.epoch} was fenced by a newer instance{owner}",
            container=self.container_id,
            epoch=self.epoch,
        )

    def commit(self, ops: Sequence[CommitOp], expect: Sequence[Expect] = ()) -> int:
        """Commit ``ops`` if ``expect`` holds and this instance still owns the container.

        Raises ``Fenced`` if it does not (nothing applied), ``VersionConflict`` if only
        ``expect`` failed.
        """
        if self.fenced:
            raise self._fenced_error(None)
        fence = Expect(CONTAINER, CONTAINER_KEY, self.version)
        try:
            return self._store.commit(ops, [*expect, fence])
        except VersionConflict:
            self.check()
            raise

    def discard_changes(self, through: int) -> int:
        """The store's ``discard_changes(through)`` if this instance still owns the
        container, checked in the same transaction. Raises ``Fenced`` if it does not
        (nothing removed); returns how many changes were removed."""
        if self.fenced:
            raise self._fenced_error(None)
        fence = Expect(CONTAINER, CONTAINER_KEY, self.version)
        try:
            return self._store.discard_changes(through, [fence])
        except VersionConflict:
            self.check()
            raise


class ReadOnlyOwnership:
    """The stand-in for ``Ownership`` of an instance that observes without owning.

    It records no epoch (so it fences nobody) and refuses every commit with
    ``ReadOnlyInstance``. ``epoch`` is the recorded owner's, for information only.
    """

    read_only = True
    fenced = False

    def __init__(self, store: MetadataStore, container_id: int) -> None:
        _, recorded = _container_record(store, container_id)
        self.container_id = container_id
        self.epoch = recorded.epoch if recorded else 0

    def check(self) -> None:
        """Nothing to check: a read-only instance cannot be fenced."""

    def commit(self, ops: Sequence[CommitOp], expect: Sequence[Expect] = ()) -> int:
        """Always ``ReadOnlyInstance``."""
        raise ReadOnlyInstance(f"container {self.container_id} was opened read-only")

    def discard_changes(self, through: int) -> int:
        """Always ``ReadOnlyInstance``."""
        raise ReadOnlyInstance(f"container {self.container_id} was opened read-only")


def _container_record(
    store: MetadataStore, container_id: int
) -> tuple[Versioned | None, ContainerRecord | None]:
    """The container record as stored and decoded (None, None: never started). Raises
    ``InvalidConfig`` if the store belongs to another container."""
    with store.snapshot() as view:
        current = view.get(CONTAINER, CONTAINER_KEY)
    recorded = ContainerRecord.decode(current.value) if current else None
    if recorded is not None and recorded.container_id != container_id:
        raise InvalidConfig(
            f"this metadata store belongs to container {recorded.container_id}, not {container_id}"
        )
    return current, recorded
