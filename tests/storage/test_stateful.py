"""ChunkedSegmentStorage against a plain model, driven by Hypothesis (STYLE.md practice 9).

A ``RuleBasedStateMachine`` runs random programs of create / write / read / seal /
unseal / concat / truncate / defrag / delete / gc / reopen (restart with a new epoch)
on memory+memory, filesystem+LMDB (a temporary folder per program) and no-append
memory+memory (an object-store-like binding). The model is, per segment,
the whole content from offset 0, the start offset and the sealed flag. After every step
the invariants of DESIGN.md §5 are checked:

* 1 (layout): ``info`` matches the model, ``verify_segment`` finds nothing, and the
  whole readable range reads back as the model's bytes;
* 2, 5, 6 (data first, leak-free): ``verify_container`` finds no problem (every chunk
  on storage is referenced or queued for GC), and after a full GC past the delay the
  chunk storage holds exactly the referenced chunks, the GC queue and the tombstones are
  empty and no chunk record or index entry is left that no live segment reaches;
* invalid operations raise one of the typed errors the model predicts and change no
  metadata at all;
* crash-and-reopen (``crash_during``): the process "dies" at the n-th metadata commit of
  an operation (before it, or after it landed) and restarts with a new epoch; the store
  then holds the model's state before or after the operation (after, if it returned).

``FaultyStorageMachine`` runs the same programs on the memory binding wrapped in
``FaultyChunkStorage`` (seeded by Hypothesis, practice 10/11): chunk ``create``,
``write``, ``concat`` and ``read`` fail at random, and some writes are torn. A failed
write leaves no trace; metadata-only operations (create, seal, concat, truncate,
delete) never fail from chunk storage faults; a failed defrag changes no content.

Failures shrink to a short program and Hypothesis prints it (and ``@reproduce_failure``)
so that it can be pasted into a regression test. ``SLTS_STATEFUL_EXAMPLES`` scales the
number of programs up for a longer soak.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import os
import random
import shutil
import struct
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from slts.bindings.base import ChunkStorage
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.bindings.memory import MemoryChunkStorage

from slts.admin.verify import verify_container, verify_segment
from slts.chunk_names import unique_source
from slts.config import StorageConfig
from slts.errors import (
    InvalidArgument,
    InvalidOffset,
    MetadataError,
    SegmentExists,
    SegmentNotFound,
    SegmentNotSealed,
    SegmentSealed,
    SegmentTruncated,
    SltsError,
    StorageUnavailable,
)
from slts.metadata.delegating import DelegatingStore
from slts.metadata.index import parse_value
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.records import SegmentRecord
from slts.metadata.schema import CHUNKS, INDEX, SEGMENTS, TABLES
from slts.metadata.store import Expect, MetadataStore, Operation
from slts.storage.chunked import ChunkedSegmentStorage, SegmentHandle
from tests.support.engine import FakeClock, NoAppendMemoryChunkStorage, segment_chunks

NAMES = ("s/a", "s/b", "s/c", "t/x", "t/y")
GC_DELAY_S = 10.0
EXAMPLES = int(os.environ.get("SLTS_STATEFUL_EXAMPLES", "100"))
#: CI runs a fixed, reproducible profile (the same programs every run, so a red run
#: means a change broke something); ``SLTS_STATEFUL_EXAMPLES=N`` is the random soak.
SOAK = "SLTS_STATEFUL_EXAMPLES" in os.environ
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=not SOAK,
    stateful_step_count=40,
    deadline=None,
    database=None,  # many people run pytest at once: no shared example database
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass
class Model:
    """What a segment must look like: all bytes from offset 0, start offset, sealed."""

    data: bytearray
    start: int
    sealed: bool


def payload(sequence: int, size: int) -> bytes:
    """Distinctive bytes for the ``sequence``-th write (never all zeros, never repeated)."""
    return random.Random(sequence).randbytes(size)


#: max_rolling_length: mostly small (writes cross it), sometimes large (chunks stay small
#: relative to it, so defrag and the seam merge have runs to merge).
ROLLING = st.one_of(st.integers(1, 32), st.sampled_from([48, 100, 160]))
#: Segments the program starts with: (max_rolling_length, sizes of the first writes).
Initial = list[tuple[int, list[int]]]
INITIAL = st.lists(st.tuples(ROLLING, st.lists(st.integers(1, 24), max_size=6)), max_size=3)


class CrashableStore(DelegatingStore):
    """Delegates to ``inner``; once armed, the ``nth`` next commit raises ``MetadataError``
    (after applying it if ``landed``: the commit is durable, its acknowledgement lost),
    standing for a process that dies right there."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner)
        self._countdown = 0
        self._landed = False

    def arm(self, nth: int, landed: bool) -> None:
        self._countdown, self._landed = nth, landed

    def disarm(self) -> None:
        self._countdown = 0

    def commit(self, ops: Sequence[Operation], expect: Sequence[Expect] = ()) -> int:
        if self._countdown:
            self._countdown -= 1
            if not self._countdown:
                if self._landed:
                    self.inner.commit(ops, expect)
                raise MetadataError("injected crash at a commit", injected=True)
        return self.inner.commit(ops, expect)


