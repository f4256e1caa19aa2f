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
    marker = open_marker(str(folder), lambda: 0)
    assert marker is not None and not marker.usable
    marker.close()
    assert open_marker(str(tmp_path / "missing"), lambda: 0) is None
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "lock.mdb").write_bytes(b"")
    assert open_marker(str(tmp_path / "empty"), lambda: 0) is None


def test_a_marker_that_disagrees_with_the_meta_pages_is_not_used(tmp_path) -> None:
    path = str(tmp_path / "metadata")
    markers = []
    with LmdbMetadataStore(path, TABLES) as store:
        store.commit([Put("segments", b"k", b"v")], [Expect("segments", b"k", 0)])
        truth = store._env._last_transaction_from_meta()
        markers = [open_marker(path, lambda: truth), open_marker(path, lambda: truth + 1)]
    assert [marker is not None and marker.usable for marker in markers] == [True, False]
    for marker in markers:  # (after the store: closing a lock file descriptor drops LMDB's locks)
        assert marker is not None
        marker.close()
    assert os.path.exists(os.path.join(path, "lock.mdb"))


_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
except OSError:
    print("in use")
else:
    print("free")
"""


def test_the_store_keeps_lmdbs_lock_on_the_lock_file_while_it_is_open(tmp_path) -> None:
    """LMDB tells other processes that an environment is in use by a record lock on
    ``lock.mdb``; POSIX drops a process's record locks on a file when it closes any
    descriptor of it. Reading the marker must never do that: a process opening the
    environment would then initialise the lock file's mutexes again under this one."""
    import subprocess
    import sys

    path = str(tmp_path / "metadata")

    def probe() -> str:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, os.path.join(path, "lock.mdb")],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()

    with LmdbMetadataStore(path, TABLES) as store:
        assert store._env.marker is not None
        store.commit([Put("segments", b"k", b"v")])
        store.change_marker  # noqa: B018 - a read through the marker
        assert probe() == "in use"
        with LmdbMetadataStore(path, TABLES) as again:  # a second handle shares the environment
            again.change_marker  # noqa: B018
        assert probe() == "in use"
    assert probe() == "free"


def test_the_marker_of_a_closed_store_raises_storage_closed(tmp_path) -> None:
    store = LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)
    env = store._env
    store.close()
    with pytest.raises(StorageClosed):
        env.last_transaction()
