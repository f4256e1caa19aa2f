"""The change marker read from LMDB's lock file (``slts.metadata.lmdb_lock_file``): it
agrees with the meta pages after this process's and another process's commits, it is
only used where the layout checks out, and it never outlives the store."""

from __future__ import annotations

import os

import pytest

from slts.errors import StorageClosed
from slts.metadata import Expect, LmdbMetadataStore, Put
from slts.metadata.lmdb_lock_file import open_marker

from .test_metadata_lmdb import TABLES, run_child


def test_the_lock_file_marker_follows_every_commit_of_this_and_another_process(tmp_path) -> None:
    path = str(tmp_path / "metadata")
    with LmdbMetadataStore(path, TABLES) as store:
        env = store._env
        assert env.marker is not None, "this platform's LMDB lock file layout is the known one"
        for round_ in range(3):
            before = store.change_marker
            store.commit([Put("segments", b"k%d" % round_, b"v")])
            assert store.change_marker != before
            assert env.marker.last_transaction() == env._last_transaction_from_meta()
        before = store.change_marker
        sequence = store.last_sequence
        run_child("commit", path, "other", "x", "0")  # a commit of another process
        assert store.change_marker != before
        assert env.marker.last_transaction() == env._last_transaction_from_meta()
        assert store.last_sequence == sequence + 1


def test_a_lock_file_of_another_layout_is_not_used(tmp_path) -> None:
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "lock.mdb").write_bytes(b"\x00" * 4096)  # no magic number
    assert open_marker(str(folder), lambda: 0) is None
    assert open_marker(str(tmp_path / "missing"), lambda: 0) is None
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "lock.mdb").write_bytes(b"")
    assert open_marker(str(tmp_path / "empty"), lambda: 0) is None


def test_a_marker_that_disagrees_with_the_meta_pages_is_not_used(tmp_path) -> None:
    path = str(tmp_path / "metadata")
    with LmdbMetadataStore(path, TABLES) as store:
        store.commit([Put("segments", b"k", b"v")], [Expect("segments", b"k", 0)])
        truth = store._env._last_transaction_from_meta()
        assert open_marker(path, lambda: truth) is not None
        assert open_marker(path, lambda: truth + 1) is None
    assert os.path.exists(os.path.join(path, "lock.mdb"))


def test_the_marker_of_a_closed_store_raises_storage_closed(tmp_path) -> None:
    store = LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)
    env = store._env
    store.close()
    with pytest.raises(StorageClosed):
        env.last_transaction()
