"""The descriptors the chunk cache keeps open between hits
(``slts.bindings.chunk_cache.open_files``), invariants 1-4: a forgotten file's descriptor
is closed at once or when its last read ends, never under a read, the idle ones kept are
bounded, and only a file the index still holds is kept. A random program of borrows,
give-backs and forgets checks each descriptor's state with ``os.fstat`` on the numbers
handed out."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slts.bindings.chunk_cache.files import CacheFile
from slts.bindings.chunk_cache.open_files import OpenFiles


def make(folder: Path, index: int, data: bytes = b"x") -> CacheFile:
    path = folder / f"file-{index}"
    path.write_bytes(data)
    return CacheFile(bytes([index]) * 16, 0, 0, len(data), index, b"", str(path), len(data))


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_kept_descriptor_is_reused_and_reads_the_file(tmp_path: Path) -> None:
    file = make(tmp_path, 1, b"abc")
    files = OpenFiles(4, lambda _: True)
    fd = files.borrow(file)
    assert os.pread(fd, 3, 0) == b"abc"
    files.give_back(file, fd)
    assert files.borrow(file) == fd and len(files) == 1
    files.give_back(file, fd)
    files.close()
    assert not is_open(fd)


def test_forgetting_an_idle_file_closes_its_descriptor_at_once(tmp_path: Path) -> None:
    file = make(tmp_path, 1)
    files = OpenFiles(4, lambda _: True)
    fd = files.borrow(file)
    files.give_back(file, fd)
    files.forget(file.path)
    assert not is_open(fd) and len(files) == 0


def test_a_file_forgotten_under_a_read_is_closed_when_the_read_ends(tmp_path: Path) -> None:
    file = make(tmp_path, 1, b"abc")
    files = OpenFiles(4, lambda _: True)
    fd = files.borrow(file)
    second = files.borrow(file)
    assert second == fd
    files.forget(file.path)
    os.unlink(file.path)
    assert os.pread(fd, 3, 0) == b"abc", "a removed file's descriptor still reads its bytes"
    files.give_back(file, fd)
    assert is_open(fd), "another read still holds it"
    files.give_back(file, fd)
    assert not is_open(fd)
    with pytest.raises(FileNotFoundError):
        files.borrow(file)


def test_a_file_the_index_no_longer_holds_is_read_once_and_closed(tmp_path: Path) -> None:
    file = make(tmp_path, 1)
    files = OpenFiles(4, lambda _: False)
    fd = files.borrow(file)
    assert len(files) == 0 and is_open(fd)
    files.give_back(file, fd)
    assert not is_open(fd)


def test_the_least_recently_borrowed_idle_descriptors_go_first(tmp_path: Path) -> None:
    entries = [make(tmp_path, i) for i in range(5)]
    files = OpenFiles(2, lambda _: True)
    fds = {}
    for entry in entries[:3]:
        fds[entry.path] = files.borrow(entry)
    assert len(files) == 3, "none idle: none closed"
    for entry in entries[:3]:
        files.give_back(entry, fds[entry.path])
    assert len(files) == 2 and not is_open(fds[entries[0].path])
    assert files.borrow(entries[1]) == fds[entries[1].path]
    files.give_back(entries[1], fds[entries[1].path])
    files.close()


@settings(max_examples=150, deadline=None)
@given(
    program=st.lists(
        st.tuples(st.sampled_from(["borrow", "give_back", "forget"]), st.integers(0, 3)), max_size=40
    ),
    capacity=st.integers(0, 3),
)
def test_a_random_program_never_leaks_or_closes_a_descriptor_under_a_read(
    tmp_path_factory: pytest.TempPathFactory, program: list[tuple[str, int]], capacity: int
) -> None:
    folder = tmp_path_factory.mktemp("open")
    entries = [make(folder, i) for i in range(4)]
    current = set(range(4))
    files = OpenFiles(capacity, lambda file: file.version in current)
    held: list[tuple[int, int]] = []  # (file index, fd) of reads in progress
    handed: set[int] = set()
    for action, index in program:
        if action == "borrow" and index in current:
            fd = files.borrow(entries[index])
            held.append((index, fd))
            handed.add(fd)
        elif action == "give_back" and held:
            file_index, fd = held.pop(index % len(held))
            files.give_back(entries[file_index], fd)
        elif action == "forget" and index in current:
            current.discard(index)
            files.forget(entries[index].path)
        for _, fd in held:
            assert is_open(fd), "invariant 2: a descriptor under a read is open"
        assert len(files) <= max(capacity, len({fd for _, fd in held})), "invariant 3"
    for file_index, fd in held:
        files.give_back(entries[file_index], fd)
    files.close()
    assert not [fd for fd in handed if is_open(fd)], "invariant 1: every descriptor closed once unused"


def test_threads_borrowing_and_forgetting_at_once_close_every_descriptor(tmp_path: Path) -> None:
    entries = [make(tmp_path, i, bytes([i]) * 64) for i in range(8)]
    current = set(range(8))
    lock = threading.Lock()
    files = OpenFiles(3, lambda file: file.version in current)
    opened: list[int] = []
    errors: list[BaseException] = []

    def reader(seed: int) -> None:
        try:
            for step in range(400):
                entry = entries[(seed * 7 + step) % 8]
                try:
                    fd = files.borrow(entry)
                except FileNotFoundError:
                    continue
                with lock:
                    opened.append(fd)
                assert os.pread(fd, 64, 0) == bytes([entry.version]) * 64
                files.give_back(entry, fd)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for index in range(8):
        with lock:
            current.discard(index)
        files.forget(entries[index].path)
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(files) == 0, "every file was forgotten: nothing kept"
    files.close()
    assert not [fd for fd in set(opened) if is_open(fd)], "every descriptor closed once unused"
