"""Every store against a plain-dict model, by a Hypothesis state machine.

Rules: conditional commits (puts, deletes and range deletes) whose expectations are
current, absent, stale or wrong (so both outcomes happen), reads (get, floor with a lower
bound, scan both ways with limits), and reopening (LMDB: close and open the folder again;
a cache: drop it). After every step the store's dump and last sequence equal the model's.
Runs are derandomized (replayable).
"""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from slts.errors import VersionConflict
from slts.metadata import (
    CachedMetadataStore,
    Delete,
    DeleteKeys,
    DeleteRange,
    Expect,
    LmdbMetadataStore,
    MemoryMetadataStore,
    MetadataStore,
    Put,
    Versioned,
)

TABLES = ("t0", "t1")
ALPHABET = [b"\x00", b"a", b"b", b"\xff"]  # few symbols: keys collide and share prefixes

tables = st.sampled_from(TABLES)
keys = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=3).map(b"".join)
bounds = st.lists(st.sampled_from(ALPHABET), min_size=0, max_size=4).map(b"".join)
values = st.binary(max_size=6)
ranges = st.builds(
    lambda table, pair: DeleteRange(table, *sorted(pair)),
    tables,
    st.tuples(bounds, bounds).filter(lambda pair: pair[0] != pair[1]),
)
key_batches = st.builds(
    lambda table, batch: DeleteKeys(table, tuple(batch)), tables, st.lists(keys, max_size=4)
)
operations = st.one_of(
    st.builds(Put, tables, keys, values),
    st.builds(Delete, tables, keys),
    ranges,
    key_batches,
)
expectation_kinds = st.sampled_from(["current", "current", "current", "absent", "stale", "wrong"])


class StoreMachine(RuleBasedStateMachine):
    """Compares one store with a model; ``kind`` is set by ``machine_for``."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="slts-model-") if "lmdb" in self.kind else None
        self.store = self._open()
        self.model: dict[str, dict[bytes, Versioned]] = {table: {} for table in TABLES}
        self.sequence = 0

    def _open(self) -> MetadataStore:
        if self.folder is not None:
            inner: MetadataStore = LmdbMetadataStore(self.folder, TABLES, durable=False)
        else:
            inner = MemoryMetadataStore(TABLES)
        if not self.kind.startswith("cached"):
            return inner
        if "bulk" in self.kind:  # a bulk delete from two keys on: small commits take that path
            return CachedMetadataStore(inner, capacity=5, bulk_deletes_min=2)
        return CachedMetadataStore(inner, capacity=5)

    def _version(self, table: str, key: bytes) -> int:
        current = self.model[table].get(key)
        return current.version if current is not None else 0

    @rule(
        ops=st.lists(operations, min_size=1, max_size=4),
        expected=st.lists(st.tuples(tables, keys, expectation_kinds), max_size=3),
    )
    def commit(self, ops: list, expected: list) -> None:
        expect = []
        for table, key, kind in expected:
            current = self._version(table, key)
            version = {
                "current": current,
                "absent": 0,
                "stale": max(current - 1, 0),
                "wrong": current + 1,
            }[kind]
            expect.append(Expect(table, key, version))
        if all(self._version(e.table, e.key) == e.version for e in expect):
            sequence = self.store.commit(ops, expect)
            assert sequence == self.sequence + 1
            self.sequence = sequence
            for op in ops:
                if isinstance(op, Put):
                    self.model[op.table][op.key] = Versioned(sequence, op.value)
                elif isinstance(op, DeleteRange):
                    for key in [k for k in self.model[op.table] if op.start <= k < op.stop]:
                        del self.model[op.table][key]
                elif isinstance(op, DeleteKeys):
                    for key in op.keys:
                        self.model[op.table].pop(key, None)
                else:
                    self.model[op.table].pop(op.key, None)
        else:
            with pytest.raises(VersionConflict):
                self.store.commit(ops, expect)

    @rule(table=tables, key=keys)
    def get(self, table: str, key: bytes) -> None:
        assert self.store.get(table, key) == self.model[table].get(key)

    def _near(self, data: st.DataObject, table: str) -> bytes:
        """A bound next to a stored key (equal, one byte shorter, or just after), or any."""
        stored = sorted(self.model[table])
        if not stored or data.draw(st.booleans()):
            return data.draw(bounds)
        key = data.draw(st.sampled_from(stored))
        return data.draw(st.sampled_from([key, key[:-1], key + b"\x00", key + b"\xff"]))

    @rule(table=tables, data=st.data())
    def floor(self, table: str, data: st.DataObject) -> None:
        key, lowest = self._near(data, table), self._near(data, table)
        assert self.store.floor(table, key, lowest) == self._floor(table, key, lowest)

    def _floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        candidates = [k for k in self.model[table] if lowest <= k <= key]
        return (max(candidates), self.model[table][max(candidates)]) if candidates else None

    @rule(table=tables, data=st.data(), limit=st.integers(1, 6), reverse=st.booleans())
    def scan(self, table: str, data: st.DataObject, limit: int, reverse: bool) -> None:
        start = self._near(data, table)
        stop = None if data.draw(st.booleans()) else self._near(data, table)
        inside = sorted(k for k in self.model[table] if start <= k and (stop is None or k < stop))
        if reverse:
            inside.reverse()
        expected = [(k, self.model[table][k]) for k in inside[:limit]]
        assert self.store.scan(table, start, stop, limit, reverse) == expected
        if not reverse:
            with self.store.snapshot() as view:
                values = view.scan_values(table, start, stop, limit)
            assert values == [(k, stored.value) for k, stored in expected]

    @precondition(lambda self: self.kind != "memory")
    @rule()
    def reopen(self) -> None:
        if self.kind.startswith("cached") and self.folder is None:
            assert isinstance(self.store, CachedMetadataStore)
            self.store.clear()
            return
        self.store.close()
        self.store = self._open()

    @invariant()
    def matches_model(self) -> None:
        assert self.store.last_sequence == self.sequence
        assert self.store.dump() == self.model

    @invariant()
    def floor_next_to_every_key(self) -> None:
        for table, entries in self.model.items():
            for key in entries:
                for probe in (key, key[:-1], key + b"\x00", key + b"\xff"):
                    assert self.store.floor(table, probe) == self._floor(table, probe)

    def teardown(self) -> None:
        self.store.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


@pytest.mark.parametrize("kind", ["memory", "lmdb", "cached-memory", "cached-lmdb", "cached-bulk-memory"])
def test_store_matches_dict_model(kind: str) -> None:
    machine = type(f"StoreMachine_{kind.replace('-', '_')}", (StoreMachine,), {"kind": kind})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=100,
            stateful_step_count=30,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
