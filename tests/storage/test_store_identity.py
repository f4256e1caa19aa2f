"""The store identity (``slts.journal.identity``): a metadata store opened over another
store's chunk storage is refused before anything is written (issue 12); restore carries
the identity over; a store made before identities adopts one, resumably."""

from __future__ import annotations

from pathlib import Path

import pytest
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.journal import identity
from slts.journal.restore import restore_to_folder
from slts.journal.system_names import identity_object

import slts
from slts.errors import StoreMismatch
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import CONTAINER, TABLES
from slts.metadata.store import Delete


def make_store(root: Path, data: bytes) -> None:
    with slts.open(f"file://{root / 'chunks'}", metadata=str(root / "metadata")) as storage:
        storage.create("s")
        storage.write(storage.open_write("s"), 0, data)


def observable(root: Path) -> tuple[dict, list[str]]:
    with LmdbMetadataStore(str(root / "metadata"), TABLES) as store:
        dump = store.dump()
    files = sorted(str(p.relative_to(root)) for p in (root / "chunks").rglob("*") if p.is_file())
    return dump, files


def test_metadata_of_one_store_over_the_chunks_of_another_is_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    make_store(a, b"store a")
    make_store(b, b"store b")
    owner_b = slts.open(f"file://{b / 'chunks'}", metadata=str(b / "metadata"))
    before_a, before_b = observable(a), observable(b)
    for read_only in (False, True):
        with pytest.raises(StoreMismatch, match="store"):
            slts.open(f"file://{b / 'chunks'}", metadata=str(a / "metadata"), read_only=read_only)
    assert observable(a) == before_a and observable(b) == before_b  # nothing written on either side
    owner_b.write(owner_b.open_write("s"), 7, b"!")  # B's owner was not fenced
    owner_b.close()


def test_a_new_metadata_folder_over_an_existing_store_points_at_restore(tmp_path: Path) -> None:
    make_store(tmp_path, b"payload")
    with pytest.raises(StoreMismatch, match="slts restore"):
        slts.open(f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "new-metadata"))
    with FileSystemChunkStorage(str(tmp_path / "chunks")) as binding:
        restore_to_folder(binding, 0, str(tmp_path / "restored"))
    with slts.open(f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "restored")) as storage:
        assert storage.read(storage.open_read("s"), 0, 7) == b"payload"


def forget_identity(root: Path, *, metadata: bool, storage: bool) -> None:
    if metadata:
        with LmdbMetadataStore(str(root / "metadata"), TABLES) as store:
            store.commit([Delete(CONTAINER, identity.IDENTITY_KEY)])
    if storage:
        (root / "chunks" / "0%" / "_system%" / "identity").unlink()


def test_a_store_made_before_identities_adopts_one(tmp_path: Path) -> None:
    make_store(tmp_path, b"legacy")
    forget_identity(tmp_path, metadata=True, storage=True)
    with slts.open(f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "metadata")) as storage:
        assert storage.read(storage.open_read("s"), 0, 6) == b"legacy"
    with (
        LmdbMetadataStore(str(tmp_path / "metadata"), TABLES) as store,
        FileSystemChunkStorage(str(tmp_path / "chunks")) as binding,
    ):
        recorded = identity.IdentityRecord.decode(store.get(CONTAINER, identity.IDENTITY_KEY).value)
        assert recorded.confirmed and identity.storage_identity(binding, 0) == recorded.store_id


@pytest.mark.parametrize("stopped_after", ["pending", "object"])
def test_an_adoption_cut_short_is_finished_by_the_next_owner(tmp_path: Path, stopped_after: str) -> None:
    make_store(tmp_path, b"legacy")
    forget_identity(tmp_path, metadata=True, storage=True)
    with (
        LmdbMetadataStore(str(tmp_path / "metadata"), TABLES) as store,
        FileSystemChunkStorage(str(tmp_path / "chunks")) as binding,
    ):
        store.commit([identity._put(identity.IdentityRecord("abc123", False))])  # step 1 only
        if stopped_after == "object":
            binding.create(identity_object(0), b"abc123")  # step 2 too
        # A read-only look in between decides nothing and writes nothing.
        assert identity.settle(store, binding, 0, read_only=True) == (
            None if stopped_after == "pending" else "abc123"
        )
        assert not identity.IdentityRecord.decode(store.get(CONTAINER, identity.IDENTITY_KEY).value).confirmed
    with slts.open(f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "metadata")) as storage:
        assert storage.read(storage.open_read("s"), 0, 6) == b"legacy"
    with (
        LmdbMetadataStore(str(tmp_path / "metadata"), TABLES) as store,
        FileSystemChunkStorage(str(tmp_path / "chunks")) as binding,
    ):
        assert identity.settle(store, binding, 0, read_only=True) == "abc123"
        assert identity.IdentityRecord.decode(store.get(CONTAINER, identity.IDENTITY_KEY).value).confirmed


def test_an_emptied_chunk_storage_is_refused(tmp_path: Path) -> None:
    make_store(tmp_path, b"payload")
    forget_identity(tmp_path, metadata=False, storage=True)
    with pytest.raises(StoreMismatch, match="no store identity"):
        slts.open(f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "metadata"))
