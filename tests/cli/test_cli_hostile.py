"""Regression tests: the last hostile inputs of the command line (issue 25), each run
through the installed ``slts`` script in a process of its own: a malformed ``--store``
URL, a file that is not an export given to ``import``, chunk storage that goes away
under a running command, and ``--version``."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slts.tools import cli, command_line

SCRIPT = os.path.join(os.path.dirname(sys.executable), "slts")


def slts(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *argv], input=stdin.decode(), capture_output=True, text=True, timeout=300)


def test_version_prints_the_installed_distribution_version() -> None:
    result = slts("--version")
    assert result.returncode == command_line.EXIT_OK, result.stderr
    assert result.stdout == f"slts {importlib.metadata.version('slts')}\n"
    assert result.stderr == ""


#: Malformed chunk storage URLs, with what the message must name.
MALFORMED_URLS = {
    "ftp://host/x": "unknown chunk storage scheme 'ftp'",
    "s3://": "S3 URL has no bucket",
    "s3:///prefix": "S3 URL has no bucket",
    "s3://bucket?colour=blue": "unknown S3 URL option 'colour'",
    "file://": "file URL has no path",
    "hdfs://": "hdfs URL names no NameNode",
}
#: Every way a command reaches the store: read-only looks, a change, the journal, restore.
COMMANDS = (
    ["ls"],
    ["info", "x"],
    ["cat", "x"],
    ["export", "x", "-"],
    ["verify"],
    ["journal", "show"],
    ["put", "x", "INPUT"],
    ["restore", "--to", "TARGET"],
)


@pytest.mark.parametrize("url", list(MALFORMED_URLS))
def test_a_malformed_store_url_is_invalid_input_before_any_metadata_is_looked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    source = tmp_path / "input"
    source.write_bytes(b"abc")
    metadata = tmp_path / "metadata"  # absent: the URL must be refused first
    for command in COMMANDS:
        argv = [
            str(source) if arg == "INPUT" else str(tmp_path / "target") if arg == "TARGET" else arg
            for arg in command
        ]
        code = cli.main([*argv, "--store", url, "--metadata", str(metadata)])
        err = capsys.readouterr().err
        assert code == command_line.EXIT_INVALID, (command, err)
        assert MALFORMED_URLS[url] in err, (command, err)
        assert len(err.strip().splitlines()) == 1, err
        assert sorted(path.name for path in tmp_path.iterdir()) == ["input"], f"{command} created files"


def container_epoch(folder: Path) -> int:
    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.records import ContainerRecord
    from slts.metadata.schema import CONTAINER, CONTAINER_KEY, TABLES

    with LmdbMetadataStore(str(folder / "metadata"), TABLES, readonly=True) as metadata:
        stored = metadata.get(CONTAINER, CONTAINER_KEY)
        assert stored is not None
        return ContainerRecord.decode(stored.value).epoch


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("random", "bad magic"),
        ("empty", "it is empty"),
        ("truncated", "CRC32C"),
        ("flipped", "CRC32C"),
        ("json", "bad magic"),
    ],
)
def test_importing_a_file_that_is_not_an_export_is_an_input_error(
    tmp_path: Path, kind: str, problem: str
) -> None:
    folder = tmp_path / "store"
    store = ["--store", str(folder)]
    assert slts("put", "live", "-", *store, stdin=b"abc").returncode == 0
    export = tmp_path / "live.export"
    assert slts("export", "live", str(export), *store).returncode == 0
    whole = export.read_bytes()
    contents = {
        "random": os.urandom(300),
        "empty": b"",
        "truncated": whole[: len(whole) // 2],
        "flipped": whole[:-10] + bytes([whole[-10] ^ 0x40]) + whole[-9:],
        "json": b'{"segment": "live", "chunks": []}\n',
    }[kind]
    bad = tmp_path / f"{kind}.input"
    bad.write_bytes(contents)
    before = container_epoch(folder)
    result = slts("import", str(bad), "--name", "copy", *store)
    assert result.returncode == command_line.EXIT_INVALID, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert str(bad) in result.stderr and problem in result.stderr, result.stderr
    assert "restore" not in result.stderr, "a bad input file sent the operator to restore a healthy store"
    assert container_epoch(folder) == before, "the store was opened (and its owner fenced) for nothing"
    assert slts("ls", *store).stdout.split() == ["live"]


def test_chunk_storage_going_away_under_put_is_one_line_per_failure(tmp_path: Path) -> None:
    """The chunk folder is replaced by a file while ``put`` waits for its input: the write
    fails, and so does the metadata copy's final flush on close (the background flusher is
    off, so the commits of the open are still to ship): one log line for the flush, one
    line for the command's error, no traceback."""
    folder = tmp_path / "store"
    argv = [SCRIPT, "put", "s", "-", "--store", str(folder), "--log-level", "info"]
    argv += ["--set", "metadata_log_flush_interval_s=0"]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdin is not None and child.stderr is not None
    first = child.stderr.readline().decode()  # the container is started: put now waits for stdin
    assert "started at epoch" in first, first
    (folder / "chunks").rename(tmp_path / "chunks.away")
    (folder / "chunks").write_bytes(b"")
    _, err = child.communicate(b"x" * 1000, timeout=300)
    lines = [first.rstrip(), *err.decode().splitlines()]
    assert child.returncode == command_line.EXIT_CHUNK_STORAGE, lines
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert lines[-1].startswith("slts put: ChunkStorageError: "), lines
    flush = [line for line in lines if "ERROR slts.journal: final metadata log flush failed" in line]
    assert len(flush) == 1 and flush[0].endswith(" not found)"), lines
    assert all(" INFO " in line or " ERROR " in line for line in lines[:-1]), lines
