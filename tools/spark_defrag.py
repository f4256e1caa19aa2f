"""Defrag batch runs on Spark (DESIGN.md §8): the Spark executor of ``run_batch``.

The plan, the GC intents and the commits stay on the driver
(``slts.storage.batch_defrag``). Spark only builds chunks: each batch's tasks are
parallelized over ``partitions`` slices, and every task rebuilds its binding from the
store URL in the executor's Python worker (once per worker; nothing unpicklable
travels). A task that fails is retried by Spark up to ``task_attempts`` times:
* in local mode through the master string ``local[N,attempts]``;
* elsewhere through ``spark.task.maxFailures``.
Retries are safe because a task is idempotent (fixed chunk name, atomic create, reuse).
On its last attempt a task returns its error instead of raising. That run then fails
alone (its leftovers are collected by GC), not the whole batch.

``spark_defrag(url, metadata, ...)`` is the whole job for library callers; the CLI
(``slts defrag --all --spark``) and the demo use it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from slts.config import StorageConfig
from slts.errors import InvalidConfig, SltsError
from slts.storage.batch_defrag import BatchReport, Executor, Outcome, RunTask, defrag_store, execute

TASK_ATTEMPTS_DEFAULT = 4
T = TypeVar("T")
R = TypeVar("R")
_LOCAL = re.compile(r"local\[(?P<threads>\*|[0-9]+)\]")


def _master_with_attempts(master: str, attempts: int) -> str:
    """``local[N]`` becomes ``local[N,attempts]`` (local mode retries tasks only so)."""
    match = _LOCAL.fullmatch(master)
    return f"local[{match['threads']},{attempts}]" if match else master


def run_attempt(work: Callable[[T], R], item: tuple[int, T], attempts: int) -> tuple[int, R | SltsError]:
    """One task in an executor: ``work``'s result, or on the last attempt its error (Spark
    retries the earlier attempts)."""
    from pyspark import TaskContext

    index, task = item
    try:
        return index, work(task)
    except SltsError as exc:
        context = TaskContext.get()
        if context is not None and context.attemptNumber() + 1 < attempts:
            raise  # Spark retries the task
        return index, exc


def _build(item: tuple[int, RunTask], attempts: int) -> tuple[int, Outcome]:
    """One defrag task: the built chunk, or on the last attempt its error."""
    return run_attempt(execute, item, attempts)


def spark_unavailable() -> str | None:
    """Why Spark cannot run here (PySpark or a Java runtime is missing), or None."""
    if importlib.util.find_spec("pyspark") is None:
        return "PySpark is not installed: pip install 'slts[spark]'"
    java_home = os.environ.get("JAVA_HOME", "")
    if not (java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK)) and not shutil.which(
        "java"
    ):
        return "Spark needs a Java runtime (17 or newer): none on PATH and no JAVA_HOME"
    return None


@contextlib.contextmanager
def spark_executor(
    master: str = "local[*]",
    partitions: int | None = None,
    *,
    task_attempts: int = TASK_ATTEMPTS_DEFAULT,
    conf: dict[str, str] | None = None,
    task: Callable[[tuple[int, Any], int], tuple[int, Any]] = _build,
    app_name: str = "slts-defrag",
) -> Iterator[Executor]:
    """A Spark session for the ``with`` block, as a ``run_batch`` executor.

    ``partitions``: slices per batch (default 4 x the default parallelism, at most one per
    task). ``conf``: extra Spark settings. ``task`` runs one (index, task) item in an
    executor (default: a defrag build; ``slts.tools.spark_scrub`` passes a chunk check).
    Raises ``InvalidConfig`` if PySpark is missing.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise InvalidConfig("Spark defrag needs PySpark: pip install 'slts[spark]'") from exc
    if task_attempts < 1 or (partitions is not None and partitions < 1):
        raise InvalidConfig(f"task_attempts and partitions must be >= 1, got {task_attempts}, {partitions}")
    # The executors' Python workers must be this interpreter (it has slts installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(_master_with_attempts(master, task_attempts))
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # slts shows its own progress
        .config("spark.task.maxFailures", str(task_attempts))
        # No second copy of a task may still be running once the batch's job ended: the
        # driver then releases the runs that did not commit (``BatchDefrag.release``).
        .config("spark.speculation", "false")
    )
    if (conf or {}).get("spark.speculation", "false").lower() != "false":
        raise InvalidConfig(
            "spark.speculation must stay off: a speculative task could build its chunk after "
            "the driver released the run"
        )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    context = session.sparkContext
    context.setLogLevel("ERROR")

    def run(tasks: Sequence[RunTask]) -> list[Outcome]:
        if not tasks:
            return []
        slices = partitions or 4 * context.defaultParallelism
        rdd = context.parallelize(list(enumerate(tasks)), max(1, min(slices, len(tasks))))
        results = dict(rdd.map(lambda item: task(item, task_attempts)).collect())
        return [results[i] for i in range(len(tasks))]

    try:
        yield run
    finally:
        session.stop()


@contextlib.contextmanager
def spark_quietly(log_path: str, master: str = "local[*]", **options: Any) -> Iterator[Executor]:
    """``spark_executor(master, **options)`` whose JVM, and the Python workers it starts,
    write their output (log4j, JVM warnings) to ``log_path`` (appended) instead of this
    terminal: file descriptors 1 and 2 point there while the session starts, which is
    when the JVM is launched (once per process) and inherits them. Raises what
    ``spark_executor`` raises, and ``OSError`` if ``log_path`` cannot be opened."""
    with contextlib.ExitStack() as stack:
        sys.stdout.flush()
        sys.stderr.flush()
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        saved = (os.dup(1), os.dup(2))
        try:
            os.dup2(log, 1)
            os.dup2(log, 2)
            executor = stack.enter_context(spark_executor(master, **options))
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (*saved, log):
                os.close(fd)
        yield executor


def spark_defrag(
    url: str,
    metadata: str,
    *,
    container_id: int = 0,
    master: str = "local[*]",
    partitions: int | None = None,
    prefix: str = "",
    names: Sequence[str] | None = None,
    config: StorageConfig | None = None,
    progress: Callable[[int], None] | None = None,
    **executor_options: Any,
) -> BatchReport:
    """Defrag the container at ``url`` (metadata in LMDB folder ``metadata``) on Spark,
    beside its live owner. Raises ``Fenced`` if a new owner starts meanwhile."""
    return defrag_store(
        url,
        metadata,
        lambda _: spark_executor(master, partitions, **executor_options),
        container_id=container_id,
        config=config,
        prefix=prefix,
        names=names,
        progress=progress,
    )
