"""The check of an LMDB data file before it is mapped (``slts.metadata.lmdb_file``, issue
25): the walk in a child process finds damage anywhere in a real engine-made file (and
a file LMDB would fault on kills the child, never this process), and the marker of the
last known good state decides, without reading the file, when an open may skip the walk.

These tests open damaged files in this very process: if the check missed the damage,
the test process would die, which fails the run as loudly as an assertion."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from slts.errors import InvalidArgument, MetadataCorrupted
from slts.metadata.lmdb_file import (
    MARKER_FILE,
    NEW,
    TRUSTED,
    UNCHECKED,
    WALKED,
    check_data_file,
    vouch,
    walk_in_child,
)
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.metadata.store import Put
from tests.metadata import lmdb_damage


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One engine-made store (200 segments), copied by the tests that change it."""
    root = tmp_path_factory.mktemp("engine")
    lmdb_damage.engine_store(root)
    return root


@pytest.fixture
def store(engine: Path, tmp_path: Path) -> Path:
    """A copy of the engine's store (a new file: its marker names the old one)."""
    shutil.copytree(engine, tmp_path / "store")
    return tmp_path / "store"


def metadata(root: Path) -> str:
    return str(root / "metadata")


def marker(root: Path) -> dict[str, object]:
    return dict(json.loads((root / "metadata" / MARKER_FILE).read_text()))


def commit_raw(root: Path) -> None:
    """A commit through LMDB alone (not through a store, which would record the marker)."""
    env = lmdb.Environment(metadata(root), max_dbs=64)
    try:
        with env.begin(write=True) as txn:
            txn.put(b"raw", b"commit", db=env.open_db(b"usage", txn=txn))
    finally:
        env.close()


def rewrite_marker(root: Path, **fields: object) -> None:
    path = root / "metadata" / MARKER_FILE
    path.write_text(json.dumps({**marker(root), **fields}))


# -- the walk ---------------------------------------------------------------------------------


def test_the_walk_reads_every_record_of_a_healthy_engine_file(store: Path) -> None:
    env = lmdb.Environment(metadata(store), readonly=True, max_dbs=64)
    with env.begin() as txn:
        names = [bytes(key) for key, _ in txn.cursor()]
        expected = len(names) + sum(txn.stat(env.open_db(name, txn=txn))["entries"] for name in names)
        txnid = txn.id()
    env.close()
    outcome = walk_in_child(metadata(store))
    assert outcome["records"] == expected and outcome["txnid"] == txnid
    assert outcome["pages"] * 4096 <= os.path.getsize(lmdb_damage.data_file(store))


def test_records_past_the_end_of_the_file_kill_the_walk_not_the_opener(store: Path) -> None:
    lmdb_damage.compact(store)
    keys = lmdb_damage.break_last_leaf(store, b"segments")
    assert keys, "the damaged page holds segment records"
    with pytest.raises(MetadataCorrupted, match="killed the checking process with SIGBUS") as raised:
        LmdbMetadataStore(metadata(store), TABLES)
    assert "slts restore" in str(raised.value) and str(lmdb_damage.data_file(store)) in str(raised.value)
    with pytest.raises(MetadataCorrupted):  # refused again: nothing was half opened
        LmdbMetadataStore(metadata(store), TABLES, readonly=True)


def test_a_page_number_past_the_last_page_is_damage(store: Path) -> None:
    lmdb_damage.break_branch(store, b"chunks")
    with pytest.raises(MetadataCorrupted, match="PageNotFound"):
        LmdbMetadataStore(metadata(store), TABLES)


def test_damage_only_a_writer_would_meet_is_found_in_the_free_page_list(store: Path) -> None:
    page = lmdb_damage.break_free_list(store)
    with pytest.raises(MetadataCorrupted, match=f"free-list record frees a page outside 2..{page - 5}"):
        LmdbMetadataStore(metadata(store), TABLES)


@pytest.mark.parametrize("seed", range(6))
def test_flipped_bytes_in_later_pages_are_damage_or_harmless(store: Path, seed: int) -> None:
    """Random bytes of one later page flipped: the open either refuses the file, or it
    opens and reads every record without LMDB complaining (the bytes were in free space
    or inside values: LMDB keeps no checksum; the records' own codecs see those)."""
    lmdb_damage.flip_later_pages(store, seed)
    try:
        opened = LmdbMetadataStore(metadata(store), TABLES)
    except MetadataCorrupted as exc:
        assert "slts restore" in str(exc)
        return
    with opened:
        for table in TABLES:
            list(opened.iterate(table))


# -- when the walk runs -------------------------------------------------------------------------


def test_a_new_folder_needs_no_walk_and_a_clean_close_needs_none_next_time(tmp_path: Path) -> None:
    folder = str(tmp_path / "metadata")
    assert vouch(folder) == NEW
    with LmdbMetadataStore(folder, TABLES) as opened:
        opened.commit([Put("segments", b"s", b"v")])
    state = check_data_file(folder)
    assert state is not None
    recorded = marker(tmp_path)
    assert recorded["synced"] is True and recorded["txnid"] == state.txnid, "the close records what it left"
    assert vouch(folder) == TRUSTED


def test_lmdb_commits_since_the_known_good_state_need_no_walk(store: Path) -> None:
    assert vouch(metadata(store)) == WALKED, "a copy is another file: walked"
    LmdbMetadataStore(metadata(store), TABLES).close()
    commit_raw(store)  # another process's commit, the marker untouched
    assert vouch(metadata(store)) == TRUSTED


