"""The chunk cache's files (``slts.bindings.chunk_cache.files``), invariants 1-3."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from slts.bindings.chunk_cache import files
from slts.bindings.chunk_cache.files import CHECK_BYTES, CacheFileDamaged

from tests.support.conformance import pattern

KEY = bytes(range(files.KEY_BYTES))


@pytest.fixture
def root(tmp_path: Path) -> str:
    files.prepare(str(tmp_path))
    return str(tmp_path)


def test_a_file_reads_back_any_range_it_holds_from_parts(root: str) -> None:
    data = pattern(3 * CHECK_BYTES + 123)
    file = files.write(
        root, KEY, 2, 1000, [data[:7], memoryview(data)[7 : CHECK_BYTES + 5], data[CHECK_BYTES + 5 :]], 9
    )
    assert (file.start, file.end, file.block, file.version) == (1000, 1000 + len(data), 2, 9)
    assert os.path.getsize(file.path) == file.size == len(data) + files.trailer_bytes(len(data))
    for offset, length in [
        (0, len(data)),
        (0, 1),
        (CHECK_BYTES - 1, 2),
        (len(data) - 1, 1),
        (5, 2 * CHECK_BYTES),
    ]:
        assert files.read_checked(file, 1000 + offset, length) == data[offset : offset + length]
    assert os.listdir(os.path.join(root, files.TMP_FOLDER)) == []  # invariant 1: renamed when whole


def test_a_flipped_byte_fails_the_reads_that_touch_its_check_block(root: str) -> None:
    """Invariant 2: a serve checks every check block it returns bytes of."""
    data = pattern(2 * CHECK_BYTES)
    file = files.write(root, KEY, 0, 0, [data], 1)
    with open(file.path, "r+b") as handle:
        handle.seek(CHECK_BYTES + 10)
        handle.write(bytes([data[CHECK_BYTES + 10] ^ 1]))
    assert files.read_checked(file, 0, CHECK_BYTES) == data[:CHECK_BYTES]  # the other block is sound
    with pytest.raises(CacheFileDamaged):
        files.read_checked(file, CHECK_BYTES - 1, 2)
    os.truncate(file.path, CHECK_BYTES + 5)
    with pytest.raises(CacheFileDamaged):
        files.read_checked(file, CHECK_BYTES, 10)


def test_scan_finds_sound_files_and_removes_the_rest(root: str) -> None:
    """Invariants 1 and 3: temporary files, and files whose trailer, name or size disagree,
    are removed; the data of sound files is not read (a flipped data byte is found when
    served)."""
    sound = files.write(root, KEY, 0, 0, [pattern(5000)], 1)
    flipped = files.write(root, KEY, 1, 65536, [pattern(5000)], 2)
    with open(flipped.path, "r+b") as handle:
        handle.write(b"\xff")
    torn = files.write(root, KEY, 2, 131072, [pattern(5000)], 3)
    os.truncate(torn.path, torn.size - 1)
    bad_trailer = files.write(root, KEY, 3, 196608, [pattern(5000)], 4)
    with open(bad_trailer.path, "r+b") as handle:
        handle.seek(bad_trailer.size - 20)  # in the key the footer records
        handle.write(b"\xff\xfe\xfd")
    renamed = files.write(root, KEY, 4, 262144, [pattern(5000)], 5)
    os.rename(renamed.path, files.block_path(root, KEY, 5, 5))
    zeroed = files.write(root, KEY, 6, 6 * 65536, [pattern(5000)], 6)
    with open(zeroed.path, "r+b") as handle:  # what a power loss may leave of an unsynced file
        handle.write(bytes(zeroed.size))
    temporary = os.path.join(root, files.TMP_FOLDER, "7.tmp")
    Path(temporary).write_bytes(b"half a file")
    stray = os.path.join(root, files.BLOCKS_FOLDER, "00", "not-a-cache-file")
    Path(stray).write_bytes(b"x")

    found = sorted(files.scan(root), key=lambda file: file.version)

    assert [file.version for file in found] == [1, 2]
    assert found[0] == sound
    assert not os.path.exists(temporary) and not os.path.exists(stray)
    for gone in (torn, bad_trailer, zeroed):
        assert not os.path.exists(gone.path)
    with pytest.raises(CacheFileDamaged):
        files.read_checked(found[1], 65536, 1)


@pytest.mark.parametrize("length", [1, 4096 - files.trailer_bytes(1), 3 * CHECK_BYTES + 123, 1 << 20])
def test_a_direct_write_reads_back_like_a_buffered_one(root: str, length: int) -> None:
    """Fills written with ``O_DIRECT`` (padded to the alignment, then cut) hold exactly the
    bytes and trailer a buffered write holds, and ``scan`` finds them sound."""
    if not files.direct_writes_work(root):
        pytest.skip(f"the file system of {root} refuses O_DIRECT")
    data = pattern(length)
    direct = files.write(root, KEY, 0, 0, [data[:3], memoryview(data)[3:]], 1, direct=True)
    buffered = files.write(root, KEY, 1, 0, [data], 2)
    assert os.path.getsize(direct.path) == direct.size == buffered.size
    assert direct.crcs == buffered.crcs
    assert files.read_checked(direct, 0, length) == data
    with open(direct.path, "rb") as one, open(buffered.path, "rb") as other:
        assert one.read()[:-64] == other.read()[:-64]  # the footers differ in block and version
    assert sorted(file.version for file in files.scan(root)) == [1, 2]
    assert os.listdir(os.path.join(root, files.TMP_FOLDER)) == []  # the probe left nothing
