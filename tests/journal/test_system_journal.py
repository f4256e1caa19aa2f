"""The system journal on its own (DESIGN.md §6): boot, replay and its failure cases.

Each test drives ``SystemJournal`` + ``SystemSegments`` directly on a binding, then
boots a newer epoch from tier-2 alone and compares: the replayed layout must equal
the writer's in-memory layout, and every system segment must read back byte-identical.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from slts.bindings.base import ChunkHandle, ChunkStorage
from slts.bindings.faulty import FaultyChunkStorage
from slts.journal import framing, system_names
from slts.journal.journal import JournalSettings, SystemJournal
from slts.journal.replay import read_object, replay
from slts.journal.system_layout import SystemLayout
from slts.journal.system_segments import SystemSegments, read_range

from slts.errors import Fenced, InvalidOffset, StorageUnavailable

LOG = system_names.METADATA_LOG
SNAPS = system_names.METADATA_SNAPSHOTS
NO_SNAPSHOTS = JournalSettings(snapshot_records=10**9)


def start(
    binding: ChunkStorage,
    epoch: int,
    settings: JournalSettings = NO_SNAPSHOTS,
    rolling: int = 1 << 20,
    fence_check: Callable[[], None] = lambda: None,
) -> SystemSegments:
    journal = SystemJournal.boot(binding, 0, epoch, settings, fence_check=fence_check)
    return SystemSegments(journal, rolling, fence_check)


def contents(binding: ChunkStorage, layout: SystemLayout) -> dict[str, bytes]:
    return {
        name: read_range(binding, seg, seg.start_offset, seg.length) for name, seg in layout.segments.items()
    }


def encoded(layout: SystemLayout) -> dict[str, object]:
    return {name: seg.encode() for name, seg in layout.segments.items() if seg.length or seg.chunks}


def write_some(segments: SystemSegments, count: int, seed: int = 0) -> dict[str, bytearray]:
    """Appends (some forced to new chunks) and truncations; returns the expected bytes."""
    expected = {LOG: bytearray(), SNAPS: bytearray()}
    starts = {LOG: 0, SNAPS: 0}
    for i in range(count):
        segment = LOG if i % 3 else SNAPS
        data = os.urandom(1 + (i * 37 + seed) % 300)
        segments.append(segment, data, {"n": i}, new_chunk=i % 11 == 0)
        expected[segment] += data
        if i % 17 == 16:
            layout = segments.layout(segment)
            cut = (layout.start_offset + layout.length) // 2
            segments.truncate(segment, cut)
            starts[segment] = cut
    return {name: data[starts[name] :] for name, data in expected.items()}


def test_boot_from_nothing(binding: ChunkStorage) -> None:
    journal = SystemJournal.boot(binding, 0, 1)
    assert journal.layout.check() == [] and encoded(journal.layout) == {}
    found = replay(binding, 0)
    assert found.checkpoint is not None, "boot takes a checkpointed journal snapshot"
    assert found.max_epoch == 1 and encoded(found.layout) == {}
    second = SystemJournal.boot(binding, 0, 2)
    assert encoded(second.layout) == {}


@pytest.mark.parametrize("snapshot_records", [10**9, 7])
def test_boot_after_many_records(binding: ChunkStorage, snapshot_records: int) -> None:
    segments = start(binding, 1, JournalSettings(snapshot_records=snapshot_records), rolling=2000)
    expected = write_some(segments, 150)
    written = segments.journal.layout
    booted = SystemJournal.boot(binding, 0, 2)
    assert encoded(booted.layout) == encoded(written)
    assert {n: bytes(d) for n, d in expected.items()} == contents(binding, booted.layout)
    assert booted.layout.segment(LOG).attrs["n"] == 149
    if snapshot_records < 10**9:  # old journal objects are cleaned up as snapshots are taken
        files, snapshots, checkpoints = (len(group) for group in _listing(binding))
        assert files < 150 // snapshot_records and snapshots <= 4 and checkpoints <= 4, (files, snapshots)


def _listing(binding: ChunkStorage) -> tuple[list[str], list[str], list[str]]:
    return (
        list(binding.list(system_names.journal_prefix(0))),
        list(binding.list(system_names.snapshots_prefix(0))),
        list(binding.list(system_names.checkpoints_prefix(0))),
    )


def test_torn_last_record_is_ignored(binding: ChunkStorage) -> None:
    segments = start(binding, 1)
    write_some(segments, 20)
    layout = encoded(segments.journal.layout)
    torn = framing.encode_record(
        {"k": "append", "id": [1, 999], "seg": LOG, "chunk": "x", "offset": 0, "length": 5}
    )
    last = sorted(binding.list(system_names.journal_prefix(0)))[-1]
    if binding.supports_append:  # a crash mid-append leaves half a record at the end of the file
        size = binding.get_info(last).length
        binding.write(binding.open_write(last), size, torn[: len(torn) // 2])
    else:  # without append every record is an object: the torn one is a file of its own
        binding.create(system_names.journal_file(0, 1, 10**6), torn[: len(torn) // 2])
    found = replay(binding, 0)
    assert found.torn == 1 and encoded(found.layout) == layout
    booted = SystemJournal.boot(binding, 0, 2)
    assert encoded(booted.layout) == layout


def test_duplicate_records_are_ignored(binding: ChunkStorage) -> None:
    segments = start(binding, 1)
    write_some(segments, 20)
    layout = encoded(segments.journal.layout)
    files = sorted(binding.list(system_names.journal_prefix(0)))
    # A retried write that had landed after all: the same records again, in a later file.
    again = b"".join(read_object(binding, name) for name in files[-3:])
    binding.create(system_names.journal_file(0, 1, 10**6), again)
    found = replay(binding, 0)
    assert found.duplicates >= 3 and found.inconsistent == 0
    assert encoded(found.layout) == layout


def test_corrupt_record_is_skipped_and_gaps_in_file_numbers_are_tolerated(binding: ChunkStorage) -> None:
    segments = start(binding, 1)
    write_some(segments, 10)
    layout = encoded(segments.journal.layout)
    bad = bytearray(
        framing.encode_record(
            {"k": "append", "id": [1, 500], "seg": LOG, "chunk": "y", "offset": 0, "length": 1}
        )
    )
    bad[-1] ^= 0xFF  # the CRC no longer matches
    binding.create(
        system_names.journal_file(0, 1, 10**6 + 7), bytes(bad)
    )  # far beyond the last number: a gap
    found = replay(binding, 0)
    assert found.corrupt == 1 and encoded(found.layout) == layout


def test_zombie_changes_never_appear(binding: ChunkStorage) -> None:
    taken_over = []

    def fence_check() -> None:  # the owner check of the metadata store, which the new epoch moved
        if taken_over:
            raise Fenced("epoch 1 was fenced")

    old = start(binding, 1, fence_check=fence_check)
    write_some(old, 12)
    new = start(binding, 2)  # takes over: boots from old's journal
    taken_over.append(True)
    assert encoded(new.journal.layout) == encoded(old.journal.layout)
    expected_new = bytearray(contents(binding, new.journal.layout)[LOG])
    # The zombie keeps going: records and chunks of its own, after the takeover.
    for i in range(15):
        old.append(LOG, b"ZOMBIE" * 10, {"n": 1000 + i}, new_chunk=i % 4 == 0)
    with pytest.raises(Fenced):  # its truncation record lands, but it deletes nothing
        old.truncate(LOG, old.layout(LOG).length)
    for i in range(5):
        data = os.urandom(50)
        new.append(LOG, data, {"n": 2000 + i})
        expected_new += data
    zombie_chunks = {c.name for c in old.journal.layout.segment(LOG).chunks} - {
        c.name for c in new.journal.layout.segment(LOG).chunks
    }
    assert zombie_chunks
    third = SystemJournal.boot(binding, 0, 3)
    assert encoded(third.layout) == encoded(new.journal.layout)
    assert contents(binding, third.layout)[LOG] == bytes(expected_new)
    assert b"ZOMBIE" not in contents(binding, third.layout)[LOG]
    assert third.layout.segment(LOG).attrs["n"] == 2004
    left = set(binding.list(system_names.segment_chunks_prefix(0, LOG)))
    assert not zombie_chunks & left, "boot removes the zombie's unreferenced chunks"


def test_an_epoch_not_newer_is_fenced(binding: ChunkStorage) -> None:
    SystemJournal.boot(binding, 0, 5)
    before = sorted(binding.list(""))
    for epoch in (4, 5):
        with pytest.raises(Fenced):
            SystemJournal.boot(binding, 0, epoch)
    assert sorted(binding.list("")) == before


def test_half_written_snapshot_falls_back_to_the_previous(binding: ChunkStorage) -> None:
    segments = start(binding, 1, JournalSettings(snapshot_records=5))
    write_some(segments, 12)
    layout = encoded(segments.journal.layout)
    valid = replay(binding, 0).checkpoint
    # A newer snapshot whose write failed half-way, with a checkpoint that points at it.
    body = framing.encode_record(
        segments.journal.layout.snapshot_record((1, 10**6)) | {"journal": [1, 10**6]}
    )
    half = system_names.journal_snapshot(0, 1, 10**5)
    binding.create(half, body[: len(body) // 2])
    pointer = {"k": "checkpoint", "snapshot": half, "epoch": 1, "number": 10**5}
    binding.create(system_names.checkpoint(0, 1, 10**5, 1), framing.encode_record(pointer))
    found = replay(binding, 0)
    assert found.invalid_checkpoints == [system_names.checkpoint(0, 1, 10**5, 1)]
    assert found.checkpoint == valid and encoded(found.layout) == layout


def test_failed_journal_write_reboots_from_tier2(binding: ChunkStorage) -> None:
    faulty = FaultyChunkStorage(binding)
    segments = start(faulty, 1)
    write_some(segments, 5)
    # Both attempts of the next journal record fail; the data chunk (create #1) lands.
    # With append the record goes to the active file first (write), then to a new file.
    if binding.supports_append:
        faulty.fail_nth("write", 1)
    else:
        faulty.fail_nth("create", 2)
    faulty.fail_nth("create", 3 if not binding.supports_append else 2)
    with pytest.raises(StorageUnavailable):
        segments.append(LOG, b"lost?", new_chunk=True)
    faulty.clear()
    segments.append(LOG, b"after", {"n": 77})  # re-boots from tier-2 first
    assert segments.journal.statistics.reboots == 1
    found = replay(binding, 0)
    assert encoded(found.layout) == encoded(segments.journal.layout)
    assert contents(binding, found.layout)[LOG].endswith(b"after")


def test_system_segment_bad_input_changes_nothing(binding: ChunkStorage) -> None:
    segments = start(binding, 1)
    write_some(segments, 4)
    before = (encoded(segments.journal.layout), sorted(binding.list("")))
    layout = segments.layout(LOG)
    for offset in (layout.start_offset - 1, layout.length + 1):
        with pytest.raises(InvalidOffset):
            segments.truncate(LOG, offset)
    with pytest.raises(InvalidOffset):
        segments.read(LOG, layout.length, 1)
    assert (encoded(segments.journal.layout), sorted(binding.list(""))) == before


def test_truncation_deletes_dropped_chunks(binding: ChunkStorage) -> None:
    segments = start(binding, 1)
    for _ in range(4):
        segments.append(SNAPS, b"x" * 100, new_chunk=True)
    first = [c.name for c in segments.layout(SNAPS).chunks]
    segments.truncate(SNAPS, 250)
    layout = segments.layout(SNAPS)
    assert [c.name for c in layout.chunks] == first[2:] and layout.start_offset == 250
    assert not set(first[:2]) & set(binding.list(system_names.segment_chunks_prefix(0, SNAPS)))
    assert segments.read(SNAPS, 250, 150) == b"x" * 150
    assert not binding.exists(first[0]) and ChunkHandle  # deleted right after the durable record


def test_a_transient_error_reading_the_checkpoint_fails_the_replay(binding: ChunkStorage) -> None:
    # Found by `slts simulate` (seed 457): a re-boot whose read of the newest checkpoint
    # failed fell back to no base, replayed this epoch's files alone, deleted the metadata
    # log's chunks as unreferenced and journaled the loss. The replay must fail instead.
    segments = start(binding, 1, JournalSettings(snapshot_records=5))
    expected = write_some(segments, 40)
    written = encoded(segments.journal.layout)
    assert _listing(binding)[2], "checkpoints were written"
    faulty = FaultyChunkStorage(binding)
    faulty.fail_nth("read", 1)  # the first read of a replay is the newest checkpoint
    with pytest.raises(StorageUnavailable):
        replay(faulty, 0)
    faulty.fail_nth("read", 1)
    with pytest.raises(StorageUnavailable):
        SystemJournal.boot(faulty, 0, 2)
    booted = SystemJournal.boot(binding, 0, 2)  # the fault passed: the same layout, every byte
    assert encoded(booted.layout) == written
    assert {n: bytes(d) for n, d in expected.items()} == contents(binding, booted.layout)
