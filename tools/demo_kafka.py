"""The demo's tiered Kafka log (``slts demo``, or alone: ``slts demo --kafka``).

A Kafka-style broker's partition folder is built from genuine v2 record batches
(kafka-python's builder: ``slts.tools.kafka_logs``), with a leader change in the middle.
SLTS tiers its rolled segments (``RemoteLogManager.copy_rolled_segments``), local
retention deletes the copied files as a broker's would, and a consumer reads the
partition back from SLTS alone, fetch by fetch from offset 0, decoding every batch with
kafka-python's reader and checking every record (offset, key, value, timestamp). Then
remote retention by size deletes the oldest segments and moves the log start offset.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slts.tools import kafka_logs

from slts.remote.local_log import local_log
from slts.remote.manager import RemoteLogManager
from slts.remote.records import TopicPartition

TOPIC_PARTITION = TopicPartition("demo-orders", 0)
FETCH_BYTES = 256 << 10


def build_partition(folder: str, segments: int, batches: int, *, records_per_batch: int = 10) -> list[Any]:
    """A partition folder of ``segments`` segments of ``batches`` batches; the leader epoch
    goes from 0 to 1 in the middle of the log. Returns every record (offset, key, value,
    timestamp) in offset order."""
    path = Path(folder)
    records: list[Any] = []
    base, checkpoint = 0, [(0, 0)]
    change = (segments // 2 * batches + batches // 2) * records_per_batch  # mid-segment, on a batch start
    for index in range(segments):
        end = base + batches * records_per_batch - 1
        epochs = [(0, base)] if end < change else [(1, base)] if base >= change else [(0, base), (1, change)]
        log = kafka_logs.build_log(
            base,
            batches,
            records_per_batch=records_per_batch,
            leader_epochs=epochs,
            seed=index,
            value_bytes=200,
        )
        kafka_logs.write_log_dir(path, log)
        records += log.records
        base = log.end_offset + 1
    checkpoint.append((1, change))
    (path / "leader-epoch-checkpoint").write_bytes(kafka_logs.leader_epoch_checkpoint_bytes(checkpoint))
    return records


def run_kafka_demo(
    folder: str, open_storage: Callable[[str], Any], *, segments: int = 8, batches: int = 400
) -> dict[str, Any]:
    """Run the tiered-log part in ``folder`` (created; removed by the caller) on the store
    ``open_storage(folder)`` opens; return its report (``kafka_verified``)."""
    log_dir = os.path.join(folder, f"{TOPIC_PARTITION}")
    os.makedirs(log_dir)
    produced = build_partition(log_dir, segments, batches)
    local = local_log(log_dir)
    log_bytes = sum(s.size_bytes for s in local.segments)
    with open_storage(os.path.join(folder, "store")) as storage:
        manager = RemoteLogManager(storage)
        started = time.perf_counter()
        copy = manager.copy_rolled_segments(TOPIC_PARTITION, local)  # never the active segment
        copy_s = time.perf_counter() - started
        copied_bytes = sum(m.size_bytes for m in copy.copied)
        for segment in local.segments[:-1]:  # local retention: the broker deletes what the remote tier holds
            for path in (segment.data.log, segment.data.offset_index, segment.data.time_index):
                os.remove(path)
        remote_end = manager.rlmm.highest_offset(TOPIC_PARTITION)
        assert remote_end is not None
        consumed: list[Any] = []
        offset, fetches = 0, 0
        started = time.perf_counter()
        while offset <= remote_end:
            result = manager.fetch(TOPIC_PARTITION, offset, FETCH_BYTES, leader_epochs=local.leader_epochs)
            consumed += [r for r in kafka_logs.decode_records(result.records) if r[0] >= offset]
            offset, fetches = result.next_offset, fetches + 1
        consume_s = time.perf_counter() - started
        matched = consumed == produced[: remote_end + 1]
        # retention.bytes covers the whole log: the active segment (only local) counts too
        limit = (
            sum(m.size_bytes for m in copy.copied[len(copy.copied) // 2 :]) + local.segments[-1].size_bytes
        )
        retention = manager.enforce_retention(TOPIC_PARTITION, local, retention_bytes=limit)
        epochs = sorted(manager.rlmm.leader_epochs(TOPIC_PARTITION))
    return {
        "kafka_segments": len(local.segments),
        "kafka_segments_copied": len(copy.copied),
        "kafka_log_bytes": log_bytes,
        "kafka_copy_mb_per_s": round(copied_bytes / copy_s / 1e6, 2),
        "kafka_records_consumed": len(consumed),
        "kafka_fetches": fetches,
        "kafka_consume_mb_per_s": round(copied_bytes / consume_s / 1e6, 2),
        "kafka_epochs": epochs,
        "kafka_retention_deleted": len(retention.deleted),
        "kafka_log_start_offset": retention.log_start_offset,
        "kafka_verified": matched and len(consumed) == remote_end + 1,
    }


def format_kafka(report: dict[str, Any]) -> list[str]:
    """The demo's lines for this part."""
    verdict = "every record matched" if report["kafka_verified"] else "FAILED: records differ"
    return [
        f"  kafka tiering {report['kafka_segments_copied']} of {report['kafka_segments']} Kafka log segments"
        f" (genuine v2 record batches, leader epochs {report['kafka_epochs']}) copied at"
        f" {report['kafka_copy_mb_per_s']} MB/s; local retention deleted them",
        f"                consumed back from SLTS alone: {report['kafka_records_consumed']} records in"
        f" {report['kafka_fetches']} fetches ({report['kafka_consume_mb_per_s']} MB/s), decoded by"
        f" kafka-python: {verdict}",
        f"                remote retention by size: {report['kafka_retention_deleted']} segments deleted,"
        f" log start offset now {report['kafka_log_start_offset']}",
    ]


def run_alone(folder: str, open_storage: Callable[[str], Any], keep: bool) -> dict[str, Any]:
    """``slts demo --kafka``: this part only, in ``folder`` (recreated)."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    try:
        return run_kafka_demo(folder, open_storage)
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
