"""Defrag batch runs: plan and commit on a driver, build chunks anywhere (DESIGN.md §8).

One logic, two drivers: ``run_batch`` takes an *executor*, a function that builds the
chunks of a list of ``RunTask``; the in-process executor (``execute_locally``) uses a
thread pool, the Spark driver (``slts.tools.spark_defrag``) ships the tasks to
executors. Everything else is here:

* **Plan** (``BatchDefrag.plan``): the runs of every segment (under a prefix, or a
  list), from ``defrag.plan_runs``, streamed in batches: each batch is read in one
  read-only transaction, and the next batch resumes after the last segment, so a large
  store is never held in memory.
* **Register**: before a batch is built, one commit puts a GC intent for each run's new
  chunk. The name is fixed by the plan, so every attempt of a task writes the same
  name, and whatever a failed attempt or a dropped run leaves is found by GC. The
  intents are *leased*: queued ``defrag_batch_lease_s`` ahead, so the owner's GC,
  which takes an intent for garbage once it is ``gc_delay_s`` old, leaves a batch's
  intents alone while the batch is built. While the executor runs, the driver renews
  the lease every third of it (``BatchDefrag.renew``: one commit moves every intent
  still held a lease ahead of now), so a batch held up for hours (a Spark job waiting
  for executors, a slow chunk storage) keeps its runs. A driver that dies stops
  renewing: its intents fall due one lease (plus ``gc_delay_s``) later.
* **Execute** (``execute``): a task builds its binding from the store URL (plain values
  only travel), then builds the chunk: native concat where the binding has it, copy
  otherwise. It is idempotent: a chunk an earlier attempt created (creates are
  atomic) with the run's length is reused.
* **Commit**: one conditional commit per run (``defrag.swap_in``) on a fresh read of
  the segment: a run whose chunks, or the chunk before it, changed is dropped (its new
  chunk goes to GC); writes to the segment's other chunks do not drop it.
* **Release**: a run that did not commit (dropped, failed) trades its leased intent
  for a ``dropped`` entry queued now, so its leftovers go at the next GC pass. If the
  intent is gone (the batch outlived its lease and GC collected it, perhaps before the
  chunk was built), the chunk is queued again (``gc.requeue_lost_intents``): the run
  is reported *expired*, and nothing leaks.

The driver is **not the container's owner**: it fences nobody. A live writer keeps its
epoch and keeps writing. Every commit of the driver expects the container record as
it was when the driver started, so once a new owner starts, the remaining runs are
dropped. New chunks are named and recorded with the owner's epoch. The dropped chunks
and leftovers are collected by the owner's GC. The owner's cache learns the new
layout through its conflict handling, and through the stale-cache retry on reads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from types import TracebackType

from slts.bindings.base import ChunkStorage
from slts.config import StorageConfig
from slts.errors import Fenced, InvalidArgument, InvalidName, SegmentNotFound, SltsError, VersionConflict
from slts.gc import queue_entry, requeue_lost_intents
from slts.limiter import PriorityLimiter
from slts.metadata.records import ContainerRecord, GcReason, SegmentRecord
from slts.metadata.schema import CONTAINER, CONTAINER_KEY, GC, SEGMENTS, name_key
from slts.metadata.store import Delete, Expect, MetadataStore, Operation, Put, prefix_stop
from slts.storage import defrag
from slts.storage.gate import GatedChunkStorage
from slts.storage.segment_names import check_segment_name, chunk_name
from slts.usage import UsageMeter

#: Runs planned (and registered, built, committed) per batch ...
BATCH_RUNS_DEFAULT = 2000
#: ... and bytes of runs per batch: what a batch holds in memory and in one register or
#: renew commit, and the most work a driver that dies throws away.
BATCH_BYTES_DEFAULT = 1 << 30
#: Segments whose runs the driver commits side by side (see ``run_batch``).
COMMIT_THREADS_DEFAULT = 8

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunTask:
    """What an executor needs to build one run's chunk: plain values only (picklable)."""

    url: str
    segment: str
    start: int
    new_chunk: str
    sources: tuple[defrag.Source, ...]
    checksums: bool
    block_bytes: int = defrag.BLOCK_BYTES_DEFAULT

    @property
    def length(self) -> int:
        return sum(source.length for source in self.sources)


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """A run of the plan, with its task and the GC intent of its new chunk."""

    run: defrag.Run
    task: RunTask
    intent_key: bytes
    intent_version: int


