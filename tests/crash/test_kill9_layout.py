"""Kill -9 during layout operations: concat, truncate, defrag, delete and GC as well as writes.

DESIGN.md §5 invariants 1, 2, 5, 6. The child (``layout_writer.py``) prints ``DO`` before
and ``ACK`` after every operation, on the filesystem binding + LMDB. It is SIGKILLed at a
random point: by the parent after a random number of lines (odd rounds), or by itself
right before or after a random chunk storage change or metadata commit (even rounds),
which lands kills inside operations. The parent drains what it printed and replays the
acknowledged operations on a model (``layout_writer.apply``). At most one operation was in flight (a ``DO``
without ``ACK``): after the kill the whole container must equal the model either
without it or with it applied completely (operations are atomic; nothing acknowledged
is lost), every segment must pass ``verify_segment`` and no chunk may be on storage
unless referenced or covered by the GC queue (``verify_container``). At the end a GC with
no delay must leave exactly the referenced chunks.

Every run replays from its seed (the child's operations and the kill points; only the
moment the signal lands inside the child varies).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading

import pytest
from slts.bindings import from_url
from slts.bindings.memory import MemoryChunkStorage
from slts.journal.restore import restore_to_folder

from slts.admin.verify import verify_container, verify_segment
from slts.config import StorageConfig
from slts.errors import MetadataError
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import segment_chunks

from . import layout_writer
from .layout_writer import State, apply

ROUNDS = 10


def read_line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    return child.stdout.readline()  # a hung child is caught by pytest-timeout


def drain(child: subprocess.Popen[str]) -> tuple[str, str]:
    """Everything left on the child's stdout and stderr, and wait for it to end.

    Not ``communicate()``: it reads the pipes' file descriptors directly and so loses
    whatever ``readline`` had already buffered in ``child.stdout`` (lines of operations
    the model would then never see). stderr is drained by a thread meanwhile, so the
    child never blocks on a full pipe."""
    assert child.stdout is not None and child.stderr is not None
    errors: list[str] = []
    reader = threading.Thread(target=lambda: errors.append(child.stderr.read()))  # type: ignore[union-attr]
    reader.start()
    rest = child.stdout.read()
    reader.join()
    child.wait()
    return rest, "".join(errors)


def run_until_killed(folder: str, seed: int, kill_after_lines: int | None, kill_at: int | None) -> list[str]:
    """Start the child; SIGKILL it after it printed ``kill_after_lines`` lines after READY
    (or let it SIGKILL itself at its ``kill_at``-th change); return every complete line it
    printed (drained after its death)."""
    extra = [] if kill_at is None else [str(kill_at)]
    child = subprocess.Popen(
        [sys.executable, layout_writer.__file__, folder, str(seed), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    lines: list[str] = []
    if kill_after_lines is not None:
        try:
            first = read_line(child)
            assert first.startswith("READY"), (first, child.stderr.read() if child.stderr else "")
            lines.append(first)
            for _ in range(kill_after_lines):
                line = read_line(child)
                if not line:  # the child died by itself: a bug surfaced as an exception
                    break
                lines.append(line)
        finally:
            os.kill(child.pid, signal.SIGKILL)
    rest, errors = drain(child)
    assert child.returncode == -signal.SIGKILL, f"the child died by itself:\n{errors}"
    # A line cut by the kill (no newline) is not an acknowledgement.
    lines.extend(line + "\n" for line in rest.split("\n")[:-1])
    lines = [line for line in lines if line.endswith("\n")]
    assert not lines or lines[0].startswith("READY"), lines[:1]
    return lines  # empty: killed while starting


def replay(state: State, lines: list[str]) -> tuple[State, list[str] | None, dict[str, int]]:
    """Apply the acknowledged operations; return the state, the operation in flight at
    the kill (a DO without its ACK) and counts per acknowledged operation."""
    pending: list[str] | None = None
    counts: dict[str, int] = {}
    for line in lines[1:]:  # after READY
        words = line.split()
        if words[0] == "DO":
            assert pending is None, f"two operations in flight: {pending} and {words}"
            pending = words[1:]
        else:
            acknowledged = pending is not None and words[1 : 1 + len(pending)] == pending
            assert words[0] == "ACK" and acknowledged, f"{line!r} does not acknowledge {pending}"
            state = apply(state, pending)
            check_ack(state, pending, words[1 + len(pending) :])
            counts[pending[0]] = counts.get(pending[0], 0) + 1
            pending = None
    return state, pending, counts


def check_ack(state: State, op: list[str], result: list[str]) -> None:
    """The results the child reported agree with the model."""
    kind = op[0]
    if kind in ("write", "concat"):
        assert int(result[0]) == len(state[op[1]].data), (op, result)
    elif kind == "truncate":
        assert int(result[0]) == state[op[1]].start, (op, result)
    elif kind == "defrag":
        assert int(result[1]) <= int(result[0]), (op, result)


def observed(storage) -> dict[str, tuple[int, bool, bytes]]:
    """Every live segment as the store has it: (start, sealed, readable bytes)."""
    result = {}
    for name in storage.list():
        info = storage.info(name)
        data = storage.read(storage.open_read(name), info.start_offset, info.length - info.start_offset)
        result[name] = (info.start_offset, info.sealed, data)
        assert info.length == info.start_offset + len(data)
    return result


def expected(state: State) -> dict[str, tuple[int, bool, bytes]]:
    return {name: (s.start, s.sealed, s.data[s.start :]) for name, s in state.items()}


def describe(actual: dict, wanted: dict) -> str:
    lines = []
    for name in sorted(set(actual) | set(wanted)):
        a, w = actual.get(name), wanted.get(name)
        if a != w:
            show = lambda v: None if v is None else (v[0], v[1], len(v[2]))
            lines.append(f"  {name}: store (start, sealed, readable bytes) {show(a)}, model {show(w)}")
    return "\n".join(lines)


def check(folder: str, state: State, pending: list[str] | None) -> State:
    """After a kill: the store equals the model without, or with, the operation in flight."""
    storage = layout_writer.open_storage(folder, read_only=True)
    try:
        actual = observed(storage)
        candidates = [state] + ([apply(state, pending)] if pending is not None else [])
        for candidate in candidates:
            if actual == expected(candidate):
                state = candidate
                break
        else:
            raise AssertionError(
                f"the store matches neither the acknowledged state nor the in-flight operation {pending}:\n"
                + describe(actual, expected(state))
            )
        report = verify_container(storage)
        assert report.problems == [], report.problems
    finally:
        storage.close()
    return state


@pytest.mark.parametrize("seed", [11, 12])
def test_acknowledged_layout_changes_survive_sigkill(tmp_path, seed: int) -> None:
    folder = str(tmp_path)
    rng = random.Random(seed)
    state: State = {}
    totals: dict[str, int] = {}
    for round_number in range(ROUNDS):
        # Odd rounds: killed from outside at a random line; even rounds: the child kills
        # itself at a random change (before or after a chunk call or a commit).
        outside = round_number % 2 == 1
        kill_after_lines = rng.randint(0, 120) if outside else None
        kill_at = None if outside else rng.randint(1, 400)
        lines = run_until_killed(folder, seed * 1000 + round_number, kill_after_lines, kill_at)
        state, pending, counts = replay(state, lines)
        for kind, count in counts.items():
            totals[kind] = totals.get(kind, 0) + count
        state = check(folder, state, pending)
    # The random program must actually have exercised the layout operations.
    for kind in ("write", "concat", "truncate", "defrag", "gc"):
        assert totals.get(kind, 0) > 0, f"no acknowledged {kind} in {ROUNDS} rounds: {totals}"

    storage = layout_writer.open_storage(folder)  # a writable owner; gc_delay_s is 0
    try:
        for _ in range(1000):
            stats = storage.gc.run_once()
            if not stats.progressed:
                break
        else:
            raise AssertionError("GC did not converge")
        referenced = {chunk.name for name in storage.list() for _, chunk in storage.chunks(name)}
        assert set(segment_chunks(storage.chunk_storage)) == referenced, (
            "orphans of killed operations were not collected"
        )
        dump = storage._store.dump()
        assert dump["gc"] == {} and dump["deleted"] == {}
        restorable = {
            name: storage.read(
                storage.open_read(name),
                storage.info(name).start_offset,
                storage.info(name).length - storage.info(name).start_offset,
            )
            for name in storage.list()
        }
        assert observed(storage) == expected(state), "GC changed what the segments hold"
        assert verify_container(storage).problems == []
    finally:
        storage.close()
    # The machine is lost after all those kills: tier-2 alone restores the same segments.
    restored = os.path.join(folder, "restored-metadata")
    with from_url(f"file://{folder}/chunks") as binding:
        restore_to_folder(binding, 0, restored)
        with (
            LmdbMetadataStore(restored, TABLES) as store,
            ChunkedSegmentStorage(
                0, None, binding, store, StorageConfig(gc_interval_s=0.0, metadata_log_flush_interval_s=0.0)
            ) as after,
        ):
            assert {
                name: after.read(
                    after.open_read(name),
                    after.info(name).start_offset,
                    after.info(name).length - after.info(name).start_offset,
                )
                for name in after.list()
            } == restorable
            assert verify_container(after).problems == []


class _FailingStore(MemoryMetadataStore):
    """The in-memory store; commit number ``fail_at`` raises (as a crash would stop it)."""

    fail_at = 0
    commits = 0

    def commit(self, ops, expect=()):
        self.commits += 1
        if self.commits == self.fail_at:
            raise MetadataError(f"injected failure of commit #{self.commits}")
        return super().commit(ops, expect)


def test_verify_accepts_chunks_an_interrupted_truncate_left_below_the_start() -> None:
    store = _FailingStore(TABLES)
    storage = ChunkedSegmentStorage(0, None, MemoryChunkStorage(), store, StorageConfig(gc_batch_max=2))
    storage.create("t", max_rolling_length=4)
    handle = storage.open_write("t")
    storage.write(handle, 0, bytes(range(40)))  # ten chunks of 4 bytes
    store.fail_at = store.commits + 2  # the truncate's second batch: the process "dies" there
    storage.truncate(handle, 30)  # the first batch moved the start: the truncate has happened
    assert store.commits >= store.fail_at, "setup: the second batch did not fail"
    info = storage.info("t")
    assert info.start_offset == 30 and storage.chunks("t")[0][0] < 28, "setup: chunks left below the start"
    assert storage.read(handle, 30, 10) == bytes(range(30, 40)), "the segment itself is healthy"
    assert verify_segment(storage, "t") == []
