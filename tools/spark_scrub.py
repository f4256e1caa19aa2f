"""Scrubs on Spark: the chunk checks of ``slts.admin.scrub`` run on Spark executors.

The driver walks the metadata and plans batches of ``ChunkCheck`` values (plain data); each
executor rebuilds the binding from the chunk storage URL (once per Python worker) and reads
and checks its chunks (``check_chunk``); the driver gathers the results in plan order, so
the report (anomalies with segment, chunk and offset; ``next_segment`` to resume) is the
in-process scrub's. A check that fails with a chunk storage error is retried by Spark like a
defrag task (``slts.tools.spark_defrag``); on its last attempt the error stops the walk.
Executors read outside the driver's limiter: size ``partitions`` to the read rate the
storage can spare.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from slts.tools.spark_defrag import run_attempt, spark_executor

from slts.admin.scrub import ChunkCheck, ChunkChecker, ChunkResult, check_chunk
from slts.storage.batch_defrag import binding_for


def _check_one(check: ChunkCheck) -> ChunkResult:
    return check_chunk(check, binding_for(check.url))


def _check(item: tuple[int, ChunkCheck], attempts: int) -> tuple[int, Any]:
    """One chunk check in an executor."""
    return run_attempt(_check_one, item, attempts)


@contextlib.contextmanager
def spark_checker(
    master: str = "local[*]", partitions: int | None = None, **options: Any
) -> Iterator[ChunkChecker]:
    """A Spark session for the ``with`` block, as a ``scrub`` checker. Raises
    ``InvalidConfig`` if PySpark is missing or an option is bad."""
    with spark_executor(master, partitions, task=_check, app_name="slts-scrub", **options) as run:
        yield run  # type: ignore[misc]