#: What an executor returns for each task, in task order: the built chunk, or the error.
Outcome = defrag.BuiltChunk | BaseException
Executor = Callable[[Sequence[RunTask]], Sequence[Outcome]]


#: The failed runs whose error a ``BatchReport`` keeps whole (the rest are counted by kind).
ERRORS_KEPT = 10


@dataclass
class BatchReport:
    """What a batch run did (``--json`` prints it)."""

    segments_scanned: int = 0
    segments_planned: int = 0  # segments with at least one run
    runs_planned: int = 0
    runs_committed: int = 0
    # Every planned run ends as exactly one of: committed, dropped, failed, expired.
    runs_dropped: int = 0  # the segment changed where the run was
    runs_failed: int = 0  # the task failed for good (its chunk, if any, goes to GC)
    runs_expired: int = 0  # its GC intent was collected before it committed (chunk queued again)
    lease_renewals: int = 0  # commits that moved a batch's intents a lease ahead again
    chunks_before: int = 0  # chunks of the segments scanned, at planning
    chunks_after: int = 0  # the same minus what committed runs removed
    bytes_native: int = 0  # concatenated by the chunk storage itself (server-side on S3)
    bytes_copied: int = 0  # read and written through the executors
    batches: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # the first ERRORS_KEPT failed runs' errors, whole
    #: Every failed run counted by its error's type (``{"ChunkNotFound": 1828}``): how a
    #: batch failed, past the first ``ERRORS_KEPT``.
    error_kinds: dict[str, int] = field(default_factory=dict)


# -- executors -----------------------------------------------------------------------------------

_bindings: dict[str, ChunkStorage] = {}
_bindings_lock = threading.Lock()


def binding_for(url: str) -> ChunkStorage:
    """One binding per URL per process (executors build it from the URL, once)."""
    from slts.bindings import from_url

    with _bindings_lock:
        if url not in _bindings:
            _bindings[url] = from_url(url)
        return _bindings[url]


def execute(task: RunTask, binding: ChunkStorage | None = None) -> defrag.BuiltChunk:
    """Build ``task``'s chunk (see module doc). Raises ``ChunkStorageError``."""
    chosen = binding if binding is not None else binding_for(task.url)
    return defrag.build_from_sources(
        chosen,
        task.sources,
        task.new_chunk,
        checksums=task.checksums,
        reuse=True,
        block_bytes=task.block_bytes,
    )


def execute_locally(binding: ChunkStorage, threads: int = 4) -> Executor:
    """The in-process executor: the tasks of a batch on a pool of ``threads``."""

    def run(tasks: Sequence[RunTask]) -> list[Outcome]:
        def one(task: RunTask) -> Outcome:
            try:
                return execute(task, binding)
            except SltsError as exc:
                return exc

        with ThreadPoolExecutor(max(1, threads)) as pool:
            return list(pool.map(one, tasks))

    return run


# -- the driver ------------------------------------------------------------------------------------


