"""``slts.bindings.batched_syncs``: data syncs of many files issued together (Linux AIO),
each file's outcome reported, and the plain fallback where AIO is missing or refuses."""

from __future__ import annotations

import errno
import os

import pytest
from slts.bindings import batched_syncs
from slts.bindings.batched_syncs import BatchedSyncs, SharedSyncs

from slts.errors import InvalidConfig


def _files(tmp_path, count: int) -> list[int]:
    fds = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644) for i in range(count)]
    for fd in fds:
        os.write(fd, b"x" * 4096)
    return fds


def _aio() -> BatchedSyncs:
    try:
        return BatchedSyncs(4)
    except InvalidConfig as exc:
        pytest.skip(f"no native AIO here: {exc}")


def test_a_descriptor_that_cannot_be_synced_is_its_own_failure_and_the_context_stays_usable(tmp_path) -> None:
    """A closed descriptor among the files: its outcome is EBADF, the others' None, and
    the context syncs the next batch."""
    syncs = _aio()
    good = _files(tmp_path, 2)
    closed = os.open(tmp_path / "closed", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(closed)
    try:
        outcomes = syncs.sync_all([good[0], closed, good[1]])
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], OSError) and outcomes[1].errno == errno.EBADF
        assert syncs.sync_all(good) == [None, None]
    finally:
        for fd in good:
            os.close(fd)
        syncs.close()
        syncs.close()  # idempotent


def test_shared_syncs_split_large_batches_and_report_in_order(tmp_path) -> None:
    """More files than one context's depth: every outcome, in the files' order."""
    shared = SharedSyncs(4)
    fds = _files(tmp_path, 9)
    closed = os.open(tmp_path / "closed", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(closed)
    try:
        outcomes = shared.sync_each([*fds[:5], closed, *fds[5:]])
        assert len(outcomes) == 10
        assert [o is None for o in outcomes] == [True] * 5 + [False] + [True] * 4
        assert shared.sync_each([]) == []
        assert shared.sync_each(fds[:1]) == [None]
    finally:
        for fd in fds:
            os.close(fd)
        shared.close()


def test_without_aio_each_file_is_synced_plainly(tmp_path, monkeypatch) -> None:
    """Where AIO is missing (``BatchedSyncs`` refuses), ``SharedSyncs`` syncs one file
    after the other, with the same outcomes, and does not try AIO again."""
    tried = []

    def refuse(depth: int) -> BatchedSyncs:
        tried.append(depth)
        raise InvalidConfig("no AIO in this test")

    monkeypatch.setattr(batched_syncs, "BatchedSyncs", refuse)
    shared = SharedSyncs(8)
    fds = _files(tmp_path, 3)
    closed = os.open(tmp_path / "closed", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(closed)
    try:
        outcomes = shared.sync_each([*fds, closed])
        assert outcomes[:3] == [None, None, None]
        assert isinstance(outcomes[3], OSError) and outcomes[3].errno == errno.EBADF
        shared.sync_each(fds)
        assert tried == [8], "AIO is tried once"
    finally:
        for fd in fds:
            os.close(fd)


def test_a_broken_context_is_dropped_and_the_files_synced_plainly(tmp_path, monkeypatch) -> None:
    """A context whose ``io_getevents`` fails: nothing is known of its syncs, so every
    file is synced again, plainly; the broken context is not reused."""
    shared = SharedSyncs(4)
    fds = _files(tmp_path, 2)
    real = BatchedSyncs.sync_all
    broken = []

    def fail(self: BatchedSyncs, fds: list[int]) -> list[OSError | None]:
        broken.append(self)
        raise OSError(errno.EINVAL, "io_getevents: broken in this test")

    try:
        _aio().close()
        monkeypatch.setattr(BatchedSyncs, "sync_all", fail)
        assert shared.sync_each(fds) == [None, None]
        monkeypatch.setattr(BatchedSyncs, "sync_all", real)
        assert shared.sync_each(fds) == [None, None]
        assert broken and broken[0]._closed, "the broken context was closed"
        assert all(context is not broken[0] for context in shared._free)
    finally:
        for fd in fds:
            os.close(fd)
        shared.close()


def test_a_forked_child_makes_contexts_of_its_own(tmp_path) -> None:
    """After ``fork`` the parent's AIO contexts are not the child's: the child's syncs use
    a context it makes (none of the parent's), and report every file durable."""
    shared = SharedSyncs(4)
    fds = _files(tmp_path, 2)
    try:
        assert shared.sync_each(fds) == [None, None]
        parents = list(shared._free)
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running the parent's clean-ups
            ok = shared.sync_each(fds) == [None, None] and all(c not in parents for c in shared._free)
            os.write(writer, b"1" if ok else b"0")
            os._exit(0)
        os.close(writer)
        assert os.read(reader, 1) == b"1"
        os.close(reader)
        assert os.waitpid(pid, 0)[1] == 0
        assert shared._free == parents
    finally:
        for fd in fds:
            os.close(fd)
        shared.close()
