"""Regression tests: the command line never prints a traceback for bad input, opens the
files it is given before the store (a mistyped file fences nobody), never creates
anything when it only looks, and reports damaged metadata instead of crashing (issue 12)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from slts.tools import command_line

SCRIPT = os.path.join(os.path.dirname(sys.executable), "slts")


def slts(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *argv], input=stdin.decode(), capture_output=True, text=True, timeout=300)


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.fixture
def store(tmp_path: Path) -> list[str]:
    folder = tmp_path / "store"
    result = slts("put", "live", "-", "--store", str(folder), stdin=b"abc")
    assert result.returncode == 0, result.stderr
    return ["--store", str(folder)]


def epoch(store: list[str]) -> int:
    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.records import ContainerRecord
    from slts.metadata.schema import CONTAINER, CONTAINER_KEY, TABLES

    with LmdbMetadataStore(os.path.join(store[1], "metadata"), TABLES) as metadata:
        stored = metadata.get(CONTAINER, CONTAINER_KEY)
        assert stored is not None
        return ContainerRecord.decode(stored.value).epoch


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["put", "n", "/nonexistent/file"], command_line.EXIT_NOT_FOUND),
        (["put", "n", "/tmp"], command_line.EXIT_FILE),
        (["import", "/nonexistent/export"], command_line.EXIT_NOT_FOUND),
    ],
    ids=["put-missing", "put-folder", "import-missing"],
)
def test_a_bad_input_file_is_one_line_and_fences_nobody(store: list[str], argv: list[str], code: int) -> None:
    before = epoch(store)
    result = slts(*argv, *store)
    assert result.returncode == code
    no_traceback(result)
    assert epoch(store) == before, "the store was opened (and its owner fenced) for nothing"


def test_export_to_a_missing_folder_is_one_line(store: list[str], tmp_path: Path) -> None:
    result = slts("export", "live", str(tmp_path / "missing" / "dir" / "f"), *store)
    assert result.returncode == command_line.EXIT_NOT_FOUND
    no_traceback(result)


@pytest.mark.parametrize(
    "argv",
    [
        ["cat", "x"],
        ["ls"],
        ["info", "x"],
        ["verify"],
        ["journal", "show"],
        ["restore", "--to", "TARGET"],
        ["export", "x", "-"],
    ],
    ids=lambda argv: argv[0],
)
def test_looking_at_a_mistyped_store_creates_nothing(tmp_path: Path, argv: list[str]) -> None:
    mistyped = tmp_path / "mistyped"
    argv = [str(tmp_path / "target") if arg == "TARGET" else arg for arg in argv]
    result = slts(*argv, "--store", str(mistyped))
    assert result.returncode == command_line.EXIT_NOT_FOUND, result.stderr
    no_traceback(result)
    assert list(tmp_path.iterdir()) == [], "a look created files"


def test_verify_reports_damaged_metadata_instead_of_crashing(store: list[str]) -> None:
    for i in range(50):
        assert slts("put", f"s{i}", "-", *store, stdin=b"x" * 100).returncode == 0
    data = Path(store[1]) / "metadata" / "data.mdb"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    result = slts("verify", *store)
    assert result.returncode == command_line.EXIT_CORRUPT, result.stderr
    no_traceback(result)
    assert "slts restore" in result.stderr


def test_a_refused_store_leaves_no_metadata_folder_behind(tmp_path: Path) -> None:
    """A chunk storage refused at open (the file system's root) after the metadata folder
    was named: the folders the call would have made, and the LMDB files in them, are gone;
    a metadata folder that was there before stays, with what it held."""
    source = tmp_path / "input"
    source.write_bytes(b"abc")
    new = tmp_path / "a" / "b" / "metadata"
    result = slts("put", "n", str(source), "--store", "file:///", "--metadata", str(new))
    assert result.returncode != 0
    no_traceback(result)
    assert "root" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["input"], "the refused open made folders"

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "note").write_text("the operator's")
    result = slts("put", "n", str(source), "--store", "file:///", "--metadata", str(kept))
    assert result.returncode != 0
    assert sorted(os.listdir(kept)) == ["note"]
