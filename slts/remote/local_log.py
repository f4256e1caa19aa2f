"""What the remote log manager's tasks know of the engine's local log.

Kafka's tasks read the broker's ``UnifiedLog``: its segments (the last one is the
active segment), its leader-epoch cache, log start and end offsets and last stable
offset, its producer-state snapshots. An engine on SLTS hands the same facts over as a
``LocalLog`` snapshot taken when the task starts; ``local_log(folder)`` builds one from a
Kafka partition folder (``<20 digits>.log`` with ``.index``, ``.timeindex``, optional
``.txnindex``, ``<20 digits>.snapshot`` producer snapshots and the
``leader-epoch-checkpoint``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from slts.errors import InvalidArgument
from slts.remote import kafka_formats as kf
from slts.remote.lineage import LeaderEpochCache
from slts.remote.records import check_offset
from slts.remote.rsm import LogSegmentData

_LOG_FILE = re.compile(r"(?P<base>[0-9]{20})\.log")
_SNAPSHOT_FILE = re.compile(r"(?P<offset>[0-9]{20})\.snapshot")
CHECKPOINT_FILE = "leader-epoch-checkpoint"


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """One segment of the local log: its base offset, files and log size in bytes (the
    bytes the copy reads: anything appended later is not part of this snapshot).
    ``data.producer_snapshot`` is the snapshot taken when the *next* segment was rolled
    (Kafka names it after the next segment's base offset); ``data.leader_epoch_checkpoint``
    is filled in by the copy task (the cache cut at this segment's end)."""

    base_offset: int
    data: LogSegmentData
    size_bytes: int


@dataclass(frozen=True, slots=True)
class LocalLog:
    """A snapshot of a partition's local log, as the remote log manager's tasks see it.

    ``segments`` by base offset; the last is the active segment, which is never copied.
    ``leader_epochs`` is the leader-epoch cache; ``log_start_offset`` the log's start
    (remote included), ``log_end_offset`` the next offset to be written,
    ``last_stable_offset`` the offset below which everything is committed. Build with
    ``LocalLog.of(...)`` (checked) or ``local_log(folder)``."""

    segments: tuple[LocalSegment, ...]
    leader_epochs: LeaderEpochCache
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int
    label: str = field(default="")

    @classmethod
    def of(
        cls,
        segments: Sequence[LocalSegment],
        leader_epochs: LeaderEpochCache | Sequence[tuple[int, int]],
        *,
        log_start_offset: int,
        log_end_offset: int,
        last_stable_offset: int,
        label: str = "",
    ) -> LocalLog:
        """Raises ``InvalidArgument`` unless the segments are ``LocalSegment`` objects with
        distinct base offsets and ``log_start_offset <= last_stable_offset <=
        log_end_offset``."""
        try:
            given = list(segments)
        except TypeError as exc:
            raise InvalidArgument("segments must be a sequence of LocalSegment") from exc
        if not all(isinstance(segment, LocalSegment) for segment in given):
            raise InvalidArgument("segments must be LocalSegment objects")
        ordered = sorted(given, key=lambda segment: segment.base_offset)
        if len({segment.base_offset for segment in ordered}) != len(ordered):
            raise InvalidArgument("two local segments have the same base offset")
        cache = (
            leader_epochs
            if isinstance(leader_epochs, LeaderEpochCache)
            else LeaderEpochCache.of(leader_epochs)
        )
        for value, what in (
            (log_start_offset, "log start offset"),
            (log_end_offset, "log end offset"),
            (last_stable_offset, "last stable offset"),
        ):
            check_offset(value, what)
        if not log_start_offset <= last_stable_offset <= log_end_offset:
            raise InvalidArgument(
                f"offsets out of order: log start {log_start_offset}, last stable "
                f"{last_stable_offset}, log end {log_end_offset}"
            )
        return cls(tuple(ordered), cache, log_start_offset, log_end_offset, last_stable_offset, label)

    def only_local_bytes(self, highest_remote_offset: int) -> int:
        """The size of the segments not yet remote (Kafka's ``onlyLocalLogSegmentsSize``:
        segments whose base offset is at or above the highest remote offset)."""
        return sum(s.size_bytes for s in self.segments if s.base_offset >= highest_remote_offset)


def local_log(
    log_dir: str | os.PathLike[str],
    *,
    last_stable_offset: int | None = None,
    log_start_offset: int | None = None,
) -> LocalLog:
    """The ``LocalLog`` of a Kafka partition folder (see module doc). The log end offset
    is the offset after the active segment's last batch (its base offset if empty),
    found by reading that segment's batch headers; ``last_stable_offset`` defaults to the
    log end offset, ``log_start_offset`` to the first segment's base offset. Raises
    ``InvalidArgument`` (no such folder, a log without its indexes, no checkpoint, offsets
    out of order), ``InvalidLogSegment`` (the checkpoint or the active segment does not
    parse)."""
    folder = os.fspath(log_dir)
    try:
        names = set(os.listdir(folder))
    except OSError as exc:
        raise InvalidArgument(f"cannot list the log folder {folder!r}: {exc.strerror}") from exc
    try:
        with open(os.path.join(folder, CHECKPOINT_FILE), "rb") as file:
            checkpoint = file.read()
    except OSError as exc:
        raise InvalidArgument(f"the log folder {folder!r} has no readable {CHECKPOINT_FILE}") from exc
    cache = LeaderEpochCache.of(kf.parse_leader_epoch_checkpoint(checkpoint, segment=folder))
    bases = sorted(int(match["base"]) for name in names if (match := _LOG_FILE.fullmatch(name)))
    snapshots = {int(match["offset"]) for name in names if (match := _SNAPSHOT_FILE.fullmatch(name))}
    segments = []
    for number, base in enumerate(bases):
        stem = os.path.join(folder, f"{base:020d}")
        for suffix in (".index", ".timeindex"):
            if not os.path.exists(stem + suffix):
                raise InvalidArgument(f"the log {stem}.log has no {suffix} file")
        following = bases[number + 1] if number + 1 < len(bases) else None
        data = LogSegmentData(
            log=f"{stem}.log",
            offset_index=f"{stem}.index",
            time_index=f"{stem}.timeindex",
            leader_epoch_checkpoint=b"",
            transaction_index=f"{stem}.txnindex" if os.path.exists(f"{stem}.txnindex") else None,
            producer_snapshot=(
                os.path.join(folder, f"{following:020d}.snapshot")
                if following is not None and following in snapshots
                else None
            ),
        )
        segments.append(LocalSegment(base, data, os.path.getsize(f"{stem}.log")))
    if not segments:
        raise InvalidArgument(f"the log folder {folder!r} holds no log segment")
    end = _end_offset(segments[-1])
    return LocalLog.of(
        segments,
        cache,
        log_start_offset=segments[0].base_offset if log_start_offset is None else log_start_offset,
        log_end_offset=end,
        last_stable_offset=end if last_stable_offset is None else last_stable_offset,
        label=folder,
    )


def _end_offset(active: LocalSegment) -> int:
    """The offset after the last batch of ``active`` (its base offset if it is empty)."""
    end = active.base_offset
    try:
        with open(active.data.log, "rb") as file:
            for header in kf.iter_batch_headers(
                file.read,
                segment=os.fspath(active.data.log),
                verify_crc=False,
                block_bytes=kf.SCAN_BLOCK_BYTES,
            ):
                end = header.last_offset + 1
    except OSError as exc:
        raise InvalidArgument(f"cannot read the active segment {active.data.log!r}: {exc.strerror}") from exc
    return end