def test_bytes_changed_without_a_transaction_are_walked(store: Path) -> None:
    LmdbMetadataStore(metadata(store), TABLES).close()
    assert vouch(metadata(store)) == TRUSTED
    data = lmdb_damage.data_file(store)
    status = data.stat()
    os.utime(data, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))  # written, no new txn
    assert vouch(metadata(store)) == WALKED
    LmdbMetadataStore(metadata(store), TABLES).close()  # the walk vouched: recorded again
    assert vouch(metadata(store)) == TRUSTED


def test_after_a_reboot_only_a_synced_unchanged_file_is_trusted(store: Path) -> None:
    LmdbMetadataStore(metadata(store), TABLES).close()
    rewrite_marker(store, boot="an earlier boot")
    assert vouch(metadata(store)) == TRUSTED, "closed cleanly and synced, untouched since"
    rewrite_marker(store, synced=False)
    assert vouch(metadata(store)) == WALKED, "not synced: an OS crash may have torn it"
    rewrite_marker(store, synced=True)
    commit_raw(store)
    assert vouch(metadata(store)) == WALKED, "written in another boot after the record"


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"v": 99}'])
def test_an_unreadable_marker_means_a_walk(store: Path, content: str) -> None:
    LmdbMetadataStore(metadata(store), TABLES).close()
    (store / "metadata" / MARKER_FILE).write_text(content)
    assert vouch(metadata(store)) == WALKED


def test_always_walks_and_never_reads_only_the_meta_pages(store: Path) -> None:
    LmdbMetadataStore(metadata(store), TABLES).close()
    assert vouch(metadata(store), "always") == WALKED
    before = marker(store)
    assert vouch(metadata(store), "never") == UNCHECKED
    with LmdbMetadataStore(metadata(store), TABLES, check="never") as opened:
        opened.commit([Put("segments", b"unchecked", b"v")])
    assert marker(store) == before, "a process that checked nothing vouches for nothing"


def test_an_unknown_mode_is_refused(store: Path) -> None:
    with pytest.raises(InvalidArgument, match="metadata_check"):
        vouch(metadata(store), "sometimes")
    with pytest.raises(InvalidArgument, match="check must be one of"):
        LmdbMetadataStore(metadata(store), TABLES, check="sometimes")


def test_a_look_records_a_walk_but_nothing_else(store: Path) -> None:
    (store / "metadata" / MARKER_FILE).unlink()
    LmdbMetadataStore(metadata(store), TABLES, readonly=True).close()
    walked = marker(store)
    assert walked["synced"] is False
    commit_raw(store)
    LmdbMetadataStore(metadata(store), TABLES, readonly=True).close()
    assert marker(store) == walked, "a trusted look has nothing to add"


_WRITER = """
import sys
import threading
import lmdb
env = lmdb.Environment(sys.argv[1], max_dbs=64, map_size=1 << 30, sync=False)
db = env.open_db(b"usage")
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("writing", flush=True)
i = 0
while not stop.is_set():  # until stdin closes: commits that free and reuse pages
    with env.begin(write=True) as txn:
        for j in range(50):
            txn.put(b"k%d" % ((i * 50 + j) % 5000), b"v" * (100 + i % 900), db=db)
        txn.delete(b"k%d" % (i % 5000), db=db)
    i += 1
env.close()
"""


def test_a_walk_beside_a_busy_writer_sees_one_consistent_snapshot(store: Path) -> None:
    """A writer commits (freeing and reusing pages) while the file is walked again and
    again: the walk's read transaction pins its snapshot, so it never reports damage."""
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, metadata(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        assert writer.stdout.readline() == "writing\n"
        seen = set()
        for _ in range(10):
            seen.add(walk_in_child(metadata(store))["txnid"])
        assert len(seen) > 1, "the writer committed between the walks"
    finally:
        writer.stdin.close()
        assert writer.wait(timeout=120) == 0


def test_the_library_walks_by_default_and_the_config_flag_turns_it_off(store: Path) -> None:
    import slts

    lmdb_damage.break_branch(store, b"chunks")  # nothing a look at the segment list reads
    where = {"metadata": metadata(store), "read_only": True}
    with pytest.raises(MetadataCorrupted, match="PageNotFound"):
        slts.open(f"file://{store / 'chunks'}", **where)
    unchecked = slts.open(f"file://{store / 'chunks'}", metadata_check=False, **where)
    try:
        assert len(list(unchecked.list())) == 120
    finally:
        unchecked.close()


def test_a_walk_adopts_a_map_another_process_grew_between_its_open_and_its_read(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LMDB answers MAP_RESIZED to a read transaction when another process grew the map
    after this one opened the file: the walk adopts the new size and reads on."""
    from slts.metadata import lmdb_walk

    real = lmdb.Environment
    resized: list[int] = []

    class GrownElsewhere:
        """The walk's environment, whose first ``begin`` meets a map grown elsewhere."""

        def __init__(self, *args: object, **kwargs: object) -> None:
            self._env = real(*args, **kwargs)

        def begin(self, *args: object, **kwargs: object) -> lmdb.Transaction:
            if not resized:
                resized.append(1)
                raise lmdb.MapResizedError("grown by another process")
            return self._env.begin(*args, **kwargs)

        def set_mapsize(self, size: int) -> None:
            resized.append(size)
            self._env.set_mapsize(size)

        def __getattr__(self, name: str) -> object:
            return getattr(self._env, name)

    monkeypatch.setattr(lmdb_walk.lmdb, "Environment", GrownElsewhere)
    found = lmdb_walk.walk(metadata(store))
    assert resized == [1, 0], "the walk adopted the grown map (set_mapsize(0)) and read again"
    assert found["records"] > 0
