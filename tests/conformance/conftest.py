"""The bindings the conformance suite runs, and the fixtures every test module uses.

Adding a binding (S3, HDFS...) is one factory and one line in ``BINDINGS``: the factory
gets a fresh, empty work folder and returns a ``BindingUnderTest`` (the storage, a raw
access hook that bypasses it, and a way to reopen it). A factory whose server or SDK is
missing calls ``pytest.skip`` with the reason; it does not fail.

Fixtures:

* ``storage``: a fresh, empty binding, once per entry of ``BINDINGS``;
* ``raw``: the raw access hook for that same storage;
* ``binding``: both, plus ``reopen``;
* ``make_binding``: a factory of further fresh bindings of the same kind (the property
  tests build one per Hypothesis example).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from slts.bindings import ChunkStorage
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.filesystem import FileSystemChunkStorage, chunk_relpath
from slts.bindings.memory import MemoryChunkStorage, _Chunk

from tests.support.azure import azure_binding, azure_real_binding, real_account_configured
from tests.support.conformance import BindingUnderTest, remove_tree
from tests.support.gcs import gcs_binding, gcs_real_binding, real_bucket_configured
from tests.support.hdfs import hdfs_binding, hdfs_real_binding, real_cluster_configured
from tests.support.s3 import s3_binding

# -- raw access hooks ------------------------------------------------------------------------


class MemoryRaw:
    """Reads and writes the memory binding's dict directly (its lock, not its methods)."""

    def __init__(self, storage: MemoryChunkStorage) -> None:
        self._storage = storage

    def read(self, name: str) -> bytes:
        with self._storage._lock:
            return bytes(self._storage._chunks[name].data)

    def write(self, name: str, data: bytes) -> None:
        with self._storage._lock:
            self._storage._chunks[name] = _Chunk(bytes(data))

    def exists(self, name: str) -> bool:
        with self._storage._lock:
            return name in self._storage._chunks


class FileSystemRaw:
    """Reads and writes the files below the root with plain ``open``."""

    def __init__(self, root: str) -> None:
        self._root = root

    def path(self, name: str) -> str:
        return os.path.join(self._root, chunk_relpath(name))

    def read(self, name: str) -> bytes:
        try:
            with open(self.path(name), "rb") as file:
                return file.read()
        except FileNotFoundError:
            raise KeyError(name) from None

    def write(self, name: str, data: bytes) -> None:
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(data)

    def exists(self, name: str) -> bool:
        return os.path.isfile(self.path(name))


# -- one factory per binding -------------------------------------------------------------------


def _memory(workdir: Path) -> BindingUnderTest:
    storage = MemoryChunkStorage("memory://conformance")
    # Memory chunks live as long as the instance: a "restarted process" sees the same one.
    return BindingUnderTest("memory", storage, MemoryRaw(storage), reopen=lambda: storage)


def _memory_minimal(workdir: Path) -> BindingUnderTest:
    # Every optional capability off, as the S3 binding will be: keeps the no-append and
    # UnsupportedOperation tests honest until a real binding without them joins.
    storage = MemoryChunkStorage(
        "memory://conformance-minimal",
        supports_append=False,
        supports_concat=False,
        supports_truncate=False,
        supports_readonly=False,
    )
    return BindingUnderTest("memory-minimal", storage, MemoryRaw(storage), reopen=lambda: storage)


def _filesystem(workdir: Path) -> BindingUnderTest:
    root = str(workdir / "chunks")
    storage = FileSystemChunkStorage(root)
    return BindingUnderTest(
        "filesystem",
        storage,
        FileSystemRaw(storage.root),
        reopen=lambda: FileSystemChunkStorage(root),
        cleanup=lambda: remove_tree(root),
    )


def _faulty_memory(workdir: Path) -> BindingUnderTest:
    # No rules: the wrapper must be transparent.
    inner = MemoryChunkStorage("memory://conformance-faulty")
    storage = FaultyChunkStorage(inner, seed=0)
    return BindingUnderTest("faulty-memory", storage, MemoryRaw(inner), reopen=lambda: storage)


def cached_memory_binding(workdir: Path) -> BindingUnderTest:
    from tests.support.chunk_cache import cached_memory_binding as build

    return build(workdir)


#: Every binding the suite runs, by test id. A new binding is one more entry.
BINDINGS: dict[str, Callable[[Path], BindingUnderTest]] = {
    "memory": _memory,
    "memory-minimal": _memory_minimal,
    "filesystem": _filesystem,
    "faulty-memory": _faulty_memory,
    # A chunk cache over memory (its fills land in the background while the tests go on).
    "cached-memory": cached_memory_binding,
    "hdfs": hdfs_binding,  # the WebHDFS test server (tests/support/webhdfs_server.py)
    # A real cluster if SLTS_HDFS_URL is set (else tests/hdfs/test_real_cluster.py skips).
    **({"hdfs-real": hdfs_real_binding} if real_cluster_configured() else {}),
    "s3": s3_binding,  # the session's SeaweedFS server (tests/support/s3server.py)
    "gcs": gcs_binding,  # the session's gcp-storage-emulator (tests/support/gcsserver.py)
    # A real bucket if SLTS_GCS_URL is set (else tests/gcs/test_real_bucket.py skips).
    **({"gcs-real": gcs_real_binding} if real_bucket_configured() else {}),
    "azure": azure_binding,  # the session's Azurite (tests/support/azurite.py)
    # A real account if SLTS_AZURE_URL is set (else tests/azure/test_real_account.py skips).
    **({"azure-real": azure_real_binding} if real_account_configured() else {}),
}


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(params=list(BINDINGS))
def make_binding(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], BindingUnderTest]]:
    factory = BINDINGS[request.param]
    counter = itertools.count()
    made: list[BindingUnderTest] = []

    def make() -> BindingUnderTest:
        workdir = tmp_path / f"{request.param}-{next(counter)}"
        workdir.mkdir()
        binding = factory(workdir)
        made.append(binding)
        return binding

    yield make
    for binding in made:
        binding.storage.close()
        binding.cleanup()


@pytest.fixture
def binding(make_binding: Callable[[], BindingUnderTest]) -> BindingUnderTest:
    return make_binding()


@pytest.fixture
def storage(binding: BindingUnderTest) -> ChunkStorage:
    return binding.storage


@pytest.fixture
def raw(binding: BindingUnderTest):
    return binding.raw
