"""Kill -9 a process tiering a Kafka log (copy and retention, ``remote_tierer.py``) at
random points: every acknowledged copy is COPY_SEGMENT_FINISHED and reads back byte for
byte until an acknowledged retention deletes it; nothing deleted comes back; the next
owner's run cleans up what the kill left half done; the GC then leaves exactly the
referenced chunks and verify finds nothing wrong."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from . import remote_tierer

ROUNDS = 10


def run_until_killed(
    folder: Path, rng: random.Random, acked: dict[uuid.UUID, tuple[int, int]], gone: set[uuid.UUID]
) -> bool:
    """One run of the tierer, killed after a random number of acknowledgements; True if
    it finished by itself first."""
    child = subprocess.Popen(
        [sys.executable, remote_tierer.__file__, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    done = False
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("READY"), (line, child.stderr.read() if child.stderr else "")
        for _ in range(rng.randint(0, 8)):
            line = child.stdout.readline()
            if line.startswith("DONE"):
                done = True
                break
            kind, *fields = line.split()
            assert kind in ("ACK", "DEL"), (line, child.stderr.read() if child.stderr else "")
            if kind == "ACK":
                acked[uuid.UUID(fields[2])] = (int(fields[0]), int(fields[1]))
            else:
                gone.add(uuid.UUID(fields[0]))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    return done


def check(folder: Path, acked: dict[uuid.UUID, tuple[int, int]], gone: set[uuid.UUID]) -> None:
    from slts.tools.kafka_logs import decode_records

    from slts.errors import RemoteSegmentNotFound
    from slts.remote import RemoteLogManager, SegmentState, TopicPartition, local_log

    tp = TopicPartition("orders", 0)
    log = local_log(folder / "orders-0")
    expected = {}
    for segment in log.segments:
        with open(segment.data.log, "rb") as file:
            expected[segment.base_offset] = file.read()
    storage = remote_tierer.open_storage(folder)
    try:
        manager = RemoteLogManager(storage)
        for segment_id, (start, end) in acked.items():
            if segment_id in gone:
                with pytest.raises(RemoteSegmentNotFound):
                    manager.rlmm.segment(segment_id)
                continue
            try:
                metadata = manager.rlmm.segment(segment_id)
            except RemoteSegmentNotFound:
                # only an unacknowledged retention of this run may have deleted it
                assert manager.rlmm.log_start_offset(tp) > end, f"acknowledged copy {segment_id} lost"
                continue
            if metadata.segment_state != SegmentState.COPY_SEGMENT_FINISHED:
                assert metadata.segment_state == SegmentState.DELETE_SEGMENT_STARTED
                assert manager.rlmm.log_start_offset(tp) > end, "a delete began below the start"
                continue
            with manager.rsm.fetch_log(metadata, 0) as stream:
                assert stream.read() == expected[start], f"copy {segment_id} reads back other bytes"
        start = manager.rlmm.earliest_offset(tp) if manager.rlmm.has_partition(tp) else None
        if start is not None:
            result = manager.fetch(tp, start, 1 << 30, leader_epochs=log.leader_epochs)
            records = decode_records(result.records)
            assert records and records[0][0] <= start
    finally:
        storage.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_acknowledged_copies_and_deletes_survive_sigkill(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    acked: dict[uuid.UUID, tuple[int, int]] = {}
    gone: set[uuid.UUID] = set()
    for _ in range(ROUNDS):
        run_until_killed(tmp_path, rng, acked, gone)
        check(tmp_path, acked, gone)
    assert acked, "no copy was acknowledged"

    import slts
    from slts.admin.verify import verify_container
    from slts.remote import RemoteLogManager, TopicPartition, local_log
    from tests.support.engine import segment_chunks

    storage = slts.open(f"file://{tmp_path}/chunks", metadata=f"{tmp_path}/metadata", gc_delay_s=0.0)
    try:
        manager = RemoteLogManager(storage)
        tp = TopicPartition("orders", 0)
        log = local_log(tmp_path / "orders-0")
        manager.copy_rolled_segments(tp, log)  # the next owner's run: cleans up, copies the rest
        from slts.remote import SegmentState

        states = {m.segment_state for m in manager.rlmm.list_segments(tp)}
        assert states <= {SegmentState.COPY_SEGMENT_FINISHED}, states
        assert manager.rlmm.highest_offset(tp) == log.segments[-1].base_offset - 1
        while storage.gc.run_once().progressed:
            pass
        referenced = {chunk.name for name in storage.list() for _, chunk in storage.chunks(name)}
        assert set(segment_chunks(storage.chunk_storage)) == referenced, "orphans of killed copies"
        assert verify_container(storage).problems == []
    finally:
        storage.close()
