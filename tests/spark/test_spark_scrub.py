"""``slts scrub --spark``: the chunk checks run on Spark executors, the walk on the driver,
and the report (anomalies with segment, chunk and offset; where to resume) is the
in-process scrub's, byte for byte in ``--json``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import slts
from tests.cli.test_scrub import BLOCK, filled, replace_chunk
from tests.support.cli import child_env, slts_command

from .conftest import require_spark


def scrub_json(store: Path, *flags: str) -> tuple[int, dict]:
    result = subprocess.run(
        slts_command("scrub", "--json", "--store", str(store), *flags),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_spark_scrub_finds_what_the_in_process_scrub_finds(tmp_path: Path) -> None:
    require_spark()
    store = tmp_path / "store"
    url, metadata = f"file://{store / 'chunks'}", str(store / "metadata")
    with slts.open(url, metadata=metadata, gc_interval_s=0.0) as storage:
        filled(storage, "a", 3, 2 * BLOCK)
        filled(storage, "b", 4, 5000)
        filled(storage, "c", 2, BLOCK)
        _, (a1_start, a1), _ = storage.chunks("a")
        damaged = bytearray(b"\x01" * (2 * BLOCK))
        damaged[BLOCK + 3] ^= 0x10  # the second block of a's second chunk
        replace_chunk(storage, a1.name, bytes(damaged))
        _, (b1_start, b1), _, _ = storage.chunks("b")
        replace_chunk(storage, b1.name, None)
    local_code, local = scrub_json(store)
    spark_code, spark = scrub_json(store, "--spark", "--master", "local[2]")
    assert local_code == spark_code == 1
    for report in (local, spark):
        report.pop("seconds")
    assert spark == local
    kinds = {(a["segment"], a["offset"], a["kind"]) for a in spark["anomalies"]}
    assert kinds == {("a", a1_start + BLOCK, "checksum"), ("b", b1_start, "missing")}
    assert spark["chunks"] == 9 and spark["bytes_read"] == 3 * 2 * BLOCK + 3 * 5000 + 2 * BLOCK

    # Resumable on Spark as in process: stop after the segment where 3 chunks were reached.
    _, first = scrub_json(store, "--spark", "--master", "local[2]", "--max-chunks", "3")
    assert first["segments"] == 1 and first["next_segment"] == "b"
