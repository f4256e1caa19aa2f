"""``slts offload``: offload a ledger file, list, read back byte for byte, delete; stream
ledger files into a managed ledger with rollover, resume a segment a crash left open;
``--json``; documented exit codes and one-line errors for bad input, which change nothing."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from slts.bindings import from_url
from slts.bindings.faulty import FaultyChunkStorage
from slts.tools import cli

from slts.config import StorageConfig
from slts.errors import StorageUnavailable
from slts.metadata.faulty_store import FaultyMetadataStore
from slts.metadata.schema import SEGMENTS
from slts.offload.ledgers import FileLedger, write_ledger_file
from slts.offload.streaming import StreamingOffloader
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.factory import open_metadata


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def ledger_file(path: Path, count: int, seed: int, largest: int = 2000) -> list[bytes]:
    rng = random.Random(seed)
    entries = [rng.randbytes(rng.randrange(largest)) for _ in range(count)]
    write_ledger_file(path, entries)
    return entries


def test_put_ls_read_delete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries = ledger_file(tmp_path / "l7", 400, seed=7)
    store = ["--store", str(tmp_path / "store")]
    code, out, err = run(
        capsys,
        "offload",
        "put",
        "7",
        str(tmp_path / "l7"),
        "--block-bytes",
        "65536",
        "--meta",
        "k=v",
        "--json",
        *store,
    )
    assert code == 0, err
    attempt = json.loads(out)
    assert attempt["state"] == "COMPLETE" and attempt["entries"] == 400 and attempt["blocks"] > 1
    assert attempt["extra_metadata"] == {"k": "v"}
    uid = attempt["uid"]

    code, out, _ = run(capsys, "offload", "ls", "--json", *store)
    assert code == 0 and [a["uid"] for a in json.loads(out)["attempts"]] == [uid]
    code, out, _ = run(capsys, "offload", "ls", "8", *store)
    assert code == 0 and out.strip() == ""

    code, _, err = run(capsys, "offload", "read", "7", uid, "--out", str(tmp_path / "back"), *store)
    assert code == 0, err
    assert (tmp_path / "back").read_bytes() == (tmp_path / "l7").read_bytes(), "the same ledger file"
    code, out, _ = run(capsys, "offload", "read", "7", uid, "--first", "10", "--last", "19", "--json", *store)
    summary = {"ledger_id": 7, "first": 10, "last": 19, "entries": 10, "bytes": sum(map(len, entries[10:20]))}
    assert json.loads(out) == summary

    code, out, _ = run(capsys, "offload", "delete", "7", uid, *store)
    assert code == 0
    code, out, err = run(capsys, "offload", "read", "7", uid, *store)
    assert code == 3 and "OffloadNotFound" in err
    code, out, _ = run(capsys, "ls", "offload/", *store)
    assert code == 0 and out.strip() == "", "both objects are gone"


def test_stream_rolls_over_reads_across_segments_and_deletes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entries = {lid: ledger_file(tmp_path / f"l{lid}", 150, seed=lid) for lid in (3, 4, 9)}
    store = ["--store", str(tmp_path / "store")]
    files = [f"{lid}={tmp_path / f'l{lid}'}" for lid in entries]
    argv = ["offload", "stream", "ml", *files, "--block-bytes", "8192", "--max-segment-bytes", "100000"]
    code, out, err = run(capsys, *argv, "--json", *store)
    assert code == 0, err
    report = json.loads(out)
    assert report["offered"] == 450 and len(report["closed"]) >= 4
    assert report["closed"][0]["begin"] == [3, 0] and report["closed"][-1]["end"] == [9, 149]
    code, out, _ = run(capsys, "offload", "segments", "ml", "--json", *store)
    segments = json.loads(out)["segments"]
    assert {s["state"] for s in segments} == {"COMPLETE"} and len(segments) == len(report["closed"])

    for lid in entries:
        code, _, err = run(
            capsys,
            "offload",
            "read",
            str(lid),
            "--managed-ledger",
            "ml",
            "--out",
            str(tmp_path / "b"),
            *store,
        )
        assert code == 0, err
        assert (tmp_path / "b").read_bytes() == (tmp_path / f"l{lid}").read_bytes(), lid

    removed: list[str] = []
    for lid in entries:
        code, out, _ = run(capsys, "offload", "delete", str(lid), "--managed-ledger", "ml", "--json", *store)
        assert code == 0
        removed += json.loads(out)["segments_removed"]
    assert sorted(removed) == sorted(s["uid"] for s in segments), "every segment went with its last ledger"
    code, out, _ = run(capsys, "ls", "offload/", *store)
    assert code == 0 and out.strip() == ""


CRASHING_OFFLOAD = """
import os, sys, uuid
import slts
from slts.offload.ledgers import FileLedger
from slts.offload.streaming import OfferResult, StreamingOffloader
store, path = sys.argv[1], sys.argv[2]
storage = slts.open("file://" + os.path.join(store, "chunks"), metadata=os.path.join(store, "metadata"))
handle = StreamingOffloader(storage, "ml", block_bytes=4096).streaming_offload(uuid.uuid4(), {}, 5, 0)
ledger = FileLedger(5, path)
for entry_id, data in enumerate(ledger.read(0, 99)):
    assert handle.offer_entry(5, entry_id, data) == OfferResult.OK
