"""``slts bench`` runs and reports the documented JSON shape (no timing is asserted)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from slts.tools import cli, command_line


def test_bench_quick_json_shape(tmp_path, capsys) -> None:
    out_file = tmp_path / "bench.json"
    only = ["write_4k", "concat_10", "defrag", "gc"]
    code = cli.main(
        ["bench", "--quick", "--only", *only, "--dir", str(tmp_path), "--json-file", str(out_file), "--json"]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out_file.read_text())
    names = [figure["name"] for figure in printed["figures"]]
    assert names == only and printed["failures"] == []
    for figure in printed["figures"]:
        assert figure["subject_min"] <= figure["subject_median"] <= figure["subject_max"]
        assert figure["baseline_min"] <= figure["baseline_median"] <= figure["baseline_max"]
        assert 0 < figure["pair_ratio_min"] <= figure["pair_ratio_max"]
        assert (
            figure["ratio"] > 0
            and figure["repetitions"] == 3
            and figure["unit"] in ("writes/s", "ops/s", "MB/s", "chunks/s")
        )
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"], "scratch folders are removed"


def test_bench_rejects_unknown_names(capsys) -> None:
    assert cli.main(["bench", "--only", "nope"]) == command_line.EXIT_INVALID


def test_bench_rejects_a_scratch_folder_that_does_not_exist(tmp_path, capsys) -> None:
    """Refused before any benchmark runs (it once ran each one into a FileNotFoundError)."""
    missing = tmp_path / "missing"
    assert (
        cli.main(["bench", "--quick", "--only", "read_seq", "--dir", str(missing)])
        == command_line.EXIT_INVALID
    )
    err = capsys.readouterr().err
    assert "not an existing folder" in err and "Traceback" not in err and not missing.exists()


def test_bench_remote_suite_runs_quick(tmp_path, capsys) -> None:
    """The tiered-log benchmarks build genuine Kafka logs, copy and fetch them, and clean up."""
    only = ["remote_copy", "remote_fetch_first"]
    code = cli.main(["bench", "--quick", "--only", *only, "--dir", str(tmp_path), "--json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)["figures"]
    assert [(f["name"], f["unit"]) for f in figures] == [
        ("remote_copy", "MB/s"),
        ("remote_fetch_first", "fetches/s"),
    ]
    assert all(f["subject_median"] > 0 and f["baseline_median"] > 0 for f in figures)
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"


def test_bench_inspect_rss_runs_quick(tmp_path, capsys) -> None:
    """The inspection's memory figure: two child processes' peak RSS, scratch removed."""
    code = cli.main(["bench", "--quick", "--only", "remote_inspect_rss", "--dir", str(tmp_path), "--json"])
    assert code == 0
    (figure,) = json.loads(capsys.readouterr().out)["figures"]
    assert figure["name"] == "remote_inspect_rss" and figure["unit"] == "MB (lower)"
    assert figure["subject_median"] > 0 and figure["baseline_median"] > 0
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"


def test_bench_offload_suite_runs_quick(tmp_path, capsys) -> None:
    """The offload benchmarks offload, stream and read back ledgers, and clean up."""
    only = ["offload_write_64k", "offload_read_64k", "offload_stream_1k", "offload_stream_1k_floor"]
    code = cli.main(["bench", "--quick", "--only", *only, "--dir", str(tmp_path), "--json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)["figures"]
    assert [(f["name"], f["unit"]) for f in figures] == [
        ("offload_write_64k", "MB/s"),
        ("offload_read_64k", "MB/s"),
        ("offload_stream_1k", "entries/s"),
        ("offload_stream_1k_floor", "entries/s"),
    ]
    assert all(f["subject_median"] > 0 and f["baseline_median"] > 0 for f in figures)
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"


def test_bench_limiter_suite_runs_quick(tmp_path, capsys) -> None:
    """Tail writes beside a limited defrag and scrub, against the same writes alone."""
    code = cli.main(["bench", "--quick", "--only", "limiter_tail", "--dir", str(tmp_path), "--json"])
    assert code == 0
    captured = capsys.readouterr()
    (figure,) = json.loads(captured.out)["figures"]
    assert figure["name"] == "limiter_tail" and figure["unit"] == "writes/s"
    assert figure["subject_median"] > 0 and figure["baseline_median"] > 0
    assert "limiter_tail: limits 10 and 5 MB/s" in captured.err and "without limits" in captured.err
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"


def test_a_failing_benchmark_is_reported_and_the_run_goes_on(tmp_path, capsys, monkeypatch) -> None:
    """A benchmark that raises mid-measure is reported in the JSON and the table; the
    benchmarks after it still run, its teardown ran, and the exit code says it failed."""
    from slts.tools import bench
    from slts.tools.benchmarks.base import Benchmark, Folder

    torn_down = []

    def broken(parent: str, quick: bool):
        folder = Folder(parent)

        def subject() -> float:
            raise RuntimeError("the subject broke")

        try:
            yield "broken work", subject, lambda: 1.0, 1.0, "ops/s"
        finally:
            folder.close()
            torn_down.append(True)

    monkeypatch.setitem(bench.BENCHMARKS, "broken", Benchmark("broken", "raises", broken))
    out_file = tmp_path / "bench.json"
    code = cli.main(
        [
            "bench",
            "--quick",
            "--only",
            "broken",
            "concat_10",
            "--dir",
            str(tmp_path),
            "--json-file",
            str(out_file),
        ]
    )
    assert code == command_line.EXIT_ERROR
    assert "broken            FAILED: RuntimeError: the subject broke" in capsys.readouterr().out
    document = json.loads(out_file.read_text())
    assert [figure["name"] for figure in document["figures"]] == ["concat_10"]
    [failure] = document["failures"]
    assert failure["name"] == "broken" and failure["error"] == "RuntimeError: the subject broke"
    assert "the subject broke" in failure["detail"] and "Traceback" in failure["detail"]
    assert torn_down == [True]
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"], "scratch folders are removed"


def test_bench_transforms_suite_runs_quick(tmp_path, capsys) -> None:
    """The transforms figures run, and the two that count bytes (not time) say what the
    design promises: zstd keeps at most 0.35 of JSON-like values, and a defrag of encrypted
    chunks moves every byte natively."""
    only = ["encrypt_write_1m", "encrypt_read_random_4k", "zstd_json", "encrypt_defrag_native"]
    code = cli.main(["bench", "--quick", "--only", *only, "--dir", str(tmp_path), "--json"])
    assert code == 0
    figures = {f["name"]: f for f in json.loads(capsys.readouterr().out)["figures"]}
    assert set(figures) == set(only)
    assert 0 < figures["zstd_json"]["ratio"] <= 0.35
    assert figures["encrypt_defrag_native"]["ratio"] == 1.0
    assert all(f["subject_median"] > 0 and f["baseline_median"] > 0 for f in figures.values())
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"


def test_each_benchmark_is_measured_on_a_settled_machine(tmp_path, monkeypatch) -> None:
    """Its setup first, then ``settle`` (earlier work's writeback and garbage paid
    outside the measurement), then the alternating repetitions."""
    from slts.tools import bench
    from slts.tools.benchmarks.base import Benchmark

    events: list[str] = []

    def ordered(parent: str, quick: bool):
        events.append("setup")
        yield (
            "ordered work",
            lambda: events.append("subject") or 1.0,
            lambda: events.append("baseline") or 1.0,
            1.0,
            "ops/s",
        )

    monkeypatch.setattr(bench, "settle", lambda: events.append("settle"))
    figure = bench.measure(Benchmark("ordered", "records its order", ordered), str(tmp_path), True, 2)
    assert events == ["setup", "settle", "subject", "baseline", "subject", "baseline"]
    assert figure.ratio == 1.0


def test_the_ratio_of_each_alternated_pair_bounds_how_far_the_run_moved(tmp_path, monkeypatch) -> None:
    """``pair_ratio_min``/``max``: subject/baseline of each pair of repetitions (here
    8/4, 4/4, 2/4), in the JSON and in the table's ``(pairs)`` column; a report written
    before they existed reads back with None, shown as ``-``."""
    from slts.tools import bench, bench_report
    from slts.tools.benchmarks import goals
    from slts.tools.benchmarks.base import Benchmark

    subject_seconds = iter([1.0, 2.0, 4.0])

    def paired(parent: str, quick: bool):
        yield ("pairs", lambda: next(subject_seconds), lambda: 2.0, 8.0, "ops/s")

    monkeypatch.setattr(bench, "settle", lambda: None)
    figure = bench.measure(Benchmark("paired", "known rates", paired), str(tmp_path), True, 3)
    assert (figure.ratio, figure.pair_ratio_min, figure.pair_ratio_max) == (1.0, 0.5, 2.0)
    row = bench_report.table_row(figure, goals.Verdict.NO_GOAL)
    assert "(0.50-2.00)" in row and row.endswith(" -")

    document = json.loads(bench_report.to_json(bench_report.Report([figure], [])))
    assert document["figures"][0]["pair_ratio_min"] == 0.5
    for key in ("pair_ratio_min", "pair_ratio_max"):
        del document["figures"][0][key]
    (older,) = bench_report.from_json(json.dumps(document)).figures
    assert older.pair_ratio_min is None and older.pair_ratio_max is None and older.ratio == 1.0
    assert bench_report.table_row(older, goals.Verdict.NO_GOAL).endswith("1.00           - -")


def test_the_write_floors_make_what_they_claim_durable(tmp_path) -> None:
    """``write_4k_x8_floor`` commits each write's two records to LMDB and
    ``write_4k_x8_floor_two_flushes`` appends them to its one log; both after the same
    appends as their baseline (no timing asserted: what each run leaves is)."""
    from slts.tools.benchmarks import concurrency

    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.schema import CHUNKS, SEGMENTS, TABLES

    count, writers = 100, concurrency.WRITERS  # --quick
    protocol = concurrency.commit_protocol_floor(str(tmp_path), True)
    _, subject, baseline, work, unit = next(protocol)
    assert (work, unit) == (writers * count, "writes/s")
    subject()
    baseline()
    (folder,) = tmp_path.iterdir()
    for i in range(writers):
        assert os.path.getsize(folder / "floor1" / f"f{i}") == count * 4096
        assert os.path.getsize(folder / "raw1" / f"f{i}") == count * 4096
    reader = LmdbMetadataStore(str(folder / "metadata"), TABLES)
    try:
        for i in range(writers):
            for table, key in ((SEGMENTS, f"floor1/s{i}"), (CHUNKS, f"floor1/c{i}")):
                record = reader.get(table, key.encode())
                assert record is not None and len(record.value) == 150, (table, key)
    finally:
        reader.close()
    protocol.close()
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"

    logged = concurrency.two_flush_floor(str(tmp_path), True)
    _, subject, _, _, _ = next(logged)
    subject()
    (folder,) = tmp_path.iterdir()
    record_bytes = len(b"floor1/s0") + len(b"floor1/c0") + 2 * 150
    assert os.path.getsize(folder / "log" / "layout.log") == writers * count * record_bytes
    logged.close()
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"


def test_the_interpreter_ceiling_runs_the_engine_in_memory_and_the_appenders_on_disk(
    tmp_path, monkeypatch
) -> None:
    """``write_4k_x8_ceiling``: its subject writes through the engine into a folder of the
    memory file system (every write readable afterwards), its baseline appends on the
    disk under test; both folders go afterwards. Without a memory file system the row
    says so (``InvalidConfig``) and leaves nothing behind (no timing asserted)."""
    from slts.tools.benchmarks import concurrency

    from slts.errors import InvalidConfig
    from slts.storage import factory

    memory, disk = tmp_path / "memory", tmp_path / "disk"
    memory.mkdir()
    disk.mkdir()
    monkeypatch.setattr(concurrency, "MEMORY_FOLDER", str(memory))
    opened = []

    def open_and_keep(url, **options):
        opened.append((url, options["metadata"]))
        return factory.open(url, **options)

    monkeypatch.setattr(concurrency, "open_storage", open_and_keep)
    count, writers = 100, concurrency.WRITERS  # --quick
    ceiling = concurrency.interpreter_ceiling(str(disk), True)
    _, subject, baseline, work, unit = next(ceiling)
    assert (work, unit) == (writers * count, "writes/s")
    assert subject() > 0 and baseline() > 0
    ((url, metadata),) = opened
    assert url.startswith(f"file://{memory}/") and metadata.startswith(f"{memory}/")
    (engine,) = memory.iterdir()
    (raw,) = disk.iterdir()
    assert sorted(p.name for p in raw.iterdir()) == ["raw"]
    for i in range(writers):
        assert os.path.getsize(raw / "raw" / f"f1-{i}") == count * 4096
    storage = factory.open(url, metadata=metadata, read_only=True)
    try:
        for i in range(writers):
            assert storage.info(f"w1/{i}").length == count * 4096
    finally:
        storage.close()
    ceiling.close()
    assert list(memory.iterdir()) == [] and list(disk.iterdir()) == [], "scratch folders are removed"
    assert not engine.exists()

    monkeypatch.setattr(concurrency, "MEMORY_FOLDER", str(tmp_path / "absent"))
    with pytest.raises(InvalidConfig, match="no writable memory file system"):
        concurrency.interpreter_ceiling(str(disk), True)
    assert list(disk.iterdir()) == []


def test_the_one_thread_floor_appends_and_syncs_every_file(tmp_path) -> None:
    """``write_4k_x8_floor_one_thread``: its one thread leaves each of the 8 files as long
    as a raw appender's (every append made, every sync of a round issued together);
    the scratch folder goes afterwards (no timing asserted)."""
    from slts.tools.benchmarks import concurrency

    count, writers = 100, concurrency.WRITERS  # --quick
    floor = concurrency.one_thread_floor(str(tmp_path), True)
    _, subject, baseline, work, unit = next(floor)
    assert (work, unit) == (writers * count, "writes/s")
    assert subject() > 0 and baseline() > 0
    (folder,) = tmp_path.iterdir()
    for i in range(writers):
        assert os.path.getsize(folder / "floor1" / f"f{i}") == count * 4096
        assert os.path.getsize(folder / "raw1" / f"f{i}") == count * 4096
    floor.close()
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"


def test_the_cold_write_row_pauses_only_its_subject_and_cleans_up(tmp_path, monkeypatch) -> None:
    """``write_4k_cold``: both workloads write through one engine in the memory folder
    (every write readable), return a CPU time per write, and only the subject sleeps
    ``PAUSE_S`` after each write; the folder goes afterwards (no timing asserted)."""
    from slts.tools.benchmarks import concurrency

    from slts.errors import InvalidConfig
    from slts.storage import factory

    monkeypatch.setattr(concurrency, "MEMORY_FOLDER", str(tmp_path))
    opened = []

    def open_and_keep(url, **options):
        opened.append((url, options["metadata"]))
        return factory.open(url, **options)

    pauses = []
    monkeypatch.setattr(concurrency, "open_storage", open_and_keep)
    monkeypatch.setattr(concurrency.time, "sleep", pauses.append)
    row = concurrency.interpreter_cold(str(tmp_path), True)
    _, subject, baseline, work, unit = next(row)
    assert (work, unit) == (1.0, "us CPU/write")
    assert subject() > 0
    assert pauses == [concurrency.PAUSE_S] * 300
    assert baseline() > 0
    assert len(pauses) == 300, "the baseline writes back to back"
    ((url, metadata),) = opened
    (folder,) = tmp_path.iterdir()
    storage = factory.open(url, metadata=metadata, read_only=True)
    try:
        assert [storage.info(name).length for name in ("cold1", "cold2")] == [300 * 4096] * 2
    finally:
        storage.close()
    row.close()
    assert not folder.exists(), "the scratch folder is removed"

    monkeypatch.setattr(concurrency, "MEMORY_FOLDER", str(tmp_path / "absent"))
    with pytest.raises(InvalidConfig, match="no writable memory file system"):
        next(concurrency.interpreter_cold(str(tmp_path), True))


def test_the_concat_floor_times_a_commit_after_its_source_s_writes(tmp_path, monkeypatch) -> None:
    """``concat_100k_floor`` writes a source's records (a chunk record and an index entry
    a chunk) before the commit it times, its subject 10,000 chunks with ``--quick``, its
    baseline 10; the commit's four records land (no timing asserted)."""
    import lmdb
    from slts.tools import bench
    from slts.tools.benchmarks.base import Folder

    kept: list[Folder] = []

    class KeptFolder(Folder):
        """Closed by the test, once it has read the environment the benchmark closed."""

        def close(self) -> None:
            kept.append(self)

    monkeypatch.setattr(bench, "Folder", KeptFolder)
    floor = bench._concat_floor(str(tmp_path), True)
    _, subject, baseline, work, unit = next(floor)
    assert (work, unit) == (1.0, "ops/s")
    assert subject() > 0 and baseline() > 0
    floor.close()
    (folder,) = kept
    reader = lmdb.open(folder.sub("lmdb"), readonly=True, max_dbs=4)
    try:
        with reader.begin() as txn:
            counts = {
                name: txn.stat(reader.open_db(name, txn=txn, create=False))["entries"]
                for name in (b"segments", b"chunks", b"index")
            }
    finally:
        reader.close()
    assert counts == {b"segments": 1, b"chunks": 10_000 + 10 + 1, b"index": 10_000 + 10 + 2}
    Folder.close(folder)
    assert list(tmp_path.iterdir()) == [], "scratch folders are removed"


