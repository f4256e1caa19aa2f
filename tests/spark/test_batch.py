"""A Spark batch defrag of a filesystem container of thousands of fragmented segments.

The executors are real Spark Python workers (``local[2]``): every task rebuilds the
binding from the store URL and builds its run's chunk (natively: ``copy_file_range``);
the driver commits. Afterwards every segment is byte-identical, a second batch finds
nothing to do, and the container verifies clean (every chunk's checksum read back), also
once the replaced chunks are collected.
"""

from __future__ import annotations

from slts.admin.verify import verify_container
from slts.storage.batch_defrag import Executor

from .conftest import collect_garbage, defrag_with, file_locations, fragment, mismatched, open_owner

SEGMENTS, PIECES = 2000, 4


def test_thousands_of_segments_merge_byte_identical(tmp_path, spark: Executor) -> None:
    url, metadata = file_locations(tmp_path)
    names = [f"stream/{i:05d}/0" for i in range(SEGMENTS)]
    sealed = names[::2]  # a sealed segment's last chunk merges too
    written = fragment(url, metadata, names, PIECES, seal=sealed)

    report = defrag_with(spark, url, metadata)
    assert report.errors == [] and report.runs_failed == report.runs_dropped == 0, report
    assert report.segments_scanned == SEGMENTS and report.chunks_before == SEGMENTS * PIECES
    assert report.runs_planned == report.runs_committed == SEGMENTS and report.batches == 1
    # Sealed: PIECES chunks -> 1; unsealed: the first PIECES-1 -> 1, the last stays.
    assert report.chunks_after == len(sealed) + 2 * (SEGMENTS - len(sealed)) <= report.chunks_before // 2
    merged = written.mergeable_bytes() + sum(written.pieces[name][-1] for name in sealed)
    assert report.bytes_native == merged and report.bytes_copied == 0

    again = defrag_with(spark, url, metadata)  # right after: nothing left to merge
    assert again.runs_planned == 0 and again.segments_scanned == SEGMENTS and again.errors == []
    assert again.chunks_before == again.chunks_after == report.chunks_after

    with open_owner(url, metadata) as owner:
        assert sum(owner.info(name).chunk_count for name in names) == report.chunks_after
        assert all(owner.info(name).sealed for name in sealed)
        assert mismatched(owner, written.lengths) == []
        assert verify_container(owner, checksums=True).problems == []
    with open_owner(url, metadata, synced=False) as owner:  # GC commits unsynced: about 3x faster
        replaced = report.chunks_before - report.chunks_after + report.runs_committed  # a new chunk per run
        assert collect_garbage(owner) == replaced
        assert mismatched(owner, written.lengths) == []
        assert verify_container(owner, checksums=True).problems == []
