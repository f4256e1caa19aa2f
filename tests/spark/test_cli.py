"""``slts defrag --all --spark``: the console script runs the batch on a local Spark of
its own (a new process, its own JVM) and reports the documented JSON document."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from slts.admin.verify import verify_container

from .conftest import file_locations, fragment, mismatched, open_owner, require_spark

SEGMENTS, PIECES = 20, 4
KEYS = {
    "segments_scanned",
    "runs_planned",
    "runs_committed",
    "runs_dropped",
    "runs_failed",
    "chunks_before",
    "chunks_after",
    "bytes_native",
    "bytes_copied",
    "seconds",
    "driver",
}


def test_defrag_all_on_spark_reports_json(tmp_path) -> None:
    require_spark()
    store = tmp_path / "store"
    url, metadata = file_locations(store)  # the CLI's layout of --store FOLDER
    names = [f"cli/{i:03d}" for i in range(SEGMENTS)]
    written = fragment(url, metadata, names, PIECES)
    script = os.path.join(os.path.dirname(sys.executable), "slts")
    result = subprocess.run(
        [script, "defrag", "--all", "--spark", "--master", "local[2]", "--json", "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert set(report) >= KEYS, sorted(KEYS - set(report))
    assert report["driver"] == "spark" and report["segments_scanned"] == SEGMENTS
    assert report["runs_planned"] == report["runs_committed"] == SEGMENTS
    assert report["runs_dropped"] == report["runs_failed"] == 0
    assert (report["chunks_before"], report["chunks_after"]) == (SEGMENTS * PIECES, 2 * SEGMENTS)
    assert report["bytes_native"] == written.mergeable_bytes() and report["bytes_copied"] == 0
    assert isinstance(report["seconds"], float) and report["seconds"] > 0
    with open_owner(url, metadata) as owner:
        assert mismatched(owner, written.lengths) == []
        assert verify_container(owner).problems == []