class BatchDefrag:
    """Plans, registers and commits defrag runs of container ``container_id`` beside its
    owner (see module doc). ``binding.url`` is what executors rebuild the binding from."""

    def __init__(
        self,
        binding: ChunkStorage,
        store: MetadataStore,
        container_id: int,
        config: StorageConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Raises ``InvalidArgument`` if the binding has no URL (executors could not
        rebuild it), ``Fenced`` if the container was never started (no owner epoch)."""
        if not binding.url:
            raise InvalidArgument(f"{binding!r} has no URL: executors could not rebuild it")
        self.binding = binding
        self.store = store
        self.container_id = container_id
        self.config = config or StorageConfig()
        self._clock = clock
        stored = store.get(CONTAINER, CONTAINER_KEY)
        if stored is None:
            raise Fenced(f"container {container_id} has never been started: nothing to defrag")
        owner = ContainerRecord.decode(stored.value)
        if owner.container_id != container_id:
            raise InvalidArgument(
                f"this metadata store belongs to container {owner.container_id}, not {container_id}"
            )
        self.epoch = owner.epoch
        self._fence = Expect(CONTAINER, CONTAINER_KEY, stored.version)

    # -- plan --------------------------------------------------------------------------------

    def plan(
        self,
        prefix: str = "",
        names: Sequence[str] | None = None,
        batch_runs: int = BATCH_RUNS_DEFAULT,
        report: BatchReport | None = None,
        batch_bytes: int = BATCH_BYTES_DEFAULT,
    ) -> Iterator[list[defrag.Run]]:
        """Batches of at most about ``batch_runs`` runs and ``batch_bytes`` bytes (a
        segment's runs stay together, so a batch holds at least one segment's), each
        planned in one read-only transaction. ``names``: only these segments (missing
        ones are skipped); else every segment under ``prefix``. Counts go to ``report``.
        Raises ``InvalidArgument`` for a bound below 1, ``InvalidName`` for a bad name."""
        if batch_runs < 1 or batch_bytes < 1:
            raise InvalidArgument(f"batch_runs and batch_bytes must be >= 1, got {batch_runs}, {batch_bytes}")
        if not isinstance(prefix, str) or "\x00" in prefix:
            raise InvalidName(f"prefix must be a string without NUL, got {prefix!r}")
        keys = sorted(name_key(check_segment_name(name)) for name in names) if names is not None else None
        report = report if report is not None else BatchReport()
        start = name_key(prefix)
        stop = prefix_stop(start) if start else None
        position = 0  # next index into keys
        while True:
            batch: list[defrag.Run] = []
            batched_bytes = 0
            with self.store.snapshot() as view:
                while len(batch) < batch_runs and batched_bytes < batch_bytes:
                    if keys is not None:
                        if position >= len(keys):
                            break
                        key, position = keys[position], position + 1
                        stored = view.get(SEGMENTS, key)
                        if stored is None:
                            continue
                        entries = [(key, stored)]
                    else:
                        entries = view.scan(SEGMENTS, start, stop, limit=1)
                        if not entries:
                            break
                        key = entries[0][0]
                        start = key + b"\x00"
                    record = SegmentRecord.decode(entries[0][1].value)
                    listed = defrag.read_list(view, record)
                    runs = list(defrag.plan_runs(record, listed, self.config))
                    report.segments_scanned += 1
                    report.chunks_before += len(listed)
                    report.chunks_after += len(listed)
                    if runs:
                        report.segments_planned += 1
                        report.runs_planned += len(runs)
                        batch.extend(runs)
                        batched_bytes += sum(run.length for run in runs)
            if not batch:
                return
            yield batch

    # -- register ----------------------------------------------------------------------------

    def register(self, runs: Sequence[defrag.Run]) -> list[PlannedRun]:
        """One commit with a leased GC intent (see module doc) for every run's new chunk;
        the runs as tasks. Raises ``Fenced`` if a new owner started since this driver did."""
        now_ms = int((self._clock() + self.config.defrag_batch_lease_s) * 1000)
        planned: list[tuple[defrag.Run, RunTask, bytes]] = []
        ops: list[Operation] = []
        for run in runs:
            opaque = run.segment_id if self.config.encryption else None
            new_chunk = chunk_name(self.container_id, run.segment, self.epoch, run.start, opaque)
            task = RunTask(
                self.binding.url,
                run.segment,
                run.start,
                new_chunk,
                defrag.run_sources(run),
                self.config.checksums,
                self.config.checksum_block_bytes,
            )
            intent = queue_entry(new_chunk, GcReason.INTENT, now_ms)
            ops.append(intent)
            planned.append((run, task, intent.key))
        if not ops:
            return []
        version = self._commit(ops, [Expect(GC, key, 0) for _, _, key in planned])
        return [PlannedRun(run, task, key, version) for run, task, key in planned]

    def renew(self, planned: Sequence[PlannedRun]) -> list[PlannedRun]:
        """Renew the lease of ``planned``'s intents: one commit moves every intent still
        as registered to ``defrag_batch_lease_s`` ahead of now. Returns the runs with
        their current intents (a run whose intent GC already took keeps the old one and
        will expire at release). Raises ``Fenced``."""
        for _ in range(self.config.commit_retries_max + 1):
            now_ms = int((self._clock() + self.config.defrag_batch_lease_s) * 1000)
            moved: dict[bytes, bytes] = {}  # held intent's key -> its renewed key
            ops: list[Operation] = []
            expect: list[Expect] = []
            with self.store.snapshot() as view:
                for p in planned:
                    stored = view.get(GC, p.intent_key)
                    renewed = queue_entry(p.task.new_chunk, GcReason.INTENT, now_ms)
                    if stored is None or stored.version != p.intent_version or renewed.key == p.intent_key:
                        continue  # taken by GC, or the clock did not move
                    moved[p.intent_key] = renewed.key
                    ops += [Delete(GC, p.intent_key), renewed]
                    expect += [Expect(GC, p.intent_key, p.intent_version), Expect(GC, renewed.key, 0)]
            if not moved:
                return list(planned)
            try:
                version = self._commit(ops, expect)
            except VersionConflict:
                continue  # GC claimed one of them meanwhile: look again
            return [
                replace(p, intent_key=moved[p.intent_key], intent_version=version)
                if p.intent_key in moved
                else p
                for p in planned
            ]
        _log.warning("could not renew the lease of %d defrag run(s): GC kept claiming intents", len(planned))
        return list(planned)

    # -- commit ------------------------------------------------------------------------------

    def commit(self, planned: PlannedRun, built: defrag.BuiltChunk) -> bool:
        """Swap the run for its built chunk; False if the run was dropped (see module doc).
        A few re-reads absorb a live writer's commits to the segment. Raises ``Fenced``."""
        dropped = [self._gc_entry(chunk.record.name) for chunk in planned.run.chunks]
        for _ in range(self.config.commit_retries_max + 1):
            stored = self.store.get(SEGMENTS, name_key(planned.run.segment))
            if stored is None:
                return False  # deleted meanwhile
            record = SegmentRecord.decode(stored.value)
            if record.segment_id != planned.run.segment_id:
                return False  # deleted and created again
            if defrag.swap_in(
                self.store,
                self._commit,
                record,
                stored.version,
                planned.run,
                built,
                epoch=self.epoch,
                intent_key=planned.intent_key,
                intent_version=planned.intent_version,
                dropped_entries=dropped,
            ):
                return True
            if not self._segment_moved(planned.run.segment, stored.version):
                return False  # the run itself changed: dropped
        return False

    def release(self, planned: PlannedRun) -> bool:
        """Hand the chunk of a run that did not commit (dropped or failed) to GC, due
        now: one commit trades the run's leased intent for a ``dropped`` entry. True if
        the intent had already been collected (the run expired): the chunk is queued
        again instead (``requeue_lost_intents``). Call it once every attempt of the
        run's task has ended. Raises ``Fenced`` (the intent then waits out its lease)."""
        chunk = planned.task.new_chunk
        try:
            self._commit(
                [Delete(GC, planned.intent_key), self._gc_entry(chunk)],
                [Expect(GC, planned.intent_key, planned.intent_version)],
            )
            return False
        except VersionConflict:
            pass  # the intent is gone or claimed
        now_ms = int(self._clock() * 1000)
        lost = requeue_lost_intents(
            self.store, self._commit, [(planned.intent_key, chunk)], planned.intent_version, now_ms
        )
        assert lost == [chunk], (lost, chunk)
        return True

    def _segment_moved(self, segment: str, version: int) -> bool:
        """True if only the segment record moved on (a writer appended): worth a re-read."""
        stored = self.store.get(SEGMENTS, name_key(segment))
        return stored is not None and stored.version != version

    def _gc_entry(self, chunk: str) -> Put:
        return queue_entry(chunk, GcReason.DROPPED, int(self._clock() * 1000))

    def _commit(self, ops: Sequence[Operation], expect: Sequence[Expect]) -> int:
        try:
            return self.store.commit(ops, [*expect, self._fence])
        except VersionConflict:
            current = self.store.get(CONTAINER, CONTAINER_KEY)
            if current is None or current.version != self._fence.version:
                raise Fenced(
                    f"container {self.container_id}: a new owner started during the defrag batch",
                    container=self.container_id,
                ) from None
            raise


class _LeaseRenewal:
    """A thread that renews a registered batch's lease every third of it until the
    ``with`` block ends; ``planned`` is then the runs with their current intents."""

    def __init__(self, driver: BatchDefrag, planned: list[PlannedRun], report: BatchReport) -> None:
        self.planned = planned
        self._driver = driver
        self._report = report
        self._every_s = driver.config.defrag_batch_lease_s / 3
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="slts-defrag-lease", daemon=True)

    def __enter__(self) -> _LeaseRenewal:
        if self._every_s > 0 and self.planned:
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self.planned = self._driver.renew(self.planned)
                self._report.lease_renewals += 1
            except Fenced:
                return  # the commits will say so
            except SltsError:
                _log.warning("could not renew a defrag batch's lease; trying again", exc_info=True)


