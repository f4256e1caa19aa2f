"""The simulated container and how each step kind runs on it.

One memory chunk storage and one memory metadata store stand for tier-2 and the local
LMDB file; every process (the owner, a zombie, the batch defrag driver, a restarted
owner) sees them through its own ``FaultyChunkStorage`` and ``FaultyMetadataStore``,
seeded from the run's seam. A step arms faults (or not), runs, and is judged:

* an operation that returned must have taken effect exactly as the model says;
* one that raised must have raised a typed error while a fault was injected, and left
  the state before it, or the state after it only if a commit's answer was lost after it
  landed (nobody can tell then); anything else is a violation;
* an exception that is not an ``SltsError`` is always a violation (a traceback).

Then the invariants of ``checks`` run on the whole container.
"""

from __future__ import annotations

import copy
import itertools
import os
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from slts.bindings import chunk_cache
from slts.bindings.base import ChunkStorage
from slts.bindings.chunk_cache import CachedChunkStorage
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.memory import MemoryChunkStorage
from slts.journal.durable_copy import DurableCopy
from slts.journal.restore import restore

from slts.admin import verify as verify_module
from slts.admin.scrub import scrub
from slts.config import StorageConfig
from slts.errors import SegmentNotFound, SegmentTruncated, SltsError
from slts.metadata.faulty_store import FaultyMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import SEGMENTS, TABLES, name_key
from slts.metadata.store import CommitOp, Expect, MetadataStore
from slts.storage import batch_defrag
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import MemoryKeyRing
from slts.transforms.sealed import RecordSeal

from . import checks
from .checks import Violation
from .model import Model, Segment, State, summary
from .observer import Interleaver, Layouts
from .offload_room import OffloadRoom
from .remote_room import RemoteRoom
from .seam import Seam

NAMES = tuple(f"p{p}/s{i}" for p in range(2) for i in range(6))
GC_DELAY_S = 10.0
LEASE_S = 30.0
#: Chunk storage operations that fail at random while faults are armed.
FAILING_OPS = ("create", "write", "read", "concat", "delete", "open_read", "open_write", "get_info", "exists")
#: ... and those whose answer may be lost after they took effect.
LOSING_OPS = ("create", "write", "concat", "delete")


class NoAppendMemoryChunkStorage(MemoryChunkStorage):
    """The memory binding as an object store has it: no append, no truncate."""

    supports_append = False
    supports_truncate = False


def payload(rng: random.Random, size: int) -> bytes:
    return rng.randbytes(size)


#: The chunk cache of a seed that has one (``World.cache_root``): blocks and room small
#: enough for the simulator's short chunks to span blocks and be evicted.
CACHE_BLOCK_BYTES = 64
CACHE_BYTES = 4096


class Process:
    """One process's view: its faulty wrappers, its chunk cache if the seed has one (over
    the faulty binding: faults reach what the cache does not hold), and (once started)
    its engine instance."""

    def __init__(self, world: World, store: MetadataStore, *, engine: bool = False) -> None:
        seam = world.seam
        self.binding = FaultyChunkStorage(world.binding, seed=seam.random.getrandbits(32))
        self.store = FaultyMetadataStore(store, seed=seam.random.getrandbits(32))
        self.store.on_crash = self.binding.kill
        #: Pauses the process's metadata reads for another process's change (``observe``).
        self.interleaver = Interleaver(self.store)
        self.storage: ChunkedSegmentStorage | None = None
        self.cache: chunk_cache.ChunkCache | None = None
        #: What the engine reads and writes through: the binding, or the cache over it.
        self.reads: ChunkStorage = self.binding
        if engine and world.cache_root is not None:  # a folder of its own: one process per folder
            root = os.path.join(world.cache_root, f"process-{next(world.process_numbers)}")
            # Fills in the reader's thread (no fill threads): no thread schedule as input.
            self.cache = chunk_cache.acquire(root, CACHE_BYTES, CACHE_BLOCK_BYTES, 0, 1 << 20)
            self.reads = CachedChunkStorage(self.binding, self.cache)

    def end(self) -> None:
        """The process is gone (closed or dead): its cache folder's lock goes with it."""
        if self.cache is not None:
            cache, self.cache = self.cache, None
            chunk_cache.release(cache)

    def faults(self) -> Counter[str]:
        return self.binding.faults + self.store.faults


