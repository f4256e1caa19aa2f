"""Replay: journals already on tier-2, damage in the middle of a journal file, objects
that vanish while replay reads them.

``data/journal_v1.json`` holds the journal objects (files, snapshots, checkpoints) that
the first journal implementation wrote, on a binding with append and on one without
(an object per record), and what that implementation's replay made of them. The
on-disk format has not changed since: replay and boot today must rebuild exactly that.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import crc32c
import msgpack
import pytest
from slts.bindings.base import ChunkHandle, ChunkStorage
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.journal import framing, system_names
from slts.journal.journal import JournalSettings, SystemJournal
from slts.journal.replay import read_object, replay
from slts.journal.system_segments import SystemSegments

from slts.errors import ChunkNotFound

LOG = system_names.METADATA_LOG
WRITTEN = json.loads((Path(__file__).parent / "data" / "journal_v1.json").read_text())


def _tier2(tmp_path: Path, objects: dict[str, str], drop_epoch: int | None = None) -> ChunkStorage:
    binding = FileSystemChunkStorage(str(tmp_path / "tier2"))
    for name, data in objects.items():
        checkpoint = system_names.parse_checkpoint(0, name)
        if checkpoint is None or checkpoint.epoch != drop_epoch:
            binding.create(name, bytes.fromhex(data))
    return binding


def _summary(binding: ChunkStorage) -> dict[str, Any]:
    found = replay(binding, 0)
    assert not (found.corrupt or found.torn or found.inconsistent or found.duplicates), found
    return {
        "layouts": {name: seg.encode() for name, seg in sorted(found.layout.segments.items())},
        "records": found.records,
        "max_record": {str(epoch): number for epoch, number in found.max_record.items()},
        "checkpoint": found.checkpoint,
        "covered": list(found.covered),
        "files": found.files,
    }


@pytest.mark.parametrize("kind", ["append", "no_append"])
@pytest.mark.parametrize("drop_epoch", [None, 2])
def test_a_journal_written_by_the_first_implementation_replays_the_same(
    tmp_path: Path, kind: str, drop_epoch: int | None
) -> None:
    written = WRITTEN[kind]
    # Without epoch 2's checkpoints, replay starts from epoch 1's and goes through all its records.
    expected = written["replay" if drop_epoch is None else "replay_without_epoch_2_checkpoints"]
    binding = _tier2(tmp_path, written["objects"], drop_epoch)
    try:
        assert _summary(binding) == expected
        booted = SystemJournal.boot(binding, 0, 3)
        assert {name: seg.encode() for name, seg in sorted(booted.layout.segments.items())} == (
            expected["layouts"]
        )
        assert _summary(binding)["layouts"] == expected["layouts"], "and so does the journal epoch 3 wrote"
    finally:
        binding.close()


def _journal_of_appends(tmp_path: Path, count: int) -> tuple[ChunkStorage, str, list[dict[str, Any]]]:
    """A filesystem tier-2 whose last journal file holds the ``add`` of a chunk, then
    ``count`` appends to it; returns it, that file's name, and the encoded layout of the
    metadata log after each of those records."""
    binding = FileSystemChunkStorage(str(tmp_path / "tier2"))
    journal = SystemJournal.boot(binding, 0, 1, JournalSettings(snapshot_records=10**9))
    segments = SystemSegments(journal, 1 << 20, lambda: None)
    segments.append(LOG, b"first", {"n": 0})
    layouts = [segments.layout(LOG).encode()]
    for i in range(count):
        segments.append(LOG, os.urandom(1 + i % 50), {"n": i + 1})
        layouts.append(segments.layout(LOG).encode())
    last = sorted(binding.list(system_names.journal_prefix(0)))[-1]
    return binding, last, layouts


def _frames(data: bytes) -> list[tuple[int, int]]:
    """(offset, end) of every frame in ``data``."""
    result, offset = [], 0
    while offset < len(data):
        length = int.from_bytes(data[offset : offset + 4], "big")
        result.append((offset, offset + framing.HEADER_BYTES + length))
        offset += framing.HEADER_BYTES + length
    return result


@pytest.mark.parametrize("damage", ["payload", "checksum", "not_a_map"])
def test_a_damaged_record_in_the_middle_of_a_file_is_skipped_and_counted(tmp_path: Path, damage: str) -> None:
    count, bad = 40, 17
    binding, name, layouts = _journal_of_appends(tmp_path, count)
    try:
        data = bytearray(read_object(binding, name))
        frames = _frames(bytes(data))
        assert len(frames) == count + 1  # the add of the chunk, then the appends
        start, end = frames[bad + 1]  # the record that made layouts[bad + 1]
        if damage == "payload":
            data[end - 3] ^= 0x5A
        elif damage == "checksum":
            data[start + 4] ^= 0x01
        else:  # a valid frame whose payload is a msgpack list: CRC passes, still corrupt
            body = msgpack.packb([1, 2, 3])
            data[start:end] = len(body).to_bytes(4, "big") + crc32c.crc32c(body).to_bytes(4, "big") + body
        binding.delete(binding.open_write(name))
        binding.create(name, bytes(data))
        found = replay(binding, 0)
        assert found.corrupt == 1 and found.torn == 0
        # The records after the gap no longer fit (their offsets are past the length).
        assert found.inconsistent == count - bad - 1
        assert found.layout.segment(LOG).encode() == layouts[bad]
        assert found.records == bad + 1  # the add and the appends before the damage
    finally:
        binding.close()


def test_a_journal_file_that_vanishes_before_its_read_is_counted(tmp_path: Path) -> None:
    binding, name, _ = _journal_of_appends(tmp_path, 5)
    try:
        for checkpoint in list(binding.list(system_names.checkpoints_prefix(0))):
            binding.delete(ChunkHandle(checkpoint, readonly=False))  # replay reads the files alone
        faulty = FaultyChunkStorage(binding)
        faulty.fail_nth("read", 2, ChunkNotFound)  # its length was read, then it was gone
        found = replay(faulty, 0)
        assert found.vanished == 1 and name not in found.files
        assert found.records == 1 and found.layout.segment(LOG).encode()["chunks"] == []  # the boot record
        again = replay(binding, 0)
        assert again.vanished == 0 and again.records == 1 + 6 and name in again.files
    finally:
        binding.close()