def _end(driver: BatchDefrag, item: PlannedRun, outcome: Outcome) -> str:
    """Commit or release one run: how it ended (committed, dropped, failed, expired)."""
    if isinstance(outcome, BaseException):
        driver.release(item)
        return "failed"
    if driver.commit(item, outcome):
        return "committed"
    return "expired" if driver.release(item) else "dropped"


def _count(report: BatchReport, item: PlannedRun, outcome: Outcome, how: str) -> None:
    if how == "failed":
        kind = type(outcome).__name__
        if len(report.errors) < ERRORS_KEPT:
            report.errors.append(f"{item.run.segment}@{item.run.start}: {kind}: {outcome}")
        report.error_kinds[kind] = report.error_kinds.get(kind, 0) + 1
        report.runs_failed += 1
    elif how == "committed":
        assert isinstance(outcome, defrag.BuiltChunk)
        report.runs_committed += 1
        report.chunks_after -= len(item.run.chunks) - 1
        report.bytes_native += outcome.bytes_native
        report.bytes_copied += outcome.bytes_copied
    elif how == "expired":
        report.runs_expired += 1
    else:
        assert how == "dropped", how
        report.runs_dropped += 1


def run_batch(
    driver: BatchDefrag,
    executor: Executor,
    *,
    prefix: str = "",
    names: Sequence[str] | None = None,
    batch_runs: int = BATCH_RUNS_DEFAULT,
    batch_bytes: int = BATCH_BYTES_DEFAULT,
    progress: Callable[[int], None] | None = None,
    commit_threads: int = COMMIT_THREADS_DEFAULT,
) -> BatchReport:
    """Plan, register, execute (through ``executor``), commit or release every batch;
    the report.

    ``executor`` must return only once every attempt of every task has ended (a task
    still running could create its chunk after its run was released); while it runs,
    the batch's lease is renewed every third of ``defrag_batch_lease_s``. ``progress(n)``
    is called with the number of runs each batch finished. Each run is its own
    conditional commit; ``commit_threads`` segments' runs are committed side by side (a
    segment's runs in order), so the store's group commit shares their syncs. Raises
    ``Fenced`` if a new owner started (runs committed until then stay committed),
    ``InvalidArgument`` for a bound below 1 (before anything changed).
    """
    if commit_threads < 1:
        raise InvalidArgument(f"commit_threads must be >= 1, got {commit_threads}")
    report = BatchReport()
    began = time.perf_counter()

    def end_in_order(pairs: list[tuple[PlannedRun, Outcome]]) -> list[tuple[PlannedRun, Outcome, str]]:
        return [(item, outcome, _end(driver, item, outcome)) for item, outcome in pairs]

    with ThreadPoolExecutor(commit_threads, thread_name_prefix="slts-defrag-commit") as committers:
        for runs in driver.plan(prefix, names, batch_runs, report, batch_bytes):
            with _LeaseRenewal(driver, driver.register(runs), report) as lease:
                outcomes = executor([p.task for p in lease.planned])
            planned = lease.planned
            assert len(outcomes) == len(planned), (len(outcomes), len(planned))
            by_segment: dict[str, list[tuple[PlannedRun, Outcome]]] = {}
            for item, outcome in zip(planned, outcomes, strict=True):
                by_segment.setdefault(item.run.segment, []).append((item, outcome))
            # A segment's runs commit in order, in one thread (they touch the same record);
            # segments commit side by side, so the store's group commit shares the syncs.
            for ended in committers.map(end_in_order, by_segment.values()):
                for item, outcome, how in ended:
                    _count(report, item, outcome, how)
            report.batches += 1
            if progress is not None:
                progress(len(planned))
    report.seconds = time.perf_counter() - began
    runs_ended = report.runs_committed + report.runs_dropped + report.runs_failed + report.runs_expired
    assert runs_ended == report.runs_planned, report
    _log.info(
        "defrag batch: %d segment(s), %d run(s) planned, %d committed, %d dropped, %d failed, %d expired",
        report.segments_scanned,
        report.runs_planned,
        report.runs_committed,
        report.runs_dropped,
        report.runs_failed,
        report.runs_expired,
        extra={"runs_planned": report.runs_planned, "runs_committed": report.runs_committed},
    )
    return report