class World:
    """The container under test, its model and its counters."""

    def __init__(self, seam: Seam) -> None:
        self.seam = seam
        profile = seam.derive()
        self.no_append = profile.random() < 0.25
        self.binding = NoAppendMemoryChunkStorage() if self.no_append else MemoryChunkStorage()
        # Half the seeds read their verified ranges through ``read_into_checked`` (the path of
        # bindings that check as they read: filesystem, chunk cache), faults included, with
        # blocks small enough for the simulator's short writes to span several; drawn from a
        # generator of their own, so every other draw of a seed stays as it was.
        checked_reads = random.Random(f"checked-reads-{seam.seed}")
        self.binding.checks_as_it_reads = checked_reads.random() < 0.5
        # A third of the seeds read through a chunk cache on disk (``slts.bindings.chunk_cache``):
        # hits asked once (``read_held_into_checked``), evictions, fills of faulty reads; also
        # from a generator of their own.
        cached = random.Random(f"chunk-cache-{seam.seed}").random() < 1 / 3
        self.cache_root: str | None = tempfile.mkdtemp(prefix="slts-simulate-cache-") if cached else None
        self.process_numbers = itertools.count()
        small_blocks: dict[str, Any] = {"checksum_block_bytes": checked_reads.choice([16, 100, 1000])}
        self.store: MetadataStore = MemoryMetadataStore(TABLES)
        checksums = profile.random() < 0.7
        # Half the seeds combine every small append, a lone one too (``combined_writes``
        # "always": the simulator runs one write at a time, so "auto" would run each alone);
        # from a generator of their own.
        combined = "always" if random.Random(f"combined-writes-{seam.seed}").random() < 0.5 else "auto"
        self.config = StorageConfig(
            gc_delay_s=GC_DELAY_S,
            gc_interval_s=0.0,
            metadata_log_flush_interval_s=0.0,
            usage_flush_interval_s=0.0,
            gc_batch_max=profile.randint(2, 8),
            gc_delete_threads=1,  # deletes in list order: no thread schedule as input
            defrag_small_chunk_bytes=profile.choice([16, 48, 200, 1000]),
            read_parallel_bytes_min=256 << 20,
            checksums=checksums,
            verify_checksums_on_read=checksums,
            combined_writes=combined,
            concat_merge_seam=profile.random() < 0.6,
            defrag_batch_lease_s=LEASE_S,
            metadata_snapshot_interval_s=1e9,
            journal_snapshot_records=profile.choice([5, 20, 100]),
            **self._transforms(seam.seed),
            **(small_blocks if self.binding.checks_as_it_reads else {}),
        )
        #: Probability of faults in a step, and per call while armed.
        self.step_fault_p = profile.choice([0.1, 0.25, 0.5])
        self.call_fault_p = profile.choice([0.05, 0.15, 0.3])
        self.model = Model()
        self.counters: Counter[str] = Counter()  # crashes, takeovers, restores
        self.faults: Counter[str] = Counter()  # of processes that ended
        self.epochs: list[int] = []
        self.in_flight: Model | None = None  # the model after the change being judged
        self.in_flight_returned = False
        self.in_flight_what = ""
        self.trail: list[str] = []  # the changes the current step completed (for a violation's message)
        self.owner = self._start(self.store)
        #: The read-only observer of ``observe`` steps, made on first use and again when
        #: ``store`` is replaced (a restore).
        self.observer: Process | None = None
        #: The remote room (``remote_room``): local Kafka logs tiered into this container.
        self.remote = RemoteRoom(self, profile)
        #: The offload room (``offload_room``): Pulsar's ledger and streaming offload.
        self.offload = OffloadRoom(self, profile)
        #: Every (data key, ordinal) a frame was stored under in the run (``checks``).
        self.nonces = checks.NonceLedger()

    def _transforms(self, seed: int) -> dict[str, Any]:
        """Client-side transforms for a third of the seeds (docs/security.md): compression,
        encryption or both, in small frames so that the simulator's short writes span
        several; drawn from their own generator, so every other draw of a seed stays as it
        was. Sets ``key_ring`` (None without encryption) and ``seal`` (restore's)."""
        rng = random.Random(f"transforms-{seed}")
        self.key_ring: MemoryKeyRing | None = None
        self.seal: RecordSeal | None = None
        if rng.random() >= 1 / 3:
            return {}
        chosen: dict[str, Any] = {"frame_bytes": rng.choice([7, 64, 4096])}
        kind = rng.choice(["zstd", "aes", "zstd+aes"])
        if "zstd" in kind:
            chosen["compression_level"] = 1
        if "aes" in kind:
            chosen["encryption"] = True
            self.key_ring = MemoryKeyRing()
            self.key_ring.activate(self.key_ring.add())
            self.seal = RecordSeal(self.key_ring, sealing=False)
        return chosen

    # -- processes ------------------------------------------------------------------------------

    def _start(self, store: MetadataStore) -> Process:
        process = Process(self, store, engine=True)
        try:
            process.storage = ChunkedSegmentStorage(
                0,
                None,
                process.reads,
                process.store,
                self.config,
                clock=self.seam.clock,
                key_ring=self.key_ring,
            )
        except Exception as exc:
            process.end()
            raise Violation(
                "start_failed", f"starting an instance raised {type(exc).__name__}: {exc}"
            ) from exc
        epoch = process.storage.epoch
        if self.epochs and epoch <= self.epochs[-1]:
            raise Violation("epoch", f"a new instance took epoch {epoch}, not newer than {self.epochs[-1]}")
        self.epochs.append(epoch)
        return process

    def _end(self, process: Process, *, close: bool) -> None:
        """The process ends: closed cleanly, or abandoned (it died)."""
        self.faults.update(process.faults())
        if close and process.storage is not None:
            process.binding.clear()
            process.store.clear()
            process.storage.close()
        process.end()

    def all_faults(self) -> Counter[str]:
        return self.faults + self.owner.faults()

    @property
    def s(self) -> ChunkedSegmentStorage:
        assert self.owner.storage is not None
        return self.owner.storage

    def close(self) -> None:
        try:
            self.remote.close()
            self._end(self.owner, close=not self.owner.store.dead)
            self._end_observer()
        finally:
            if self.cache_root is not None:
                shutil.rmtree(self.cache_root, ignore_errors=True)

    def _end_observer(self) -> None:
        if self.observer is not None:
            process, self.observer = self.observer, None
            self._end(process, close=True)

    def _observer(self) -> Process:
        """The read-only observer on the current store (made anew after a restore): its
        own process (cache, binding, locks)."""
        if self.observer is not None and self.observer.store.inner is not self.store:
            self._end_observer()
        if self.observer is None:
            process = Process(self, self.store, engine=True)
            process.storage = ChunkedSegmentStorage(
                0,
                None,
                process.reads,
                process.store,
                self.config,
                clock=self.seam.clock,
                read_only=True,
                key_ring=self.key_ring,
            )
            self.observer = process
        return self.observer

    # -- faults ------------------------------------------------------------------------------

    def arm(self, process: Process, rng: random.Random) -> bool:
        """Maybe arm faults for one step on ``process`` (seeded by the step): True if armed."""
        if rng.random() >= self.step_fault_p:
            return False
        p = self.call_fault_p
        binding, store = process.binding, process.store
        binding.random = random.Random(rng.getrandbits(64))
        store.random = random.Random(rng.getrandbits(64))
        for op in FAILING_OPS:
            binding.fail_probability(op, p)
        if rng.random() < 0.5:
            for op in LOSING_OPS:
                binding.lose_reply_probability(op, p / 2)
        if rng.random() < 0.3:
            binding.partial_write(rng.randint(1, 3))
        if rng.random() < 0.3:
            binding.latency(self.seam.clock.advance, p, rng.choice([0.5, 4.0, GC_DELAY_S * 1.5]))
        store.fail_probability(p / 2)
        if rng.random() < 0.5:
            store.lose_reply_probability(p / 2)
        return True

    @staticmethod
    def disarm(process: Process) -> None:
        process.binding.clear()
        process.store.clear()

    # -- judging -----------------------------------------------------------------------------

    def observe(self) -> State:
        return checks.observe(self.s)

    def run_op(
        self, process: Process, rng: random.Random | None, fn: Callable[[], Any]
    ) -> tuple[bool, Any, Counter]:
        """Run ``fn`` on ``process`` (faults armed from ``rng`` if given): (returned,
        result or error, faults injected meanwhile). A non-``SltsError`` is a violation."""
        before = process.faults()
        if rng is not None:
            self.arm(process, rng)
        try:
            return True, fn(), process.faults() - before
        except SltsError as exc:
            return False, exc, process.faults() - before
        except Exception as exc:
            raise Violation(f"exception:{type(exc).__name__}", f"{exc!r}") from exc
        finally:
            self.disarm(process)

    def judge(self, what: str, after: Model, returned: bool, result: Any, injected: Counter) -> str:
        """Settle the model after an operation that changes it into ``after`` (see module doc)."""
        observed = self.observe()
        if returned:
            checks.check_content(observed, after.state())
            self.model = after
            return "ok"
        if not injected:
            raise Violation(
                f"unexpected_error:{type(result).__name__}",
                f"{what} raised {result!r} with no fault injected",
            )
        if observed == self.model.state():
            return f"failed ({type(result).__name__})"
        if observed == after.state():
            lost = injected["commit-lost-reply"] or injected["crash"]
            self.model = after  # what the store holds, whether or not the error was right to say otherwise
            if not lost:
                raise Violation(
                    f"error_after_effect:{what.split()[0]}",
                    f"{what} raised {result!r}, yet it took effect (faults {dict(injected)})",
                )
            self.model = after
            return f"failed ({type(result).__name__}) but landed"
        raise Violation(
            "partial_effect",
            f"{what} raised {result!r}; the store holds neither the state before "
            f"nor after: {summary(observed)} vs {summary(after.state())}",
        )

    # -- choices ----------------------------------------------------------------------------------

    def pick(
        self, rng: random.Random, predicate: Callable[[str, Segment], bool] = lambda n, s: True
    ) -> str | None:
        names = sorted(n for n, s in self.model.segments.items() if predicate(n, s))
        return rng.choice(names) if names else None

    def free_name(self, rng: random.Random) -> str | None:
        free = [n for n in NAMES if n not in self.model.segments]
        return rng.choice(free) if free else None

    # -- steps ---------------------------------------------------------------------------------

    def step(self, kind: str, rng: random.Random) -> str:
        """Run one step; its description (for the printed program)."""
        return getattr(self, f"do_{kind}")(rng)

    def mutate(self, rng: random.Random | None, what: str, after: Model, fn: Callable[[], Any]) -> str:
        """Run a change whose model is ``after`` and judge it (``in_flight`` keeps it for
        a crash that interrupts the judging)."""
        self.in_flight, self.in_flight_returned, self.in_flight_what = after, False, what
        returned, result, injected = self.run_op(self.owner, rng, fn)
        self.in_flight_returned = returned
        verdict = self.judge(what, after, returned, result, injected)
        self.in_flight = None
        self.trail.append(f"{what}: {verdict}")
        return f"{what}: {verdict}"

    def do_create(self, rng: random.Random) -> str:
        name = self.free_name(rng)
        if name is None:
            return "create: no free name"
        rolling = rng.choice([8, 16, 32, 64, 160, 1024])
        after = self.model.copy()
        after.segments[name] = Segment()
        return self.mutate(
            rng,
            f"create {name} rolling {rolling}",
            after,
            lambda: self.s.create(name, max_rolling_length=rolling),
        )

    def _write(self, rng: random.Random | None, name: str, size: int, data_rng: random.Random) -> str:
        after = self.model.copy()
        segment = after.segments[name]
        data = payload(data_rng, size)
        offset = len(segment.data)
        segment.data += data
        return self.mutate(
            rng,
            f"write {name} @{offset} +{size}",
            after,
            lambda: self.s.write(self.s.open_write(name), offset, data),
        )

    def do_write(self, rng: random.Random) -> str:
        name = self.pick(rng, lambda n, s: not s.sealed)
        if name is None:
            return "write: no unsealed segment"
        return self._write(rng, name, rng.choice([0, rng.randint(1, 12), rng.randint(13, 90)]), rng)

    def do_read(self, rng: random.Random) -> str:
        name = self.pick(rng)
        if name is None:
            return "read: no segment"
        segment = self.model.segments[name]
        offset = rng.randint(segment.start, len(segment.data))
        size = rng.randint(0, len(segment.data) - offset)
        returned, result, injected = self.run_op(
            self.owner, rng, lambda: self.s.read(self.s.open_read(name), offset, size)
        )
        what = f"read {name} @{offset} +{size}"
        if returned:
            if result != bytes(segment.data[offset : offset + size]):
                raise Violation("read_content", f"{what} returned other bytes than the model's")
            return f"{what}: ok"
        if not injected:
            raise Violation(
                f"unexpected_error:{type(result).__name__}", f"{what} raised {result!r}, no fault injected"
            )
        return f"{what}: failed ({type(result).__name__})"

    _OBSERVATIONS = ("read", "chunks", "verify", "scrub")
    #: The owner's changes beside a read-only observer, and what may change a layout
    #: beside the owner's own reads (its changes wait for its locks): a defrag batch.
    _BESIDE = ("change", "change", "defrag", "defrag_gc", "gc")
    _BESIDE_OWNER = ("batch_defrag",)

    def do_observe(self, rng: random.Random) -> str:
        """A reader reads, walks, verifies or scrubs a segment, and at a seeded point among
        its metadata reads another process changes that segment (no faults) to its end
        (``observer``): the owner beside a read-only observer, a defrag batch beside the
        owner. The reader must see one committed layout, never a mix, and report no
        damage (the store has none)."""
        name = self.pick(rng)
        if name is None:
            return "observe: no segment"
        by_owner = rng.random() < 0.4
        if by_owner:  # the most fragmented segment: the batch beside it has runs to merge
            name = max(sorted(self.model.segments), key=lambda n: len(self.s.chunks(n)))
        process = self.owner if by_owner else self._observer()
        reader = process.storage
        assert reader is not None
        before = copy.deepcopy(self.model.segments[name])
        offset = rng.randint(before.start, len(before.data))
        size = rng.randint(0, len(before.data) - offset)
        observation = rng.choice(self._OBSERVATIONS)
        beside = rng.choice(self._BESIDE_OWNER if by_owner else self._BESIDE)
        layouts = Layouts(self.store, name)
        lines: list[str] = []

        def change() -> None:
            try:
                lines.append(self._beside_reader(beside, name, rng, layouts))
            finally:
                layouts.finish()

        process.interleaver.pause_at(rng.randint(1, 8), change)
        calls: dict[str, Callable[[], Any]] = {
            "read": lambda: reader.read(reader.open_read(name), offset, size),
            "chunks": lambda: reader.chunks(name),
            "verify": lambda: verify_module.verify_segment(reader, name, checksums=True),
            "scrub": lambda: scrub(reader, prefix=name).anomalies,
        }
        try:
            result: Any = calls[observation]()
            error: SltsError | None = None
        except SltsError as exc:
            result, error = None, exc
        except Exception as exc:
            raise Violation(f"exception:{type(exc).__name__}", f"{observation}: {exc!r}") from exc
        finally:
            process.interleaver.run_pending()
        if process.interleaver.error is not None:  # the change beside was judged wrong
            error_of_change, process.interleaver.error = process.interleaver.error, None
            raise error_of_change
        who = "owner" if by_owner else "observer"
        what = f"{who} {observation} {name} @{offset} +{size} beside [{'; '.join(lines)}]"
        self._judge_observation(what, observation, name, (offset, size), before, layouts, result, error)
        return f"{what}: ok"

    def _beside_reader(self, beside: str, name: str, rng: random.Random, layouts: Layouts) -> str:
        """The change of segment ``name`` inside an observation (no faults), its commits
        recorded in ``layouts``."""
        if beside == "batch_defrag":  # never through the owner: its reader holds its locks
            return self._batch_defrag_of(name, layouts)
        self.owner.store.before_commit = layouts.record
        try:
            if beside == "change":
                return self._change_of(name, rng)
            if beside == "gc":
                self.seam.clock.advance(GC_DELAY_S + 1)
                return self.mutate(None, "gc past the delay", self.model.copy(), lambda: self.s.gc.run_once())
            line = self.mutate(None, f"defrag {name}", self.model.copy(), lambda: self.s.defrag(name))
            if beside == "defrag_gc":  # the chunks defrag replaced are collected at once
                self.seam.clock.advance(GC_DELAY_S + 1)
                line += "; " + self.mutate(None, "gc", self.model.copy(), lambda: self.s.gc.run_once())
            return line
        finally:
            self.owner.store.before_commit = None

    def _batch_defrag_of(self, name: str, layouts: Layouts) -> str:
        """A defrag batch of segment ``name`` alone, run to its end by a driver process
        (no faults), each commit recorded in ``layouts``."""
        driver_process = Process(self, self.store)
        driver_process.store.before_commit = layouts.record
        binding = driver_process.binding
        ended: list[str] = []
        try:
            driver = batch_defrag.BatchDefrag(
                binding, driver_process.store, 0, self.config, clock=self.seam.clock
            )
            for runs in driver.plan(names=[name]):
                for item in driver.register(runs):
                    outcome = batch_defrag.execute(item.task, binding)
                    ended.append(batch_defrag._end(driver, item, outcome))  # noqa: SLF001 - as run_batch
        finally:
            self._end(driver_process, close=False)
        return f"batch defrag {name}: {','.join(ended) or 'nothing to merge'}"

    def _judge_observation(
        self,
        what: str,
        observation: str,
        name: str,
        span: tuple[int, int],
        before: Segment,
        layouts: Layouts,
        result: Any,
        error: SltsError | None,
    ) -> None:
        """The oracle of ``do_observe`` (see ``observer``'s module doc)."""
        after = self.model.segments.get(name)
        gone = None in layouts.lists()
        if error is not None:
            explained = isinstance(error, SegmentNotFound) and gone
            if observation == "read":
                offset, size = span
                explained = explained or (
                    isinstance(error, SegmentTruncated) and after is not None and offset < after.start
                )
            if not explained:
                raise Violation(
                    f"observer_error:{type(error).__name__}", f"{what} raised {error!r} on an undamaged store"
                )
            return
        if observation == "read":
            offset, size = span
            if result != bytes(before.data[offset : offset + size]):
                raise Violation("observer_read_content", f"{what} returned other bytes than the model's")
        elif observation == "chunks":
            seen = tuple((start, chunk.name, chunk.length) for start, chunk in result)
            if seen not in layouts.lists():
                raise Violation(
                    "observer_mixed_layout",
                    f"{what} returned a layout the owner never committed: {seen} not in {layouts.lists()}",
                )
        elif result:
            raise Violation(f"observer_false_{observation}", f"{what} reported damage: {result[:3]}")

    def _set_sealed(self, rng: random.Random | None, name: str, sealed: bool) -> str:
        after = self.model.copy()
        after.segments[name].sealed = sealed
        verb = "seal" if sealed else "unseal"
        return self.mutate(
            rng, f"{verb} {name}", after, lambda: getattr(self.s, verb)(self.s.open_write(name))
        )

    def do_seal(self, rng: random.Random) -> str:
        name = self.pick(rng)
        return self._set_sealed(rng, name, True) if name else "seal: no segment"

    def do_unseal(self, rng: random.Random) -> str:
        name = self.pick(rng)
        return self._set_sealed(rng, name, False) if name else "unseal: no segment"

    def _concat(self, rng: random.Random | None, target: str, source: str) -> str:
        after = self.model.copy()
        offset = len(after.segments[target].data)
        after.segments[target].data += after.segments.pop(source).data
        after.targets.discard(source)
        after.targets.add(target)
        return self.mutate(
            rng,
            f"concat {source} -> {target} @{offset}",
            after,
            lambda: self.s.concat(self.s.open_write(target), offset, source),
        )

    def _valid_targets(self, source: str) -> Callable[[str, Segment], bool]:
        return lambda n, s: n != source and not s.sealed

    def do_concat(self, rng: random.Random) -> str:
        source = self.pick(rng, lambda n, s: s.sealed and s.start == 0)
        target = self.pick(rng, self._valid_targets(source)) if source else None
        if source is None or target is None:
            return "concat: no valid pair"
        return self._concat(rng, target, source)

    def do_transaction(self, rng: random.Random) -> str:
        """Create a transaction segment, fill it, seal it, concat it into a live one."""
        target = self.pick(rng, lambda n, s: not s.sealed)
        source = self.free_name(rng)
        if target is None or source is None:
            return "transaction: no parent or no free name"
        rolling = rng.choice([8, 32, 160, 1024])
        lines = [
            self.mutate(
                None,
                f"create {source}",
                self._with(source),
                lambda: self.s.create(source, max_rolling_length=rolling),
            )
        ]
        for _ in range(rng.randint(0, 3)):
            lines.append(self._write(None, source, rng.randint(1, 40), rng))
        lines.append(self._set_sealed(None, source, True))
        lines.append(self._concat(rng, target, source))
        return "transaction: " + "; ".join(lines)

    def _with(self, name: str) -> Model:
        after = self.model.copy()
        after.segments[name] = Segment()
        return after

    def do_chain(self, rng: random.Random) -> str:
        """Concat a segment that was itself a concat target into another (a chain)."""
        source = self.pick(rng, lambda n, s: n in self.model.targets and s.start == 0)
        target = self.pick(rng, self._valid_targets(source)) if source else None
        if source is None or target is None:
            return "chain: no former concat target to chain"
        lines = [] if self.model.segments[source].sealed else [self._set_sealed(None, source, True)]
        lines.append(self._concat(rng, target, source))
        return "chain: " + "; ".join(lines)

    def _truncate(self, rng: random.Random | None, name: str, offset_rng: random.Random) -> str:
        after = self.model.copy()
        segment = after.segments[name]
        offset = offset_rng.randint(segment.start, len(segment.data))
        segment.start = offset
        return self.mutate(
            rng, f"truncate {name} @{offset}", after, lambda: self.s.truncate(self.s.open_write(name), offset)
        )

    def do_truncate(self, rng: random.Random) -> str:
        name = self.pick(rng)
        return self._truncate(rng, name, rng) if name else "truncate: no segment"

    def _delete(self, rng: random.Random | None, name: str) -> str:
        after = self.model.copy()
        del after.segments[name]
        after.targets.discard(name)
        return self.mutate(rng, f"delete {name}", after, lambda: self.s.delete(self.s.open_write(name)))

    def do_delete(self, rng: random.Random) -> str:
        name = self.pick(rng)
        return self._delete(rng, name) if name else "delete: no segment"

    def do_defrag(self, rng: random.Random) -> str:
        name = self.pick(rng, lambda n, s: True)
        if name is None:
            return "defrag: no segment"
        return self.mutate(rng, f"defrag {name}", self.model.copy(), lambda: self.s.defrag(name))

    def do_gc(self, rng: random.Random) -> str:
        seconds = rng.choice([0.0, 1.0, GC_DELAY_S / 2, GC_DELAY_S + 1])
        self.seam.clock.advance(seconds)
        return self.mutate(rng, f"gc after {seconds}s", self.model.copy(), lambda: self.s.gc.run_once())

    def do_gc_full(self, rng: random.Random) -> str:
        """Everything due (past the delay and any batch lease): GC until quiet, then exact."""
        self.seam.clock.advance(GC_DELAY_S + LEASE_S + 1)
        for passes in range(1, 501):  # noqa: B007 - the count is reported below
            sequence = self.store.last_sequence
            returned, stats, _ = self.run_op(self.owner, None, lambda: self.s.gc.run_once())
            if not returned:
                raise Violation(
                    f"unexpected_error:{type(stats).__name__}", f"GC without faults raised {stats!r}"
                )
            if stats.errors:
                raise Violation("gc_errors", f"GC without faults counted {stats.errors} errors")
            # Quiet: nothing counted and nothing committed (a pass that only clears a deleted
            # segment's index entries counts nothing, yet it is progress).
            if not (stats.chunks_deleted or stats.entries_kept or stats.tombstones_finished) and (
                self.store.last_sequence == sequence
            ):
                break
        else:
            raise Violation("gc_not_converging", "500 GC passes and still busy")
        checks.check_exact(self.s, self.binding)
        return f"gc until quiet: {passes} passes, storage exact"

    def _durable(self) -> DurableCopy:
        """The owner's durable copy of the metadata, as it is now (the owner may change)."""
        assert self.s.durable is not None
        return self.s.durable

    def do_snapshot(self, rng: random.Random) -> str:
        assert self.s.durable is not None
        return self.mutate(rng, "metadata snapshot", self.model.copy(), lambda: self._durable().snapshot())

    def do_flush(self, rng: random.Random) -> str:
        assert self.s.durable is not None
        return self.mutate(rng, "metadata log flush", self.model.copy(), lambda: self._durable().flush())

    def do_restore(self, rng: random.Random) -> str:
        """The machine is lost after a flush: restore from tier-2 into a fresh store."""
        assert self.s.durable is not None
        self.s.durable.flush()
        self._end(self.owner, close=True)
        fresh = MemoryMetadataStore(TABLES)
        try:
            report = restore(self.binding, 0, fresh, seal=self.seal)
        except Exception as exc:
            raise Violation("restore_failed", f"restore raised {type(exc).__name__}: {exc}") from exc
        self.store = fresh
        self.owner = self._start(fresh)
        self.counters["restores"] += 1
        checks.check_content(self.observe(), self.model.state())
        return f"restore from tier-2 (sequence {report.sequence}) into a fresh store, epoch {self.s.epoch}"

    # -- the remote room (``remote_room``) --------------------------------------------------

    def do_remote_produce(self, rng: random.Random) -> str:
        return self.remote.produce(rng)

    def do_remote_copy(self, rng: random.Random) -> str:
        return self.remote.copy(rng)

    def do_remote_fetch(self, rng: random.Random) -> str:
        return self.remote.fetch(rng)

    def do_remote_retention(self, rng: random.Random) -> str:
        return self.remote.retention(rng)

    def do_remote_delete_partition(self, rng: random.Random) -> str:
        return self.remote.delete_partition(rng)

    # -- the offload room (``offload_room``) ------------------------------------------------

    def do_offload_ledger(self, rng: random.Random) -> str:
        return self.offload.offload_ledger(rng)

    def do_offload_stream_offer(self, rng: random.Random) -> str:
        return self.offload.offer(rng)

    def do_offload_stream_flush(self, rng: random.Random) -> str:
        return self.offload.flush(rng)

    def do_offload_stream_close(self, rng: random.Random) -> str:
        return self.offload.close(rng)

    def do_offload_read(self, rng: random.Random) -> str:
        return self.offload.read(rng)

    def do_offload_delete(self, rng: random.Random) -> str:
        return self.offload.delete(rng)

    def do_offload_cleanup(self, rng: random.Random) -> str:
        return self.offload.cleanup(rng)

    # -- crash, takeover, batch defrag --------------------------------------------------------

    _CRASHABLE = (
        "write",
        "truncate",
        "delete",
        "defrag",
        "gc",
        "seal",
        "create",
        "transaction",
        "chain",
        "snapshot",
        "flush",
        "remote_copy",
        "remote_retention",
        "offload_ledger",
        "offload_stream_offer",
        "offload_stream_flush",
        "offload_stream_close",
        "offload_delete",
        "offload_cleanup",
    )

    def do_crash(self, rng: random.Random) -> str:
        """The owner dies at the n-th commit of an operation (landed or not) and restarts
        with a new epoch: the store holds the state before or after the operation."""
        kind = rng.choice(self._CRASHABLE)
        nth, landed = rng.randint(1, 4), rng.random() < 0.5
        self.owner.store.crash_at(nth, landed)
        inner_rng = random.Random(rng.getrandbits(64))
        self.in_flight, self.in_flight_what = None, ""
        try:
            what = self.step(kind, inner_rng)
        except Violation:
            if not self.owner.store.dead:
                raise
            what = f"{self.in_flight_what or kind} (died)"  # judged below, against the restart
        died = self.owner.store.dead
        before = self.model
        after = self.in_flight if self.in_flight is not None else self.model
        returned = self.in_flight_returned if self.in_flight is not None else True
        self.in_flight = None
        self.owner.store.clear()
        self._end(self.owner, close=False)
        self.owner = self._start(self.store)
        self.counters["crashes"] += 1
        observed = self.observe()
        if observed == after.state():
            self.model = after
        elif observed != before.state():
            raise Violation(
                "crash_state",
                f"after a crash in {kind}: neither the state before nor after it: {summary(observed)}",
            )
        elif returned:
            raise Violation(
                "acknowledged_lost", f"{kind} returned before the crash (died: {died}), its effect is gone"
            )
        how = "landed" if landed else "not landed"
        return f"crash at commit {nth} ({how}) of [{what}]; restart epoch {self.s.epoch}"

    _ZOMBIE_ACTS = (
        "write",
        "truncate",
        "seal",
        "unseal",
        "delete",
        "defrag",
        "gc",
        "create",
        "flush",
        "read",
        "remote_copy",
        "remote_retention",
        "offload_stream",
        "offload_ledger",
        "offload_delete",
        "offload_cleanup",
    )

    def do_zombie(self, rng: random.Random) -> str:
        """A new owner takes over; the old instance keeps acting: it must change nothing
        and say so (a typed error), except reads, which may still return the bytes."""
        zombie = self.owner
        self.owner = self._start(self.store)
        self.counters["takeovers"] += 1
        acts = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(self._ZOMBIE_ACTS)
            acts.append(self._zombie_act(zombie, kind, rng))
        self._end(zombie, close=True)
        return "takeover; zombie: " + "; ".join(acts)

    def _zombie_act(self, zombie: Process, kind: str, rng: random.Random) -> str:
        z = zombie.storage
        assert z is not None
        name = self.pick(rng) or "p0/s0"
        segment = self.model.segments.get(name, Segment())
        calls: dict[str, Callable[[], Any]] = {
            "write": lambda: z.write(z.open_write(name), len(segment.data), b"ZOMBIE" * rng.randint(1, 5)),
            "truncate": lambda: z.truncate(z.open_write(name), rng.randint(0, len(segment.data))),
            "seal": lambda: z.seal(z.open_write(name)),
            "unseal": lambda: z.unseal(z.open_write(name)),
            "delete": lambda: z.delete(z.open_write(name)),
            "defrag": lambda: z.defrag(name),
            "gc": lambda: z.gc.run_once(),
            "create": lambda: z.create(self.free_name(rng) or name),
            "flush": lambda: z.durable.flush() if z.durable else None,
            "read": lambda: z.read(z.open_read(name), segment.start, len(segment.data) - segment.start),
            "remote_copy": lambda: self.remote.zombie_task(z, "copy", rng),
            "remote_retention": lambda: self.remote.zombie_task(z, "retention", rng),
            "offload_stream": lambda: self.offload.zombie_task(z, "stream", rng),
            "offload_ledger": lambda: self.offload.zombie_task(z, "ledger", rng),
            "offload_delete": lambda: self.offload.zombie_task(z, "delete", rng),
            "offload_cleanup": lambda: self.offload.zombie_task(z, "cleanup", rng),
        }
        remote_before = self.remote.snapshot()
        offload_before = self.offload.snapshot()
        self.seam.clock.advance(rng.choice([0.0, GC_DELAY_S + 1]))
        returned, result, _ = self.run_op(zombie, None, calls[kind])
        room = kind.startswith(("remote", "offload"))
        what = kind if room else f"{kind} {name}"
        observed = self.observe()
        if (
            observed != self.model.state()
            or self.remote.snapshot() != remote_before
            or self.offload.snapshot() != offload_before
        ):
            how = "returned" if returned else repr(result)
            raise Violation("zombie_changed_state", f"the zombie's {what} changed the store ({how})")
        if room and returned and not result:
            return f"{what}: nothing to change"  # nothing to copy or delete: no commit tried
        if kind == "read":
            if returned and result != bytes(segment.data[segment.start :]):
                raise Violation(
                    "zombie_read_content", f"the zombie's {what} returned other bytes than the model's"
                )
            return f"{what}: {'ok' if returned else type(result).__name__}"
        if returned:
            noop = (
                kind in ("defrag", "flush")
                or (kind == "seal" and segment.sealed)
                or (kind == "unseal" and not segment.sealed)
                or (kind == "truncate" and name in self.model.segments)
            )
            # (a zombie's truncate picks an offset <= length; state unchanged means at or below the start)
            raise Violation(
                "zombie_noop_acknowledged" if noop else "zombie_acknowledged",
                f"the zombie's {what} returned normally after a takeover",
            )
        return f"{what}: {type(result).__name__}"

    def do_batch_defrag(self, rng: random.Random) -> str:
        """A defrag batch beside the owner, driven step by step: plan, register (leased
        intents), then maybe a write, a renewal, an expiry or a takeover, then build every
        run (faults), then commit or release each run (``beside``: some of them inside an
        owner's change of their segment, see ``_beside``)."""
        driver_process = Process(self, self.store)
        binding, store = driver_process.binding, driver_process.store
        events: list[str] = []
        try:
            driver = batch_defrag.BatchDefrag(binding, store, 0, self.config, clock=self.seam.clock)
            for runs in driver.plan(batch_runs=rng.choice([1, 3, 100])):
                planned = driver.register(runs)
                event = rng.choice(["none", "none", "write", "renew", "expire", "takeover", "beside"])
                events.append(self._batch_event(event, planned, driver, rng))
                self.arm(driver_process, rng)
                outcomes: list[Any] = []
                for item in planned:
                    try:
                        outcomes.append(batch_defrag.execute(item.task, binding))
                    except SltsError as exc:
                        outcomes.append(exc)
                self.disarm(driver_process)
                pairs = list(zip(planned, outcomes, strict=True))
                if event == "beside" and pairs:
                    events.append(self._beside(driver, pairs, rng))
                for item, outcome in pairs:
                    how = batch_defrag._end(driver, item, outcome)  # noqa: SLF001 - commit or release, as run_batch
                    events.append(f"{item.run.segment}@{item.run.start}:{how}")
        except SltsError as exc:
            events.append(f"driver stopped: {type(exc).__name__}")
        except Violation:
            raise  # an owner's change beside the batch (``_beside``) was judged wrong
        except Exception as exc:
            raise Violation(f"exception:{type(exc).__name__}", f"batch defrag: {exc!r}") from exc
        finally:
            self.disarm(driver_process)
            self.faults.update(driver_process.faults())
        checks.check_content(self.observe(), self.model.state())
        return "batch defrag: " + ", ".join(events[:12]) + (" ..." if len(events) > 12 else "")

    def _beside(self, driver: Any, pairs: list[tuple[Any, Any]], rng: random.Random) -> str:
        """End (commit or release) the built runs of one segment inside the owner's next
        change of that segment, between the owner's reads and its commit: the change
        must absorb the batch's commit (no error without a fault: none is armed). The
        runs ended here leave ``pairs``."""
        segment = pairs[rng.randrange(len(pairs))][0].run.segment
        mine = [pair for pair in pairs if pair[0].run.segment == segment]
        pairs[:] = [pair for pair in pairs if pair[0].run.segment != segment]
        key = name_key(segment)
        ended: list[str] = []

        def land(ops: Sequence[CommitOp], expect: Sequence[Expect]) -> None:
            touched = (x for x in (*ops, *expect) if x.table == SEGMENTS)  # ranges are on other tables
            if not ended and any(getattr(x, "key", None) == key for x in touched):
                ended.extend(batch_defrag._end(driver, item, outcome) for item, outcome in mine)  # noqa: SLF001

        store = self.owner.store
        store.before_commit = land
        try:
            what = self._change_of(segment, rng)
        finally:
            store.before_commit = None
        if not ended:  # the change committed nothing on the segment (a no-op, or it is gone)
            ended.extend(batch_defrag._end(driver, item, outcome) for item, outcome in mine)  # noqa: SLF001
        return f"beside [{what}]: {segment} runs {','.join(ended)}"

    def _change_of(self, name: str, rng: random.Random) -> str:
        """One owner change of segment ``name`` (no faults armed), by the model's state."""
        segment = self.model.segments.get(name)
        if segment is None:
            return f"{name} is gone"
        choices = ["seal" if not segment.sealed else "unseal", "truncate", "delete"]
        source = target = None
        if not segment.sealed:
            choices += ["write", "write"]
            source = self.pick(rng, lambda n, s: s.sealed and s.start == 0 and n != name)
            choices += ["concat into"] if source is not None else []
        elif segment.start == 0:
            target = self.pick(rng, self._valid_targets(name))
            choices += ["concat from"] if target is not None else []
        choice = rng.choice(choices)
        if choice == "write":
            return self._write(None, name, rng.randint(1, 40), rng)
        if choice in ("seal", "unseal"):
            return self._set_sealed(None, name, choice == "seal")
        if choice == "truncate":
            return self._truncate(None, name, rng)
        if choice == "delete":
            return self._delete(None, name)
        if choice == "concat into":
            assert source is not None
            return self._concat(None, name, source)
        assert choice == "concat from" and target is not None
        return self._concat(None, target, name)

    def _batch_event(self, event: str, planned: list[Any], driver: Any, rng: random.Random) -> str:
        if event == "write" and planned:
            name = planned[rng.randrange(len(planned))].run.segment
            if name in self.model.segments and not self.model.segments[name].sealed:
                return self._write(None, name, rng.randint(1, 30), rng)
        if event == "renew":
            self.seam.clock.advance(LEASE_S / 2)
            planned[:] = driver.renew(planned)
            return "renewed"
        if event == "expire":
            self.seam.clock.advance(LEASE_S + GC_DELAY_S + 1)
            for _ in range(5):
                self.s.gc.run_once()
            return "lease expired, GC ran"
        if event == "takeover":
            self._end(self.owner, close=True)
            self.owner = self._start(self.store)
            self.counters["takeovers"] += 1
            return "new owner"
        return "-"