handle.flush()
os._exit(0)  # a crash: the segment stays open, entries 0..99 durable
"""


def assert_ledger_5_reads_back(capsys: pytest.CaptureFixture[str], tmp_path: Path, store: Path) -> None:
    """``offload read`` of managed ledger ``ml``'s ledger 5 gives back the file ``l5``."""
    out = tmp_path / "b"
    argv = ["offload", "read", "5", "--managed-ledger", "ml", "--out", str(out), "--store", str(store)]
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    assert out.read_bytes() == (tmp_path / "l5").read_bytes()


def test_stream_resumes_the_segment_a_crash_left_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger_file(tmp_path / "l5", 300, seed=5, largest=500)
    store = tmp_path / "store"
    (store / "chunks").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(
        [sys.executable, "-c", CRASHING_OFFLOAD, str(store), str(tmp_path / "l5")], check=True, env=env
    )
    code, out, _ = run(capsys, "offload", "segments", "ml", "--json", "--store", str(store))
    (left,) = json.loads(out)["segments"]
    assert left["state"] == "OPEN" and left["end"] == [5, 99]

    code, out, err = run(
        capsys, "offload", "stream", "ml", f"5={tmp_path / 'l5'}", "--json", "--store", str(store)
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["offered"] == 200, "entries 0..99 were durable: skipped, not written twice"
    assert report["closed"] == [{"uid": left["uid"], "begin": [5, 0], "end": [5, 299]}]
    assert_ledger_5_reads_back(capsys, tmp_path, store)


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["offload", "put", "7", "{missing}"], 3, "cannot use"),
        (["offload", "put", "7", "{folder}"], 9, "cannot use"),
        (["offload", "put", "7", "{garbage}"], 5, "truncated entry"),
        (["offload", "put", "7", "{l7}", "--block-bytes", "1000"], 5, "EntryTooLarge"),
        (["offload", "put", "7", "{l7}", "--uid", "not-a-uuid"], 2, "not a UUID"),
        (["offload", "put", "7", "{l7}", "--meta", "novalue"], 2, "KEY=VALUE"),
        (["offload", "stream", "ml", "9={l7}", "8={l7}"], 5, "must increase"),
        (["offload", "stream", "ml", "x={l7}"], 2, "LEDGER_ID=FILE"),
        (["offload", "read", "7"], 5, "exactly one of UID and --managed-ledger"),
        (["offload", "read", "7", str(uuid.UUID(int=1)), "--managed-ledger", "ml"], 5, "exactly one"),
        (["offload", "read", "7", str(uuid.UUID(int=1))], 3, "OffloadNotFound"),
        (["offload", "delete", "7", "--managed-ledger", "ml"], 3, "OffloadNotFound"),
    ],
)
def test_bad_input_is_a_one_line_error_that_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, says: str
) -> None:
    ledger_file(tmp_path / "l7", 50, seed=1, largest=3000)
    (tmp_path / "garbage").write_bytes(b"\x00\x01")
    store = tmp_path / "store"
    assert run(capsys, "offload", "put", "7", str(tmp_path / "l7"), "--store", str(store))[0] == 0
    before = run(capsys, "offload", "ls", "--json", "--store", str(store))[1]
    names = {
        "missing": tmp_path / "missing",
        "folder": tmp_path,
        "garbage": tmp_path / "garbage",
        "l7": tmp_path / "l7",
    }
    filled = [a.format(**names) for a in argv]
    if code == 2:  # argparse: usage error
        with pytest.raises(SystemExit) as exit_info:
            cli.main([*filled, "--store", str(store)])
        assert exit_info.value.code == 2 and says in capsys.readouterr().err
    else:
        got, _, err = run(capsys, *filled, "--store", str(store))
        assert got == code and says in err and len(err.strip().splitlines()) == 1, err
    assert run(capsys, "offload", "ls", "--json", "--store", str(store))[1] == before
    assert run(capsys, "offload", "segments", "ml", "--json", "--store", str(store))[1] == (
        '{"managed_ledger": "ml", "segments": []}\n'
    )