#: Makes the executor of a batch over a binding, for the length of a ``with`` block.
ExecutorFactory = Callable[[ChunkStorage], contextlib.AbstractContextManager[Executor]]


def local_executor(threads: int = 4) -> ExecutorFactory:
    """The in-process executor (``execute_locally``) as an ``ExecutorFactory``."""
    return lambda binding: contextlib.nullcontext(execute_locally(binding, threads))


def defrag_store(
    url: str,
    metadata: str,
    executor: ExecutorFactory,
    *,
    container_id: int = 0,
    config: StorageConfig | None = None,
    prefix: str = "",
    names: Sequence[str] | None = None,
    batch_runs: int = BATCH_RUNS_DEFAULT,
    batch_bytes: int = BATCH_BYTES_DEFAULT,
    progress: Callable[[int], None] | None = None,
    limiter: PriorityLimiter | None = None,
) -> BatchReport:
    """The whole defrag batch over the store at ``url`` (chunk storage) with its LMDB
    metadata folder ``metadata``, beside the container's live owner (it fences nobody):
    open both, plan and commit every batch (``run_batch``) with the executor that
    ``executor(binding)`` enters, close both. The one wiring the CLI, the Spark job and
    the demo share. ``limiter``: the batch's chunk storage calls in process go through it
    (``slts.limiter``; Spark executors open their own binding and are not paced). The
    calls in process are metered and their usage recorded in the store at the end
    (``slts.usage``; a Spark executor's are not).

    Raises ``SegmentNotFound`` if one of ``names`` does not exist (nothing done),
    ``StoreNotFound``/``InvalidConfig`` for a missing or bad metadata folder, and what
    ``BatchDefrag`` and ``run_batch`` raise (``Fenced`` if a new owner starts meanwhile).
    """
    from slts.bindings import from_url
    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.schema import TABLES

    with from_url(url) as opened, LmdbMetadataStore(metadata, TABLES) as store:
        for name in names or ():
            if store.get(SEGMENTS, name_key(check_segment_name(name))) is None:
                raise SegmentNotFound(f"segment {name!r} does not exist", segment=name)
        meter = UsageMeter()
        binding = GatedChunkStorage(opened, meter, limiter)
        driver = BatchDefrag(binding, store, container_id, config)
        try:
            with executor(binding) as run_tasks:
                return run_batch(
                    driver,
                    run_tasks,
                    prefix=prefix,
                    names=names,
                    batch_runs=batch_runs,
                    batch_bytes=batch_bytes,
                    progress=progress,
                )
        finally:
            try:
                meter.flush(store, container_id)  # the run's requests, for ``slts cost``
            except SltsError as exc:  # accounting: never the reason a run fails
                _log.warning("defrag run's chunk storage usage not recorded: %s", exc)
