"""Fencing of every path that writes to the metadata store (DESIGN.md §5 invariant 4).

Instance A (epoch e) and instance B (epoch e+1) run on one LMDB folder and one chunk
folder: B in this process on a store object of its own, or in another process (the
``slts`` CLI, as an operator would run it). Once B has started, nothing A does may change
the store: each attempt raises ``Fenced`` (or, for the usage counts at close, is dropped
with a log line), and the store's records (``dump``) and its change log are byte for
byte what they were before. Where the takeover has to fall between A's read and its
write, B is started from a hook of A's ``FaultyMetadataStore`` (``before``), right
before A's call: the fence must be checked in the write itself, not before it.

docs/architecture.md ("Ownership and fencing") lists every path and how it is fenced.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from slts.bindings.filesystem import FileSystemChunkStorage

from slts.config import StorageConfig
from slts.errors import Fenced
from slts.metadata.faulty_store import FaultyMetadataStore
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES, USAGE
from slts.metadata.store import Change, MetadataStore, Versioned
from slts.offload.ledgers import MemoryLedger
from slts.offload.offloader import LedgerOffloader
from slts.offload.streaming import StreamingOffloader
from slts.remote.records import TopicPartition, new_segment_metadata
from slts.remote.rlmm import RemoteLogMetadataManager
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.cli import run_slts

#: No background threads: every flush in these tests is one the test asks for.
QUIET = {"gc_interval_s": 0.0, "metadata_log_flush_interval_s": 0.0, "usage_flush_interval_s": 0.0}


@dataclass
class Folders:
    """One container's chunk folder and LMDB folder, shared by A and B."""

    root: Path
    opened: list[ChunkedSegmentStorage]
    stores: list[MetadataStore]

    @property
    def url(self) -> str:
        return f"file://{self.root / 'chunks'}"

    def store(self) -> LmdbMetadataStore:
        """A store object of its own on the LMDB folder."""
        store = LmdbMetadataStore(str(self.root / "metadata"), TABLES)
        self.stores.append(store)
        return store

    def start(self, store: MetadataStore | None = None, **config: object) -> ChunkedSegmentStorage:
        """A new owner (the next epoch) on the folders, on ``store`` or a store of its own."""
        settings = StorageConfig(**{**QUIET, **config})  # type: ignore[arg-type]
        binding = FileSystemChunkStorage(str(self.root / "chunks"))
        storage = ChunkedSegmentStorage(0, None, binding, store or self.store(), settings)
        self.opened.append(storage)
        return storage

    def start_elsewhere(self, *settings: str) -> None:
        """B in another process: ``slts put`` starts the next epoch, writes and exits."""
        data = self.root / "b-input"
        data.write_bytes(b"written by B")
        argv = ["put", "--store", self.url, "--metadata", str(self.root / "metadata")]
        for setting in settings:
            argv += ["--set", setting]
        done = run_slts(*argv, f"b/{uuid.uuid4().hex[:8]}", str(data))
        assert done.returncode == 0, done.stderr


@pytest.fixture
def folders(tmp_path: Path) -> Folders:
    made = Folders(tmp_path, [], [])
    yield made
    for storage in reversed(made.opened):
        storage.close()
    for store in made.stores:
        store.close()


def records(store: MetadataStore) -> tuple[dict[str, dict[bytes, Versioned]], list[Change]]:
    """Everything A could change: every table, and the change log."""
    return store.dump(), store.changes(after=0, limit=1 << 20)


def start_b(folders: Folders, where: str, *, journal: bool = True) -> Callable[[], None]:
    """What starts B: in this process (on a store object of its own), or in another."""
    if where == "this process":
        return lambda: folders.start(journal=journal)
    return lambda: folders.start_elsewhere(f"journal={'true' if journal else 'false'}")


def busy(storage: ChunkedSegmentStorage, name: str = "a") -> None:
    """Work that leaves usage counts and captured commits behind."""
    storage.create(name)
    handle = storage.open_write(name)
    storage.write(handle, 0, b"x" * 100)
    storage.read(storage.open_read(name), 0, 100)


