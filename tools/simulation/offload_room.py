"""The offload room: Pulsar's offload (``slts.offload``) on the simulated container.

Two sources feed it. Closed ledgers (entries drawn from the step's seed) are offloaded
whole (PIP-17, ``LedgerOffloader``), read back and deleted. One managed ledger's log (an
append-only run of (ledger, entry, bytes), a ledger now and then rolling to a later id)
is offloaded as it grows (PIP-76, ``StreamingOffloader`` with ``threads=False``: the
writer's work runs in the step, so the run stays deterministic): entries are offered,
flushed, segments roll over by size and by age or are closed; a write that fails fails
the segment and the next one is its redo from its begin; a crash (``crash`` steps, at
any commit of an offer, flush or close) leaves an OPEN segment that is resumed under its
uid or redone under a new one; ledgers are deleted and ``cleanup`` runs. Faults are
armed or not, as for every step; a takeover leaves the old owner's offloaders to a
zombie.

The oracle, Pulsar's invariants (``OffloadRoom.check`` after every step, faults off, and
the steps' own judgements):

* ``offload_acknowledged_lost``: every acknowledged entry of a ledger not deleted is in
  a block of an OPEN or COMPLETE segment (acknowledged: a ``flush`` or the segment's
  close result returned after it was offered; a resume must continue at or after it);
* ``offload_acknowledged_unreadable`` / ``offload_read_content``: reading it returns
  exactly its bytes, in order (an acknowledged PIP-17 offload likewise, whole);
* ``offload_duplicated``: no (ledger, entry) is in the blocks of two segments that are
  not FAILED;
* ``offload_close_result``: a closed segment's result begins at its begin and ends at
  the last entry offered to it;
* ``offload_deleted_left`` / ``offload_garbage_left``: once ``cleanup`` ran with no fault,
  no ``offload/`` segment remains of a deleted ledger (PIP-17), of a complete segment
  whose ledgers are all deleted, of a FAILED segment or of one a redo abandoned;
* ``offload_deleted_readable``: a deleted ledger reads as ``OffloadNotFound``;
* a zombie (the owner before a takeover) changes no offload table or object
  (``zombie_changed_state``, judged by the world).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slts.errors import InvalidArgument, OffloadNotFound, SltsError
from slts.metadata.schema import OFFLOAD_TABLES
from slts.offload.ledgers import MemoryLedger
from slts.offload.offloader import LedgerOffloader
from slts.offload.records import OffloadState, StreamSegmentRecord, StreamState
from slts.offload.streaming import OfferResult, OffloadHandle, StreamingOffloader

from .checks import OFFLOAD_PREFIX, Violation

if TYPE_CHECKING:
    from .world import World

#: The managed ledger the room streams.
MANAGED_LEDGER = "sim/default/orders"
#: The first ledger id of the streamed log (the PIP-17 ledgers count from 1).
FIRST_STREAMED_LEDGER = 1000

Position = tuple[int, int]


@dataclass
class StreamLog:
    """The managed ledger's log: entries in order, drawn when first needed."""

    entries: list[tuple[int, int, bytes]] = field(default_factory=list)
    index: dict[Position, int] = field(default_factory=dict)

    def at(self, i: int, rng: random.Random) -> tuple[int, int, bytes]:
        """Entry ``i`` (drawn from ``rng`` if it is the next one not yet written)."""
        assert 0 <= i <= len(self.entries), i
        if i == len(self.entries):
            if not self.entries:
                position = (FIRST_STREAMED_LEDGER, 0)
            else:
                ledger, entry, _ = self.entries[-1]
                roll = rng.random() < 0.2
                position = (ledger + rng.choice([1, 1, 2]), 0) if roll else (ledger, entry + 1)
            size = rng.choice([0, rng.randint(1, 40), rng.randint(41, 120), rng.randint(121, 300)])
            self.entries.append((*position, rng.randbytes(size)))
            self.index[position] = i
        return self.entries[i]

    def after(self, position: Position) -> int:
        """The index of the entry after ``position``."""
        return self.index[position] + 1

    def ledger_entries(self, ledger: int, upto: int) -> list[bytes]:
        """The payloads of ``ledger``'s entries among the first ``upto`` of the log."""
        return [data for lid, _, data in self.entries[:upto] if lid == ledger]


