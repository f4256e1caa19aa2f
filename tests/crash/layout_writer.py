"""Crash-test child for layout operations: writes, transaction concats, truncate, defrag, GC.

Run as ``python layout_writer.py FOLDER SEED [KILL_AT]``; it never stops by itself:
the parent SIGKILLs it, or, given ``KILL_AT``, it SIGKILLs itself right before or right
after its ``KILL_AT``-th chunk storage change (create, write, delete, concat) or metadata
commit, counted from the start. That places kills at every step *inside* operations
(between a chunk write and its commit, between the commits of a batched truncate,
between a GC claim and the chunk deletion...), which a kill from outside, arriving
right after a line was printed, rarely hits. It works on the filesystem binding + LMDB in
FOLDER: main segments ``main/0``, ``main/1`` and short-lived transaction segments ``txn/<epoch>.<n>`` that are
filled, sealed and concatenated into a main segment (or deleted).

Protocol, one flushed line each:

* ``READY <epoch>`` once the instance has started;
* ``DO <op> <args...>`` right before an operation is called, and
  ``ACK <op> <args...> <result...>`` right after it returned.

The ``DO`` arguments determine the operation's effect completely, so the parent can
compute the state before and after any operation (``apply``): ``create SEG``,
``write SEG OFFSET`` (the bytes are ``piece(SEG, OFFSET)``), ``seal SEG``, ``concat
TARGET OFFSET SOURCE``, ``truncate SEG OFFSET``, ``defrag SEG``, ``delete SEG``, ``gc``.
Results in ``ACK``: ``write``: the end offset; ``concat``: the target's new length;
``truncate``: the start offset after it; ``defrag``: chunks before and after; ``gc``:
chunks deleted.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

MAIN = ("main/0", "main/1")
TXN_PREFIX = "txn/"
TXN_OPEN_MAX = 3
ROLLING_BYTES = 512
PIECE_BYTES_MAX = 1500
CONFIG = {
    "gc_delay_s": 0.0,  # GC deletes at once: kills land inside real deletions too
    "gc_batch_max": 3,  # truncates, deletes and GC runs take several commits
    "rolling_length_bytes_default": ROLLING_BYTES,
    "defrag_small_chunk_bytes": 400,
}


def piece(segment: str, offset: int) -> bytes:
    """The bytes of the write that starts at ``offset`` of ``segment``."""
    rng = random.Random(f"{segment}@{offset}")
    return rng.randbytes(rng.randint(1, PIECE_BYTES_MAX))


@dataclass(frozen=True)
class Segment:
    """What a segment holds according to the acknowledged operations."""

    data: bytes  # from offset 0
    start: int
    sealed: bool


State = dict[str, Segment]


def apply(state: State, op: list[str]) -> State:
    """The state after operation ``op`` (a ``DO`` line's words after ``DO``)."""
    state = dict(state)
    kind, args = op[0], op[1:]
    if kind == "create":
        assert args[0] not in state, op
        state[args[0]] = Segment(b"", 0, False)
    elif kind == "write":
        name, offset = args[0], int(args[1])
        segment = state[name]
        assert offset == len(segment.data) and not segment.sealed, (op, len(segment.data))
        state[name] = replace(segment, data=segment.data + piece(name, offset))
    elif kind == "seal":
        state[args[0]] = replace(state[args[0]], sealed=True)
    elif kind == "concat":
        target, offset, source = args[0], int(args[1]), args[2]
        donor = state.pop(source)
        assert donor.sealed and donor.start == 0 and offset == len(state[target].data), op
        state[target] = replace(state[target], data=state[target].data + donor.data)
    elif kind == "truncate":
        segment = state[args[0]]
        assert int(args[1]) <= len(segment.data), op
        state[args[0]] = replace(segment, start=max(segment.start, int(args[1])))
    elif kind == "delete":
        del state[args[0]]
    else:
        assert kind in ("defrag", "gc"), op  # no visible change
    return state


def open_storage(folder: str, **overrides: object):
    """The container as the parent opens it (read-only to check, or to collect)."""
    import slts

    return slts.open(f"file://{folder}/chunks", metadata=f"{folder}/metadata", **{**CONFIG, **overrides})


class _KillSwitch:
    """SIGKILLs this process at the ``kill_at``-th tick (never if None)."""

    def __init__(self, kill_at: int | None) -> None:
        self.left = kill_at

    def tick(self) -> None:
        if self.left is not None:
            self.left -= 1
            if self.left <= 0:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)


