"""``slts remote ...``: tiered Kafka-style logs (KIP-405) from the command line.

``ls`` lists a partition's remote segments, ``copy`` tiers the rolled segments of a Kafka
partition folder, ``fetch`` reads record batches back by offset, ``retention`` deletes
what retention no longer keeps. Every action takes ``--json``; errors are the ``slts``
exit codes (docs/cli.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

# ``slts.tools.cli`` imports this module inside ``build_parser``, after it has loaded.
from slts.tools.command_line import EXIT_OK, emit, non_negative, open_storage, positive

from slts.remote.kafka_formats import iter_batch_headers
from slts.remote.local_log import LocalLog, local_log
from slts.remote.manager import RemoteLogManager
from slts.remote.records import RemoteLogSegmentMetadata, SegmentState, TopicPartition


def _segment_fields(metadata: RemoteLogSegmentMetadata) -> dict[str, Any]:
    return {
        "id": str(metadata.id),
        "partition": str(metadata.topic_partition),
        "start_offset": metadata.start_offset,
        "end_offset": metadata.end_offset,
        "leader_epochs": {str(e): o for e, o in sorted(metadata.leader_epochs.items())},
        "max_timestamp_ms": metadata.max_timestamp_ms,
        "size_bytes": metadata.size_bytes,
        "state": SegmentState(metadata.state).name,
    }


def cmd_remote_ls(args: argparse.Namespace) -> int:
    """List a partition's remote log segments (every state but deleted), by start offset."""
    tp = TopicPartition.parse(args.partition)
    with open_storage(args, read_only=True) as storage:
        rlmm = RemoteLogManager(storage).rlmm
        known = rlmm.has_partition(tp)  # a partition never copied lists as empty
        segments = [_segment_fields(m) for m in rlmm.list_segments(tp, args.from_offset)] if known else []
        earliest, highest = (rlmm.earliest_offset(tp), rlmm.highest_offset(tp)) if known else (None, None)
    lines = [
        f"{s['start_offset']:>20} {s['end_offset']:>20} {s['size_bytes']:>12} {s['state']:<24} {s['id']}"
        for s in segments
    ]
    emit(
        args,
        {"partition": str(tp), "earliest": earliest, "highest": highest, "segments": segments},
        "\n".join(lines),
    )
    return EXIT_OK


def cmd_remote_copy(args: argparse.Namespace) -> int:
    """Copy the rolled segments of a Kafka partition folder (named TOPIC-PARTITION) that are
    not remote yet: every segment but the newest (the active one) whose next segment starts
    at or below --last-stable-offset (default: the log end offset)."""
    tp, log = _local(args)
    with open_storage(args) as storage:
        report = RemoteLogManager(storage, validate=not args.no_validate).copy_rolled_segments(tp, log)
    copied = [_segment_fields(m) for m in report.copied]
    text = [f"{tp}: copied {len(copied)} segment(s), skipped {report.skipped}, cleaned {len(report.cleaned)}"]
    text += [f"  {s['start_offset']}..{s['end_offset']} ({s['size_bytes']} bytes) {s['id']}" for s in copied]
    emit(
        args,
        {
            "partition": str(tp),
            "copied": copied,
            "skipped": report.skipped,
            "cleaned": [str(i) for i in report.cleaned],
        },
        "\n".join(text),
    )
    return EXIT_OK


def cmd_remote_fetch(args: argparse.Namespace) -> int:
    """Read record batches from the one holding OFFSET, up to --max-bytes (at least one
    batch): raw batches to --out or stdout; with --json a summary of each batch."""
    tp = TopicPartition.parse(args.partition)
    epochs = None if args.logdir is None else local_log(os.path.abspath(args.logdir)).leader_epochs
    with open_storage(args, read_only=True) as storage:
        result = RemoteLogManager(storage).fetch(tp, args.offset, args.max_bytes, leader_epochs=epochs)
    if args.json:
        batches = [
            {
                "base_offset": h.base_offset,
                "last_offset": h.last_offset,
                "records": h.records_count,
                "bytes": h.size,
            }
            for h in iter_batch_headers(_reader(result.records), segment=str(tp))
        ]
        fields = {"partition": str(tp), "offset": result.offset, "next_offset": result.next_offset}
        emit(args, {**fields, "bytes": len(result.records), "batches": batches}, "")
        return EXIT_OK
    if args.out and args.out != "-":
        with open(args.out, "wb") as out:
            out.write(result.records)
    else:
        sys.stdout.buffer.write(result.records)
        sys.stdout.buffer.flush()
    return EXIT_OK


