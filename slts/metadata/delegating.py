"""``DelegatingStore``: a metadata store that forwards everything to ``inner``.

Wrappers that hook commits or reads (the simulator's fault-injecting store, test doubles)
subclass it and override only those, so they keep up with the store contract (change
capture, replicate) for free.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from slts.metadata.store import (
    Change,
    CommitOp,
    Expect,
    MetadataStore,
    Operation,
    ReadView,
    Row,
    StoreStatistics,
)


class DelegatingStore(MetadataStore):
    """Forwards every call to ``inner``."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner
        self.tables = inner.tables

    def snapshot(self) -> contextlib.AbstractContextManager[ReadView]:
        return self.inner.snapshot()

    def count(self, table: str) -> int:
        return self.inner.count(table)

    def commit(self, ops: Sequence[CommitOp], expect: Sequence[Expect] = ()) -> int:
        return self.inner.commit(ops, expect)

    @property
    def last_sequence(self) -> int:
        return self.inner.last_sequence

    @property
    def change_marker(self) -> object:
        return self.inner.change_marker

    def make_durable(self) -> None:
        self.inner.make_durable()

    def statistics(self) -> StoreStatistics:
        return self.inner.statistics()

    def close(self) -> None:
        self.inner.close()

    def enable_change_capture(self) -> None:
        self.inner.enable_change_capture()

    @property
    def change_capture_enabled(self) -> bool:
        return self.inner.change_capture_enabled

    def changes(self, after: int, limit: int = 1000) -> list[Change]:
        return self.inner.changes(after, limit)

    def encoded_changes(self, after: int, limit: int = 1000) -> list[tuple[int, bytes]]:
        return self.inner.encoded_changes(after, limit)

    def discard_changes(self, through: int, expect: Sequence[Expect] = ()) -> int:
        return self.inner.discard_changes(through, expect)

    def replicate(
        self, sequence: int, ops: Sequence[Operation], versions: Sequence[int] | None = None
    ) -> None:
        self.inner.replicate(sequence, ops, versions)

    def replicate_rows(self, sequence: int, rows: Mapping[str, Sequence[Row]]) -> None:
        self.inner.replicate_rows(sequence, rows)