def expected_state(model: dict[str, Model]) -> dict[str, tuple[int, int, bool, bytes]]:
    return {
        name: (m.start, len(m.data), m.sealed, bytes(m.data[m.start :])) for name, m in sorted(model.items())
    }


def summary(state: dict[str, tuple[int, int, bool, bytes]]) -> dict[str, tuple[int, int, bool]]:
    return {name: value[:3] for name, value in state.items()}


def index_leaks(dump: dict[str, dict[bytes, Any]]) -> dict[int, list[int]]:
    """Index namespaces (with their keys' offsets) that no live segment reaches, directly
    or through concat links, plus chunk entries naming a chunk without a record."""
    namespaces: dict[int, list[tuple[int, bytes]]] = {}
    for key, stored in dump[INDEX].items():
        namespace, offset = struct.unpack(">QQ", key)
        namespaces.setdefault(namespace, []).append((offset, stored.value))
    pending = [SegmentRecord.decode(stored.value).segment_id for stored in dump[SEGMENTS].values()]
    reached: set[int] = set()
    while pending:
        namespace = pending.pop()
        if namespace not in reached:
            reached.add(namespace)
            pending.extend(
                link[0] for _, value in namespaces.get(namespace, []) if (link := parse_value(value)[1])
            )
    leaks = {
        namespace: [offset for offset, _ in entries]
        for namespace, entries in namespaces.items()
        if namespace not in reached
    }
    chunks = {key.decode() for key in dump[CHUNKS]}
    for namespace, entries in namespaces.items():
        dangling = [
            offset for offset, value in entries if (name := parse_value(value)[0]) and name not in chunks
        ]
        if dangling:
            leaks.setdefault(namespace, []).extend(dangling)
    return leaks


def has_segments(machine: StorageMachine) -> bool:
    return bool(machine.model)


