"""Crash-test tierer: copies a Kafka partition folder's rolled segments one by one and
applies retention, acknowledging each finished step on stdout.

Run as ``python remote_tierer.py FOLDER``; it never stops by itself. It raises the last
stable offset one segment at a time and calls ``copy_rolled_segments``; for each segment
copied it prints ``ACK <start> <end> <id>``; every few copies it runs retention by size
and prints ``DEL <id>`` for each segment deleted. When everything is copied and deleted
it starts over from the partition's current state. The parent kills it with SIGKILL at a
random moment.
"""

from __future__ import annotations

import sys
from pathlib import Path

SEGMENTS = 30
BATCHES = 20


def partition_folder(folder: Path) -> Path:
    """``FOLDER/orders-0``: SEGMENTS rolled segments and an active one (built once)."""
    from slts.tools.kafka_logs import build_log, leader_epoch_checkpoint_bytes, write_log_dir

    log_dir = folder / "orders-0"
    if (log_dir / "leader-epoch-checkpoint").exists():
        return log_dir
    base = 0
    for number in range(SEGMENTS + 1):
        log = build_log(base, BATCHES, leader_epochs=[(0, base)], seed=number)
        write_log_dir(log_dir, log)
        base = log.end_offset + 1
    (log_dir / "leader-epoch-checkpoint").write_bytes(leader_epoch_checkpoint_bytes([(0, 0)]))
    return log_dir


def open_storage(folder: Path):
    import slts

    return slts.open(f"file://{folder}/chunks", metadata=f"{folder}/metadata", gc_delay_s=3600.0)


def main() -> None:
    import dataclasses

    from slts.remote import RemoteLogManager, TopicPartition, local_log

    folder = Path(sys.argv[1])
    log_dir = partition_folder(folder)
    storage = open_storage(folder)
    manager = RemoteLogManager(storage)
    tp = TopicPartition("orders", 0)
    print("READY", flush=True)
    full = local_log(log_dir)
    bases = [s.base_offset for s in full.segments]
    copies = 0
    for lso in bases[1:]:
        log = dataclasses.replace(full, last_stable_offset=lso)
        for metadata in manager.copy_rolled_segments(tp, log).copied:
            print(f"ACK {metadata.start_offset} {metadata.end_offset} {metadata.id}", flush=True)
            copies += 1
        if copies % 3 == 0:
            remote = sum(m.size_bytes for m in manager.rlmm.list_segments(tp))
            local = full.only_local_bytes(lso)
            report = manager.enforce_retention(tp, log, retention_bytes=local + remote * 2 // 3)
            for metadata in report.deleted:
                print(f"DEL {metadata.id}", flush=True)
    print("DONE", flush=True)
    storage.close()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
