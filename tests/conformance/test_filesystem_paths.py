"""The filesystem binding's name mapping and temporary files (bindings/filesystem.py).

Invariants checked here: every chunk name maps to a path strictly below the root, made of
components that are neither ``.`` nor ``..`` and fit in a file name; the mapping is
injective and no chunk's path is a folder on another chunk's path; the listing decodes
back to the exact names; the reserved ``%tmp`` folder is never listed and its stale files
are removed at start, and only when old.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slts.bindings import ConcatSource, from_url
from slts.bindings.base import CHUNK_NAME_BYTES_MAX, ChunkHandle
from slts.bindings.filesystem import TMP_AGE_S_MAX, FileSystemChunkStorage, chunk_relpath

from slts.errors import ChunkNotFound, ChunkStorageError, InvalidConfig, StorageUnavailable
from tests.support.conformance import remove_tree

from .test_names import HOSTILE_NAMES, LONGEST_NAMES

FILE_NAME_BYTES_MAX = 255

# Text heavy in the characters the mapping treats specially.
SPECIAL = st.sampled_from(list("/.%~-_aZ9 é\\:*😀\t+"))
HOSTILE_TEXT = st.lists(SPECIAL | st.characters(blacklist_characters="\x00"), min_size=1, max_size=40).map(
    "".join
)


def _valid_name(name: str) -> bool:
    """What ``check_name`` accepts: ``characters()`` may draw lone surrogates, which it refuses."""
    try:
        return "\x00" not in name and len(name.encode("utf-8")) <= CHUNK_NAME_BYTES_MAX
    except UnicodeEncodeError:
        return False


NAME = (HOSTILE_TEXT | st.text(min_size=1, max_size=60) | st.text(min_size=200, max_size=400)).filter(
    _valid_name
)


def assert_maps_below(root: str, name: str) -> str:
    relpath = chunk_relpath(name)
    parts = relpath.split(os.sep)
    assert not os.path.isabs(relpath), (name, relpath)
    for part in parts:
        assert part not in ("", ".", ".."), (name, relpath)
        assert len(part.encode()) <= FILE_NAME_BYTES_MAX, (name, part)
    assert parts[0] != "%tmp", name
    path = os.path.join(root, relpath)
    assert os.path.commonpath([root, os.path.normpath(path)]) == root, (name, path)
    assert os.path.normpath(path) == path, (name, path)
    return path


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FileSystemChunkStorage]:
    storage = FileSystemChunkStorage(str(tmp_path / "root"))
    yield storage
    remove_tree(storage.root)  # names 1024 folders deep defeat shutil.rmtree


@pytest.mark.parametrize("name", HOSTILE_NAMES + LONGEST_NAMES, ids=lambda n: repr(n)[:40])
def test_hostile_names_map_below_the_root_and_list_back(fs, name):
    path = assert_maps_below(fs.root, name)
    fs.create(name, b"x")
    assert os.path.isfile(path)
    assert os.path.realpath(path).startswith(fs.root + os.sep)
    assert list(fs.list()) == [name]


@settings(max_examples=150, deadline=None)
@given(name=NAME)
def test_any_name_maps_below_the_root_and_lists_back(name):
    with tempfile.TemporaryDirectory() as folder:
        fs = FileSystemChunkStorage(os.path.join(folder, "root"))
        path = assert_maps_below(fs.root, name)
        fs.create(name, name.encode("utf-8", "surrogatepass"))
        with open(path, "rb") as file:
            assert file.read() == name.encode("utf-8", "surrogatepass")
        assert list(fs.list()) == [name]
        assert list(fs.list(name)) == [name]


@settings(max_examples=300, deadline=None)
@given(first=NAME, second=NAME)
def test_the_mapping_is_injective_and_never_nests_a_chunk_in_a_chunk(first, second):
    if first == second:
        return
    one, two = chunk_relpath(first), chunk_relpath(second)
    assert one != two
    assert not two.startswith(one + os.sep)
    assert not one.startswith(two + os.sep)


def test_a_name_one_character_longer_than_a_file_name_still_works(fs):
    for length in range(250, 262):
        for char in ("a", ".", "%"):
            name = char * length
            assert_maps_below(fs.root, name)
            fs.create(name, str(length).encode())
    assert len(list(fs.list())) == 36


def test_stale_temporary_files_are_removed_at_start_only_when_old(tmp_path):
    root = tmp_path / "root"
    FileSystemChunkStorage(str(root))
    tmp = root / "%tmp"
    old, fresh = tmp / "old-leftover", tmp / "fresh-leftover"
    old.write_bytes(b"half a chunk")
    fresh.write_bytes(b"being written by another process")
    stale_s = time.time() - TMP_AGE_S_MAX - 60
    os.utime(old, (stale_s, stale_s))
    FileSystemChunkStorage(str(root))
    assert not old.exists()
    assert fresh.read_bytes() == b"being written by another process"


def test_a_crash_leftover_temporary_file_is_never_a_chunk(fs):
    fs.create("real", b"r")
    leftover = Path(fs.root) / "%tmp" / "0123456789abcdef"
    leftover.write_bytes(b"partial")
    assert list(fs.list()) == ["real"]
    assert list(fs.list("%")) == []
    assert not fs.exists("%tmp/0123456789abcdef")
    fs.create("%tmp", b"a chunk named like the folder")
    fs.create("%tmp/0123456789abcdef", b"another")
    assert list(fs.list()) == ["%tmp", "%tmp/0123456789abcdef", "real"]
    assert leftover.read_bytes() == b"partial"


def test_no_temporary_file_is_left_after_creates_and_concats(fs):
    fs.create("a", b"0123456789")
    fs.concat("b", [ConcatSource("a", 2, 3)])
    with pytest.raises(FileExistsError):
        fs.create("a", b"again")
    with pytest.raises(IndexError):
        fs.concat("c", [ConcatSource("a", 8, 3)])
    assert os.listdir(os.path.join(fs.root, "%tmp")) == []


def test_read_only_is_enforced_by_mode_bits_even_for_root(fs):
    handle = fs.create("c")
    fs.set_readonly(handle, True)
    path = os.path.join(fs.root, chunk_relpath("c"))
    assert os.stat(path).st_mode & 0o222 == 0
    fs.set_readonly(handle, False)
    assert os.stat(path).st_mode & 0o200


def test_file_url_reopens_the_same_root(fs):
    fs.create("a/b", b"payload")
    reopened = from_url(f"file://{fs.root}")
    assert isinstance(reopened, FileSystemChunkStorage)
    assert reopened.root == fs.root
    assert list(reopened.list()) == ["a/b"]
    assert reopened.read(reopened.open_read("a/b"), 0, 100) == b"payload"


@pytest.mark.parametrize("url", ["file:///", "file:////", "file:///tmp/.."])
def test_the_root_of_the_file_system_is_refused_before_anything_is_written(url, monkeypatch):
    """``file:///`` would make every chunk, and the binding's temporary folder, a file
    under ``/``: refused with ``InvalidConfig`` naming the fix, nothing created."""
    made = []
    monkeypatch.setattr(os, "makedirs", lambda *args, **kwargs: made.append(args))
    with pytest.raises(InvalidConfig, match="root must be a folder of its own"):
        from_url(url)
    assert made == []


def test_files_that_are_not_chunks_are_ignored(fs):
    fs.create("real", b"r")
    os.mkdir(os.path.join(fs.root, "not-a-chunk-folder"))
    os.mkdir(os.path.join(fs.root, "folder%"))
    for foreign in (
        "not-a-chunk-folder/file",
        "backup~",
        "real%2e",
        "low%2fer",
        "%00",
        "folder%/x%2E",
    ):
        with open(os.path.join(fs.root, foreign), "wb"):
            pass
    os.symlink("/etc/passwd", os.path.join(fs.root, "link"))
    assert list(fs.list()) == ["real"]


def test_delete_removes_the_folders_it_emptied(fs):
    fs.create("a/b/c/d", b"1")
    fs.create("a/x", b"2")
    fs.create("y" * 600, b"3")  # continuation folders
    fs.delete(fs.open_read("a/b/c/d"))
    fs.delete(fs.open_read("y" * 600))
    assert sorted(os.listdir(fs.root)) == ["%tmp", "a%"]
    assert os.listdir(os.path.join(fs.root, "a%")) == ["x"]
    fs.delete(fs.open_read("a/x"))
    assert os.listdir(fs.root) == ["%tmp"]
    fs.create("a/b/c/d", b"again")
    assert list(fs.list()) == ["a/b/c/d"]


def test_creates_racing_with_deletes_in_one_folder_all_land(fs):
    # Each delete may prune the folder another thread's create has just made; that create
    # must retry instead of failing with ChunkNotFound.
    threads_count, rounds = 4, 150
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_count)

    def churn(index: int) -> None:
        barrier.wait()
        try:
            for i in range(rounds):
                fs.delete(fs.create(f"deep/er/t{index}-{i}"))
            fs.create(f"deep/er/t{index}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert list(fs.list()) == [f"deep/er/t{i}" for i in range(threads_count)]


def test_parallel_deletes_of_a_whole_folder_leave_no_folder(fs):
    """Deletes in flight in one folder leave the pruning to the last of them: when many
    threads delete every chunk of two folders (some twice: ``ChunkNotFound``), both
    folders and their parent are gone afterwards, and nothing is left counted."""
    names = [f"seg/{side}/c{i}" for side in ("a", "b") for i in range(120)]
    for name in names:
        fs.create(name, b"x")
    pending = list(reversed(names + names[::7]))  # a few deleted twice
    lock = threading.Lock()
    errors: list[BaseException] = []

    def drain() -> None:
        while True:
            with lock:
                if not pending:
                    return
                name = pending.pop()
            try:
                fs.delete(ChunkHandle(name, readonly=False))
            except ChunkNotFound:
                pass
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=drain) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert os.listdir(fs.root) == ["%tmp"]
    assert fs._deleting == {}  # the binding's own count, back to nothing


def test_a_failed_delete_that_ends_last_still_prunes(fs, monkeypatch):
    """The last delete in flight prunes whatever its own unlink did: a folder emptied by a
    delete that ran beside a failing one is removed when the failing one ends."""
    fs.create("f/one", b"1")
    fs.create("f/two", b"2")
    real_unlink = os.unlink
    started, release = threading.Event(), threading.Event()

    def slow_failing_unlink(path: str, *args: object, **kwargs: object) -> None:
        if path.endswith("two"):
            started.set()
            release.wait(30)
            real_unlink(path)  # the file goes, then the call reports an error
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", slow_failing_unlink)
    failures: list[BaseException] = []

    def delete_two() -> None:
        try:
            fs.delete(ChunkHandle("f/two", readonly=False))
        except ChunkStorageError as exc:
            failures.append(exc)

    thread = threading.Thread(target=delete_two)
    thread.start()
    assert started.wait(30)
    fs.delete(ChunkHandle("f/one", readonly=False))  # not the last in flight: no pruning
    assert os.path.isdir(os.path.join(fs.root, "f%"))
    release.set()
    thread.join(30)
    assert len(failures) == 1
    assert os.listdir(fs.root) == ["%tmp"]


# -- OS failures, injected below the binding ---------------------------------------------------


def _failing(code: int):
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code))

    return fail


@pytest.mark.parametrize(
    ("code", "error", "retryable"),
    [(errno.ESTALE, StorageUnavailable, True), (errno.EIO, ChunkStorageError, False)],
)
def test_os_errors_leave_as_typed_errors_with_their_cause(fs, monkeypatch, code, error, retryable):
    handle = fs.create("c", b"data")
    monkeypatch.setattr(os, "pread", _failing(code))
    with pytest.raises(error) as caught:
        fs.read(handle, 0, 4)
    assert caught.value.retryable is retryable
    assert caught.value.chunk == "c"
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == code


def test_a_failed_append_leaves_the_chunk_as_it_was(fs, monkeypatch):
    handle = fs.create("c", b"head")
    monkeypatch.setattr(os, "fdatasync", _failing(errno.ENOSPC))
    with pytest.raises(ChunkStorageError):
        fs.write(handle, 4, b"tail")
    monkeypatch.undo()
    assert fs.read(fs.open_read("c"), 0, 100) == b"head"
    fs.write(handle, 4, b"tail")
    assert fs.read(fs.open_read("c"), 0, 100) == b"headtail"


def test_appends_work_where_flock_is_unavailable(fs, monkeypatch):
    monkeypatch.setattr(fcntl, "flock", _failing(errno.ENOLCK))
    handle = fs.create("c")
    fs.write(handle, 0, b"one")
    with pytest.raises(IndexError):
        fs.write(handle, 0, b"two")
    assert fs.read(handle, 0, 100) == b"one"


def test_concat_copies_through_user_space_where_copy_file_range_fails(fs, monkeypatch):
    monkeypatch.setattr(os, "copy_file_range", _failing(errno.EXDEV), raising=False)
    fs.create("a", b"0123456789")
    fs.concat("b", [ConcatSource("a", 7, 3), ConcatSource("a", 0, 2)])
    assert fs.read(fs.open_read("b"), 0, 100) == b"78901"


def test_a_removed_temporary_folder_is_made_again_and_a_removed_root_is_named(tmp_path) -> None:
    """A binding kept for a long time (a Spark worker keeps its own) outlives an operator's
    clean-up of ``%tmp``: creates and concats make the folder again. A root that is gone
    is reported as the binding's, naming its temporary folder, not as the chunk missing;
    the root is never made again."""
    root = tmp_path / "chunks"
    binding = FileSystemChunkStorage(str(root))
    binding.create("a", b"A" * 10)
    remove_tree(str(root / "%tmp"))
    binding.create("b", b"B" * 10)
    remove_tree(str(root / "%tmp"))
    assert binding.concat("c", [ConcatSource("a", 0, 10), ConcatSource("b", 0, 10)]).length == 20
    assert binding.read(binding.open_read("c"), 0, 20) == b"A" * 10 + b"B" * 10
    assert sorted(binding.list("")) == ["a", "b", "c"]
    remove_tree(str(root))
    with pytest.raises(ChunkStorageError, match="temporary folder") as raised:
        binding.create("d", b"D")
    assert not isinstance(raised.value, ChunkNotFound) and not root.exists()
