"""Engine test environments: a container on every (binding, metadata store) pair.

``env`` builds instances on one shared binding + store so that a test can restart the
container (``env.reopen()``: a new epoch on the same data) and inspect raw state
(``env.binding``, ``env.store``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from slts.bindings.base import ChunkStorage
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.bindings.memory import MemoryChunkStorage
from slts.journal.system_names import system_prefix
from slts.tools.simulation.seam import FakeClock  # one fake clock for tests and the simulator

from slts.config import StorageConfig
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.records import ChunkRecord
from slts.metadata.schema import TABLES
from slts.metadata.store import MetadataStore
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import FolderKeyRing
from tests.support.azure import azure_storage_binding
from tests.support.s3 import s3_storage_binding


def segment_chunks(binding: ChunkStorage, container_id: int = 0) -> list[str]:
    """The container's segment chunks on ``binding``, sorted: every name under its prefix
    but the system objects (journal, system segments), which the journal tests cover."""
    system = system_prefix(container_id)
    return sorted(name for name in binding.list(f"{container_id}/") if not name.startswith(system))


def chunk_contents(storage: ChunkedSegmentStorage, chunk: ChunkRecord) -> bytes:
    """The bytes chunk ``chunk`` holds of its segment: its stored bytes, decoded if it is a
    chunk of frames (a check of the layout that does not go through the segment's reads)."""
    binding = storage.chunk_storage
    handle = binding.open_read(chunk.name)
    if not chunk.transformed:
        return binding.read(handle, 0, chunk.length)
    assert chunk.frames is not None
    return storage.transforms.decode(
        chunk.name, chunk.frames, chunk.data_keys, 0, chunk.length, lambda at, n: binding.read(handle, at, n)
    )


class NoAppendMemoryChunkStorage(MemoryChunkStorage):
    """The memory binding behaving like an object store: no append, no truncate."""

    supports_append = False
    supports_truncate = False


@dataclass
class Env:
    binding: ChunkStorage
    store: MetadataStore
    clock: FakeClock = field(default_factory=FakeClock)
    instances: list[ChunkedSegmentStorage] = field(default_factory=list)
    #: Client-side transforms every instance gets (``TRANSFORMS``), and their key ring.
    transforms: Mapping[str, object] = field(default_factory=dict)
    key_ring: FolderKeyRing | None = None

    def open(self, epoch: int | None = None, **config: object) -> ChunkedSegmentStorage:
        # No background threads: the metadata log is flushed by GC's barrier and on close only.
        defaults = {"gc_delay_s": 10.0, "gc_interval_s": 0.0, "metadata_log_flush_interval_s": 0.0}
        settings = StorageConfig(**{**defaults, **self.transforms, **config})  # type: ignore[arg-type]
        storage = ChunkedSegmentStorage(
            0, epoch, self.binding, self.store, settings, clock=self.clock, key_ring=self.key_ring
        )
        self.instances.append(storage)
        return storage

    def reopen(self, **config: object) -> ChunkedSegmentStorage:
        """Close the newest instance and start the next epoch on the same data."""
        if self.instances:
            self.instances[-1].close()
        return self.open(**config)

    def lose_machine_and_restore(self, storage: ChunkedSegmentStorage) -> ChunkedSegmentStorage:
        """Flush ``storage``'s metadata log to tier-2, close it, forget its metadata store
        (the machine is gone) and start the container on a store restored from tier-2 alone."""
        from slts.journal.restore import restore

        storage.durable.flush()
        storage.close()
        self.instances.remove(storage)
        restored = MemoryMetadataStore(TABLES)
        restore(self.binding, 0, restored)
        revived = ChunkedSegmentStorage(0, None, self.binding, restored)
        self.instances.append(revived)
        return revived

    def snapshot(self) -> tuple[dict, list[tuple[str, bytes]]]:
        """Everything observable: every metadata table and every chunk's bytes."""
        chunks = [
            (name, self.binding.read(self.binding.open_read(name), 0, 1 << 40))
            for name in self.binding.list("")
        ]
        return self.store.dump(), chunks


BINDINGS: dict[str, Callable[[object], ChunkStorage]] = {
    "memory": lambda tmp: MemoryChunkStorage(),
    "filesystem": lambda tmp: FileSystemChunkStorage(str(tmp / "chunks")),
    "no-append": lambda tmp: NoAppendMemoryChunkStorage(),
    "s3": s3_storage_binding,  # a new bucket on the session's SeaweedFS server per test
    "azure": azure_storage_binding,  # a new container on the session's Azurite per test
}
STORES: dict[str, Callable[[object], MetadataStore]] = {
    "memory": lambda tmp: MemoryMetadataStore(TABLES),
    "lmdb": lambda tmp: LmdbMetadataStore(str(tmp / "metadata"), TABLES),
}
#: Client-side transforms an environment may run with (docs/security.md): the config each
#: instance gets; encryption brings a key ring of one active key.
TRANSFORMS: dict[str, dict[str, object]] = {
    "zstd": {"compression_level": 3, "frame_bytes": 4096},
    "aes": {"encryption": True, "frame_bytes": 4096},
    "zstd+aes": {"compression_level": 3, "encryption": True, "frame_bytes": 4096},
}
PAIRS: list[tuple[str, ...]] = [
    ("memory", "memory"),
    ("filesystem", "lmdb"),
    ("no-append", "memory"),
    ("s3", "lmdb"),
]
#: Environments with transforms on (each transform, appending and object-store bindings).
TRANSFORM_PAIRS: list[tuple[str, ...]] = [
    ("filesystem", "lmdb", "zstd+aes"),
    ("memory", "memory", "aes"),
    ("no-append", "memory", "zstd"),
    ("s3", "lmdb", "zstd+aes"),
    # Azure in the engine's matrix once, with transforms (its appends carry frames); the rest
    # of its engine coverage is tests/azure/test_azure_engine.py (CI time).
    ("azure", "lmdb", "zstd+aes"),
]


def key_ring(tmp_path: Path) -> FolderKeyRing:
    """A new key ring under ``tmp_path`` with one active key."""
    ring = FolderKeyRing.create(str(tmp_path / "key-ring"))
    ring.activate(ring.add())
    return ring


def env_fixture(pairs: list[tuple[str, ...]]) -> Any:
    """A fixture ``env`` parametrized over (binding, store[, transforms]) ``pairs``: a fresh
    ``Env`` per test, every instance, the store and the binding closed afterwards."""

    @pytest.fixture(params=pairs, ids=["+".join(pair) for pair in pairs])
    def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
        binding_name, store_name, *transforms = request.param
        environment = Env(BINDINGS[binding_name](tmp_path), STORES[store_name](tmp_path))
        if transforms:
            environment.transforms = TRANSFORMS[transforms[0]]
            if environment.transforms.get("encryption"):
                environment.key_ring = key_ring(tmp_path)
        yield environment
        for instance in environment.instances:
            instance.close()
        environment.store.close()
        environment.binding.close()

    return env


env = env_fixture(PAIRS)


@pytest.fixture
def storage(env: Env) -> ChunkedSegmentStorage:
    return env.open()