def cmd_remote_retention(args: argparse.Namespace) -> int:
    """Delete the remote segments of a Kafka partition folder's log past --retention-ms or
    --retention-bytes (the whole log: local segments not yet remote count), below its log
    start offset, outside its leader-epoch lineage, or half-deleted; the log start offset
    moves first."""
    tp, log = _local(args)
    with open_storage(args) as storage:
        report = RemoteLogManager(storage).enforce_retention(
            tp, log, retention_ms=args.retention_ms, retention_bytes=args.retention_bytes
        )
    fields = {
        "partition": str(tp),
        "deleted": [_segment_fields(m) for m in report.deleted],
        "bytes_deleted": report.bytes_deleted,
        "log_start_offset": report.log_start_offset,
    }
    text = (
        f"{tp}: deleted {len(report.deleted)} segment(s), {report.bytes_deleted} bytes; "
        f"log start offset {report.log_start_offset}"
    )
    emit(args, fields, text)
    return EXIT_OK


def _local(args: argparse.Namespace) -> tuple[TopicPartition, LocalLog]:
    """The partition and local log of ``args.logdir`` (named TOPIC-PARTITION unless
    ``--partition`` says otherwise)."""
    folder = os.path.abspath(args.logdir)
    tp = TopicPartition.parse(args.partition or os.path.basename(folder.rstrip("/")))
    return tp, local_log(folder, last_stable_offset=args.last_stable_offset)


def _reader(data: bytes) -> Callable[[int], bytes]:
    position = 0

    def read(size: int) -> bytes:
        nonlocal position
        piece = data[position : position + size]
        position += len(piece)
        return piece

    return read


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``remote`` and its actions to the ``slts`` parser's subcommands ``sub``."""
    remote = sub.add_parser(
        "remote", help="tiered Kafka-style logs (KIP-405): ls, copy, fetch, retention", description=__doc__
    )
    actions = remote.add_subparsers(dest="action", required=True, metavar="ACTION")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        action = actions.add_parser(name, parents=[common], help=help_text, description=func.__doc__)
        action.set_defaults(func=func)
        return action

    ls = add("ls", cmd_remote_ls, "list a partition's remote segments")
    ls.add_argument("partition", metavar="TOPIC-PARTITION")
    ls.add_argument("--from", dest="from_offset", type=non_negative, default=0, metavar="OFFSET")

    copy = add("copy", cmd_remote_copy, "copy a Kafka partition folder's rolled segments")
    copy.add_argument("logdir", metavar="LOGDIR")
    copy.add_argument("--partition", default=None, metavar="TOPIC-PARTITION", help="default: LOGDIR's name")
    copy.add_argument("--last-stable-offset", type=non_negative, default=None, metavar="OFFSET")
    copy.add_argument(
        "--no-validate", action="store_true", help="copy without checking batches and indexes first"
    )

    fetch = add("fetch", cmd_remote_fetch, "read record batches by offset")
    fetch.add_argument("partition", metavar="TOPIC-PARTITION")
    fetch.add_argument("offset", type=non_negative)
    fetch.add_argument("--max-bytes", type=positive, default=1 << 20)
    fetch.add_argument("--out", default=None, metavar="FILE", help="write the batches here (default: stdout)")
    fetch.add_argument(
        "--logdir", default=None, metavar="LOGDIR", help="follow this partition folder's leader-epoch lineage"
    )

    retention = add("retention", cmd_remote_retention, "delete what retention no longer keeps")
    retention.add_argument("logdir", metavar="LOGDIR")
    retention.add_argument(
        "--partition", default=None, metavar="TOPIC-PARTITION", help="default: LOGDIR's name"
    )
    retention.add_argument("--last-stable-offset", type=non_negative, default=None, metavar="OFFSET")
    retention.add_argument("--retention-ms", type=non_negative, default=None)
    retention.add_argument("--retention-bytes", type=non_negative, default=None)
