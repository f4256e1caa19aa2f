"""Regression tests for ``slts.open`` and the metadata folder (issue 12): every argument
is checked before anything is written, the caller's store stays the caller's, a path
that cannot be a metadata folder and a damaged metadata file are typed errors, and a
read-only open never creates anything."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import slts
from slts.errors import Fenced, InvalidArgument, InvalidConfig, MetadataCorrupted, StoreNotFound
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.ownership import EPOCH_MAX
from slts.metadata.schema import TABLES


def open_at(tmp_path: Path, **kwargs: object) -> slts.ChunkedSegmentStorage:
    return slts.open(f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "metadata"), **kwargs)


def test_a_rejected_epoch_is_never_committed(tmp_path: Path) -> None:
    owner = open_at(tmp_path, gc_interval_s=0, metadata_log_flush_interval_s=0)
    owner.create("s")
    with pytest.raises(InvalidArgument, match="epoch"):
        open_at(tmp_path, epoch=2**31)
    owner.write(owner.open_write("s"), 0, b"still the owner")  # not fenced
    owner.close()
    again = open_at(tmp_path)
    assert again.epoch == owner.epoch + 1
    again.close()


def test_the_next_epoch_past_the_largest_is_refused_before_it_is_written(tmp_path: Path) -> None:
    last = open_at(tmp_path, epoch=EPOCH_MAX)
    last.create("s")
    with pytest.raises(InvalidArgument, match="largest"):
        open_at(tmp_path)
    last.write(last.open_write("s"), 0, b"x")  # the owner was not fenced
    last.close()


@pytest.mark.parametrize(
    "kwargs",
    [{"epoch": 2**70}, {"container_id": 2**64}, {"epoch": 0}, {"container_id": -1}, {"epoch": True}],
)
def test_out_of_range_integers_are_typed_errors(tmp_path: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        open_at(tmp_path, **kwargs)
    assert (
        not (tmp_path / "metadata" / "data.mdb").exists()
        or LmdbMetadataStore(str(tmp_path / "metadata"), TABLES).dump()["container"] == {}
    )


@pytest.mark.parametrize(
    "setting",
    [
        {"rolling_length_bytes_default": 2**64},
        {"gc_delay_s": math.nan},
        {"gc_delay_s": math.inf},
        {"write_bytes_max": 2**63},
    ],
)
def test_out_of_range_settings_are_invalid_config(tmp_path: Path, setting: dict[str, object]) -> None:
    with pytest.raises(InvalidConfig):
        open_at(tmp_path, **setting)


def test_max_rolling_length_out_of_range_is_invalid_argument(tmp_path: Path) -> None:
    storage = open_at(tmp_path)
    with pytest.raises(InvalidArgument, match="max_rolling_length"):
        storage.create("s", max_rolling_length=2**64)
    assert not storage.exists("s")
    storage.close()


def test_the_callers_store_is_never_closed(tmp_path: Path) -> None:
    store = LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)
    first = slts.open(f"file://{tmp_path / 'chunks'}", metadata=store, epoch=5)
    first.close()
    assert store.dump()["container"]  # still open
    with pytest.raises(Fenced):  # a failed start
        slts.open(f"file://{tmp_path / 'chunks'}", metadata=store, epoch=3)
    assert store.dump()["container"]
    store.close()


def test_a_file_in_the_way_of_the_metadata_folder_is_invalid_config(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text("not a folder")
    with pytest.raises(InvalidConfig, match="metadata folder"):
        open_at(tmp_path)


def test_a_metadata_folder_under_proc_is_invalid_config() -> None:
    with pytest.raises(InvalidConfig, match="metadata folder"):
        slts.open("memory://x", metadata="/proc/self/slts-metadata")


def test_a_read_only_open_of_nothing_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound):
        open_at(tmp_path, read_only=True)
    assert list(tmp_path.iterdir()) == []


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "meta pages overwritten": lambda data: b"\xff" * 8192 + data[8192:],
    "empty": lambda data: b"",
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_metadata_file_is_metadata_corrupted_not_sigbus(tmp_path: Path, damage: str) -> None:
    storage = open_at(tmp_path)
    for i in range(200):
        storage.create(f"s{i}")
        storage.write(storage.open_write(f"s{i}"), 0, b"x" * 100)
    storage.close()
    path = tmp_path / "metadata" / "data.mdb"
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    # In a child: if the check missed the damage, LMDB's SIGBUS kills the child, not pytest.
    program = (
        "import sys, slts\n"
        "from slts.errors import MetadataCorrupted\n"
        "try:\n"
        f"    slts.open('file://{tmp_path / 'chunks'}', metadata='{tmp_path / 'metadata'}')\n"
        "except MetadataCorrupted as exc:\n"
        "    print(exc); sys.exit(3)\n"
    )
    child = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert child.returncode == 3, (child.returncode, child.stderr[-2000:])
    assert "slts restore" in child.stdout and str(path) in child.stdout


def test_a_healthy_file_passes_the_check(tmp_path: Path) -> None:
    from slts.metadata.lmdb_file import check_data_file

    storage = open_at(tmp_path)
    storage.create("s")
    storage.close()
    check_data_file(str(tmp_path / "metadata"))
    with pytest.raises(MetadataCorrupted):
        os.truncate(tmp_path / "metadata" / "data.mdb", 4096)
        check_data_file(str(tmp_path / "metadata"))
