"""Inspection beside layout changes sees one committed layout (issue 25, point 1).

``chunks``, ``verify_segment``, ``scrub`` and reads walk a segment's chunk list while its
owner appends, concatenates, truncates, defragments and collects the chunks it dropped. A
walk read across commits once met a chunk that a defrag had replaced and GC had collected
("chunk record ... is referenced but missing": an operator told the store is corrupt when
it is not), and a check planned from one layout found its chunks gone from the chunk
storage. Here every walk is one layout (contiguous starts that end at the segment's length
in the same state), verify and scrub report nothing, and reads return the model's bytes:
from the owner itself, from a read-only instance in the same process, and from a read-only
observer in another process (``layout_observer.py``). Real damage is still reported.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from slts.admin.scrub import scrub
from slts.admin.verify import verify_segment
from slts.config import StorageConfig
from slts.errors import SegmentTruncated
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, env_fixture

KiB = 1 << 10
SMALL = {"defrag_small_chunk_bytes": 8 * KiB, "checksum_block_bytes": KiB, "gc_delay_s": 0.0}
OBSERVER = Path(__file__).with_name("layout_observer.py")

env = env_fixture([("filesystem", "lmdb"), ("memory", "memory")])
lmdb_env = env_fixture([("filesystem", "lmdb")])


def expected(offset: int, length: int) -> bytes:
    """The model: the byte at segment offset ``o`` is ``o % 251``, whatever the layout."""
    return bytes((offset + i) % 251 for i in range(length))


class Owner:
    """The owner's side: one segment ``s`` changed at random, the model kept by offset."""

    def __init__(self, storage: ChunkedSegmentStorage, env: Env, seed: int) -> None:
        self.storage, self.env, self.rng = storage, env, random.Random(seed)
        storage.create("s", max_rolling_length=16 * KiB)
        self.handle = storage.open_write("s")
        self.length = 0
        self.sources = 0
        for _ in range(12):
            self.append()

    def append(self) -> None:
        data = expected(self.length, self.rng.randint(1, 6 * KiB))
        self.storage.write(self.handle, self.length, data)
        self.length += len(data)

    def step(self) -> None:
        action = self.rng.choice(["append"] * 3 + ["concat", "truncate", "defrag", "gc", "gc"])
        storage = self.storage
        if action == "append":
            self.append()
        elif action == "concat":
            self.sources += 1
            source = f"source-{self.sources}"
            data = expected(self.length, self.rng.randint(1, 10 * KiB))
            storage.create(source, max_rolling_length=self.rng.choice([2 * KiB, 16 * KiB]))
            storage.write(storage.open_write(source), 0, data)
            storage.seal(storage.open_write(source))
            storage.concat(self.handle, self.length, source)
            self.length += len(data)
        elif action == "truncate":
            start = storage.info("s").start_offset
            storage.truncate(self.handle, max(start, self.length - 48 * KiB))
        elif action == "defrag":
            storage.defrag("s")
        else:
            self.env.clock.advance(1.0)
            storage.gc.run_once()


def check_one_layout(storage: ChunkedSegmentStorage) -> None:
    """One round of inspection of ``s``: each result is one committed layout, healthy."""
    layout = storage.chunks("s")
    starts = [start for start, _ in layout]
    ends = [start + chunk.length for start, chunk in layout]
    assert starts[1:] == ends[:-1], ("a walk across two layouts", starts, ends)
    assert verify_segment(storage, "s", checksums=True) == []
    report = scrub(storage, prefix="s")
    assert report.anomalies == [], report.anomalies
    info = storage.info("s")
    handle = storage.open_read("s")
    position = max(info.start_offset, info.length - 40 * KiB)
    while position < info.length:
        size = min(7 * KiB, info.length - position)
        try:
            data = storage.read(handle, position, size)
        except SegmentTruncated:
            return
        assert data == expected(position, size), (position, size)
        position += size


def run_beside(owner: Owner, steps: int, observers: list[Callable[[], None]]) -> list[int]:
    """``observers`` each called in a loop on its own thread while the owner takes
    ``steps`` steps (and at least until each finished two rounds); the rounds each did.
    The first failure of any thread is raised."""
    stop = threading.Event()
    failures: list[BaseException] = []
    rounds = [0] * len(observers)
    enough = threading.Semaphore(0)

    def loop(index: int, observe: Callable[[], None]) -> None:
        try:
            while not stop.is_set():
                observe()
                rounds[index] += 1
                if rounds[index] == 2:
                    enough.release()
        except BaseException as exc:
            failures.append(exc)
            stop.set()
            enough.release()

    threads = [threading.Thread(target=loop, args=(i, o)) for i, o in enumerate(observers)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(steps):
            if stop.is_set():
                break
            owner.step()
        for _ in observers:  # the owner goes on until every observer saw two rounds
            while not enough.acquire(blocking=False):
                if stop.is_set():
                    break
                owner.step()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    return rounds


@pytest.mark.parametrize("seed", range(3))
def test_inspection_in_the_same_process_sees_one_layout(env: Env, seed: int) -> None:
    owner = Owner(env.open(**SMALL), env, seed)
    reader = ChunkedSegmentStorage(0, None, env.binding, env.store, StorageConfig(**SMALL), read_only=True)
    env.instances.append(reader)
    rounds = run_beside(
        owner, 150, [lambda: check_one_layout(owner.storage), lambda: check_one_layout(reader)]
    )
    assert all(count >= 2 for count in rounds), rounds
    assert verify_segment(owner.storage, "s", checksums=True) == []


@pytest.mark.slow  # a second Python process
def test_a_read_only_observer_in_another_process_sees_one_layout(lmdb_env: Env, tmp_path: Path) -> None:
    owner = Owner(lmdb_env.open(**SMALL), lmdb_env, seed=11)
    stop = tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, str(OBSERVER), str(tmp_path / "chunks"), str(tmp_path / "metadata"), "s", str(stop)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines: list[str] = []
    passes = threading.Semaphore(0)

    def follow() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.strip())
            passes.release()

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        for _ in range(200):
            owner.step()
        for _ in range(5):  # at least five more rounds of the observer beside the owner's steps
            while not passes.acquire(blocking=False):
                if child.poll() is not None:
                    break
                owner.step()
    finally:
        stop.touch()
        child.wait(timeout=120)
        follower.join()
    failures = [line for line in lines if line.startswith("failure")]
    assert not failures, failures[0]
    assert child.returncode == 0, lines[-3:]
    assert sum(line.startswith("pass") for line in lines) >= 5, lines[-3:]


def test_real_damage_is_still_reported(env: Env) -> None:
    """The confirmation keeps what is damage: a chunk the layout still lists but the
    chunk storage lost is reported by verify and scrub, and ``chunks`` still walks it."""
    owner = Owner(env.open(**SMALL), env, seed=5)
    layout = owner.storage.chunks("s")
    lost = layout[len(layout) // 2][1].name
    env.binding.delete(env.binding.open_write(lost))
    problems = verify_segment(owner.storage, "s")
    assert any(lost in problem and "missing" in problem for problem in problems), problems
    anomalies = scrub(owner.storage).anomalies
    assert [(a.chunk, a.kind) for a in anomalies] == [(lost, "missing")]
    assert [chunk.name for _, chunk in owner.storage.chunks("s")] == [chunk.name for _, chunk in layout]
