"""``slts.bindings.checked_reads.read_checked``: the reference and its compiled twin answer
alike, for ranges read on one core and on two (from 256 KiB the twin cuts the blocks in two
runs, the second read and checked by its own thread), at the end of a file, with bad
blocks in either run, from several threads at once and in a forked child. Where the twin
is not built (or Google's CRC32C library is not found) its runs skip, saying so, unless
``SLTS_REQUIRE_NATIVE=1`` (set by tests/run.sh, so CI runs both): then they fail."""

from __future__ import annotations

import concurrent.futures
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slts.bindings import checked_reads

KiB = 1 << 10
MiB = 1 << 20

ReadChecked = Callable[[int, memoryview, int, bytes], tuple[int, int]]
TWINS: dict[str, ReadChecked | None] = {
    "python": checked_reads.read_checked_python,
    "compiled": getattr(checked_reads.NATIVE, "read_checked", None),
}


@pytest.fixture(params=list(TWINS))
def read_checked(request: pytest.FixtureRequest) -> ReadChecked:
    found = TWINS[request.param]
    if found is None:
        if os.environ.get("SLTS_REQUIRE_NATIVE") == "1" and os.environ.get("SLTS_PURE_PYTHON") != "1":
            pytest.fail("SLTS_REQUIRE_NATIVE=1, but slts.bindings._checked_reads is not usable")
        pytest.skip("slts.bindings._checked_reads is not built, or Google's CRC32C library is missing")
    return found


def test_the_compiled_twin_is_used_where_usable() -> None:
    if checked_reads.NATIVE is None:
        assert checked_reads.read_checked is checked_reads.read_checked_python
    else:
        assert checked_reads.read_checked is checked_reads.NATIVE.read_checked
        assert checked_reads.NATIVE.configured()


DATA = random.Random(7).randbytes(3 * MiB + 12345)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("checked") / "data"
    path.write_bytes(DATA)
    return path


def blocks_of(data: bytes, lengths: list[int], bad: frozenset[int] = frozenset()) -> bytes:
    """The list of ``data`` cut into ``lengths`` (past its end: CRCs of nothing), with the
    CRCs of the blocks in ``bad`` wrong."""
    pairs, at = [], 0
    for index, length in enumerate(lengths):
        crc = crc32c.crc32c(data[at : at + length])
        pairs.append(struct.pack(">II", length, crc ^ 1 if index in bad else crc))
        at += length
    return b"".join(pairs)


def cut(length: int, block: int) -> list[int]:
    return [min(block, length - at) for at in range(0, length, block)]


def run(
    read_checked: ReadChecked, path: Path, offset: int, lengths: list[int], bad: frozenset[int] = frozenset()
):
    buffer = bytearray(b"\xee" * sum(lengths))
    blocks = blocks_of(DATA[offset:], lengths, bad)
    fd = os.open(path, os.O_RDONLY)
    try:
        count, first_bad = read_checked(fd, memoryview(buffer), offset, blocks)
    finally:
        os.close(fd)
    return count, first_bad, bytes(buffer)


@pytest.mark.parametrize(
    ("offset", "lengths"),
    [
        (0, [4096]),  # one block, one core
        (100, cut(200 * KiB, 64 * KiB)),  # under the split
        (0, cut(256 * KiB, 64 * KiB)),  # at the split: two runs
        (7, cut(3 * MiB, 64 * KiB)),  # many blocks, two runs
        (0, [1, 3 * MiB - 1]),  # a run of one tiny block
        (5, [3 * MiB - 100, 10]),  # one huge block, one small
        (0, cut(2 * MiB, 1000)),  # odd block sizes
    ],
)
def test_a_whole_range_is_read_and_passes(read_checked, data_file, offset, lengths) -> None:
    count, bad, got = run(read_checked, data_file, offset, lengths)
    assert (count, bad) == (sum(lengths), -1)
    assert got == DATA[offset : offset + count]


