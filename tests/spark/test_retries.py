"""Spark task failures: a task that fails once is retried (same chunk name: the retry
reuses what the failed attempt built), and a task that always fails makes its run
fail alone, its leftover chunk collected by GC.

The task function is injected (``spark_executor(task=...)``): ``flaky_task`` makes
``slts.tools.spark_defrag.execute`` build the chunk and then raise a retryable
``StorageUnavailable`` for the runs of two chosen segments, on the first attempt
(``ONCE``) or on every attempt (``ALWAYS``), and lets ``_build`` do the rest. Each
attempt is logged to ``attempts.log`` beside the chunks folder. Spark's workers are
other processes, which cannot import this test module: it is pickled by value.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest

from slts.admin.verify import verify_container
from slts.errors import StorageUnavailable
from slts.storage.batch_defrag import Executor, RunTask, execute

from .conftest import (
    MASTER,
    collect_garbage,
    defrag_with,
    file_locations,
    fragment,
    mismatched,
    open_owner,
    require_spark,
)

ONCE, ALWAYS = "once/0003", "always/0003"
TASK_ATTEMPTS = 3
SEGMENTS, PIECES = 8, 4


def flaky_task(item: tuple[int, RunTask], attempts: int) -> tuple[int, object]:
    """``_build``, but the runs of ``ONCE`` (first attempt) and ``ALWAYS`` (every
    attempt) build their chunk and then fail (see module doc)."""
    from pyspark import TaskContext
    from slts.tools import spark_defrag

    _, task = item
    attempt = TaskContext.get().attemptNumber()
    folder = os.path.dirname(urlparse(task.url).path)
    with open(os.path.join(folder, "attempts.log"), "a") as log:
        log.write(f"{task.segment} {attempt}\n")
    if not (task.segment == ALWAYS or (task.segment == ONCE and attempt == 0)):
        return spark_defrag._build(item, attempts)

    def build_then_fail(failing: RunTask) -> object:
        execute(failing)  # the chunk lands: a leftover the next attempt (or GC) finds
        raise StorageUnavailable(
            f"injected: executor lost after building {failing.new_chunk}, attempt {attempt}"
        )

    spark_defrag.execute = build_then_fail  # type: ignore[assignment]
    try:
        return spark_defrag._build(item, attempts)
    finally:
        spark_defrag.execute = execute


@pytest.fixture(scope="module")
def spark() -> Iterator[Executor]:
    require_spark()
    from pyspark import cloudpickle
    from slts.tools.spark_defrag import spark_executor

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        # Two partitions per batch: the failing run's partition holds other runs, retried too.
        with spark_executor(MASTER, 2, task_attempts=TASK_ATTEMPTS, task=flaky_task) as executor:
            yield executor
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def attempts(root: object) -> list[tuple[str, int]]:
    with open(os.path.join(str(root), "attempts.log")) as log:
        return [(line.split()[0], int(line.split()[1])) for line in log]


def test_a_task_that_fails_once_is_retried(tmp_path, spark: Executor) -> None:
    url, metadata = file_locations(tmp_path)
    names = [f"once/{i:04d}" for i in range(SEGMENTS)]
    written = fragment(url, metadata, names, PIECES)
    report = defrag_with(spark, url, metadata)
    assert report.runs_failed == report.runs_dropped == 0 and report.errors == [], report
    assert report.runs_committed == SEGMENTS and report.chunks_after == 2 * SEGMENTS
    logged = attempts(tmp_path)
    assert (ONCE, 0) in logged and (ONCE, 1) in logged, "Spark retried the failed task"
    assert max(attempt for name, attempt in logged if name != ONCE) <= 1
    with open_owner(url, metadata) as owner:
        assert owner.info(ONCE).chunk_count == 2
        assert mismatched(owner, written.lengths) == []
        collect_garbage(owner)
        assert verify_container(owner, checksums=True).problems == []
        assert mismatched(owner, written.lengths) == []


def test_a_task_that_always_fails_fails_its_run_alone(tmp_path, spark: Executor) -> None:
    url, metadata = file_locations(tmp_path)
    names = [f"always/{i:04d}" for i in range(SEGMENTS)]
    written = fragment(url, metadata, names, PIECES)
    report = defrag_with(spark, url, metadata)
    assert report.runs_failed == 1 and report.runs_dropped == 0, report
    assert report.runs_committed == SEGMENTS - 1 and len(report.errors) == 1
    assert report.errors[0].startswith(f"{ALWAYS}@0: StorageUnavailable: injected"), report.errors
    assert sorted(attempt for name, attempt in attempts(tmp_path) if name == ALWAYS) == list(
        range(TASK_ATTEMPTS)
    )
    with open_owner(url, metadata) as owner:
        leftover = report.errors[0].split("after building ")[1].split(", attempt")[0]
        assert leftover.startswith(f"0/{ALWAYS}/") and owner.chunk_storage.exists(leftover), (
            "a leftover is there"
        )
        assert owner.info(ALWAYS).chunk_count == PIECES, "the failed run changed nothing"
        assert mismatched(owner, written.lengths) == []
        assert verify_container(owner).problems == [], "the leftover is queued for GC, not leaked"
        collect_garbage(owner)
        assert not owner.chunk_storage.exists(leftover), "GC deleted the leftover"
        assert verify_container(owner, checksums=True).problems == []
        assert mismatched(owner, written.lengths) == []