# -- usage --------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["this process", "another process"])
def test_a_fenced_instance_adds_no_usage_and_drops_it_at_close(
    folders: Folders, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    a = folders.start()
    busy(a)
    assert sum(record.request_count for record in a.meter.usage().values()) > 0
    start_b(folders, where)()
    observer = folders.store()
    before = records(observer)
    with pytest.raises(Fenced):
        a.flush_usage()
    unflushed = sum(record.request_count for record in a.meter.usage().values())
    with caplog.at_level(logging.WARNING, logger="slts"):
        a.close()
    assert records(observer) == before, "the fenced instance changed the store"
    dropped = [r.getMessage() for r in caplog.records if "was fenced" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].endswith(f"; {unflushed} requests dropped"), dropped


def test_a_usage_flush_that_the_takeover_overtakes_writes_nothing(folders: Folders) -> None:
    """B starts between A's read of the usage records and its commit of the sums."""
    raw = folders.store()
    hooked = FaultyMetadataStore(raw)
    a = folders.start(hooked, journal=False)
    busy(a)
    before: list[object] = []

    def take_over() -> None:
        folders.start(journal=False)
        before.append(records(raw))

    hooked.before("commit", take_over, table=USAGE)
    with pytest.raises(Fenced):
        a.flush_usage()
    assert before, "the hook did not run: A's flush never committed"
    assert records(raw) == before[0]


# -- the metadata's durable copy ----------------------------------------------------------------


@pytest.mark.parametrize("where", ["this process", "another process"])
@pytest.mark.parametrize("step", ["flush", "snapshot"])
def test_a_copy_step_that_the_takeover_overtakes_trims_nothing(
    folders: Folders, where: str, step: str
) -> None:
    """A's copy ships a batch (or a snapshot) to tier-2; B starts right before A trims the
    store's change log. B keeps its own copy off, so the change log holds exactly what
    A's trim would remove. A's trim raises ``Fenced`` and removes nothing."""
    raw = folders.store()
    hooked = FaultyMetadataStore(raw)
    a = folders.start(hooked)
    busy(a)
    assert raw.changes(after=0), "nothing captured: the copy would have nothing to trim"
    before: list[object] = []

    def take_over() -> None:
        start_b(folders, where, journal=False)()
        before.append(records(raw))

    hooked.before("discard_changes", take_over)
    with pytest.raises(Fenced):
        if step == "flush":
            a.durable.flush()
        else:
            a.durable.snapshot()
    assert before, "the hook did not run: A's copy never trimmed"
    assert records(raw) == before[0], "the fenced instance trimmed the change log"


# -- the other rooms: every change goes through the ownership's fenced commit --------------------

TP = TopicPartition("payments", 3)


def _remote_change(storage: ChunkedSegmentStorage) -> None:
    metadata = new_segment_metadata(
        TP, start_offset=0, end_offset=9, leader_epochs={0: 0}, max_timestamp_ms=1, size_bytes=10
    )
    RemoteLogMetadataManager(storage).add_segment(metadata)


def _offload(storage: ChunkedSegmentStorage) -> None:
    LedgerOffloader(storage).offload(MemoryLedger(5, [b"entry"] * 3), uuid.uuid4())


def _stream(storage: ChunkedSegmentStorage) -> None:
    StreamingOffloader(storage, "public/default/t").streaming_offload(uuid.uuid4(), {}, 0, 0)


@pytest.mark.parametrize(
    "change",
    [_remote_change, _offload, _stream, lambda storage: busy(storage, "late")],
    ids=["rlmm", "ledger offload", "streaming offload", "segments"],
)
def test_a_fenced_instance_changes_nothing_in_any_room(
    folders: Folders, change: Callable[[ChunkedSegmentStorage], None]
) -> None:
    """A guard of the paths that were fenced already: B in another process."""
    a = folders.start()
    busy(a)
    folders.start_elsewhere()
    observer = folders.store()
    before = records(observer)
    with pytest.raises(Fenced):
        change(a)
    a.close()
    assert records(observer) == before
