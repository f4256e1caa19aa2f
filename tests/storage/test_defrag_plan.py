"""Pure pieces of defrag: the run planner and CRC32C combination."""

from __future__ import annotations

import crc32c
from hypothesis import given
from hypothesis import strategies as st

from slts.config import StorageConfig
from slts.metadata.records import ChunkRecord, SegmentRecord, SegmentStatus
from slts.storage.defrag import ListedChunk, crc32c_combine, plan_runs


@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_crc32c_combine_equals_crc_of_concatenation(a: bytes, b: bytes) -> None:
    assert crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(a + b)


def segment(lengths: list[int], sealed: bool, rolling: int = 1000) -> tuple[SegmentRecord, list[ListedChunk]]:
    listed, start = [], 0
    for i, length in enumerate(lengths):
        following = f"c{i + 1}" if i + 1 < len(lengths) else None
        listed.append(ListedChunk(ChunkRecord(f"c{i}", 1, start, length, following, 1, None), 1, start))
        start += length
    status = SegmentStatus.ACTIVE | (SegmentStatus.SEALED if sealed else 0)
    record = SegmentRecord(
        "s",
        1,
        int(status),
        0,
        start,
        "c0",
        f"c{len(lengths) - 1}",
        0,
        listed[-1].start,
        rolling,
        1,
        len(lengths),
        0,
        0,
    )
    return record, listed


def runs_of(lengths: list[int], sealed: bool = True, **config: int) -> list[list[str]]:
    record, listed = segment(lengths, sealed)
    settings = StorageConfig(
        defrag_small_chunk_bytes=10, defrag_run_bytes_max=25, gc_interval_s=0.0, **config
    )
    return [[chunk.record.name for chunk in run.chunks] for run in plan_runs(record, listed, settings)]


def test_runs_are_consecutive_small_chunks_within_bounds() -> None:
    assert runs_of([5, 5, 5, 5, 5, 5]) == [["c0", "c1", "c2", "c3", "c4"]]  # 25 bytes max
    assert runs_of([5, 50, 5, 5]) == [["c2", "c3"]]  # a big chunk breaks runs
    assert runs_of([5, 50, 5]) == []  # single small chunks are not runs
    assert runs_of([9, 9, 9, 9]) == [["c0", "c1"], ["c2", "c3"]]
    assert runs_of([5, 5, 5], defrag_run_chunks_max=2) == [["c0", "c1"]]


def test_the_last_chunk_of_an_unsealed_segment_is_left_out() -> None:
    assert runs_of([5, 5, 5], sealed=False) == [["c0", "c1"]]
    assert runs_of([5, 5], sealed=False) == []
