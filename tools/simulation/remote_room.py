"""The remote room: a tiered Kafka log (``slts.remote``) on the simulated container.

Each run keeps one or two partitions' local Kafka logs (``LocalPartition``: batches of
genuine v2 record batches in segments, a leader-epoch cache; the files are written into
a temporary folder of the run, their bytes drawn from the step's seed), and the steps
produce to them (append batches, roll segments, bump the leader epoch, now and then an
unclean leader election: the log is truncated at an earlier batch and continues under a
new epoch with other bytes), copy rolled segments, fetch, enforce retention and delete a
partition (which then starts over), through the owner's ``RemoteLogManager``, faults
armed or not, interleaved with the other rooms' crashes, takeovers and restores.

The oracle (``RemoteRoom.check``, after every step, faults off) holds Kafka's
invariants:

* ``remote_fetch_content``: a fetch with the lineage's cache returns whole batches, each
  byte for byte the batch the local log holds at that offset in the current lineage
  (never another leader's divergent bytes), or ``RemoteOffsetOutOfRange`` (any typed
  error while faults were armed);
* ``remote_acknowledged_lost``: a segment whose copy was acknowledged stays
  COPY_SEGMENT_FINISHED until retention or a partition deletion runs;
* ``remote_deleted_came_back``: a segment that left the listing never reappears;
* ``remote_log_start_moved_back``: the remote log start offset never decreases (until
  the partition is deleted);
* ``remote_acknowledged_unreadable``: the first offset of an acknowledged segment still
  in the lineage and at or above the remote log start offset is readable.

A zombie (the owner before a takeover) may run a remote copy or retention: it changes
neither the remote tables nor the remote segments (``zombie_changed_state``), and may
return only if it had nothing to change.
"""

from __future__ import annotations

import random
import shutil
import struct
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slts.tools.kafka_logs import BatchInfo, kafka_index_bytes, make_batch

from slts.errors import RemoteOffsetOutOfRange, SltsError
from slts.metadata.schema import REMOTE_TABLES
from slts.remote.lineage import LeaderEpochCache
from slts.remote.local_log import LocalLog, LocalSegment
from slts.remote.manager import RemoteLogManager
from slts.remote.records import SegmentState, TopicPartition
from slts.remote.rsm import LogSegmentData

from .checks import REMOTE_PREFIX, Violation

if TYPE_CHECKING:
    from .world import World

#: The partitions a run may use (the first always, the second in some runs).
PARTITIONS = (TopicPartition("sim", 0), TopicPartition("sim", 1))
#: Small index interval, so that the offset index has entries in small segments.
INDEX_INTERVAL_BYTES = 300


@dataclass(frozen=True, slots=True)
class Batch:
    """One record batch of the local log."""

    base: int
    last: int
    epoch: int
    max_timestamp: int
    data: bytes


@dataclass
class LocalSegmentModel:
    """A local segment: its base offset, batches and (once written) its files."""

    base: int
    batches: list[Batch] = field(default_factory=list)
    files: LogSegmentData | None = None

    def size(self) -> int:
        return sum(len(b.data) for b in self.batches)


