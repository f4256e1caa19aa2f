"""Zero-copy reads of the filesystem binding (``slts.bindings.mapped_reads``): views of one
shared mapping per file, the bounds on mappings and descriptors, and what a delete frees.
Observed from outside where Linux shows it: ``/proc/self/maps`` and ``/proc/self/fd``."""

from __future__ import annotations

import gc
import mmap
import os
from pathlib import Path

import pytest
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.bindings.mapped_reads import FileMappings

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")


def mapped_files(below: Path) -> list[str]:
    """The files below ``below`` this process maps (a deleted one ends in "(deleted)")."""
    with open("/proc/self/maps") as maps:
        return [line.split(maxsplit=5)[5].strip() for line in maps if str(below) in line]


def open_files(below: Path) -> list[str]:
    """The files below ``below`` this process holds a descriptor of."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if str(below) in target:
            found.append(target)
    return found


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_reads_of_one_file_share_one_mapping_kept_after_the_last_view(tmp_path: Path) -> None:
    path = write(tmp_path / "f", bytes(range(256)) * 64)
    mappings = FileMappings(mappings_max=4, kept_max=1)
    first = mappings.view("f", path, 0, 100)
    second = mappings.view("f", path, 5000, 100)
    assert first is not None and second is not None
    assert first.obj is second.obj and isinstance(first.obj, mmap.mmap)
    assert first.readonly and first == (bytes(range(256)) * 64)[:100]
    del first, second
    gc.collect()
    assert mapped_files(tmp_path) == [path], "kept: the next reader finds it mapped"
    mappings.clear()
    gc.collect()
    assert mapped_files(tmp_path) == [] and open_files(tmp_path) == []


def test_beyond_mappings_max_a_read_is_left_to_copy_until_a_mapping_goes(tmp_path: Path) -> None:
    paths = [write(tmp_path / f"f{i}", bytes([i]) * 100) for i in range(3)]
    mappings = FileMappings(mappings_max=2, kept_max=0)
    held = [mappings.view(f"f{i}", paths[i], 0, 10) for i in range(2)]
    assert all(view is not None for view in held)
    assert mappings.view("f2", paths[2], 0, 10) is None, "no slot: the caller copies"
    assert len(open_files(tmp_path)) == 2, "one descriptor per mapping, no more"
    del held[0]
    gc.collect()
    third = mappings.view("f2", paths[2], 0, 10)
    assert third is not None and third == bytes([2]) * 10


def test_a_replaced_file_is_mapped_anew_and_the_old_view_keeps_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write(path, b"a" * 100)
    mappings = FileMappings()
    old = mappings.view("f", str(path), 0, 100)
    os.unlink(path)
    write(path, b"b" * 50)
    new = mappings.view("f", str(path), 0, 100)
    assert old == b"a" * 100 and new == b"b" * 50


def test_a_range_past_the_end_raises_and_an_empty_file_gives_nothing(tmp_path: Path) -> None:
    mappings = FileMappings()
    path = write(tmp_path / "f", b"x" * 10)
    with pytest.raises(ValueError, match="past its end 10"):
        mappings.view("f", path, 11, 1)
    assert mappings.view("f", path, 10, 5) == b""
    empty = write(tmp_path / "e", b"")
    assert mappings.view("e", empty, 0, 5) == b""
    with pytest.raises(FileNotFoundError):
        mappings.view("m", str(tmp_path / "missing"), 0, 1)


def test_deleting_a_chunk_through_the_binding_unmaps_it_once_its_views_go(tmp_path: Path) -> None:
    """A deleted chunk's disk space is not held by a kept mapping: only by live views."""
    binding = FileSystemChunkStorage(str(tmp_path / "root"))
    handle = binding.create("a/chunk", b"z" * 8192)
    view = binding.read_view(handle, 0, 8192)
    assert isinstance(view.obj, mmap.mmap)
    binding.delete(handle)
    assert [name.endswith("(deleted)") for name in mapped_files(tmp_path)] == [True]
    assert view == b"z" * 8192, "a live view keeps its bytes"
    del view
    gc.collect()
    assert mapped_files(tmp_path) == [] and open_files(tmp_path) == []


def test_closing_the_binding_drops_its_kept_mappings(tmp_path: Path) -> None:
    binding = FileSystemChunkStorage(str(tmp_path / "root"))
    handle = binding.create("c", b"q" * 4096)
    assert binding.read_view(handle, 0, 10) == b"q" * 10
    gc.collect()
    assert len(mapped_files(tmp_path)) == 1
    binding.close()
    gc.collect()
    assert mapped_files(tmp_path) == []
