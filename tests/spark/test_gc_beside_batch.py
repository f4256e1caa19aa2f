"""The owner's GC running while a Spark batch builds its chunks (formerly a strict xfail:
a batch slower than ``gc_delay_s`` lost its intents to GC and leaked a chunk per run).

A batch registers the GC intents of its runs before Spark builds them. The owner's GC
takes an intent for garbage once it is ``gc_delay_s`` old, so the intents are leased
(``defrag_batch_lease_s``): GC leaves them alone while the batch runs. If a batch
outlives its lease all the same, the runs whose intents GC took *expire*: the driver
queues their chunks again, and nothing leaks. Here the owner's GC (delay 0) runs
while the batch is being built, as it would a minute into a long batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from slts.admin.verify import verify_container
from slts.config import StorageConfig
from slts.storage.batch_defrag import Executor, Outcome, RunTask

from .conftest import collect_garbage, defrag_with, file_locations, fragment, mismatched, open_owner

SEGMENTS, PIECES = 4, 4


def _gc_then(spark: Executor, owner: object) -> Executor:
    def slow_batch(tasks: Sequence[RunTask]) -> Sequence[Outcome]:
        owner.gc.run_once()  # type: ignore[attr-defined]
        return spark(tasks)

    return slow_batch


def test_the_owners_gc_leaves_a_running_batch_alone(tmp_path, spark: Executor) -> None:
    url, metadata = file_locations(tmp_path)
    written = fragment(url, metadata, [f"leased/{i}" for i in range(SEGMENTS)], PIECES)
    with open_owner(url, metadata) as owner:  # the live owner, gc_delay_s=0
        report = defrag_with(_gc_then(spark, owner), url, metadata)
        assert report.runs_committed == SEGMENTS and report.runs_expired == 0, report
        assert mismatched(owner, written.lengths) == []
        collect_garbage(owner)
        assert verify_container(owner, checksums=True).problems == []
        assert all(owner.info(name).chunk_count == 2 for name in written.lengths)


def test_a_batch_that_outlives_its_lease_leaks_no_chunk(tmp_path, spark: Executor) -> None:
    url, metadata = file_locations(tmp_path)
    written = fragment(url, metadata, [f"slow/{i}" for i in range(SEGMENTS)], PIECES)
    with open_owner(url, metadata) as owner:
        unleased = StorageConfig(defrag_batch_lease_s=0.0)
        report = defrag_with(_gc_then(spark, owner), url, metadata, unleased)
        assert report.runs_expired == SEGMENTS and report.runs_committed == report.runs_dropped == 0, report
        assert mismatched(owner, written.lengths) == []
        assert verify_container(owner).problems == [], "the chunks built after GC's pass are queued again"
        assert collect_garbage(owner) >= SEGMENTS
        assert verify_container(owner, checksums=True).problems == []
        assert all(owner.info(name).chunk_count == PIECES for name in written.lengths)
