"""A Spark batch defrag of a container on S3 (the session's SeaweedFS server).

The executors build each run's chunk through their own S3 binding, rebuilt from the
store URL; the credentials reach them as environment variables (never in the URL):
set before the session starts, and passed as ``spark.executorEnv.*`` too, since the
JVM (and so the workers' environment) may already have been started by an earlier
module of this test process.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slts.admin.verify import verify_container
from slts.storage.batch_defrag import Executor
from tests.support.s3server import SeaweedServer

from .conftest import MASTER, defrag_with, fragment, mismatched, open_owner, require_spark

SEGMENTS, PIECES = 300, 4


@pytest.fixture(scope="module")
def s3_url(s3_server: SeaweedServer) -> Iterator[str]:
    """A new bucket's URL; the credentials in the environment for the module."""
    with pytest.MonkeyPatch.context() as patch:
        for variable, value in s3_server.credentials().items():
            patch.setenv(variable, value)
        yield f"s3://{s3_server.new_bucket('spark')}/chunks?endpoint_url={s3_server.endpoint_url}"


@pytest.fixture(scope="module")
def spark(s3_url: str, s3_server: SeaweedServer) -> Iterator[Executor]:
    require_spark()
    from slts.tools.spark_defrag import spark_executor

    conf = {f"spark.executorEnv.{variable}": value for variable, value in s3_server.credentials().items()}
    with spark_executor(MASTER, conf=conf) as executor:
        yield executor


def test_segments_on_s3_merge_byte_identical(tmp_path, s3_url: str, spark: Executor) -> None:
    metadata = str(tmp_path / "metadata")
    names = [f"stream/{i:04d}/0" for i in range(SEGMENTS)]
    written = fragment(s3_url, metadata, names, PIECES)

    report = defrag_with(spark, s3_url, metadata)
    assert report.errors == [] and report.runs_failed == report.runs_dropped == 0, report
    assert report.segments_scanned == report.runs_committed == SEGMENTS
    assert report.chunks_before == SEGMENTS * PIECES and report.chunks_after == 2 * SEGMENTS
    assert report.bytes_native + report.bytes_copied == written.mergeable_bytes()

    again = defrag_with(spark, s3_url, metadata)
    assert again.runs_planned == 0 and again.chunks_before == again.chunks_after == report.chunks_after

    # Reads check every chunk's checksum; the replaced chunks wait in the GC queue (GC of
    # them after a batch is tested on the filesystem: on S3 it takes about 20 ms a chunk).
    with open_owner(s3_url, metadata) as owner:
        assert sum(owner.info(name).chunk_count for name in names) == report.chunks_after
        assert mismatched(owner, written.lengths) == []
        assert verify_container(owner).problems == []
