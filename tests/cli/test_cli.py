"""The ``slts`` CLI: each verb, ``--json`` output, documented exit codes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from slts.tools import cli, command_line


@pytest.fixture
def store(tmp_path) -> list[str]:
    return ["--store", str(tmp_path / "store")]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_put_cat_info_ls(tmp_path, store: list[str], capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    payload = os.urandom(100_000)
    source = tmp_path / "in.bin"
    source.write_bytes(payload)
    code, out, _ = run(capsys, "put", "s/one", str(source), "--write-bytes", "30000", "--json", *store)
    assert code == 0 and json.loads(out) == {"segment": "s/one", "bytes_written": 100_000, "length": 100_000}

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"-tail")))
    code, out, _ = run(capsys, "put", "s/one", "-", *store)
    assert code == 0 and "length 100005" in out

    stdout = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(stdout))
    assert cli.main(["cat", "s/one", *store]) == 0
    sys.stdout.flush()
    assert stdout.getvalue() == payload + b"-tail"
    monkeypatch.undo()

    code, out, _ = run(capsys, "info", "s/one", "--json", *store)
    info = json.loads(out)
    assert code == 0 and info["length"] == 100_005 and info["sealed"] is False and info["chunk_count"] >= 1

    run(capsys, "put", "s/two", str(source), *store)
    code, out, _ = run(capsys, "ls", "s/", *store)
    assert code == 0 and out.split() == ["s/one", "s/two"]
    code, out, _ = run(capsys, "ls", "--json", *store)
    assert [entry["name"] for entry in json.loads(out)] == ["s/one", "s/two"]


def test_cat_range(tmp_path, store: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(b"0123456789")
    run(capsys, "put", "r", str(source), *store)
    result = subprocess.run(
        [sys.executable, "-m", "slts.tools.cli", "cat", "r", "--offset", "3", "--length", "4", *store],
        capture_output=True,
    )
    assert result.returncode == 0 and result.stdout == b"3456"


def test_exit_codes(tmp_path, store: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(b"abc")
    code, _, err = run(capsys, "info", "missing", *store)  # no store yet: a look creates none
    assert code == command_line.EXIT_NOT_FOUND and "StoreNotFound" in err
    run(capsys, "put", "x", str(source), *store)
    assert run(capsys, "info", "missing", *store)[0] == command_line.EXIT_NOT_FOUND
    code, _, err = run(capsys, "info", "../etc", *store)
    assert code == command_line.EXIT_INVALID and "InvalidName" in err
    assert run(capsys, "cat", "x", "--offset", "5", *store)[0] == command_line.EXIT_INVALID
    assert run(capsys, "seal", "x", *store)[0] == 0
    assert run(capsys, "put", "x", str(source), *store)[0] == command_line.EXIT_STATE
    assert run(capsys, "rm", "x", "--json", *store)[0] == 0
    assert run(capsys, "info", "x", *store)[0] == command_line.EXIT_NOT_FOUND
    with pytest.raises(SystemExit) as usage:
        cli.main(["cat"])
    assert usage.value.code == command_line.EXIT_USAGE


def test_console_script_and_demo(tmp_path) -> None:
    from slts.tools.spark_defrag import spark_unavailable

    if (missing := spark_unavailable()) is not None:
        pytest.skip(f"the demo's defrag step runs on Spark: {missing}")
    folder = tmp_path / "demo"
    script = os.path.join(os.path.dirname(sys.executable), "slts")
    result = subprocess.run(
        [script, "demo", "--dir", str(folder), "--segments", "4", "--writes", "10", "--json"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "Spark's output goes to the demo folder's spark.log, not the terminal"
    report = json.loads(result.stdout)
    assert report["verified"] is True and report["mismatched"] == []
    # 1: ingest; 2-4: failovers (4 stays: the live owner); 5: verify; 6: after the restore.
    assert report["writes"] == 40 and report["epochs"] == [1, 2, 3, 4, 5, 6]
    assert report["transactions"] == 2 * 8 and report["truncated"] == 1
    # The Spark defrag, beside the live owner: every stream's runs merged, nothing failed,
    # and the owner kept its epoch and wrote on afterwards.
    assert report["defrag_driver"] == "spark" and report["defrag_master"] == "local[2]"
    assert report["chunks_after_defrag"] < report["chunks_before_defrag"]
    assert report["defrag_runs"] == 4 and report["defrag_runs_dropped"] == report["defrag_runs_failed"] == 0
    assert (
        report["defrag_bytes_native"] > 0 and report["defrag_bytes_copied"] == 0
    )  # filesystem: copy_file_range
    assert report["defrag_s"] > 0 and report["spark_start_s"] > 0
    assert report["owner_epoch_after_defrag"] == 4 and report["writes_after_defrag"] == 4
    assert report["gc_chunks_deleted"] > 0 and report["problems"] == []
    # slts cost's figures around the defrag: fewer chunks to read, more requests recorded.
    before, after = report["cost_before_defrag"], report["cost_after_defrag"]
    assert before["chunks"] == report["chunks_before_defrag"] and after["chunks"] < before["chunks"]
    assert after["requests"] > before["requests"] > 0 and after["requests_cost"] > before["requests_cost"]
    assert report["snapshot_entries"] > 0 and report["restore_sequence"] >= report["snapshot_sequence"]
    assert not folder.exists(), "the demo folder is removed unless --keep"


def test_demo_refuses_a_foreign_folder(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    code, _, _ = run(capsys, "demo", "--dir", str(tmp_path), "--segments", "1", "--writes", "1")
    assert code == command_line.EXIT_INVALID and (tmp_path / "precious.txt").exists()


def test_concat_truncate_defrag_gc(tmp_path, store: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.bin"
    for i in range(4):
        source.write_bytes(bytes([65 + i]) * 10)
        run(capsys, "put", f"txn{i}", str(source), *store)
        assert run(capsys, "seal", f"txn{i}", *store)[0] == 0
    run(capsys, "put", "main", str(source), *store)
    for i in range(4):
        code, out, _ = run(capsys, "concat", "main", f"txn{i}", "--json", *store)
        assert code == 0 and json.loads(out)["length"] == 10 * (i + 2)
    assert run(capsys, "concat", "main", "missing", *store)[0] == command_line.EXIT_NOT_FOUND
    code, out, _ = run(capsys, "truncate", "main", "15", "--json", *store)
    assert code == 0 and json.loads(out)["start_offset"] == 15
    code, out, _ = run(capsys, "defrag", "main", "--json", *store)
    assert code == 0 and json.loads(out)["segments"] == 1
    code, out, _ = run(capsys, "defrag", "--all", "--json", *store)
    assert code == 0 and json.loads(out)["runs_dropped"] == 0
    assert run(capsys, "defrag", *store)[0] == command_line.EXIT_INVALID
    code, out, _ = run(capsys, "gc", "--json", *store)
    assert code == 0 and json.loads(out)["errors"] == 0
    result = subprocess.run(
        [sys.executable, "-m", "slts.tools.cli", "cat", "main", *store], capture_output=True
    )
    assert result.stdout == (b"D" * 10 + b"A" * 10 + b"B" * 10 + b"C" * 10 + b"D" * 10)[15:]


def test_verify_and_orphans(tmp_path, store: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(b"payload")
    run(capsys, "put", "v", str(source), *store)
    code, out, _ = run(capsys, "verify", "--json", *store)
    assert code == 0 and json.loads(out) == {
        "segments": 1,
        "problems": [],
        "copy_sequence": json.loads(out)["copy_sequence"],
        "leaks": {"index_entries": 0, "chunk_records": 0, "gc_entries": 0},
    }
    assert json.loads(out)["copy_sequence"] > 0
    leaked = tmp_path / "store" / "chunks" / "0%" / "v%" / "E1.O7.0123456789abcdef0123456789abcdef"
    leaked.write_bytes(b"nobody references me")
    code, out, _ = run(capsys, "verify", "--json", *store)
    assert code == command_line.EXIT_ERROR and "leak" in json.loads(out)["problems"][0]
    run(capsys, "seal", "v", *store)  # a newer epoch owns the container: epoch 1's leftovers are orphans
    code, out, _ = run(capsys, "gc", "--orphans", "--dry-run", "--json", *store)
    assert code == 0 and len(json.loads(out)["orphans"]) == 1 and leaked.exists()
    assert run(capsys, "gc", "--dry-run", *store)[0] == command_line.EXIT_INVALID
    assert run(capsys, "gc", "--orphans", *store)[0] == 0
    assert leaked.exists(), "queued orphans wait gc_delay_s like any garbage"


def test_export_import(tmp_path, store: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(b"exported bytes")
    run(capsys, "put", "e", str(source), *store)
    backup = tmp_path / "e.slts"
    assert run(capsys, "export", "e", str(backup), *store)[0] == 0
    assert run(capsys, "import", str(backup), *store)[0] == command_line.EXIT_EXISTS
    code, out, _ = run(capsys, "export", "e", "--format", "rolling", "--json", *store)
    assert code == 0 and json.loads(out)["header"] == "e$header"
    assert run(capsys, "rm", "e", *store)[0] == 0
    code, out, _ = run(capsys, "import", "--format", "rolling", "--name", "e", "--json", *store)
    assert code == command_line.EXIT_INVALID, "the chunks still belong to the deleted segment until GC"
    assert run(capsys, "import", "--format", "rolling", *store)[0] == command_line.EXIT_INVALID


def test_snapshot_restore_journal_show(
    tmp_path, store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.bin"
    payloads = {f"dr/{i}": os.urandom(5000 + i) for i in range(5)}
    for name, payload in payloads.items():
        source.write_bytes(payload)
        assert run(capsys, "put", name, str(source), "--write-bytes", "1000", *store)[0] == 0
    code, out, _ = run(capsys, "snapshot", "--json", *store)
    snapshot = json.loads(out)
    assert code == 0 and snapshot["entries"] > 0 and snapshot["durable_sequence"] >= snapshot["sequence"]
    source.write_bytes(b"after the snapshot")
    run(capsys, "put", "dr/0", str(source), *store)
    payloads["dr/0"] += b"after the snapshot"

    code, out, _ = run(capsys, "journal", "show", "--records", "--json", *store)
    shown = json.loads(out)
    assert code == 0 and shown["checkpoint"] and shown["corrupt"] == 0 and shown["record_list"]
    assert shown["layouts"]["_system/metadata-snapshots"]["attrs"]["sequence"] == snapshot["sequence"]

    # The machine is lost: only the chunk storage is left.
    chunks = f"file://{tmp_path / 'store' / 'chunks'}"
    import shutil

    shutil.rmtree(tmp_path / "store" / "metadata")
    restored = str(tmp_path / "restored")
    code, out, _ = run(capsys, "restore", "--from", str(tmp_path / "store"), "--to", restored, "--json")
    report = json.loads(out)
    assert code == 0 and report["snapshot_sequence"] == snapshot["sequence"] and report["log_records"] > 0
    moved = ["--store", chunks, "--metadata", restored]
    for name, payload in payloads.items():
        result = subprocess.run(
            [sys.executable, "-m", "slts.tools.cli", "cat", name, *moved], capture_output=True, check=True
        )
        assert result.stdout == payload
    code, out, _ = run(capsys, "verify", "--json", *moved)
    assert (
        code == 0
        and json.loads(out)["problems"] == []
        and json.loads(out)["copy_sequence"] >= report["sequence"]
    )


def test_restore_and_snapshot_bad_input(
    tmp_path, store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    code, _, err = run(
        capsys, "restore", "--to", str(tmp_path / "target"), *store
    )  # no store: nothing created
    assert code == command_line.EXIT_NOT_FOUND and "StoreNotFound" in err
    assert not (tmp_path / "target").exists() and not (tmp_path / "store").exists()
    (tmp_path / "store" / "chunks").mkdir(parents=True)  # a store with nothing on tier-2 yet
    code, _, err = run(capsys, "restore", "--to", str(occupied), *store)
    assert code == command_line.EXIT_INVALID and "not an empty folder" in err
    assert os.listdir(occupied) == ["keep.txt"]
    empty_target = tmp_path / "fresh"
    code, _, err = run(capsys, "restore", "--to", str(empty_target), *store)  # nothing on tier-2 yet
    assert code == command_line.EXIT_CORRUPT and "no system journal" in err and not empty_target.exists()
    run(capsys, "put", "x", str(occupied / "keep.txt"), *store)
    os.environ["SLTS_JOURNAL"] = "false"
    try:
        code, _, err = run(capsys, "snapshot", *store)
    finally:
        del os.environ["SLTS_JOURNAL"]
    assert code == command_line.EXIT_INVALID and "journal" in err
    with pytest.raises(SystemExit) as exited:  # argparse: a usage error
        cli.main(["journal", "list", *store])
    assert exited.value.code == command_line.EXIT_USAGE


def test_verify_checksums_finds_bit_rot(
    tmp_path, store: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(os.urandom(3000))
    run(capsys, "put", "rot", str(source), *store)
    assert run(capsys, "verify", "--checksums", *store)[0] == 0
    chunk = next(path for path in (tmp_path / "store" / "chunks").rglob("E*") if "rot" in str(path))
    damaged = bytearray(chunk.read_bytes())
    damaged[1234] ^= 0x01  # same length: only the checksum can tell
    chunk.write_bytes(bytes(damaged))
    assert run(capsys, "verify", *store)[0] == 0, "lengths alone cannot see bit rot"
    code, out, _ = run(capsys, "verify", "--checksums", "--json", *store)
    assert code == command_line.EXIT_ERROR and "CRC32C" in json.loads(out)["problems"][0]


def test_demo_without_the_spark_extra_names_it(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    import importlib.util

    from slts.tools import spark_defrag

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real_find_spec(name, *a)
    )
    assert spark_defrag.spark_unavailable() == "PySpark is not installed: pip install 'slts[spark]'"
    folder = tmp_path / "demo"
    code, _, err = run(capsys, "demo", "--dir", str(folder), "--segments", "1", "--writes", "1")
    assert code == command_line.EXIT_INVALID and "pip install 'slts[spark]'" in err and "Traceback" not in err
    assert not folder.exists(), "refused before anything was written"