def test_a_failed_spark_defrag_run_keeps_its_container_and_spark_s_log(tmp_path) -> None:
    """The evidence of a failed ``defrag_spark`` run leaves the scratch folder (removed
    with the benchmark) for a folder of the bench's ``--dir``."""
    from slts.tools.benchmarks.spark import _keep_evidence

    scratch = tmp_path / "scratch"
    (scratch / "run-3" / "chunks").mkdir(parents=True)
    (scratch / "run-3" / "chunks" / "c").write_bytes(b"chunk")
    (scratch / "spark.log").write_text("executor lost")
    kept = Path(_keep_evidence(str(scratch / "run-3"), str(scratch / "spark.log"), str(tmp_path)))
    assert kept.parent == tmp_path and kept.name.startswith("defrag_spark-failed-")
    assert (kept / "container" / "chunks" / "c").read_bytes() == b"chunk"
    assert (kept / "spark.log").read_text() == "executor lost"
    assert not (scratch / "run-3").exists()


def test_a_benchmark_leaves_no_memory_store_behind(tmp_path, monkeypatch) -> None:
    """The ``memory://`` stores a benchmark opens are discarded once it is measured, even
    when its teardown forgets them; a store opened before the benchmark is kept."""
    from slts.bindings import discard_memory, from_url, memory_urls
    from slts.tools import bench
    from slts.tools.benchmarks.base import Benchmark

    kept = f"memory://bench-test-kept-{tmp_path.name}"
    from_url(kept)
    opened = f"memory://bench-test-opened-{tmp_path.name}"

    def leaves_a_store(parent: str, quick: bool):
        from_url(opened).create("chunk", b"x")
        yield ("a store", lambda: 1.0, lambda: 1.0, 1.0, "ops/s")

    monkeypatch.setattr(bench, "settle", lambda: None)
    bench.measure(Benchmark("leaves", "opens a memory store", leaves_a_store), str(tmp_path), True, 1)
    assert opened not in memory_urls()
    assert kept in memory_urls()
    discard_memory(kept)
