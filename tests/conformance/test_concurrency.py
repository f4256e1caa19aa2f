"""Thread safety: every method may be called from many threads at once (bindings/base.py).

Threads start together on a barrier to make the races likely; nothing sleeps and nothing
is timed. The assertions are about outcomes: one winner per conditional operation, no
lost or duplicated bytes, no partial chunk ever visible.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from slts.bindings import ConcatSource

from slts.errors import ChunkExists, ChunkInvalidOffset
from tests.support.conformance import NO_APPEND, NO_CONCAT, content, pattern, require

THREADS = 8
ROUNDS = 12
JOIN_S_MAX = 60.0


def run_together(count: int, work: Callable[[int], Any]) -> list[tuple[str, Any]]:
    """Run ``work(i)`` for i in range(count) on ``count`` threads released at once.

    Returns ``("ok", result)`` or ``("error", exception)`` per thread, in thread order.
    """
    barrier = threading.Barrier(count)
    outcomes: list[tuple[str, Any]] = [("missing", None)] * count

    def body(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = ("ok", work(index))
        except Exception as exc:
            outcomes[index] = ("error", exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S_MAX)
        assert not thread.is_alive(), "a binding call hung"
    return outcomes


def the_winner(outcomes: list[tuple[str, Any]], loser_error: type[Exception]) -> int:
    """The index of the one thread that succeeded; every other one failed with ``loser_error``."""
    winners = [i for i, (kind, _) in enumerate(outcomes) if kind == "ok"]
    assert len(winners) == 1, outcomes
    for i, (_, value) in enumerate(outcomes):
        if i != winners[0]:
            assert isinstance(value, loser_error), value
    return winners[0]


def test_many_threads_build_distinct_chunks(storage, raw):
    pieces = 20

    def work(index: int) -> None:
        if storage.supports_append:
            handle = storage.create(f"t{index}/chunk")
            offset = 0
            for piece in range(pieces):
                data = pattern(100 + piece, seed=index * pieces + piece)
                storage.write(handle, offset, data)
                offset += len(data)
        else:
            for piece in range(pieces):
                storage.create(f"t{index}/chunk{piece:02}", pattern(100 + piece, seed=index * pieces + piece))

    outcomes = run_together(THREADS, work)
    assert outcomes == [("ok", None)] * THREADS
    expected: dict[str, bytes] = {}
    for index in range(THREADS):
        datas = [pattern(100 + piece, seed=index * pieces + piece) for piece in range(pieces)]
        if storage.supports_append:
            expected[f"t{index}/chunk"] = b"".join(datas)
        else:
            expected.update({f"t{index}/chunk{piece:02}": data for piece, data in enumerate(datas)})
    assert list(storage.list()) == sorted(expected)
    for name, data in expected.items():
        assert content(storage, name) == data
        assert raw.read(name) == data


def test_racing_creates_of_one_name_have_exactly_one_winner(storage, raw):
    for round_ in range(ROUNDS):
        name = f"race/{round_}"
        datas = [pattern(1000 * (i + 1), seed=i) for i in range(THREADS)]
        outcomes = run_together(THREADS, lambda i: storage.create(name, datas[i]))  # noqa: B023
        winner = the_winner(outcomes, ChunkExists)
        assert content(storage, name) == datas[winner]
        assert raw.read(name) == datas[winner]
    assert len(list(storage.list("race/"))) == ROUNDS


def test_racing_writes_at_one_offset_have_exactly_one_winner(storage, raw):
    # Offset 0 of an empty chunk is valid on every binding; with append also a later end.
    heads = [b""] + ([b"head"] if storage.supports_append else [])
    for round_ in range(ROUNDS):
        for head in heads:
            name = f"race/{round_}/{len(head)}"
            storage.create(name, head)
            handles = [storage.open_write(name) for _ in range(THREADS)]
            datas = [pattern(500 * (i + 1), seed=i) for i in range(THREADS)]
            outcomes = run_together(
                THREADS,
                lambda i: storage.write(handles[i], len(head), datas[i]),  # noqa: B023
            )
            winner = the_winner(outcomes, ChunkInvalidOffset)
            assert raw.read(name) == head + datas[winner]


def test_racing_concats_to_one_target_have_exactly_one_winner(storage, raw):
    require(storage, "supports_concat", NO_CONCAT)
    storage.create("source", pattern(THREADS * 10))
    for round_ in range(ROUNDS):
        target = f"target/{round_}"
        outcomes = run_together(
            THREADS,
            lambda i: storage.concat(target, [ConcatSource("source", i * 10, 10)]),  # noqa: B023
        )
        winner = the_winner(outcomes, ChunkExists)
        assert raw.read(target) == pattern(THREADS * 10)[winner * 10 : winner * 10 + 10]


def test_readers_never_see_a_partial_chunk(storage):
    names = [f"atomic/{i}" for i in range(20)]
    data = pattern(256 << 10)
    done = threading.Event()

    def writer() -> None:
        try:
            for name in names:
                storage.create(name, data)
        finally:
            done.set()

    def reader() -> None:
        while not done.is_set():
            for name in storage.list("atomic/"):
                info = storage.get_info(name)
                assert info.length == len(data), info
                assert storage.read(storage.open_read(name), len(data) - 16, 16) == data[-16:]

    outcomes = run_together(2, lambda i: writer() if i == 0 else reader())
    assert outcomes == [("ok", None), ("ok", None)]
    assert list(storage.list("atomic/")) == sorted(names)


def test_appends_from_many_threads_to_one_chunk_lose_nothing(storage, raw):
    # Each thread retries at the new end after losing a race: exactly all pieces land, once.
    require(storage, "supports_append", NO_APPEND)
    handle = storage.create("shared")
    pieces_per_thread = 10

    def work(index: int) -> int:
        retries = 0
        for piece in range(pieces_per_thread):
            data = bytes([index]) * (piece + 1)
            for _ in range(10_000):  # bounded: every loss means another thread progressed
                try:
                    storage.write(handle, storage.get_info("shared").length, data)
                    break
                except ChunkInvalidOffset:
                    retries += 1
            else:
                raise AssertionError("no progress")
        return retries

    outcomes = run_together(THREADS, work)
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    stored = raw.read("shared")
    assert len(stored) == THREADS * sum(range(1, pieces_per_thread + 1))
    for index in range(THREADS):
        assert stored.count(bytes([index])) == sum(range(1, pieces_per_thread + 1))
