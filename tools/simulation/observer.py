"""Readers beside the owner's changes: the simulator's ``observe`` step.

A read-only instance (another process in the real system: its own cache, binding and
locks) reads a segment while the owner changes its layout. Threads would make the
interleaving an accident of the schedule; here it is drawn from the seed instead: the
reader's metadata store is an ``InterleavingStore``, which pauses the reader at its n-th
read of the metadata (inside a snapshot as well as between reads), runs one owner change
to its end on another thread, and lets the reader go on. So a walk, a lookup or a check
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

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from slts.metadata.delegating import DelegatingStore
from slts.metadata.records import SegmentRecord
from slts.metadata.schema import SEGMENTS, name_key
from slts.metadata.store import Expect, MetadataStore, Operation, ReadView, Versioned
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

    def record(self, ops: Sequence[Operation], expect: Sequence[Expect]) -> None:
        current = layout_of(self.store, self.name)
        if current != self.seen[-1]:
            self.seen.append(current)

    def finish(self) -> None:
        self.record((), ())

    def lists(self) -> list[tuple[tuple[int, str, int], ...] | None]:
        return [None if layout is None else layout[2] for layout in self.seen]


class InterleavingStore(DelegatingStore):
    """``inner`` whose ``pause_at``-th read (counted over every view read) first runs an
    action to its end on another thread (so it may commit while this thread holds a
    snapshot open), once. Deterministic: this thread waits for it."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner)
        self._countdown = 0
        self._action: Callable[[], None] | None = None
        self.error: BaseException | None = None

    def pause_at(self, nth: int, action: Callable[[], None]) -> None:
        assert nth >= 1, nth
        self._countdown, self._action = nth, action

    def run_pending(self) -> None:
        """Run the action now if the reader did not reach its read (it did fewer)."""
        if self._action is not None:
            self._run()

    def _tick(self) -> None:
        if self._action is None:
            return
        self._countdown -= 1
        if self._countdown <= 0:
            self._run()

    def _run(self) -> None:
        action, self._action = self._action, None
        assert action is not None

        def run() -> None:
            try:
                action()
            except BaseException as exc:  # noqa: BLE001 - handed to the step, which raises it
                self.error = exc

        thread = threading.Thread(target=run, name="simulated-owner")
        thread.start()
        thread.join()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[ReadView]:
        with self.inner.snapshot() as view:
            yield _PausingView(view, self._tick)


class _PausingView(ReadView):
    """A view whose reads call ``tick`` first."""

    def __init__(self, view: ReadView, tick: Callable[[], None]) -> None:
        self._view, self._tick = view, tick

    @property
    def sequence(self) -> int:
        return self._view.sequence

    def get(self, table: str, key: bytes) -> Versioned | None:
        self._tick()
        return self._view.get(table, key)

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        self._tick()
        return self._view.floor(table, key, lowest)

    def scan(
        self,
        table: str,
        start: bytes = b"",
        stop: bytes | None = None,
        limit: int = 1000,
        reverse: bool = False,
    ) -> list[tuple[bytes, Versioned]]:
        self._tick()
        return self._view.scan(table, start, stop, limit, reverse)

    def count(self, table: str) -> int:
        self._tick()
        return self._view.count(table)