def open_child_storage(folder: str, kill_at: int | None):
    """The child's container: the same binding and store, with a tick before and after
    every change, so that ``kill_at`` picks a point inside an operation."""
    from slts.bindings.filesystem import FileSystemChunkStorage

    from slts.config import StorageConfig
    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.schema import TABLES
    from slts.storage.chunked import ChunkedSegmentStorage

    switch = _KillSwitch(kill_at)

    def ticking(method):
        def call(self, *args, **kwargs):
            switch.tick()
            result = method(self, *args, **kwargs)
            switch.tick()
            return result

        return call

    class Binding(FileSystemChunkStorage):
        create = ticking(FileSystemChunkStorage.create)
        write = ticking(FileSystemChunkStorage.write)
        delete = ticking(FileSystemChunkStorage.delete)
        concat = ticking(FileSystemChunkStorage.concat)

    class Store(LmdbMetadataStore):
        def commit(self, ops: Sequence, expect: Sequence = ()) -> int:
            switch.tick()
            version = super().commit(ops, expect)
            switch.tick()
            return version

    return ChunkedSegmentStorage(
        0,
        None,
        Binding(f"{folder}/chunks"),
        Store(f"{folder}/metadata", TABLES),
        StorageConfig(**CONFIG),  # type: ignore[arg-type]
        owns_resources=True,
    )


def say(*words: object) -> None:
    print(*words, flush=True)


def main() -> None:
    folder, seed = sys.argv[1], int(sys.argv[2])
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    os.makedirs(f"{folder}/metadata", exist_ok=True)
    storage = open_child_storage(folder, kill_at)
    rng = random.Random(seed)
    say("READY", storage.epoch)
    handles: dict = {}

    def handle(name: str):
        if name not in handles:
            handles[name] = storage.open_write(name)
        return handles[name]

    for name in MAIN:
        if not storage.exists(name):
            say("DO create", name)
            storage.create(name)
            say("ACK create", name)
    txn_number = 0
    while True:
        txns = [(name, storage.info(name)) for name in storage.list(TXN_PREFIX)]
        open_txns = [name for name, info in txns if not info.sealed]
        sealed_txns = [name for name, info in txns if info.sealed]
        main = rng.choice(MAIN)
        dice = rng.random()
        if dice < 0.35:
            offset = storage.info(main).length
            say("DO write", main, offset)
            storage.write(handle(main), offset, piece(main, offset))
            say("ACK write", main, offset, storage.info(main).length)
        elif dice < 0.55 and open_txns:
            name = rng.choice(open_txns)
            if rng.random() < 0.6:
                offset = storage.info(name).length
                say("DO write", name, offset)
                storage.write(handle(name), offset, piece(name, offset))
                say("ACK write", name, offset, storage.info(name).length)
            else:
                say("DO seal", name)
                storage.seal(handle(name))
                say("ACK seal", name)
        elif dice < 0.65 and len(txns) < TXN_OPEN_MAX:
            txn_number += 1
            name = f"{TXN_PREFIX}{storage.epoch}.{txn_number}"
            say("DO create", name)
            storage.create(name, max_rolling_length=rng.choice([64, ROLLING_BYTES]))
            say("ACK create", name)
        elif dice < 0.75 and sealed_txns:
            source = rng.choice(sealed_txns)
            offset = storage.info(main).length
            say("DO concat", main, offset, source)
            storage.concat(handle(main), offset, source)
            handles.pop(source, None)
            say("ACK concat", main, offset, source, storage.info(main).length)
        elif dice < 0.83:
            info = storage.info(main)
            offset = rng.randint(info.start_offset, info.length) if rng.random() < 0.8 else info.length
            say("DO truncate", main, offset)
            storage.truncate(handle(main), offset)
            say("ACK truncate", main, offset, storage.info(main).start_offset)
        elif dice < 0.91:
            name = rng.choice([*MAIN, *(name for name, _ in txns)])
            say("DO defrag", name)
            result = storage.defrag(name)
            say("ACK defrag", name, result.chunks_before, result.chunks_after)
        elif dice < 0.94 and txns:
            name = rng.choice(txns)[0]
            say("DO delete", name)
            storage.delete(handle(name))
            handles.pop(name, None)
            say("ACK delete", name)
        else:
            say("DO gc")
            stats = storage.gc.run_once()
            say("ACK gc", stats.chunks_deleted)


if __name__ == "__main__":
    main()