@pytest.mark.parametrize("bad", [{0}, {3}, {17}, {47}, {20, 40}, {30, 5}, {47, 46}])
def test_the_first_bad_block_in_file_order_is_reported(read_checked, data_file, bad) -> None:
    lengths = cut(3 * MiB, 64 * KiB)  # 48 blocks: two runs of 24
    count, first_bad, got = run(read_checked, data_file, 0, lengths, frozenset(bad))
    assert (count, first_bad) == (3 * MiB, min(bad))
    assert got == DATA[: 3 * MiB], "the bytes are read all the same"


@pytest.mark.parametrize(
    "offset",
    [
        len(DATA) - 100 * KiB,  # the end in the first run
        len(DATA) - 400 * KiB,  # the end in the second run
        len(DATA),  # nothing to read
        len(DATA) + 5,  # past the end
    ],
)
def test_a_range_past_the_end_of_the_file_is_read_short_and_only_whole_blocks_are_checked(
    read_checked, data_file, offset
) -> None:
    lengths = cut(MiB, 64 * KiB)
    available = max(0, len(DATA) - offset)
    whole = sum(1 for end in _ends(lengths) if end <= available)
    # A wrong CRC on the block cut short (and on those past the end) is never seen.
    count, bad, got = run(read_checked, data_file, offset, lengths, frozenset(range(whole, len(lengths))))
    assert (count, bad) == (min(available, MiB), -1)
    assert got[:count] == DATA[offset : offset + count]
    if whole:
        assert run(read_checked, data_file, offset, lengths, frozenset({whole - 1}))[1] == whole - 1


def _ends(lengths: list[int]) -> list[int]:
    ends, at = [], 0
    for length in lengths:
        at += length
        ends.append(at)
    return ends


def test_a_read_error_raises_and_a_bad_list_is_refused(read_checked, tmp_path: Path, data_file) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)  # a folder: pread fails with EISDIR
    try:
        with pytest.raises(OSError):
            read_checked(fd, memoryview(bytearray(MiB)), 0, blocks_of(DATA, cut(MiB, 64 * KiB)))
    finally:
        os.close(fd)
    fd = os.open(data_file, os.O_RDONLY)
    try:
        for blocks in (b"", blocks_of(DATA, [100]), b"\x00" * 7, blocks_of(DATA, [MiB + 1])):
            with pytest.raises(ValueError):
                read_checked(fd, memoryview(bytearray(MiB)), 0, blocks)
        with pytest.raises(ValueError):
            read_checked(fd, memoryview(bytearray(4)), -1, blocks_of(DATA, [4]))
    finally:
        os.close(fd)


@settings(max_examples=60, deadline=None)
@given(
    offset=st.integers(0, len(DATA)),
    lengths=st.lists(st.integers(1, 300 * KiB), min_size=1, max_size=12),
    bad=st.frozensets(st.integers(0, 11), max_size=3),
)
def test_the_twins_answer_alike(
    tmp_path_factory, offset: int, lengths: list[int], bad: frozenset[int]
) -> None:
    path = tmp_path_factory.getbasetemp() / "twins-data"
    if not path.exists():
        path.write_bytes(DATA)
    answers = {
        name: run(implementation, path, offset, lengths, bad)
        for name, implementation in TWINS.items()
        if implementation is not None
    }
    assert len(set(answers.values())) == 1, answers
    count, _, got = answers["python"]
    assert got[:count] == DATA[offset : offset + count]


