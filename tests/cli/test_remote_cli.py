"""``slts remote``: copy a Kafka partition folder, list, fetch, retention; ``--json``;
documented exit codes and one-line errors for bad input."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from slts.tools import cli
from slts.tools.kafka_logs import build_log, decode_records, leader_epoch_checkpoint_bytes, write_log_dir


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def partition(tmp_path: Path) -> tuple[Path, list]:
    """``clicks-2``: three segments of 50 batches; the last one is the active segment."""
    folder = tmp_path / "clicks-2"
    records, base = [], 0
    for index in range(3):
        log = build_log(base, 50, leader_epochs=[(0, base)], seed=index)
        write_log_dir(folder, log)
        records += log.records
        base = log.end_offset + 1
    (folder / "leader-epoch-checkpoint").write_bytes(leader_epoch_checkpoint_bytes([(0, 0)]))
    return folder, records


def test_copy_ls_fetch_retention(
    tmp_path: Path, partition: tuple[Path, list], capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    folder, records = partition
    store = ["--store", str(tmp_path / "store")]
    code, out, err = run(capsys, "remote", "copy", str(folder), "--json", *store)
    assert code == 0, err
    copied = json.loads(out)
    assert copied["partition"] == "clicks-2" and len(copied["copied"]) == 2 and copied["skipped"] == 0
    code, out, _ = run(capsys, "remote", "copy", str(folder), *store)
    assert code == 0 and "copied 0 segment(s), skipped 2" in out

    code, out, _ = run(capsys, "remote", "ls", "clicks-2", "--json", *store)
    listing = json.loads(out)
    assert [s["start_offset"] for s in listing["segments"]] == [0, 150]
    assert listing["earliest"] == 0 and listing["highest"] == 299
    assert {s["state"] for s in listing["segments"]} == {"COPY_SEGMENT_FINISHED"}
    code, out, _ = run(capsys, "remote", "ls", "clicks-2", "--from", "200", *store)
    assert code == 0 and len(out.strip().splitlines()) == 1

    code, out, _ = run(capsys, "remote", "fetch", "clicks-2", "160", "--max-bytes", "1", "--json", *store)
    fetched = json.loads(out)
    assert fetched["batches"][0]["base_offset"] <= 160 <= fetched["batches"][0]["last_offset"]
    assert fetched["next_offset"] == fetched["batches"][-1]["last_offset"] + 1
    stdout = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(stdout))
    assert cli.main(["remote", "fetch", "clicks-2", "0", "--max-bytes", "100000000", *store]) == 0
    sys.stdout.flush()
    assert decode_records(stdout.getvalue()) == records[:300], "raw batches, decoded by kafka-python"
    monkeypatch.undo()

    active = (folder / f"{300:020d}.log").stat().st_size  # retention.bytes covers the local log too
    limit = listing["segments"][1]["size_bytes"] + active
    code, out, _ = run(
        capsys, "remote", "retention", str(folder), "--retention-bytes", str(limit), "--json", *store
    )
    report = json.loads(out)
    assert code == 0 and [s["start_offset"] for s in report["deleted"]] == [0]
    assert report["log_start_offset"] == 150


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["remote", "ls", "no-partition-number"], 5, "TOPIC-PARTITION"),
        (["remote", "fetch", "clicks-2", "5"], 5, "outside the remote log"),
        (["remote", "copy", "/missing/clicks-2"], 5, "cannot list"),
    ],
)
def test_bad_input_is_one_line_and_a_documented_code(
    tmp_path: Path, argv: list[str], code: int, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--store", str(tmp_path / "store")]
    assert cli.main(["put", "x", "/dev/null", *store]) == 0  # a store to look at
    result, _, err = run(capsys, *argv, *store)
    assert result == code and says in err and len(err.strip().splitlines()) == 1, err


def test_a_folder_right_after_a_roll_copies_its_rolled_segments(
    tmp_path: Path, partition: tuple[Path, list], capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty active segment (the broker just rolled) is never copied and fails nothing:
    the three full segments are rolled now and all of them are copied."""
    folder, _ = partition
    for suffix in (".log", ".index", ".timeindex"):
        (folder / f"{450:020d}{suffix}").write_bytes(b"")
    code, out, err = run(capsys, "remote", "copy", str(folder), "--json", "--store", str(tmp_path / "store"))
    assert code == 0, err
    assert [s["start_offset"] for s in json.loads(out)["copied"]] == [0, 150, 300]