class StorageMachine(RuleBasedStateMachine):
    """Random programs on one (binding, store) pair, checked against ``Model``."""

    binding_name = "memory"
    store_name = "memory"

    def __init__(self) -> None:
        super().__init__()
        on_disk = self.store_name == "lmdb" or self.binding_name == "filesystem"
        self.tmp = tempfile.mkdtemp(prefix="slts-stateful-") if on_disk else None
        self.clock = FakeClock()
        self.binding = self._new_binding()
        self.store = self._new_store()
        self.model: dict[str, Model] = {}
        self.handles: dict[str, SegmentHandle] = {}
        self.storage: ChunkedSegmentStorage | None = None
        self.config: dict[str, Any] = {}
        self.writes = 0
        self.epochs: list[int] = []
        # Chunk names from a counter, not uuid4: a replayed program makes the same names,
        # so nothing that follows their order (listings, sets) differs between replays.
        self.names = contextlib.ExitStack()
        made = itertools.count(1)
        self.names.enter_context(unique_source(lambda: f"{next(made):032x}"))

    # -- environment --------------------------------------------------------------------------

    def _new_binding(self) -> ChunkStorage:
        if self.binding_name == "filesystem":
            assert self.tmp is not None
            return FileSystemChunkStorage(os.path.join(self.tmp, "chunks"))
        if self.binding_name == "no-append":
            return NoAppendMemoryChunkStorage()
        return MemoryChunkStorage()

    def _new_store(self) -> CrashableStore:
        if self.store_name == "lmdb":
            assert self.tmp is not None
            return CrashableStore(LmdbMetadataStore(os.path.join(self.tmp, "metadata"), TABLES))
        return CrashableStore(MemoryMetadataStore(TABLES))

    def _open(self) -> ChunkedSegmentStorage:
        storage = ChunkedSegmentStorage(
            0, None, self.binding, self.store, StorageConfig(**self.config), clock=self.clock
        )
        if self.epochs:
            assert storage.epoch > self.epochs[-1], "a restart must take a newer epoch"
        self.epochs.append(storage.epoch)
        return storage

    def teardown(self) -> None:
        try:
            if self.storage is not None:
                self.storage.close()
            self.store.close()
            self.binding.close()
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
        finally:
            self.names.close()

    # Fault hooks (no faults here; FaultyStorageMachine overrides them).

    def faults_on(self) -> None:
        """Arm chunk storage faults for the operation under test."""

    def faults_off(self) -> None:
        """Disarm them (invariant checks, metadata-only expectations)."""

    def may_fail(self, fn: Callable[[], Any]) -> tuple[bool, Any]:
        """Run ``fn`` with faults armed: (True, result) or (False, None) if the chunk
        storage failed (only possible in the faulty machine)."""
        self.faults_on()
        try:
            return True, fn()
        finally:
            self.faults_off()

    # -- helpers -----------------------------------------------------------------------------------

    @property
    def s(self) -> ChunkedSegmentStorage:
        assert self.storage is not None
        return self.storage

    def snapshot(self) -> tuple[dict, list[str]]:
        return self.store.dump(), sorted(self.binding.list(""))

    def expect_error(self, allowed: tuple[type[SltsError], ...], fn: Callable[[], Any]) -> None:
        """``fn`` must raise one of ``allowed`` and change nothing at all."""
        assert allowed, "expect_error needs the errors the model predicts"
        before = self.snapshot()
        try:
            fn()
        except SltsError as exc:
            assert isinstance(exc, allowed), f"raised {exc!r}, the model predicts one of {allowed}"
        else:
            raise AssertionError(f"no error, the model predicts one of {allowed}")
        assert self.snapshot() == before, "a rejected operation changed the store"

    def handle(self, name: str) -> SegmentHandle:
        if name not in self.handles:
            self.handles[name] = self.s.open_write(name)
        return self.handles[name]

    def pick(self, data: st.DataObject) -> str:
        """One of the live segments (the rule's precondition ensures there is one)."""
        return data.draw(st.sampled_from(sorted(self.model)), label="segment")

    def referenced(self) -> set[str]:
        return {chunk.name for name in self.model for _, chunk in self.s.chunks(name)}

    # -- rules ----------------------------------------------------------------------------------------

    @initialize(
        small=st.integers(16, 64),
        batch=st.integers(3, 7),
        parallel=st.sampled_from([1, 40, 4 << 20]),
        checksums=st.booleans(),
        merge_seam=st.booleans(),
        initial=INITIAL,
    )
    def start(
        self,
        small: int,
        batch: int,
        parallel: int,
        checksums: bool,
        merge_seam: bool,
        initial: Initial,
    ) -> None:
        self.config = {
            "gc_delay_s": GC_DELAY_S,
            "gc_batch_max": batch,
            "defrag_small_chunk_bytes": small,
            "read_parallel_bytes_min": parallel,
            "read_threads": 3,
            "checksums": checksums,
            "verify_checksums_on_read": checksums,
            "concat_merge_seam": merge_seam,
        }
        self.storage = self._open()
        for name, (rolling, sizes) in zip(NAMES, initial, strict=False):  # up to 3 of the 5 names
            self.create(name, rolling)
            for size in sizes:
                self._write(name, size)

    @rule(name=st.sampled_from(NAMES), rolling=ROLLING)
    def create(self, name: str, rolling: int) -> None:
        if name in self.model:
            self.expect_error((SegmentExists,), lambda: self.s.create(name, max_rolling_length=rolling))
            return
        info = self.s.create(name, max_rolling_length=rolling)
        assert (info.length, info.start_offset, info.sealed, info.chunk_count) == (0, 0, False, 0)
        assert info.max_rolling_length == rolling and info.owner_epoch == self.s.epoch
        self.model[name] = Model(bytearray(), 0, False)
        self.handles.pop(name, None)

    @precondition(has_segments)
    @rule(data=st.data(), size=st.one_of(st.just(0), st.integers(1, 12), st.integers(13, 70)))
    def write(self, data: st.DataObject, size: int) -> None:
        self._write(self.pick(data), size)

    @precondition(has_segments)
    @rule(data=st.data(), sizes=st.lists(st.integers(1, 12), min_size=2, max_size=6))
    def write_several(self, data: st.DataObject, sizes: list[int]) -> None:
        name = self.pick(data)
        for size in sizes:
            self._write(name, size)

    def _write(self, name: str, size: int) -> None:
        model = self.model[name]
        self.writes += 1
        written = payload(self.writes, size)
        handle = self.handle(name)
        if model.sealed:
            self.expect_error((SegmentSealed,), lambda: self.s.write(handle, len(model.data), written))
            return
        ok, _ = self.may_fail(lambda: self.s.write(handle, len(model.data), written))
        if ok:
            model.data += written
        # Failed or not, the length is the model's (a failed write leaves no trace).
        assert self.s.info(name).length == len(model.data)

    @precondition(has_segments)
    @rule(data=st.data(), delta=st.sampled_from([-3, -1, 1, 2, 1000]), size=st.integers(0, 5))
    def write_at_wrong_offset(self, data: st.DataObject, delta: int, size: int) -> None:
        name = self.pick(data)
        model = self.model[name]
        offset = len(model.data) + delta
        if offset < 0:
            return
        errors: tuple[type[SltsError], ...] = (InvalidOffset,) + ((SegmentSealed,) if model.sealed else ())
        handle = self.handle(name)
        self.expect_error(errors, lambda: self.s.write(handle, offset, b"x" * size))

    @precondition(has_segments)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        name = self.pick(data)
        model = self.model[name]
        length = len(model.data)
        offset = data.draw(st.integers(0, length + 2), label="offset")
        size = data.draw(st.integers(0, max(0, length - offset) + 2), label="size")
        handle = self.s.open_read(name)
        read = data.draw(st.sampled_from([self.s.read, self.s.read_view]), label="read")
        errors: tuple[type[SltsError], ...] = ()
        if offset < model.start:
            errors += (SegmentTruncated,)
        if offset + size > length:
            errors += (InvalidOffset,)
        if errors:
            self.expect_error(errors, lambda: read(handle, offset, size))
            return
        ok, got = self.may_fail(lambda: read(handle, offset, size))
        if ok:
            assert got == bytes(model.data[offset : offset + size])

    @precondition(has_segments)
    @rule(data=st.data())
    def seal(self, data: st.DataObject) -> None:
        name = self.pick(data)
        self.s.seal(self.handle(name))
        self.model[name].sealed = True

    @precondition(has_segments)
    @rule(data=st.data())
    def unseal(self, data: st.DataObject) -> None:
        name = self.pick(data)
        self.s.unseal(self.handle(name))
        self.model[name].sealed = False

    def _concat_errors(self, target: str, offset: int, source: str) -> tuple[type[SltsError], ...]:
        errors: tuple[type[SltsError], ...] = ()
        if offset < 0 or offset != len(self.model[target].data):
            errors += (InvalidOffset,)
        if source == target:
            errors += (InvalidArgument,)
        if source not in self.model:
            return (*errors, SegmentNotFound)
        if self.model[target].sealed:
            errors += (SegmentSealed,)
        if not self.model[source].sealed:
            errors += (SegmentNotSealed,)
        if self.model[source].start > 0:
            errors += (SegmentTruncated,)
        return errors

    def _concat(self, target: str, source: str) -> None:
        """A valid concat: must succeed (metadata only), whatever the chunk storage does."""
        donor = self.model[source]
        offset = len(self.model[target].data)
        self.s.concat(self.handle(target), offset, source)
        self.model[target].data += donor.data
        del self.model[source]
        self.handles.pop(source, None)
        assert not self.s.exists(source)

    def _valid_concats(self) -> list[tuple[str, str]]:
        return [
            (target, source)
            for target in self.model
            for source in self.model
            if not self._concat_errors(target, len(self.model[target].data), source)
        ]

    @precondition(lambda self: bool(self._valid_concats()))
    @rule(data=st.data())
    def concat(self, data: st.DataObject) -> None:
        target, source = data.draw(st.sampled_from(self._valid_concats()), label="target, source")
        self._concat(target, source)

    @precondition(
        lambda self: len(self.model) < len(NAMES) and any(not m.sealed for m in self.model.values())
    )
    @rule(data=st.data(), rolling=ROLLING, sizes=st.lists(st.integers(0, 24), max_size=4))
    def transaction(self, data: st.DataObject, rolling: int, sizes: list[int]) -> None:
        """The stream engine's pattern: fill a transaction segment, seal it, concat it
        into its parent."""
        target = data.draw(
            st.sampled_from(sorted(n for n, m in self.model.items() if not m.sealed)),
            label="parent",
        )
        source = next(name for name in NAMES if name not in self.model)
        self.create(source, rolling)
        for size in sizes:
            self._write(source, size)
        self.s.seal(self.handle(source))
        self.model[source].sealed = True
        self._concat(target, source)

    @precondition(has_segments)
    @rule(data=st.data(), source=st.sampled_from(NAMES), delta=st.sampled_from([0, 0, -1, 1]))
    def concat_any(self, data: st.DataObject, source: str, delta: int) -> None:
        target = self.pick(data)
        offset = len(self.model[target].data) + delta
        errors = self._concat_errors(target, offset, source)
        if not errors:
            self._concat(target, source)
            return
        handle = self.handle(target)
        self.expect_error(errors, lambda: self.s.concat(handle, offset, source))

    @precondition(has_segments)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        name = self.pick(data)
        model = self.model[name]
        offset = data.draw(st.integers(0, len(model.data) + 2), label="offset")
        handle = self.handle(name)
        if offset > len(model.data):
            self.expect_error((InvalidOffset,), lambda: self.s.truncate(handle, offset))
            return
        before = self.s.info(name).chunk_count
        self.s.truncate(handle, offset)
        model.start = max(model.start, offset)
        chunks = self.s.chunks(name)
        assert len(chunks) <= before
        # Truncate drops every chunk that lies wholly below the new start.
        assert all(start + chunk.length > model.start for start, chunk in chunks), (
            "a chunk below the start stayed"
        )

    @precondition(has_segments)
    @rule(data=st.data())
    def defrag(self, data: st.DataObject) -> None:
        # Prefer segments with something to merge (several chunks); any segment otherwise.
        fragmented = sorted(name for name in self.model if self.s.info(name).chunk_count >= 3)
        name = data.draw(st.sampled_from(fragmented), label="segment") if fragmented else self.pick(data)
        ok, result = self.may_fail(lambda: self.s.defrag(name))
        if not ok:
            return  # content unchanged: the invariants check it
        info = self.s.info(name)
        assert result.chunks_after == info.chunk_count <= result.chunks_before
        assert result.runs_committed == result.runs_planned, (
            "nothing runs concurrently: no run may be dropped"
        )
        assert (result.chunks_after < result.chunks_before) == (result.runs_committed > 0)
        # Greedy merging leaves no two neighbours that one more run could have merged.
        small = self.config["defrag_small_chunk_bytes"]
        bytes_max = min(StorageConfig().defrag_run_bytes_max, info.max_rolling_length)
        lengths = [chunk.length for _, chunk in self.s.chunks(name)]
        candidates = lengths if info.sealed else lengths[:-1]
        for left, right in itertools.pairwise(candidates):
            assert not (left < small and right < small and left + right <= bytes_max), (
                f"defrag left mergeable neighbours {left}+{right} in {lengths}"
            )

    @precondition(has_segments)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        name = self.pick(data)
        handle = self.handle(name)
        self.s.delete(handle)
        del self.model[name]
        self.handles.pop(name, None)
        assert not self.s.exists(name)
        self.expect_error((SegmentNotFound,), lambda: self.s.read(handle, 0, 0))

    @rule(name=st.sampled_from(NAMES))
    def missing_segment(self, name: str) -> None:
        """Every operation on a name that is not a live segment: ``SegmentNotFound``."""
        if name in self.model:
            return
        for call in (
            lambda: self.s.open_write(name),
            lambda: self.s.open_read(name),
            lambda: self.s.info(name),
            lambda: self.s.defrag(name),
            lambda: self.s.read(SegmentHandle(name, read_only=True), 0, 0),
            lambda: self.s.write(SegmentHandle(name, read_only=False), 0, b"x"),
            lambda: self.s.seal(SegmentHandle(name, read_only=False)),
            lambda: self.s.truncate(SegmentHandle(name, read_only=False), 0),
            lambda: self.s.delete(SegmentHandle(name, read_only=False)),
        ):
            self.expect_error((SegmentNotFound,), call)
        assert not self.s.exists(name)

    @rule(seconds=st.sampled_from([0.0, 1.0, GC_DELAY_S / 2]))
    def gc_early(self, seconds: float) -> None:
        """A GC run that may find nothing due: it must never touch anything referenced
        (the invariants check every referenced chunk is still there)."""
        self.clock.advance(seconds)
        self.s.gc.run_once()

    @rule()
    def gc(self) -> None:
        """Everything queued is due: GC until quiet; then storage holds exactly the
        referenced chunks and the queue and tombstones are empty (invariant 5/6)."""
        self.clock.advance(GC_DELAY_S + 1)
        for _ in range(500):
            stats = self.s.gc.run_once()
            assert stats.errors == 0
            if not stats.progressed:
                break
        else:
            raise AssertionError("GC did not converge")
        referenced = self.referenced()
        on_storage = set(segment_chunks(self.binding))
        assert on_storage == referenced, (
            f"after GC: orphans {sorted(on_storage - referenced)}, missing {sorted(referenced - on_storage)}"
        )
        dump = self.store.dump()
        assert dump["gc"] == {}, "GC queue not empty after everything became due"
        assert dump["deleted"] == {}, "tombstones left after everything became due"
        assert {key.decode() for key in dump["chunks"]} == referenced, "chunk records of no segment"
        assert index_leaks(dump) == {}, "index entries no live segment can reach"
        leaks = self.s.check_leaks()
        assert leaks.total == 0, leaks.problems()

    @rule()
    def reopen(self) -> None:
        """Restart: close, (for LMDB/filesystem: reopen the files), start the next epoch,
        open every segment for writing again (takeover)."""
        self._restart()
        for name in self.model:
            self.handle(name)
            assert self.s.info(name).owner_epoch == self.s.epoch

    def _restart(self) -> None:
        self.s.close()
        if self.tmp is not None:  # on disk: reopen the files, as a new process would
            self.store.close()
            self.binding.close()
            self.binding = self._new_binding()
            self.store = self._new_store()
        self.storage = self._open()
        self.handles = {}

    @precondition(has_segments)
    @rule(
        data=st.data(),
        kind=st.sampled_from(["write", "concat", "truncate", "defrag", "delete", "gc", "seal", "create"]),
        nth=st.integers(1, 4),
        landed=st.booleans(),
    )
    def crash_during(self, data: st.DataObject, kind: str, nth: int, landed: bool) -> None:
        """The process dies at the ``nth`` metadata commit of an operation (before the
        commit, or after it ``landed``), and restarts. Every operation is atomic: the
        store then holds the state before it or the state after it, and the latter for
        sure if the operation returned (practice 9's crash-and-reopen)."""
        call, after = self._crash_candidate(data, kind)
        if call is None:
            return
        self.store.arm(nth, landed)
        try:
            call()
            returned = True
        except MetadataError as exc:
            assert exc.context.get("injected"), f"not the injected crash: {exc!r}"
            returned = False
        finally:
            self.store.disarm()
        self._restart()
        seen = self.observed()
        if seen == expected_state(after):
            self.model = after
        else:
            assert not returned, f"{kind} returned, yet its effect is not there after the restart"
            assert seen == expected_state(self.model), (
                f"after a crash in {kind}: neither the state before nor after it\n"
                f"store {summary(seen)}\nbefore {summary(expected_state(self.model))}\n"
                f"after {summary(expected_state(after))}"
            )
        for name in self.model:
            self.handle(name)

    def _crash_candidate(
        self, data: st.DataObject, kind: str
    ) -> tuple[Callable[[], Any] | None, dict[str, Model]]:
        """(the call, the model after it) for a valid operation of ``kind``."""
        after = copy.deepcopy(self.model)
        name = self.pick(data)
        model = after[name]
        if kind == "write":
            if model.sealed:
                return None, after
            self.writes += 1
            written = payload(self.writes, data.draw(st.integers(1, 70), label="size"))
            offset = len(model.data)
            model.data += written
            handle = self.handle(name)
            return lambda: self.s.write(handle, offset, written), after
        if kind == "concat":
            valid = self._valid_concats()
            if not valid:
                return None, after
            target, source = data.draw(st.sampled_from(valid), label="target, source")
            after[target].data += after.pop(source).data
            handle, offset = self.handle(target), len(self.model[target].data)
            return lambda: self.s.concat(handle, offset, source), after
        if kind == "truncate":
            offset = data.draw(st.integers(0, len(model.data)), label="offset")
            model.start = max(model.start, offset)
            handle = self.handle(name)
            return lambda: self.s.truncate(handle, offset), after
        if kind == "defrag":
            return lambda: self.s.defrag(name), after
        if kind == "delete":
            del after[name]
            handle = self.handle(name)
            return lambda: self.s.delete(handle), after
        if kind == "gc":
            self.clock.advance(GC_DELAY_S + 1)
            return lambda: self.s.gc.run_once(), after
        if kind == "seal":
            model.sealed = True
            handle = self.handle(name)
            return lambda: self.s.seal(handle), after
        assert kind == "create"
        free = [n for n in NAMES if n not in after]
        if not free:
            return None, after
        after[free[0]] = Model(bytearray(), 0, False)
        return lambda: self.s.create(free[0], max_rolling_length=8), after

    def observed(self) -> dict[str, tuple[int, int, bool, bytes]]:
        """Every live segment as the store has it: (start, length, sealed, readable bytes)."""
        result = {}
        for name in self.s.list():
            info = self.s.info(name)
            readable = self.s.read(self.s.open_read(name), info.start_offset, info.length - info.start_offset)
            result[name] = (info.start_offset, info.length, info.sealed, readable)
        return result

    # -- invariants ---------------------------------------------------------------------------------

    @invariant()
    def segments_match_the_model(self) -> None:
        if self.storage is None:
            return
        assert list(self.s.list()) == sorted(self.model)
        for name, model in self.model.items():
            info = self.s.info(name)
            assert (info.length, info.start_offset, info.sealed) == (
                len(model.data),
                model.start,
                model.sealed,
            ), name
            assert verify_segment(self.s, name) == []
            readable = self.s.read(self.s.open_read(name), model.start, len(model.data) - model.start)
            assert readable == bytes(model.data[model.start :]), f"{name}: content differs from the model"

    @invariant()
    def container_is_leak_free(self) -> None:
        if self.storage is None:
            return
        report = verify_container(self.s)
        assert report.problems == []
        assert report.segments == len(self.model)


