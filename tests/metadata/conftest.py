"""Fixtures for the metadata store suite: one suite, every store.

``store_factory`` is parametrised over the four stores. LMDB-backed kinds live in the
test's ``tmp_path``; ``factory.open()`` can be called again to get a second handle on the
same folder (the suite's stand-in for a second process) or, after closing, to reopen.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from slts.metadata import CachedMetadataStore, LmdbMetadataStore, MemoryMetadataStore, MetadataStore

TABLES = ("segments", "chunks", "index")
STORE_KINDS = ("memory", "lmdb", "cached-memory", "cached-lmdb")
CACHE_CAPACITY = 64


class StoreFactory:
    """Opens stores of one kind; closes whatever it opened at teardown."""

    def __init__(self, kind: str, folder: Path) -> None:
        self.kind = kind
        self.folder = folder
        self.opened: list[MetadataStore] = []
        self._memory: MemoryMetadataStore | None = None

    @property
    def persistent(self) -> bool:
        """Whether ``open`` after ``close`` sees the same data (LMDB kinds)."""
        return self.kind.endswith("lmdb")

    def open(self, tables: tuple[str, ...] = TABLES) -> MetadataStore:
        """A new store object (for LMDB kinds: on the same folder every time)."""
        if self.kind.endswith("lmdb"):
            inner: MetadataStore = LmdbMetadataStore(str(self.folder), tables)
        else:
            inner = MemoryMetadataStore(tables)
        store = CachedMetadataStore(inner, CACHE_CAPACITY) if self.kind.startswith("cached") else inner
        self.opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(params=STORE_KINDS)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory = StoreFactory(request.param, tmp_path / "metadata")
    yield factory
    factory.close_all()


@pytest.fixture
def store(store_factory: StoreFactory) -> MetadataStore:
    return store_factory.open()


@pytest.fixture
def lmdb_path(tmp_path: Path) -> str:
    return os.fspath(tmp_path / "lmdb")