def test_callers_on_several_threads_each_get_their_own_range(read_checked, data_file) -> None:
    """One check thread: callers that find it busy read their whole range themselves."""
    lengths = cut(512 * KiB, 64 * KiB)

    def one(offset: int) -> bool:
        count, bad, got = run(read_checked, data_file, offset, lengths, frozenset({offset % 8}))
        return (count, bad) == (512 * KiB, offset % 8) and got == DATA[offset : offset + count]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(one, range(0, 2 * MiB, 4099)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_reads_with_a_check_thread_of_its_own(read_checked, data_file) -> None:
    lengths = cut(2 * MiB, 64 * KiB)
    assert run(read_checked, data_file, 0, lengths)[:2] == (2 * MiB, -1)  # the parent's thread exists
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its two-run read is right
        try:
            count, bad, got = run(read_checked, data_file, 3, lengths, frozenset({30}))
            os._exit(0 if (count, bad) == (2 * MiB, 30) and got == DATA[3 : 3 + 2 * MiB] else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# The CRC32C libraries the compiled twin can call: each one found gives the reference's
# answers (on blocks from 1 byte to past 1 MiB, good and bad), in a process of its own
# (the library is chosen once per process, ``SLTS_CRC32C_LIBRARY``).
_EACH_LIBRARY = r"""
import os, random, struct, sys
import crc32c
from slts.bindings import checked_reads
assert checked_reads.CRC32C_LIBRARY == sys.argv[1], checked_reads.CRC32C_LIBRARY
path = sys.argv[2]
data = random.Random(11).randbytes(3 << 20)
with open(path, "wb") as file:
    file.write(data)
fd = os.open(path, os.O_RDONLY)
for lengths in ([1], [7, 8, 9], [64 << 10] * 20, [(1 << 20) + 3, 5], [3 << 19, 3 << 19]):
    for bad in (None, 0, len(lengths) - 1):
        pairs, at = [], 0
        for index, length in enumerate(lengths):
            crc = crc32c.crc32c(data[at : at + length])
            pairs.append(struct.pack(">II", length, crc ^ 1 if index == bad else crc))
            at += length
        view = memoryview(bytearray(at))
        answer = checked_reads.NATIVE.read_checked(fd, view, 0, b"".join(pairs))
        assert answer == (at, -1 if bad is None else bad), (lengths, bad, answer)
        assert view == data[:at]
print("ok")
"""


@pytest.mark.parametrize("library", [kind for kind, _ in checked_reads._LIBRARIES])
def test_each_crc32c_library_the_twin_can_call_answers_as_the_reference(library: str, tmp_path: Path) -> None:
    found = dict(checked_reads._LIBRARIES)[library]()
    if checked_reads.NATIVE is None or found is None:
        if os.environ.get("SLTS_REQUIRE_NATIVE") == "1" and os.environ.get("SLTS_PURE_PYTHON") != "1":
            pytest.fail(f"SLTS_REQUIRE_NATIVE=1, but the twin or the {library} CRC32C library is missing")
        pytest.skip(f"the compiled twin or the {library} CRC32C library is missing")
    done = subprocess.run(
        [sys.executable, "-c", _EACH_LIBRARY, library, str(tmp_path / "data")],
        env={**os.environ, "SLTS_CRC32C_LIBRARY": library},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_twin_calls_the_fastest_crc32c_library_it_finds() -> None:
    if checked_reads.NATIVE is None or os.environ.get("SLTS_CRC32C_LIBRARY"):
        pytest.skip("no compiled twin, or a library chosen by SLTS_CRC32C_LIBRARY")
    first_found = next(kind for kind, find in checked_reads._LIBRARIES if find() is not None)
    assert first_found == checked_reads.CRC32C_LIBRARY


def test_a_library_that_is_not_a_crc32c_one_is_refused(tmp_path: Path) -> None:
    if checked_reads.NATIVE is None:
        pytest.skip("no compiled twin")
    with pytest.raises(ValueError, match="kind must be"):
        checked_reads.NATIVE.configure("/nonexistent", "zlib")
    with pytest.raises(OSError, match="cannot load"):
        checked_reads.NATIVE.configure(str(tmp_path / "missing.so"), "isal")
    libc = "libc.so.6"
    with pytest.raises(OSError, match="has no crc32_iscsi"):
        checked_reads.NATIVE.configure(libc, "isal")
    assert checked_reads.NATIVE.configured() == checked_reads.CRC32C_LIBRARY  # unchanged by the refusals