def test_stream_redoes_a_failed_segment_from_its_begin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A segment's second block fails to write, and so does the removal of its data
    object: ``offload segments`` shows it FAILED, ``offload cleanup`` removes its object,
    and ``offload stream`` redoes it from its begin under a new uid before going on."""
    ledger_file(tmp_path / "l5", 300, seed=6, largest=500)
    store = tmp_path / "store"
    (store / "chunks").mkdir(parents=True)
    binding = FaultyChunkStorage(from_url(f"file://{store / 'chunks'}"), seed=0)
    metadata = FaultyMetadataStore(open_metadata(str(store / "metadata")), seed=0)
    storage = ChunkedSegmentStorage(0, None, binding, metadata, StorageConfig(), owns_resources=True)

    def second_block_fails() -> None:
        metadata.fail_nth(1, table=SEGMENTS)  # the removal of the data object that follows
        raise StorageUnavailable("injected write failure", injected=True)

    binding.before(("create", "write"), second_block_fails, nth=2, prefix="0/offload/ml/")
    offloader = StreamingOffloader(storage, "ml", block_bytes=4096, threads=False)
    handle = offloader.streaming_offload(uuid.uuid4(), {}, 5, 0)
    with pytest.raises(StorageUnavailable):
        for entry_id, data in enumerate(FileLedger(5, str(tmp_path / "l5")).read(0, 99)):
            handle.offer_entry(5, entry_id, data)
    storage.close()

    code, out, _ = run(capsys, "offload", "segments", "ml", "--json", "--store", str(store))
    (failed,) = json.loads(out)["segments"]
    assert failed["state"] == "FAILED" and failed["begin"] == [5, 0]
    code, out, _ = run(capsys, "offload", "cleanup", "--json", "--store", str(store))
    assert json.loads(out)["segments"] == [{"managed_ledger": "ml", "uid": failed["uid"]}]
    code, out, _ = run(capsys, "offload", "cleanup", "--json", "--store", str(store))
    assert json.loads(out)["segments"] == []
    code, out, err = run(
        capsys, "offload", "stream", "ml", f"5={tmp_path / 'l5'}", "--json", "--store", str(store)
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["offered"] == 300, "the redo offers every entry from the failed segment's begin"
    (closed,) = report["closed"]
    assert closed["uid"] != failed["uid"] and (closed["begin"], closed["end"]) == ([5, 0], [5, 299])
    code, out, _ = run(capsys, "offload", "segments", "ml", "--json", "--store", str(store))
    assert [s["state"] for s in json.loads(out)["segments"]] == ["COMPLETE"]
    assert_ledger_5_reads_back(capsys, tmp_path, store)
