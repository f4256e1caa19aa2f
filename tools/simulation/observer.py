"""Readers beside the owner's changes: the simulator's ``observe`` step.

A read-only instance (another process in the real system: its own cache, binding and
locks) reads a segment while the owner changes its layout; or the owner reads while a
defrag batch commits beside it. Threads would make the interleaving an accident of the
schedule; here it is drawn from the seed instead: an ``Interleaver`` pauses the reader at
its n-th read of the metadata (inside a snapshot as well as between reads: its
``FaultyMetadataStore``'s ``on_read``), runs the other process's change to its end on
another thread, and lets the reader go on. So a walk, a lookup or a check
is cut at a seeded point by a write, truncate, concat, delete, defrag, or a defrag and a
GC pass that collects the chunks the reader planned to read.

The oracle (``Layouts``): every commit of the owner during the change is recorded with
the segment's layout as it stood before it, and the layout after the change; a reader
must see one of those layouts, never a mix of two, and never report damage: ``chunks``
returns one of them, a read returns the bytes of the model before or after the change
(or the typed error one of those states explains), ``verify_segment`` finds nothing and
``scrub`` no anomaly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from slts.metadata.faulty_store import FaultyMetadataStore
from slts.metadata.records import SegmentRecord
from slts.metadata.schema import SEGMENTS, name_key
from slts.metadata.store import CommitOp, Expect, MetadataStore
from slts.storage.context import walk_chunks

#: A segment's layout as the oracle compares it: (start offset, length, ((chunk start,
#: chunk name, chunk length), ...)); None while the segment does not exist.
Layout = tuple[int, int, tuple[tuple[int, str, int], ...]] | None


def layout_of(store: MetadataStore, name: str) -> Layout:
    """Segment ``name``'s committed layout in ``store`` now (one snapshot)."""
    with store.snapshot() as view:
        stored = view.get(SEGMENTS, name_key(name))
        if stored is None:
            return None
        record = SegmentRecord.decode(stored.value)
        listed, problems = walk_chunks(view, record)
    assert not problems, problems  # a committed state is whole (the checks hold it)
    return record.start_offset, record.length, tuple((s, c.name, c.length) for s, c in listed)


class Layouts:
    """The layouts of one segment the owner committed during a change (see module doc):
    install ``record`` as the owner store's ``before_commit``, then ``finish``."""

    def __init__(self, store: MetadataStore, name: str) -> None:
        self.store, self.name = store, name
        self.seen: list[Layout] = [layout_of(store, name)]

    def record(self, ops: Sequence[CommitOp], expect: Sequence[Expect]) -> None:
        current = layout_of(self.store, self.name)
        if current != self.seen[-1]:
            self.seen.append(current)

    def finish(self) -> None:
        self.record((), ())

    def lists(self) -> list[tuple[tuple[int, str, int], ...] | None]:
        return [None if layout is None else layout[2] for layout in self.seen]


class Interleaver:
    """Pauses a process's reads of the metadata (its ``FaultyMetadataStore``'s
    ``on_read``, called before every read of a view, inside a snapshot too): at the
    ``nth`` read from ``pause_at`` on, ``action`` runs to its end on another thread (so it
    may commit while the reader holds a snapshot open), once. Deterministic: the reader's
    thread waits for it."""

    def __init__(self, store: FaultyMetadataStore) -> None:
        self._store = store
        self._countdown = 0
        self._action: Callable[[], None] | None = None
        self.error: BaseException | None = None

    def pause_at(self, nth: int, action: Callable[[], None]) -> None:
        assert nth >= 1 and self._store.on_read is None, nth
        self._countdown, self._action = nth, action
        self._store.on_read = self._read

    def run_pending(self) -> None:
        """Run the action now if the reader made fewer reads than ``nth``."""
        if self._action is not None:
            self._run()

    def _read(self, method: str, table: str, key: bytes) -> None:
        self._countdown -= 1
        if self._countdown <= 0 and self._action is not None:
            self._run()

    def _run(self) -> None:
        action, self._action = self._action, None
        self._store.on_read = None
        assert action is not None

        def run() -> None:
            try:
                action()
            except BaseException as exc:  # noqa: BLE001 - handed to the step, which raises it
                self.error = exc

        thread = threading.Thread(target=run, name="simulated-owner")
        thread.start()
        thread.join()