class LocalPartition:
    """A partition's local log on the leader (the last segment is the active one)."""

    def __init__(self, tp: TopicPartition, folder: Path, first_epoch: int) -> None:
        self.tp = tp
        self.folder = folder
        self.segments = [LocalSegmentModel(0)]
        self.cache: list[tuple[int, int]] = [(first_epoch, 0)]
        self.log_start = 0
        self._files = 0

    @property
    def epoch(self) -> int:
        return self.cache[-1][0]

    def end(self) -> int:
        """The log end offset (the next offset to be written)."""
        for segment in reversed(self.segments):
            if segment.batches:
                return segment.batches[-1].last + 1
        return self.segments[-1].base

    def batches(self) -> dict[int, Batch]:
        """Every batch of the current lineage by base offset."""
        return {b.base: b for s in self.segments for b in s.batches}

    def batch_holding(self, offset: int) -> Batch | None:
        for segment in self.segments:
            for batch in segment.batches:
                if batch.base <= offset <= batch.last:
                    return batch
        return None

    def produce(self, rng: random.Random, now_ms: int) -> str:
        count = rng.randint(1, 4)
        for _ in range(count):
            base = self.end()
            records = [
                (
                    None if rng.random() < 0.2 else b"k%d" % rng.randrange(100),
                    rng.randbytes(rng.randint(5, 60)),
                    now_ms + rng.randint(-500, 500),
                )
                for _ in range(rng.randint(1, 4))
            ]
            data = make_batch(base, records, leader_epoch=self.epoch)
            batch = Batch(base, base + len(records) - 1, self.epoch, max(ts for *_, ts in records), data)
            active = self.segments[-1]
            active.batches.append(batch)
            active.files = None
        rolled = False
        if rng.random() < 0.5:
            self.segments.append(LocalSegmentModel(self.end()))
            rolled = True
        return f"+{count} batches to {self.end()}" + (", rolled" if rolled else "")

    def new_epoch(self, epoch: int, at: int) -> None:
        """Leader epoch ``epoch`` starts at offset ``at`` (replacing a latest entry that
        starts there: an epoch in which nothing was written)."""
        assert epoch > self.epoch
        self.cache = [(e, s) for e, s in self.cache if s < at]
        self.cache.append((epoch, at))

    def unclean_election(self, rng: random.Random, floor: int, epoch: int) -> str:
        """The new leader's log ends at an earlier batch boundary at or above ``floor``:
        everything after it is truncated, and epoch ``epoch`` starts there."""
        starts = [b.base for b in self.batches().values() if b.base >= floor] + [self.end()]
        at = rng.choice(starts[-6:])
        kept: list[LocalSegmentModel] = []
        for segment in self.segments:
            if segment.base > at or (segment.base == at and kept):
                continue
            cut = [b for b in segment.batches if b.base < at]
            if len(cut) != len(segment.batches):
                segment.batches, segment.files = cut, None
            kept.append(segment)
        self.segments = kept
        self.new_epoch(epoch, at)
        return f"truncated to {at}, epoch {epoch}"

    def _write(self, segment: LocalSegmentModel) -> LogSegmentData:
        if segment.files is None:
            self._files += 1
            stem = self.folder / f"{self._files:06d}-{segment.base:020d}"
            data, infos = bytearray(), []
            for b in segment.batches:
                infos.append(BatchInfo(len(data), len(b.data), b.base, b.last, b.max_timestamp, b.epoch))
                data += b.data
            offset_index, time_index = kafka_index_bytes(infos, segment.base, INDEX_INTERVAL_BYTES)
            for suffix, content in (
                (".log", bytes(data)),
                (".index", offset_index),
                (".timeindex", time_index),
            ):
                Path(f"{stem}{suffix}").write_bytes(content)
            segment.files = LogSegmentData(f"{stem}.log", f"{stem}.index", f"{stem}.timeindex", b"")
        return segment.files

    def local_log(self, rng: random.Random | None = None) -> LocalLog:
        """A snapshot of the log (the last stable offset sometimes below the end)."""
        end = self.end()
        lso = end if rng is None or rng.random() < 0.7 else rng.randint(self.log_start, end)
        segments = [LocalSegment(s.base, self._write(s), s.size()) for s in self.segments]
        return LocalLog.of(
            segments,
            LeaderEpochCache.of(self.cache),
            log_start_offset=min(self.log_start, lso),
            log_end_offset=end,
            last_stable_offset=lso,
        )


@dataclass
class Tracked:
    """What the oracle knows of one partition's remote log."""

    #: Acknowledged copies (COPY_SEGMENT_FINISHED), id -> (start, end, the batches'
    #: bytes by base offset when copied).
    acked: dict[uuid.UUID, tuple[int, int, dict[int, bytes]]] = field(default_factory=dict)
    #: A retention or deletion ran since the last check: acknowledged copies may be gone.
    may_lose: bool = False
    #: Every id ever listed (to see one disappear).
    listed: set[uuid.UUID] = field(default_factory=set)
    log_start: int | None = None


