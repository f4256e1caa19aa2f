"""The HDFS binding's name mapping and temporary files (bindings/hdfs.py, invariant 1).

Every chunk name maps to a path strictly below the root made of components HDFS accepts
(non-empty, no leading dot, so no ``.``, ``..``, ``.snapshot``, ``.reserved``; no ``:``;
at most 255 bytes), at a depth HDFS accepts; the mapping is injective and no chunk's path
is a folder on another chunk's path; listing decodes back to the exact names and ignores
temporary and foreign files; stale temporary files are removed at start, young ones not.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyhdfs", reason="pyhdfs is not installed (pip install 'slts[hdfs]')")

from slts.bindings.base import CHUNK_NAME_BYTES_MAX
from slts.bindings.hdfs import FOLDERS_MAX, TMP_AGE_S_MAX, HdfsChunkStorage, chunk_relpath

from tests.support.hdfs import TEST_OPTIONS, TEST_USER

#: Pieces of a 1024-byte name encoded 3 bytes per byte, 254 bytes per piece.
DEPTH_MAX = FOLDERS_MAX + (3 * CHUNK_NAME_BYTES_MAX) // 254 + 2


def fits(name: str) -> bool:
    return "\x00" not in name and 0 < len(name.encode("utf-8")) <= CHUNK_NAME_BYTES_MAX


NAMES = st.one_of(
    st.text(min_size=1, max_size=40),
    st.text(alphabet="ab./%~:é ", min_size=1, max_size=400),
    st.lists(st.text(alphabet="a.:%~/", max_size=3), min_size=1, max_size=80).map("/".join),
).filter(fits)


@settings(max_examples=400, deadline=None)
@given(NAMES)
def test_every_name_maps_to_components_hdfs_accepts(name):
    parts = chunk_relpath(name).split("/")
    assert 1 <= len(parts) <= DEPTH_MAX
    for part in parts:
        assert part and not part.startswith(".") and ":" not in part and part != "%tmp"
        assert len(part.encode("utf-8")) <= 255
        assert part.isascii()


@settings(max_examples=400, deadline=None)
@given(NAMES, NAMES)
def test_distinct_names_never_meet(first, second):
    if first == second:
        return
    a, b = chunk_relpath(first), chunk_relpath(second)
    assert a != b
    assert not b.startswith(a + "/") and not a.startswith(b + "/")  # no file is another's folder


def test_deep_names_keep_their_tail_in_the_file_part():
    name = "/".join(["c"] * 40) + "x"
    parts = chunk_relpath(name).split("/")
    assert parts[:FOLDERS_MAX] == ["c%"] * FOLDERS_MAX
    assert parts[FOLDERS_MAX:] == ["%2F".join(["c"] * 8) + "x"]
    assert len(chunk_relpath("/" * CHUNK_NAME_BYTES_MAX).split("/")) <= DEPTH_MAX


NAMES_HDFS_RESERVES = [
    ".snapshot",
    ".reserved",
    "a/.snapshot/b",
    "a:b",
    "..",
    ".",
    "x/..",
    "%tmp",
    "~",
]


def test_names_hdfs_reserves_are_stored_and_listed(storage, server, root):
    for name in NAMES_HDFS_RESERVES:
        storage.create(name, name.encode())
    assert list(storage.list()) == sorted(NAMES_HDFS_RESERVES)
    for name in NAMES_HDFS_RESERVES:
        assert server.raw_read(f"{root}/{chunk_relpath(name)}") == name.encode()


def test_deep_names_round_trip_through_the_server(storage, server, root):
    names = [
        "/".join(["d"] * 40) + "x",
        "/".join(["d"] * 40),
        "/".join(["d"] * 33) + "/",
        "d/" * 31 + "d",
    ]
    for name in names:
        storage.create(name, b"1")
    assert list(storage.list()) == sorted(names)
    assert list(storage.list("d/" * 33)) == sorted(n for n in names if n.startswith("d/" * 33))


def test_foreign_files_are_not_chunks(storage, server, root):
    for path in ("plain", "x%/%%", "%2E", "a.txt", "a%2e", "weird%", "dir/f", "y%/z~"):
        server.raw_write(f"{root}/{path}", b"?", owner=TEST_USER)
    # Canonical paths of "plain", "x/" and "."; the others decode to names whose paths differ.
    assert list(storage.list()) == [".", "plain", "x/"]


def test_temporary_files_are_never_listed_and_stale_ones_go_at_start(server, root):
    old_ms = int((time.time() - TMP_AGE_S_MAX - 60) * 1000)
    server.raw_write(f"{root}/%tmp/old", b"debris", owner=TEST_USER, mtime_ms=old_ms)
    server.raw_write(f"{root}/%tmp/young", b"in flight", owner=TEST_USER)
    storage = HdfsChunkStorage.from_url(server.url(root, **TEST_OPTIONS))
    assert server.raw_list(f"{root}/%tmp") == ["young"]  # another process's create may own it
    assert list(storage.list()) == []
    assert list(storage.list("%tmp")) == []
    storage.close()
