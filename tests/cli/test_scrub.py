"""The scrubber: a flipped byte inside a chunk, a missing chunk and a short chunk found at
the right segment offsets, the walk resumed where it stopped, the reads paid as the SCRUB
class, and ``slts scrub`` as a user runs it (exit 1 on anomalies, ``--json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slts.tools import cli, command_line

import slts
from slts.admin.scrub import scrub
from slts.errors import InvalidArgument
from slts.limiter import PriorityLimiter, TrafficClass
from slts.storage.chunked import ChunkedSegmentStorage

BLOCK = 64 << 10


def filled(storage: ChunkedSegmentStorage, name: str, chunks: int, chunk_bytes: int) -> None:
    storage.create(name, max_rolling_length=chunk_bytes)
    handle = storage.open_write(name)
    for i in range(chunks):
        storage.write(handle, i * chunk_bytes, bytes([i % 251]) * chunk_bytes)


def replace_chunk(storage: ChunkedSegmentStorage, chunk: str, data: bytes | None) -> None:
    """Put ``data`` in place of ``chunk``'s bytes on the chunk storage (None: delete it)."""
    binding = storage.chunk_storage
    binding.delete(binding.open_write(chunk))
    if data is not None:
        binding.create(chunk, data)


@pytest.fixture
def storage(tmp_path: Path) -> ChunkedSegmentStorage:
    opened = slts.open(f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "md"), gc_interval_s=0.0)
    yield opened
    opened.close()


def test_a_healthy_store_scrubs_clean_and_every_byte_is_read(storage: ChunkedSegmentStorage) -> None:
    filled(storage, "a", 3, 3 * BLOCK)
    filled(storage, "b", 2, 1000)
    report = scrub(storage, piece_bytes=BLOCK)
    assert report.anomalies == [] and report.segments == 2 and report.chunks == 5
    assert report.bytes_read == 9 * BLOCK + 2000 and report.next_segment is None


def test_damage_is_found_at_its_segment_offset(storage: ChunkedSegmentStorage) -> None:
    filled(storage, "a", 3, 4 * BLOCK)
    filled(storage, "b", 3, 5000)
    (_, first), (second_start, second), (third_start, third) = storage.chunks("a")
    data = bytearray(b"\x01" * (4 * BLOCK))
    data[2 * BLOCK + 17] ^= 0xFF  # in the third block of the second chunk
    replace_chunk(storage, second.name, bytes(data))
    replace_chunk(storage, third.name, None)
    (_, b0), (b1_start, b1), _ = storage.chunks("b")
    replace_chunk(storage, b1.name, b"x" * 100)
    report = scrub(storage, piece_bytes=3 * BLOCK)
    found = {(a.segment, a.kind, a.offset, a.chunk) for a in report.anomalies}
    assert found == {
        ("a", "checksum", second_start + 2 * BLOCK, second.name),
        ("a", "missing", third_start, third.name),
        ("b", "short", b1_start + 100, b1.name),
    }
    assert first.name not in {a.chunk for a in report.anomalies} and b0.name not in {
        a.chunk for a in report.anomalies
    }


def test_the_walk_resumes_where_it_stopped(storage: ChunkedSegmentStorage) -> None:
    for name in ("a", "b", "c", "d"):
        filled(storage, name, 2, 1000)
    first = scrub(storage, max_chunks=3)
    assert first.segments == 2 and first.chunks == 4 and first.next_segment == "c"
    rest = scrub(storage, start_at=first.next_segment)
    assert rest.segments == 2 and rest.chunks == 4 and rest.next_segment is None


def test_scrub_reads_are_the_scrub_class(tmp_path: Path) -> None:
    limiter = PriorityLimiter()
    storage = slts.open(
        f"file://{tmp_path / 'c'}", metadata=str(tmp_path / "m"), limiter=limiter, gc_interval_s=0.0
    )
    try:
        filled(storage, "a", 4, 10_000)
        report = scrub(storage)
        assert limiter.stats()[TrafficClass.SCRUB].bytes == report.bytes_read == 40_000
    finally:
        storage.close()


@pytest.mark.parametrize(
    "kwargs", [{"max_chunks": 0}, {"piece_bytes": -1}, {"start_at": 5}, {"max_chunks": True}]
)
def test_bad_arguments_are_typed_errors(storage: ChunkedSegmentStorage, kwargs: dict) -> None:
    with pytest.raises(InvalidArgument):
        scrub(storage, **kwargs)


def test_slts_scrub(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = ["--store", str(tmp_path / "store")]
    (tmp_path / "data").write_bytes(b"z" * 300_000)
    for name in ("a", "b"):
        assert (
            cli.main(
                ["put", name, str(tmp_path / "data"), *store, "--set", "rolling_length_bytes_default=100000"]
            )
            == 0
        )
    capsys.readouterr()
    assert cli.main(["scrub", "--json", *store]) == 0
    clean = json.loads(capsys.readouterr().out)
    assert clean["chunks"] == 6 and clean["anomalies"] == [] and clean["bytes_read"] == 600_000

    with slts.open(
        f"file://{tmp_path / 'store' / 'chunks'}", metadata=str(tmp_path / "store" / "metadata")
    ) as owner:
        (_, chunk), *_ = owner.chunks("b")
        replace_chunk(owner, chunk.name, None)
    assert cli.main(["scrub", *store]) == command_line.EXIT_ERROR
    out = capsys.readouterr().out
    assert f"b @0: missing: chunk {chunk.name}" in out and "1 anomalies" in out
    assert cli.main(["scrub", "--max-chunks", "2", "--json", *store]) == 0
    assert json.loads(capsys.readouterr().out)["next_segment"] == "b"


def test_batches_of_chunk_checks_give_the_same_report(storage: ChunkedSegmentStorage) -> None:
    from slts.admin.scrub import check_chunks_locally

    filled(storage, "a", 3, 2 * BLOCK)
    filled(storage, "b", 3, 1000)
    (_, _), (b1_start, b1), _ = storage.chunks("b")
    replace_chunk(storage, b1.name, b"short")
    one_by_one = scrub(storage)
    batched = scrub(storage, checker=check_chunks_locally(storage.chunk_storage), batch_chunks=2)
    one_by_one.seconds = batched.seconds = 0.0
    assert batched == one_by_one and len(batched.anomalies) == 1
    assert batched.anomalies[0].offset == b1_start + 5 and batched.anomalies[0].kind == "short"
    with pytest.raises(InvalidArgument, match="checker"):
        scrub(storage, checker="spark")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="batch_chunks"):
        scrub(storage, batch_chunks=0)