class FaultyStorageMachine(StorageMachine):
    """The same programs; chunk storage calls fail at random (seeded by Hypothesis)."""

    def _new_binding(self) -> ChunkStorage:
        self.faulty = FaultyChunkStorage(MemoryChunkStorage(), seed=0)
        return self.faulty

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        probability=st.sampled_from([0.1, 0.25, 0.5]),
        small=st.integers(16, 64),
        batch=st.integers(3, 7),
        merge_seam=st.booleans(),
        initial=INITIAL,
    )
    def start(  # type: ignore[override]
        self,
        seed: int,
        probability: float,
        small: int,
        batch: int,
        merge_seam: bool,
        initial: Initial,
    ) -> None:
        self.faulty.seed = seed
        self.faulty.random = random.Random(seed)
        self.probability = probability
        super().start(small, batch, 40, True, merge_seam, initial)

    def faults_on(self) -> None:
        for op in ("create", "write", "concat", "read"):
            self.faulty.fail_probability(op, self.probability)

    def faults_off(self) -> None:
        self.faulty.clear()

    def may_fail(self, fn: Callable[[], Any]) -> tuple[bool, Any]:
        try:
            return super().may_fail(fn)
        except StorageUnavailable as exc:
            assert exc.context.get("injected"), f"a fault that was not injected: {exc!r}"
            return False, None

    def _concat(self, target: str, source: str) -> None:
        # Metadata only: chunk storage faults may only cost the (best-effort) seam merge.
        self.faults_on()
        try:
            super()._concat(target, source)
        finally:
            self.faults_off()

    @precondition(has_segments)
    @rule(data=st.data(), size=st.integers(1, 70))
    def torn_write(self, data: st.DataObject, size: int) -> None:
        """The next chunk write or create stores only a prefix of its bytes, then fails."""
        name = self.pick(data)
        if self.model[name].sealed:
            return
        model = self.model[name]
        self.writes += 1
        handle = self.handle(name)
        self.faulty.partial_write(1)
        try:
            with pytest.raises(StorageUnavailable):
                self.s.write(handle, len(model.data), payload(self.writes, size))
        finally:
            self.faults_off()
        assert self.s.info(name).length == len(model.data), "a torn write became visible"

    @precondition(has_segments)
    @rule(data=st.data())
    def truncate_and_seal_under_faults(self, data: st.DataObject) -> None:
        """Metadata-only operations never touch the chunk storage: they never fail."""
        name = self.pick(data)
        model = self.model[name]
        self.faults_on()
        try:
            self.s.truncate(self.handle(name), (model.start + len(model.data)) // 2)
            self.s.seal(self.handle(name))
        finally:
            self.faults_off()
        model.start = max(model.start, (model.start + len(model.data)) // 2)
        model.sealed = True


PAIRS = [("memory", "memory"), ("filesystem", "lmdb"), ("no-append", "memory")]


@pytest.mark.parametrize(("binding_name", "store_name"), PAIRS, ids=[f"{b}+{s}" for b, s in PAIRS])
def test_engine_matches_model(binding_name: str, store_name: str) -> None:
    machine = type(
        f"StorageMachine_{binding_name}_{store_name}".replace("-", "_"),
        (StorageMachine,),
        {"binding_name": binding_name, "store_name": store_name},
    )
    run_state_machine_as_test(machine, settings=SETTINGS)


def test_engine_matches_model_under_chunk_storage_faults() -> None:
    run_state_machine_as_test(FaultyStorageMachine, settings=SETTINGS)