class RemoteRoom:
    """The remote room of one world: local partitions, the oracle's knowledge."""

    def __init__(self, world: World, profile: random.Random) -> None:
        self.world = world
        self.folder = Path(tempfile.mkdtemp(prefix="slts-sim-remote-"))
        self.tps = PARTITIONS[: profile.choice([1, 2])]
        self.epochs = 0  # the highest leader epoch given out
        self.partitions = {tp: self._fresh(tp) for tp in self.tps}
        self.tracked = {tp: Tracked() for tp in self.tps}
        self.gone: set[uuid.UUID] = set()  # ids that left the listing, forever
        self._manager: RemoteLogManager | None = None
        self._manager_of: Any = None

    def _fresh(self, tp: TopicPartition) -> LocalPartition:
        folder = self.folder / f"{tp.topic}-{tp.partition}-{self.epochs}"
        folder.mkdir()
        return LocalPartition(tp, folder, self.epochs)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def manager(self, storage: Any) -> RemoteLogManager:
        """The remote log manager of an instance (one per instance)."""
        if self._manager is None or self._manager_of is not storage:
            self._manager = RemoteLogManager(storage, clock=self.world.seam.clock, threads=False)
            self._manager_of = storage
        return self._manager

    @property
    def rlm(self) -> RemoteLogManager:
        return self.manager(self.world.s)

    def now_ms(self) -> int:
        return int(self.world.seam.clock.now * 1000)

    # -- steps --------------------------------------------------------------------------------------

    def produce(self, rng: random.Random) -> str:
        tp = rng.choice(self.tps)
        partition = self.partitions[tp]
        roll = rng.random()
        if roll < 0.1:
            self.epochs += 1
            floor = max(partition.log_start, self.tracked[tp].log_start or 0)
            what = partition.unclean_election(rng, floor, self.epochs)
        elif roll < 0.25:
            self.epochs += 1
            partition.new_epoch(self.epochs, partition.end())
            what = f"epoch {self.epochs} from {partition.end()}"
        else:
            what = ""
        self.world.seam.clock.advance(rng.choice([0.0, 0.5, 5.0]))
        return f"{tp} " + ", ".join(x for x in (what, partition.produce(rng, self.now_ms())) if x)

    def copy(self, rng: random.Random) -> str:
        tp = rng.choice(self.tps)
        log = self.partitions[tp].local_log(rng)
        returned, result, injected = self.world.run_op(
            self.world.owner, rng, lambda: self.rlm.copy_rolled_segments(tp, log)
        )
        what = f"remote copy {tp} (lso {log.last_stable_offset})"
        self._unexpected(what, returned, result, injected)
        if not returned:
            return f"{what}: failed ({type(result).__name__})"
        batches = self.partitions[tp].batches()
        for metadata in result.copied:
            if metadata.segment_state != SegmentState.COPY_SEGMENT_FINISHED:
                raise Violation("remote_copy_state", f"{what} returned {metadata.segment_state.name}")
            first, last = metadata.start_offset, metadata.end_offset
            content = {b: batch.data for b, batch in batches.items() if first <= b <= last}
            self.tracked[tp].acked[metadata.id] = (first, last, content)
        return f"{what}: copied {[(m.start_offset, m.end_offset) for m in result.copied]}"

    def fetch(self, rng: random.Random) -> str:
        tp = rng.choice(self.tps)
        partition = self.partitions[tp]
        remote = [(m.start_offset, m.end_offset) for m in self._listing(tp)]
        if remote and rng.random() < 0.7:  # mostly where something was copied
            first, last = rng.choice(remote)
            offset = rng.randint(first, last)
        else:
            offset = rng.randint(0, partition.end() + 1)
        max_bytes = rng.choice([1, 100, 400, 2000, 1 << 20])
        cache = LeaderEpochCache.of(partition.cache)
        returned, result, injected = self.world.run_op(
            self.world.owner, rng, lambda: self.rlm.fetch(tp, offset, max_bytes, leader_epochs=cache)
        )
        what = f"remote fetch {tp} @{offset} max {max_bytes}"
        if not returned:
            if not isinstance(result, RemoteOffsetOutOfRange):
                self._unexpected(what, returned, result, injected)
            return f"{what}: {type(result).__name__} ({result})"
        self._judge_fetch(what, partition, offset, result.records, result.next_offset)
        return f"{what}: {len(result.records)} bytes to {result.next_offset}"

    def retention(self, rng: random.Random) -> str:
        tp = rng.choice(self.tps)
        partition = self.partitions[tp]
        log = partition.local_log()
        retention_ms = rng.choice([None, None, 5_000, 30_000, 120_000])
        retention_bytes = rng.choice([None, None, 0, 2_000, 5_000, 20_000])
        self.world.seam.clock.advance(rng.choice([0.0, 2.0, 20.0]))
        returned, result, injected = self.world.run_op(
            self.world.owner,
            rng,
            lambda: self.rlm.enforce_retention(
                tp, log, retention_ms=retention_ms, retention_bytes=retention_bytes, now_ms=self.now_ms()
            ),
        )
        what = f"remote retention {tp} ms {retention_ms} bytes {retention_bytes}"
        self._unexpected(what, returned, result, injected)
        self.tracked[tp].may_lose = True
        if not returned:
            return f"{what}: failed ({type(result).__name__})"
        if result.log_start_offset is not None:
            partition.log_start = max(partition.log_start, min(result.log_start_offset, partition.end()))
        return f"{what}: deleted {[(m.start_offset, m.end_offset) for m in result.deleted]}"

    def delete_partition(self, rng: random.Random) -> str:
        """Now and then the topic is deleted (the partition starts over); else the
        cleanup of crashed uploads and deletes runs on its own."""
        tp = rng.choice(self.tps)
        if rng.random() < 0.6:
            returned, result, injected = self.world.run_op(
                self.world.owner, rng, lambda: self.rlm.cleanup(tp)
            )
            what = f"remote cleanup {tp}"
            self._unexpected(what, returned, result, injected)
            return f"{what}: {f'{len(result)} cleaned' if returned else f'failed ({type(result).__name__})'}"
        returned, result, injected = self.world.run_op(
            self.world.owner, rng, lambda: self.rlm.delete_partition(tp)
        )
        what = f"remote delete partition {tp}"
        self._unexpected(what, returned, result, injected)
        how = "ok" if returned else f"failed ({type(result).__name__}), repeated"
        if not returned:  # the controller repeats it until it is done
            again, result, _ = self.world.run_op(
                self.world.owner, None, lambda: self.rlm.delete_partition(tp)
            )
            if not again:
                raise Violation(
                    f"unexpected_error:{type(result).__name__}", f"{what} repeated with no fault: {result!r}"
                )
        if self.rlm.rlmm.has_partition(tp):
            raise Violation("remote_partition_kept", f"{what} returned, yet the RLMM still knows it")
        self.tracked[tp] = Tracked()
        self.epochs += 1
        self.partitions[tp] = self._fresh(tp)
        return f"{what}: {how}; the partition starts over at epoch {self.epochs}"

    def zombie_task(self, storage: Any, task: str, rng: random.Random) -> bool:
        """A remote task of a fenced instance (``storage``, after a takeover): it must
        change nothing. True if it had something to change (a copy or a delete to do)."""
        rlm = RemoteLogManager(storage, clock=self.world.seam.clock, threads=False)
        tp = rng.choice(self.tps)
        log = self.partitions[tp].local_log()
        if task == "copy":
            return bool(rlm.copy_rolled_segments(tp, log).copied)
        report = rlm.enforce_retention(tp, log, retention_bytes=0, now_ms=self.now_ms())
        return bool(report.deleted)

    def snapshot(self) -> tuple[Any, ...]:
        """The remote tables and the remote segments' names, to compare."""
        dump = self.world.store.dump()
        tables = tuple(sorted((k, v.value) for t in REMOTE_TABLES for k, v in dump[t].items()))
        return tables, tuple(n for n in self.world.s.list() if n.startswith(REMOTE_PREFIX))

    # -- the oracle --------------------------------------------------------------------------------

    def _unexpected(self, what: str, returned: bool, result: Any, injected: Any) -> None:
        if not returned and not injected:
            raise Violation(
                f"unexpected_error:{type(result).__name__}",
                f"{what} raised {result!r} with no fault injected",
            )

    def _listing(self, tp: TopicPartition) -> list[Any]:
        rlmm = self.rlm.rlmm
        return list(rlmm.list_segments(tp)) if rlmm.has_partition(tp) else []

    def _judge_fetch(
        self, what: str, partition: LocalPartition, offset: int, records: bytes, after: int
    ) -> None:
        if not records:
            raise Violation("remote_fetch_content", f"{what} returned no batch (min_one_message)")
        first = partition.batch_holding(offset)
        if first is None:
            raise Violation("remote_fetch_content", f"{what}: offset {offset} is in no batch of the lineage")
        batches, position, last = partition.batches(), 0, -1
        expected: Batch | None = first
        while position < len(records):
            if len(records) - position < 12:
                raise Violation("remote_fetch_content", f"{what}: a partial batch at byte {position}")
            base, length = struct.unpack_from(">qi", records, position)
            piece = records[position : position + 12 + length]
            if expected is None or base != expected.base or piece != expected.data:
                raise Violation(
                    "remote_fetch_content",
                    f"{what}: the batch at byte {position} (base offset {base}) is not the lineage's "
                    f"batch {None if expected is None else expected.base}",
                )
            position += len(piece)
            last = expected.last
            expected = batches.get(last + 1)
        if after != last + 1:
            raise Violation("remote_fetch_content", f"{what}: next offset {after}, not {last + 1}")

    def check(self) -> None:
        """Kafka's invariants on the remote log (see module doc), faults off."""
        rlm = self.rlm
        for tp in self.tps:
            tracked = self.tracked[tp]
            listed = self._listing(tp)
            ids = {m.id for m in listed}
            back = ids & self.gone
            if back:
                raise Violation(
                    "remote_deleted_came_back", f"{tp}: segments {sorted(map(str, back))[:2]} listed again"
                )
            self.gone |= tracked.listed - ids
            tracked.listed = ids
            finished = {m.id for m in listed if m.segment_state == SegmentState.COPY_SEGMENT_FINISHED}
            if tracked.may_lose:  # retention ran (returned or not): what it deleted may go
                tracked.acked = {i: r for i, r in tracked.acked.items() if i in finished}
                tracked.may_lose = False
            lost = set(tracked.acked) - finished
            if lost:
                ranges = sorted(tracked.acked[i][:2] for i in lost)
                raise Violation(
                    "remote_acknowledged_lost", f"{tp}: acknowledged copies {ranges[:3]} are gone"
                )
            start = rlm.rlmm.log_start_offset(tp) if rlm.rlmm.has_partition(tp) else None
            if tracked.log_start is not None and (start is None or start < tracked.log_start):
                raise Violation(
                    "remote_log_start_moved_back", f"{tp}: remote log start {start}, was {tracked.log_start}"
                )
            tracked.log_start = start
            self._check_readable(tp, tracked, start)

    def _check_readable(self, tp: TopicPartition, tracked: Tracked, start: int | None) -> None:
        partition = self.partitions[tp]
        if not tracked.acked or start is None:
            return
        acked = sorted(tracked.acked.values(), key=lambda a: a[:2])
        for first, last, content in (acked[0], acked[-1]):
            offset = max(first, start)
            batch = partition.batch_holding(offset)
            if offset > last or batch is None or content.get(batch.base) != batch.data:
                continue  # retention passed it, or the lineage diverged before it
            what = f"reading acknowledged copy {first}..{last} of {tp} @{offset}"
            try:
                result = self.rlm.fetch(tp, offset, 1, leader_epochs=LeaderEpochCache.of(partition.cache))
            except SltsError as exc:
                raise Violation("remote_acknowledged_unreadable", f"{what}: {exc!r}") from exc
            self._judge_fetch(what, partition, offset, result.records, result.next_offset)
