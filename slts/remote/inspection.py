"""The check of a rolled Kafka log segment's files before it is tiered (KIP-405's copy).

The remote storage manager (``rsm``) stores the files as opaque bytes, as Kafka's RSM
contract has it; the remote log manager calls ``inspect_segment`` first, so that damaged
local files are refused before anything is recorded or written, and so that the
metadata it records (offsets, leader epochs, size, largest timestamp) comes from the
bytes themselves. What is checked:

* every batch of the ``.log`` parses and passes its CRC32C, and offsets increase
  (``kafka_formats.iter_batches``); leader epochs do not decrease;
* every offset index entry points at the start of a batch, within its reach (Kafka's
  rule: ``kafka_formats.OffsetIndexCheck``);
* every time index entry stays within the log's offsets;
* the leader-epoch checkpoint parses.

Bad files raise ``InvalidLogSegment`` naming the segment (``label``), the byte position
and the offset. The log is read once, in blocks of ``kf.SCAN_BLOCK_BYTES``, and nothing
is kept per batch: the summary is folded as the batches pass (``kf.SummaryBuilder``) and
the offset index is merged with them by position, its entries decoded one at a time from
the file's bytes. Memory is the two index files' bytes (Kafka caps them at 10 MiB), the
leader epochs and one block, whatever the number of batches.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

from slts.errors import InvalidArgument, InvalidLogSegment
from slts.remote import kafka_formats as kf
from slts.remote.rsm import LogSegmentData

#: Largest index file read (Kafka's ``segment.index.bytes`` is 10 MiB by default).
INDEX_BYTES_MAX = 64 << 20


@dataclass(frozen=True, slots=True)
class InspectedLog:
    """What ``inspect_segment`` learned from a segment's files, all checked."""

    summary: kf.LogSummary
    batches: int
    leader_epoch_checkpoint: list[tuple[int, int]]


def inspect_segment(data: LogSegmentData, *, label: str, size_bytes: int | None = None) -> InspectedLog:
    """Check the files of ``data`` (see module doc) and summarise the log.

    ``size_bytes``: inspect exactly the first that many bytes of the log (the copy then
    copies exactly those); None: the file's size when it is opened. Bytes appended to the
    file later are never read. ``label`` names the segment in errors (empty: the log's
    path).

    Raises ``InvalidLogSegment`` (bad bytes; an empty log; a log file shorter than
    ``size_bytes``), ``InvalidArgument`` (not a LogSegmentData, a checkpoint that is not
    bytes, a bad ``size_bytes`` or ``label``, a file missing, unreadable or an index over
    ``INDEX_BYTES_MAX``). Reads only; changes nothing.
    """
    if not isinstance(data, LogSegmentData):
        raise InvalidArgument(f"{data!r} is not a LogSegmentData")
    if not isinstance(label, str):
        raise InvalidArgument(f"label {label!r} is not a string")
    if size_bytes is not None and (
        isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0
    ):
        raise InvalidArgument(f"size_bytes {size_bytes!r} is not None or a non-negative integer")
    if not isinstance(data.leader_epoch_checkpoint, bytes):
        raise InvalidArgument("leader_epoch_checkpoint must be the checkpoint file's bytes")
    label = label or os.fspath(data.log)
    checkpoint = kf.parse_leader_epoch_checkpoint(data.leader_epoch_checkpoint, segment=label)
    offset_index = _read_index(data.offset_index, "offset index")
    time_index = _read_index(data.time_index, "time index")
    with _open(data.log, "log") as file:
        length = os.fstat(file.fileno()).st_size
        if size_bytes is not None and length < size_bytes:
            raise InvalidLogSegment(
                f"{label}: the log file holds {length} bytes, fewer than the {size_bytes} to inspect",
                segment=label,
                position=length,
                offset=None,
            )
        log = _Prefix(file, length if size_bytes is None else size_bytes)
        summary = _scan(log, offset_index, label)
    if log.remaining:  # the file shrank under the pass, between two batches
        raise InvalidLogSegment(
            f"{label}: the log file ended at {summary.size_bytes} bytes, {log.remaining} short of "
            f"the {log.limit} to inspect",
            segment=label,
            position=summary.size_bytes,
            offset=summary.end_offset,
        )
    assert summary.size_bytes == log.limit, (summary, log.limit)
    _check_time_index(time_index, summary, label)
    return InspectedLog(summary, summary.batch_count, checkpoint)


def _scan(log: _Prefix, offset_index: bytes, label: str) -> kf.LogSummary:
    """One pass over the log: every batch checked, folded into the summary and merged
    with the offset index."""
    summary = kf.SummaryBuilder(segment=label)
    check: kf.OffsetIndexCheck | None = None
    for header in kf.iter_batch_headers(log.read, segment=label, block_bytes=kf.SCAN_BLOCK_BYTES):
        if check is None:  # the entries are relative to the first batch's base offset
            entries = kf.iter_offset_index(offset_index, header.base_offset, segment=label)
            check = kf.OffsetIndexCheck(entries, segment=label)
        summary.add(header)
        check.add(header)
    result = summary.result()  # InvalidLogSegment for an empty log
    assert check is not None
    check.finish(result.end_offset)
    return result


def _check_time_index(time_index: bytes, summary: kf.LogSummary, label: str) -> None:
    base, end = summary.base_offset, summary.end_offset
    for entry in kf.iter_time_index(time_index, base, segment=label):
        if not base <= entry.offset <= end:
            raise InvalidLogSegment(
                f"{label}: time index entry for offset {entry.offset} is outside the log's "
                f"offsets {base}..{end}",
                segment=label,
                position=None,
                offset=entry.offset,
            )


class _Prefix:
    """``read`` of the first ``limit`` bytes of an open file, never further."""

    def __init__(self, file: io.BufferedReader, limit: int) -> None:
        self._file = file
        self.limit = limit
        self.remaining = limit

    def read(self, count: int) -> bytes:
        count = min(count, self.remaining)
        if count <= 0:
            return b""
        piece = self._file.read(count)
        self.remaining -= len(piece)
        return piece


def _open(path: str | os.PathLike[str], what: str) -> io.BufferedReader:
    try:
        return open(path, "rb")
    except (OSError, TypeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not a path"
        raise InvalidArgument(f"cannot read the {what} file {path!r}: {reason}") from exc


def _read_index(path: str | os.PathLike[str], what: str) -> bytes:
    with _open(path, what) as file:
        if os.fstat(file.fileno()).st_size > INDEX_BYTES_MAX:
            raise InvalidArgument(f"the {what} file {os.fspath(path)!r} is over {INDEX_BYTES_MAX} bytes")
        return file.read()