@dataclass
class Stream:
    """What the oracle knows of the streamed managed ledger."""

    #: ``log[:acked]`` is acknowledged.
    acked: int = 0
    #: The live handle (this owner's), where its segment began and the next index to offer.
    handle: OffloadHandle | None = None
    begin: int = 0
    offered: int = 0
    #: Where the next new segment begins: after the last segment known closed (the
    #: engine's offload position: every segment may be deleted by then).
    next_begin: int = 0
    #: Ledgers deleted, and the uids of segments redone (abandoned) or failed.
    deleted: set[int] = field(default_factory=set)
    abandoned: set[uuid.UUID] = field(default_factory=set)


class OffloadRoom:
    """The offload room of one world: the sources, the offloaders, the oracle's knowledge."""

    def __init__(self, world: World, profile: random.Random) -> None:
        self.world = world
        self.block_bytes = profile.choice([256, 512, 1024])
        self.buffer_bytes = profile.choice([256, 700, 2048])
        self.max_segment_bytes = profile.choice([256, 600, 1500, 4000])
        self.max_segment_age_s = profile.choice([20.0, 60.0, 300.0])
        self.min_segment_age_s = profile.choice([0.0, 0.0, 5.0])
        self.max_block_bytes = profile.choice([512, 1024, 4096])
        self.write_bytes = profile.choice([100, 1000, 8 << 20])
        self.log = StreamLog()
        self.stream = Stream()
        #: PIP-17: the ledgers made so far, acknowledged offloads (ledger, uid) -> entries,
        #: the deleted ones.
        self.ledgers: dict[int, list[bytes]] = {}
        self.offloaded: dict[tuple[int, uuid.UUID], list[bytes]] = {}
        self.deleted: set[tuple[int, uuid.UUID]] = set()
        self._checks = 0
        self.pending_deletes: list[tuple[str, Any]] = []
        self._of: Any = None
        self._streaming: StreamingOffloader | None = None
        self._ledger_offloader: LedgerOffloader | None = None

    # -- the owner's offloaders ---------------------------------------------------------------------

    def _sync(self) -> None:
        """New offloaders when the owner changed (a crash, a takeover, a restore): the old
        owner's handle went with it."""
        storage = self.world.s
        if self._of is not storage:
            self._of = storage
            self._streaming = self.streaming_offloader(storage)
            self._ledger_offloader = LedgerOffloader(
                storage, max_block_bytes=self.max_block_bytes, write_bytes=self.write_bytes
            )
            self.stream.handle = None

    def streaming_offloader(self, storage: Any) -> StreamingOffloader:
        return StreamingOffloader(
            storage,
            MANAGED_LEDGER,
            block_bytes=self.block_bytes,
            buffer_bytes=self.buffer_bytes,
            max_segment_bytes=self.max_segment_bytes,
            max_segment_age_s=self.max_segment_age_s,
            min_segment_age_s=self.min_segment_age_s,
            clock=self.world.seam.clock,
            threads=False,
        )

    @property
    def streaming(self) -> StreamingOffloader:
        self._sync()
        assert self._streaming is not None
        return self._streaming

    @property
    def ledger_offloader(self) -> LedgerOffloader:
        self._sync()
        assert self._ledger_offloader is not None
        return self._ledger_offloader

    def _run(self, rng: random.Random | None, what: str, fn: Any) -> tuple[bool, Any]:
        """Run ``fn`` on the owner (faults armed from ``rng``); an error is a violation
        unless a fault was injected (or the process died)."""
        returned, result, injected = self.world.run_op(self.world.owner, rng, fn)
        if not returned and not injected and not self.world.owner.store.dead:
            raise Violation(
                f"unexpected_error:{type(result).__name__}",
                f"{what} raised {result!r} with no fault injected",
            )
        return returned, result

    # -- streaming: open, offer, flush, close ----------------------------------------------------------

    def _acknowledge(self, upto: int, what: str) -> None:
        self.stream.acked = max(self.stream.acked, upto)

    def _unacknowledge(self, begin: int) -> None:
        """A segment beginning at ``begin`` failed or was abandoned: its entries are no
        longer offloaded (the source keeps them until the redo offloads them again)."""
        self.stream.acked = min(self.stream.acked, begin)

    def _closed(self, handle: OffloadHandle, what: str) -> str:
        """The live handle's segment closed (by size, age or ``close``): its result
        acknowledges what was offered to it."""
        stream = self.stream
        result = handle.result()
        offered = stream.offered
        begin = self.log.entries[stream.begin][:2]
        last = self.log.entries[offered - 1][:2] if offered > stream.begin else None
        if (result.begin_ledger, result.begin_entry) != begin or (
            last is not None and (result.end_ledger, result.end_entry) != last
        ):
            raise Violation(
                "offload_close_result",
                f"{what}: segment {result.uid} closed as {(result.begin_ledger, result.begin_entry)}.."
                f"{(result.end_ledger, result.end_entry)}, offered {begin}..{last}",
            )
        self._acknowledge(offered, what)
        stream.handle, stream.next_begin = None, max(stream.next_begin, offered)
        return f"segment closed {begin}..{last}"

    def _failed(self, handle: OffloadHandle | None, result: Any) -> str:
        self.stream.handle = None
        return f"failed ({type(result).__name__})"

    def _open(self, rng: random.Random) -> str:
        """Open the next segment as the engine does after what the store says: a new one
        after the last closed segment, the resume of an OPEN one left without a writer, or
        the redo of a FAILED (or writerless OPEN) one from its begin."""
        stream, log = self.stream, self.log
        segments = self.streaming.segments()
        last = segments[-1] if segments else None
        uid = uuid.UUID(int=rng.getrandbits(128))
        probe: int | None = None
        if last is None:
            begin, how = stream.next_begin, "new"
        elif last.state in (StreamState.COMPLETE, StreamState.DELETING):
            begin, how = self._after(last), "new"
            stream.next_begin = max(stream.next_begin, begin)
        elif last.state == StreamState.OPEN and rng.random() < 0.6:
            return self._resume(rng, last)
        else:
            begin, how = log.index[(last.begin_ledger, last.begin_entry)], "redo"
            if rng.random() < 0.3:  # an engine's mistake: go on after what was durable
                durable = (last.end_ledger, last.end_entry)
                probe = log.after(durable) if durable in log.index else begin + rng.randint(1, 3)
                probe = min(probe, len(log.entries))
        if probe is not None:
            entry = log.at(probe, rng)
            returned, result, _ = self.world.run_op(
                self.world.owner, None, lambda: self.streaming.streaming_offload(uid, {}, entry[0], entry[1])
            )
            if not returned and not isinstance(result, InvalidArgument):
                raise Violation(
                    f"unexpected_error:{type(result).__name__}", f"redo at {entry[:2]} raised {result!r}"
                )
            if not returned:
                how += f" (from {entry[:2]} refused)"
            else:  # accepted: the engine goes on from there (the oracle judges)
                stream.handle, stream.begin, stream.offered = result, probe, probe
                return f"redo from {entry[:2]}, not its begin: accepted"
        entry = log.at(begin, rng)
        if how.startswith("redo"):  # asking for it gives the segment up, whether it then lands or not
            self._unacknowledge(begin)
        returned, result = self._run(
            rng, "open", lambda: self.streaming.streaming_offload(uid, {}, entry[0], entry[1])
        )
        if not returned:
            return f"open {how} at {entry[:2]}: failed ({type(result).__name__})"
        if how.startswith("redo"):
            assert last is not None
            stream.abandoned.add(last.id)
        stream.handle, stream.begin, stream.offered = result, begin, begin
        return f"open {how} {uid} at {entry[:2]}"

    def _after(self, segment: StreamSegmentRecord) -> int:
        """The index of the entry after closed ``segment`` (its begin if it is empty)."""
        if (segment.end_ledger, segment.end_entry) == (-1, -1):
            return self.log.index[(segment.begin_ledger, segment.begin_entry)]
        return self.log.after((segment.end_ledger, segment.end_entry))

    def _resume(self, rng: random.Random, last: StreamSegmentRecord) -> str:
        stream, log = self.stream, self.log
        returned, result = self._run(rng, "resume", lambda: self.streaming.streaming_offload(last.id))
        if not returned:
            return f"resume {last.id}: failed ({type(result).__name__})"
        handle: OffloadHandle = result
        durable = handle.last_offered()
        begin = log.index[(last.begin_ledger, last.begin_entry)]
        after = log.after(durable) if durable is not None else begin
        if after < stream.acked and stream.acked > begin:
            raise Violation(
                "offload_acknowledged_lost",
                f"resumed segment {last.id} continues after {durable}, acknowledged up to "
                f"{log.entries[stream.acked - 1][:2]}",
            )
        stream.handle, stream.begin, stream.offered = handle, begin, after
        why = "after a restart" if last.epoch < self.world.s.epoch else "after a failure"
        if not handle.alive:  # the crash came during its close: the resume finished it
            return f"resume {last.id} ({why}, closed by it): " + self._closed(handle, "resume")
        return f"resume {last.id} ({why}) after {durable}"

    def _live(self, rng: random.Random) -> tuple[OffloadHandle | None, str]:
        self._sync()
        handle = self.stream.handle
        if handle is not None and handle.alive:
            return handle, ""
        what = self._open(rng)
        handle = self.stream.handle
        return (handle if handle is not None and handle.alive else None), what

    def offer(self, rng: random.Random) -> str:
        handle, opened = self._live(rng)
        if handle is None:
            return opened or "no segment"
        stream, log = self.stream, self.log
        count = rng.randint(1, 8)
        self.world.seam.clock.advance(rng.choice([0.0, 0.0, 1.0, 7.0]))
        outcomes: list[str] = []

        def offers() -> None:
            for _ in range(count):
                ledger, entry, data = log.at(stream.offered, rng)
                outcome = handle.offer_entry(ledger, entry, data)
                if outcome == OfferResult.OK:
                    stream.offered += 1
                if outcome != OfferResult.OK or not handle.alive:
                    outcomes.append(outcome.name)
                    return

        returned, result = self._run(rng, "offer", offers)
        what = f"{opened + '; ' if opened else ''}offered to {stream.offered}"
        if not returned:
            return f"{what}: {self._failed(handle, result)}"
        if not handle.alive:
            try:
                return f"{what} {outcomes}: {self._closed(handle, 'offer')}"
            except SltsError as exc:  # the close the offer started failed
                return f"{what}: close {self._failed(handle, exc)}"
        return f"{what}: {outcomes or 'ok'}"

    def flush(self, rng: random.Random) -> str:
        handle, opened = self._live(rng)
        if handle is None:
            return opened or "no segment"
        offered = self.stream.offered
        returned, result = self._run(rng, "flush", handle.flush)
        what = f"{opened + '; ' if opened else ''}flush to {offered}"
        if not returned:
            return f"{what}: {self._failed(handle, result)}"
        self._acknowledge(offered, what)
        return f"{what}: ok"

    def close(self, rng: random.Random) -> str:
        handle, opened = self._live(rng)
        if handle is None:
            return opened or "no segment"
        by_age = rng.random() < 0.4
        if by_age:
            self.world.seam.clock.advance(self.max_segment_age_s + 1)
        call = handle.check_age if by_age else handle.close
        returned, result = self._run(rng, "close", call)
        what = f"{opened + '; ' if opened else ''}{'age check' if by_age else 'close'}"
        if not returned:
            return f"{what}: {self._failed(handle, result)}"
        if handle.alive:
            raise Violation("offload_close_result", f"{what} returned and the segment is still open")
        try:
            return f"{what}: {self._closed(handle, what)}"
        except SltsError as exc:
            return f"{what}: {self._failed(handle, exc)}"

    # -- PIP-17 ----------------------------------------------------------------------------------------

    def offload_ledger(self, rng: random.Random) -> str:
        self._sync()
        if self.ledgers and rng.random() < 0.25:  # offloaded again, under a new uid
            ledger_id = rng.choice(sorted(self.ledgers))
        else:
            ledger_id = len(self.ledgers) + 1
            most = self.max_block_bytes - 140
            self.ledgers[ledger_id] = [
                rng.randbytes(rng.choice([0, rng.randint(1, 60), rng.randint(1, most)]))
                for _ in range(rng.randint(1, 30))
            ]
        entries = self.ledgers[ledger_id]
        uid = uuid.UUID(int=rng.getrandbits(128))
        returned, result = self._run(
            rng,
            "offload",
            lambda: self.ledger_offloader.offload(MemoryLedger(ledger_id, entries), uid, {"sim": "1"}),
        )
        what = f"offload ledger {ledger_id} ({len(entries)} entries) as {uid}"
        if not returned:
            return f"{what}: failed ({type(result).__name__})"
        if result.state != OffloadState.COMPLETE or result.entries != len(entries):
            raise Violation("offload_record", f"{what} returned {result}")
        self.offloaded[(ledger_id, uid)] = entries
        return f"{what}: ok"

    # -- read, delete, cleanup -------------------------------------------------------------------------

    def read(self, rng: random.Random) -> str:
        self._sync()
        if self.offloaded and rng.random() < 0.4:
            key = rng.choice(sorted(self.offloaded))
            return self._read_ledger_offload(rng, key)
        if self.deleted and rng.random() < 0.1:
            ledger_id, uid = rng.choice(sorted(self.deleted))
            returned, result, _ = self.world.run_op(
                self.world.owner, rng, lambda: self.ledger_offloader.read_offloaded(ledger_id, uid)
            )
            if returned:
                raise Violation("offload_deleted_readable", f"deleted offload {uid} of {ledger_id} reads")
            return f"read deleted offload of {ledger_id}: {type(result).__name__}"
        ledgers = sorted({lid for lid, _, _ in self.log.entries[: self.stream.acked]})
        if not ledgers:
            return "read: nothing acknowledged"
        ledger_id = rng.choice(ledgers)
        return self._read_streamed(rng, ledger_id)

    def _read_ledger_offload(self, rng: random.Random | None, key: tuple[int, uuid.UUID]) -> str:
        ledger_id, uid = key
        return self._check_read(
            rng,
            f"read offload {uid} of ledger {ledger_id}",
            self.offloaded[key],
            lambda: self.ledger_offloader.read_offloaded(ledger_id, uid),
        )

    def _check_read(
        self, rng: random.Random | None, what: str, expected: list[bytes], open_handle: Any
    ) -> str:
        """Read a range of ``expected`` (random with ``rng``; all of it without) through the
        handle ``open_handle()`` gives: exactly those entries, or a typed error while
        faults may be armed (with ``rng``)."""
        first = rng.randrange(len(expected)) if rng is not None else 0
        last = rng.randint(first, len(expected) - 1) if rng is not None else len(expected) - 1
        what += f" {first}..{last}"
        returned, result = self._run(rng, what, lambda: _read(open_handle(), first, last))
        if not returned:
            if rng is None:
                raise Violation("offload_acknowledged_unreadable", f"{what}: {result!r}")
            return f"{what}: {type(result).__name__}"
        if result != expected[first : last + 1]:
            raise Violation("offload_read_content", f"{what}: other entries than offloaded")
        return f"{what}: ok"

    def _read_streamed(self, rng: random.Random | None, ledger_id: int) -> str:
        acked = self.log.ledger_entries(ledger_id, self.stream.acked)
        what = f"read streamed ledger {ledger_id}"
        if ledger_id in self.stream.deleted:
            returned, result, _ = self.world.run_op(
                self.world.owner, rng, lambda: self.streaming.read_ledger(ledger_id)
            )
            if returned or (not isinstance(result, OffloadNotFound) and rng is None):
                raise Violation("offload_deleted_readable", f"{what}: deleted, yet {result!r}")
            return f"{what} (deleted): {type(result).__name__}"
        if not acked:
            return f"{what}: nothing acknowledged"
        return self._check_read(rng, what, acked, lambda: self.streaming.read_ledger(ledger_id))

    def delete(self, rng: random.Random) -> str:
        """Delete a streamed ledger whose entries are all acknowledged (not the one being
        written), or an acknowledged PIP-17 offload. A delete that fails is repeated
        without faults (the engine retries until it is done)."""
        self._sync()
        stream = self.stream
        candidates = sorted(self._finished_ledgers() - stream.deleted)
        if candidates and (not self.offloaded or rng.random() < 0.6):
            ledger_id = rng.choice(candidates)
            what = f"delete streamed ledger {ledger_id}"
            call: Any = lambda: self.streaming.delete_ledger(ledger_id)  # noqa: E731
            mark: Any = lambda: stream.deleted.add(ledger_id)  # noqa: E731
        elif self.offloaded:
            key = rng.choice(sorted(self.offloaded))
            what = f"delete offload {key[1]} of ledger {key[0]}"
            call = lambda: self.ledger_offloader.delete_offloaded(*key)  # noqa: E731

            def mark() -> None:
                del self.offloaded[key]
                self.deleted.add(key)
        else:
            return "delete: nothing to delete"
        returned, result = self._run(rng, what, call)
        how = "ok"
        if not returned:
            if self.world.owner.store.dead:  # the engine repeats it once restarted
                self.pending_deletes.append((what, call))
                how = f"failed ({type(result).__name__}), to be repeated"
            else:
                how = "failed, repeated: " + self._repeat(what, call)
        mark()
        return f"{what}: {how}"

    def _finished_ledgers(self) -> set[int]:
        """The streamed ledgers that may be deleted: a later ledger follows them (closed,
        as a managed ledger trims only closed ledgers) and all their entries are in
        segments whose close returned. (The library keeps a ledger deleted while its
        segment is open deleted through a redo, tested in
        tests/offload/test_streaming_pulsar.py; this room's engine would then offer the
        deleted ledger's entries again in later segments, which no managed ledger does.)"""
        closed = self.log.entries[: min(self.stream.acked, self.stream.next_begin)]
        if not closed:
            return set()
        newest = closed[-1][0]
        return {lid for lid, _, _ in closed if lid < newest}

    def _repeat_deletes(self) -> None:
        """Deletes a crash interrupted, repeated by the restarted engine (no faults)."""
        pending, self.pending_deletes = self.pending_deletes, []
        for what, call in pending:
            self._repeat(what, call)

    def _repeat(self, what: str, call: Any) -> str:
        """Repeat a delete that failed, without faults: it succeeds, or finds that the
        failed one had landed (``OffloadNotFound``: gone already)."""
        returned, result, _ = self.world.run_op(self.world.owner, None, call)
        if not returned and not isinstance(result, OffloadNotFound):
            raise Violation(
                f"unexpected_error:{type(result).__name__}", f"{what} repeated with no fault: {result!r}"
            )
        return "ok" if returned else "gone already"

    def cleanup(self, rng: random.Random) -> str:
        self._sync()

        def both() -> tuple[int, int]:
            return len(self.ledger_offloader.cleanup()), len(self.streaming.cleanup())

        before = self.world.owner.faults()
        returned, result = self._run(rng, "offload cleanup", both)
        if not returned:
            return f"offload cleanup: failed ({type(result).__name__})"
        if self.world.owner.faults() - before:
            return f"offload cleanup under faults: {result}"
        self._check_collected()
        return f"offload cleanup: {result[0]} attempts, {result[1]} segments; nothing left behind"

    def _check_collected(self) -> None:
        """After a cleanup without faults: no object of what was deleted, failed or abandoned."""
        records = {s.id: s for s in self.streaming.segments()}
        attempts = {(a.ledger_id, a.id): a for a in self.ledger_offloader.attempts()}
        epoch = self.world.s.epoch
        stream_folder = f"{OFFLOAD_PREFIX}{MANAGED_LEDGER}/"
        for name in self.world.s.list(OFFLOAD_PREFIX):
            if name.startswith(stream_folder):
                uid = uuid.UUID(name[len(stream_folder) :].removesuffix("-index"))
                record = records.get(uid)
                if record is None or record.state in (StreamState.FAILED, StreamState.DELETING):
                    why = "abandoned by a redo" if uid in self.stream.abandoned else "of no live segment"
                    state = "no record" if record is None else StreamState(record.state).name
                    raise Violation("offload_garbage_left", f"{name} ({state}, {why}) after cleanup")
                if record.state == StreamState.COMPLETE and set(record.ledgers) <= self.stream.deleted:
                    raise Violation(
                        "offload_deleted_left",
                        f"{name}: its ledgers {sorted(record.ledgers)} are all deleted",
                    )
                continue
            stem = name[len(OFFLOAD_PREFIX) :].removesuffix("-index")
            uid_text, _, ledger_text = stem.partition("-ledger-")
            key = (int(ledger_text), uuid.UUID(uid_text))
            if key in self.deleted:
                raise Violation("offload_deleted_left", f"{name} of a deleted offload after cleanup")
            attempt = attempts.get(key)
            in_progress = attempt is not None and (
                attempt.state == OffloadState.COMPLETE
                or (attempt.state == OffloadState.STARTED and attempt.epoch == epoch)
            )
            if key not in self.offloaded and not in_progress:
                raise Violation("offload_garbage_left", f"{name} of a failed offload after cleanup")

    # -- the zombie ------------------------------------------------------------------------------------

    def zombie_task(self, storage: Any, task: str, rng: random.Random) -> bool:
        """An offload task of a fenced instance (``storage``, after a takeover): it must
        change nothing. True if it had something to change."""
        if task == "stream":
            streaming = self.streaming_offloader(storage)
            segments = streaming.segments()
            last = segments[-1] if segments else None
            if last is None:
                begin = (FIRST_STREAMED_LEDGER, 0)
            elif last.state in (StreamState.OPEN, StreamState.FAILED):
                begin = (last.begin_ledger, last.begin_entry)
            else:
                begin = self.log.at(self._after(last), rng)[:2]
            handle = streaming.streaming_offload(uuid.UUID(int=rng.getrandbits(128)), {}, *begin)
            handle.offer_entry(*begin, b"ZOMBIE")
            handle.flush()
            return True
        offloader = LedgerOffloader(storage, max_block_bytes=self.max_block_bytes)
        if task == "ledger":
            offloader.offload(MemoryLedger(999, [b"ZOMBIE"]), uuid.UUID(int=rng.getrandbits(128)))
            return True
        if task == "delete":
            live = sorted(self._finished_ledgers() - self.stream.deleted)
            if live and rng.random() < 0.5:
                self.streaming_offloader(storage).delete_ledger(rng.choice(live))
                return True
            if self.offloaded:
                offloader.delete_offloaded(*rng.choice(sorted(self.offloaded)))
                return True
            return False
        assert task == "cleanup", task
        objects = set(storage.list(OFFLOAD_PREFIX))
        cleaned = [str(uid) for uid in self.streaming_offloader(storage).cleanup()]
        cleaned += [str(attempt.id) for attempt in offloader.cleanup()]
        # (a FAILED segment whose objects are gone already is reported again: nothing to change)
        return any(uid in name for uid in cleaned for name in objects)

    def snapshot(self) -> tuple[Any, ...]:
        """The offload tables and the offloaded objects' names, to compare."""
        dump = self.world.store.dump()
        tables = tuple(sorted((t, k, v.value) for t in OFFLOAD_TABLES for k, v in dump[t].items()))
        return tables, tuple(self.world.s.list(OFFLOAD_PREFIX))

    # -- the oracle ------------------------------------------------------------------------------------

    def check(self) -> None:
        """Pulsar's invariants (see module doc), faults off."""
        self._sync()
        self._repeat_deletes()
        self._checks += 1
        segments = self.streaming.segments()
        if segments and segments[-1].state == StreamState.FAILED:  # its entries are the redo's again
            failed = segments[-1]
            self._unacknowledge(self.log.index[(failed.begin_ledger, failed.begin_entry)])
        held: dict[int, list[tuple[int, int, uuid.UUID]]] = {}
        for segment in segments:
            if segment.state == StreamState.FAILED:
                continue
            for ledger_id, first, _, _, _, last in segment.blocks:
                held.setdefault(ledger_id, []).append((first, last, segment.id))
        for ledger_id, ranges in held.items():
            ranges.sort()
            end, holder = -1, None
            for first, last, uid in ranges:
                if first <= end:
                    raise Violation(
                        "offload_duplicated",
                        f"ledger {ledger_id}: entry {first} is in segments {holder} and {uid}",
                    )
                end, holder = last, uid
        acked: dict[int, int] = {}
        for ledger_id, entry, _ in self.log.entries[: self.stream.acked]:
            acked[ledger_id] = entry
        for ledger_id, last in acked.items():
            if ledger_id in self.stream.deleted:
                continue
            expected = 0
            for first, end, _ in held.get(ledger_id, []):
                if first > expected:
                    break
                expected = max(expected, end + 1)
            if expected <= last:
                raise Violation(
                    "offload_acknowledged_lost",
                    f"ledger {ledger_id}: acknowledged entry {expected} (of 0..{last}) is in no segment",
                )
        # Reads, a few per check: the newest acknowledged ledger, one more in turn, one PIP-17 offload.
        live = [lid for lid in acked if lid not in self.stream.deleted]
        for ledger_id in {live[-1], live[self._checks % len(live)]} if live else ():
            self._read_streamed(None, ledger_id)
        if self.offloaded:
            keys = sorted(self.offloaded)
            self._read_ledger_offload(None, keys[self._checks % len(keys)])
        attempts = {(a.ledger_id, a.id): a.state for a in self.ledger_offloader.attempts()}
        for key in self.offloaded:
            if attempts.get(key) != OffloadState.COMPLETE:
                raise Violation("offload_acknowledged_lost", f"offload {key[1]} of ledger {key[0]} is gone")


def _read(handle: Any, first: int, last: int) -> list[bytes]:
    """Entries ``first..last`` of a read handle (as bytes), the handle closed after."""
    with handle:
        return [bytes(entry) for entry in handle.read(first, last)]
