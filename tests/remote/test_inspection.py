"""The check of a rolled segment's files before it is tiered (``slts.remote.inspection``):
genuine logs built by kafka-python pass and are summarised as a whole-log scan does; every
kind of damage is refused naming the segment, position and offset; the bytes inspected
are exactly the first ``size_bytes``; memory does not grow with the number of batches."""

from __future__ import annotations

import dataclasses
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from slts.tools.kafka_logs import (
    BatchInfo,
    KafkaLog,
    build_log,
    kafka_index_bytes,
    write_log_dir,
    write_uniform_log,
)

from slts.errors import InvalidArgument, InvalidLogSegment
from slts.remote import kafka_formats as kf
from slts.remote.inspection import InspectedLog, inspect_segment
from slts.remote.rsm import LogSegmentData

BASE = 5000
LABEL = "payments-7 segment 00000000000000005000"


@pytest.fixture(scope="module")
def kafka_log() -> KafkaLog:
    """600 batches of 3 records (about 200 KB) under three leader epochs."""
    return build_log(BASE, 600, leader_epochs=((2, BASE), (3, BASE + 300), (7, BASE + 1200)), seed=4)


def segment_data(folder: Path, log: KafkaLog) -> LogSegmentData:
    paths = write_log_dir(folder, log)
    return LogSegmentData(
        log=paths["log"],
        offset_index=paths["index"],
        time_index=paths["timeindex"],
        leader_epoch_checkpoint=log.leader_epoch_checkpoint,
    )


def refused(data: LogSegmentData, **kwargs: object) -> InvalidLogSegment:
    with pytest.raises(InvalidLogSegment) as caught:
        inspect_segment(data, label=LABEL, **kwargs)  # type: ignore[arg-type]
    assert caught.value.segment == LABEL, "the error names the segment"
    return caught.value


def test_a_genuine_log_passes_and_is_summarised_as_a_whole_log_scan(
    kafka_log: KafkaLog, tmp_path: Path
) -> None:
    data = segment_data(tmp_path, kafka_log)
    inspected = inspect_segment(data, label=LABEL)
    assert isinstance(inspected, InspectedLog)
    assert inspected.summary == kf.scan_log(data.log, segment=LABEL)
    assert inspected.summary.base_offset == BASE and inspected.summary.end_offset == kafka_log.end_offset
    assert inspected.summary.size_bytes == len(kafka_log.data)
    assert inspected.summary.leader_epochs == {2: BASE, 3: BASE + 300, 7: BASE + 1200}
    assert inspected.batches == inspected.summary.batch_count == 600
    assert inspected.leader_epoch_checkpoint == [(2, BASE), (3, BASE + 300), (7, BASE + 1200)]
    assert inspect_segment(data, label=LABEL, size_bytes=len(kafka_log.data)) == inspected


def flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_record_byte_is_a_crc_mismatch(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    batch = kafka_log.batches[123]
    flip(Path(data.log), batch.position + 70)
    error = refused(data)
    assert (error.position, error.offset) == (batch.position, batch.base_offset)
    assert "CRC mismatch" in str(error)


def test_a_truncated_last_batch(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    Path(data.log).write_bytes(kafka_log.data[:-7])
    error = refused(data)
    assert (error.position, error.offset) == (
        kafka_log.batches[-1].position,
        kafka_log.batches[-1].base_offset,
    )


def test_offsets_that_do_not_increase(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    batch = kafka_log.batches[10]
    raw = bytearray(kafka_log.data)
    struct.pack_into(">q", raw, batch.position, kafka_log.batches[9].base_offset)  # outside the CRC
    Path(data.log).write_bytes(bytes(raw))
    error = refused(data)
    assert (error.position, error.offset) == (batch.position, kafka_log.batches[9].base_offset)


def test_a_leader_epoch_that_goes_back(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    batch = kafka_log.batches[200]  # in epoch 3; set it to 2 after batches of epoch 3
    raw = bytearray(kafka_log.data)
    struct.pack_into(">i", raw, batch.position + 12, 2)
    Path(data.log).write_bytes(bytes(raw))
    error = refused(data)
    assert (error.position, error.offset) == (batch.position, batch.base_offset)


def offset_entries(log: KafkaLog) -> list[tuple[int, int]]:
    return list(struct.iter_unpack(">II", log.offset_index))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_an_index_entry_into_a_batch(kafka_log: KafkaLog, tmp_path: Path, where: str) -> None:
    data = segment_data(tmp_path, kafka_log)
    entries = offset_entries(kafka_log)
    number = {"first": 0, "middle": len(entries) // 2, "last": len(entries) - 1}[where]
    relative, position = entries[number]
    entries[number] = (relative, position + 3)
    Path(data.offset_index).write_bytes(b"".join(struct.pack(">II", *e) for e in entries))
    error = refused(data)
    assert (error.position, error.offset) == (position + 3, BASE + relative)
    assert "not the start of a batch" in str(error)


def test_an_index_entry_past_the_log(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    past = struct.pack(">II", kafka_log.end_offset + 5 - BASE, len(kafka_log.data))
    Path(data.offset_index).write_bytes(kafka_log.offset_index + past)
    error = refused(data)
    assert (error.position, error.offset) == (len(kafka_log.data), kafka_log.end_offset + 5)


@pytest.mark.parametrize("change", ["below its batch", "past the next indexed batch", "past the end"])
def test_an_index_entry_offset_outside_its_reach(kafka_log: KafkaLog, tmp_path: Path, change: str) -> None:
    data = segment_data(tmp_path, kafka_log)
    entries = offset_entries(kafka_log)
    by_position = {batch.position: batch for batch in kafka_log.batches}
    number = len(entries) - 1 if change == "past the end" else 4
    position = entries[number][1]
    if change == "below its batch":
        offset = by_position[position].base_offset
    elif change == "past the next indexed batch":
        offset = by_position[entries[number + 1][1]].base_offset
    else:
        offset = kafka_log.end_offset + 1
    if change == "below its batch":  # keep the offsets strictly increasing
        assert offset > BASE + entries[number - 1][0]
    entries[number] = (offset - BASE, position)
    Path(data.offset_index).write_bytes(b"".join(struct.pack(">II", *e) for e in entries))
    error = refused(data)
    assert (error.position, error.offset) == (position, offset)


def test_older_followers_multi_batch_entries_pass(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    entries = offset_entries(kafka_log)
    position = entries[3][1]
    after = next(batch for batch in kafka_log.batches if batch.position > position)
    entries[3] = (after.last_offset - BASE, position)
    Path(data.offset_index).write_bytes(b"".join(struct.pack(">II", *e) for e in entries))
    inspect_segment(data, label=LABEL)


def test_an_index_of_odd_length_or_out_of_order(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    Path(data.offset_index).write_bytes(kafka_log.offset_index + b"\x00")
    assert refused(data).position == len(kafka_log.offset_index)
    entries = offset_entries(kafka_log)
    entries[2], entries[3] = entries[3], entries[2]
    Path(data.offset_index).write_bytes(b"".join(struct.pack(">II", *e) for e in entries))
    assert refused(data).offset == BASE + entries[3][0]


def test_a_time_index_entry_outside_the_offsets(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    beyond = struct.pack(">qI", 1 << 50, kafka_log.end_offset + 1 - BASE)
    Path(data.time_index).write_bytes(kafka_log.time_index + beyond)
    error = refused(data)
    assert error.offset == kafka_log.end_offset + 1 and "time index" in str(error)
    Path(data.time_index).write_bytes(kafka_log.time_index[:-1])
    refused(data)


def test_a_bad_checkpoint(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = dataclasses.replace(segment_data(tmp_path, kafka_log), leader_epoch_checkpoint=b"0\n3\n0 0\n")
    assert refused(data).line == 2


def test_an_empty_log(tmp_path: Path, kafka_log: KafkaLog) -> None:
    data = segment_data(tmp_path, kafka_log)
    Path(data.log).write_bytes(b"")
    assert "empty log" in str(refused(data))
    Path(data.log).write_bytes(kafka_log.data)
    assert "empty log" in str(refused(data, size_bytes=0))


def test_bytes_past_size_bytes_are_not_inspected(kafka_log: KafkaLog, tmp_path: Path) -> None:
    """A broker appends to the file after the segment's size was taken: the appended bytes
    (here garbage) are never read; without a size, the file's size at open is the end."""
    data = segment_data(tmp_path, kafka_log)
    with open(data.log, "ab") as file:
        file.write(b"\xff" * 100)
    inspected = inspect_segment(data, label=LABEL, size_bytes=len(kafka_log.data))
    assert inspected.summary.size_bytes == len(kafka_log.data)
    assert inspected.summary.end_offset == kafka_log.end_offset
    assert refused(data).position == len(kafka_log.data), "without a size the garbage is inspected"


def test_size_bytes_inside_a_batch_or_past_the_file(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    last = kafka_log.batches[-1]
    error = refused(data, size_bytes=last.position + 30)
    assert (error.position, error.offset) == (last.position, last.base_offset) and "truncated" in str(error)
    error = refused(data, size_bytes=len(kafka_log.data) + 1)
    assert error.position == len(kafka_log.data) and "fewer than" in str(error)
    shorter = last.position  # a whole number of batches: a shorter segment, fine
    assert inspect_segment(data, label=LABEL, size_bytes=shorter).summary.end_offset == last.base_offset - 1


def test_bad_arguments_are_invalid_argument(kafka_log: KafkaLog, tmp_path: Path) -> None:
    data = segment_data(tmp_path, kafka_log)
    for call in (
        lambda: inspect_segment("log", label=LABEL),  # type: ignore[arg-type]
        lambda: inspect_segment(data, label=7),  # type: ignore[arg-type]
        lambda: inspect_segment(data, label=LABEL, size_bytes=-1),
        lambda: inspect_segment(data, label=LABEL, size_bytes=True),
        lambda: inspect_segment(dataclasses.replace(data, leader_epoch_checkpoint="0\n0\n"), label=LABEL),  # type: ignore[arg-type]
        lambda: inspect_segment(dataclasses.replace(data, log=tmp_path / "missing.log"), label=LABEL),
        lambda: inspect_segment(dataclasses.replace(data, offset_index=tmp_path / "missing"), label=LABEL),
    ):
        with pytest.raises(InvalidArgument) as caught:
            call()
        assert not isinstance(caught.value, InvalidLogSegment), caught.value


def test_a_uniform_logs_indexes_are_kafkas(tmp_path: Path) -> None:
    """The helper of the memory test and the bench writes the indexes Kafka's rule gives."""
    for batch_bytes, interval in ((100, 4096), (100, 50), (300, 100_000), (1000, 4096)):
        log = write_uniform_log(
            tmp_path / f"{batch_bytes}-{interval}",
            batch_bytes=batch_bytes,
            total_bytes=120_000,
            base_offset=BASE,
            interval_bytes=interval,
        )
        batches = [
            BatchInfo(number * batch_bytes, batch_bytes, BASE + number, BASE + number, log.timestamp, 0)
            for number in range(log.batch_count)
        ]
        offset_index, time_index = kafka_index_bytes(batches, BASE, interval)
        assert log.paths["index"].read_bytes() == offset_index
        assert log.paths["timeindex"].read_bytes() == time_index
        data = LogSegmentData(
            log.paths["log"],
            log.paths["index"],
            log.paths["timeindex"],
            log.paths["leader-epoch-checkpoint"].read_bytes(),
        )
        summary = inspect_segment(data, label=LABEL).summary
        assert (summary.base_offset, summary.end_offset, summary.size_bytes) == (
            BASE,
            log.end_offset,
            log.size_bytes,
        )


def peak_bytes_inspecting(folder: Path, batches: int) -> int:
    """tracemalloc's peak while inspecting a log of ``batches`` 100-byte batches whose
    offset index has about 50 entries whatever the count. Measured in a child process
    with nothing else running: tracemalloc counts every thread's allocations, and a test
    process has the threads earlier tests left (a store's flusher, an S3 client's pool)."""
    log = write_uniform_log(folder, batch_bytes=100, total_bytes=batches * 100, interval_bytes=batches * 2)
    paths = [str(log.paths[kind]) for kind in ("log", "index", "timeindex", "leader-epoch-checkpoint")]
    child = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(batches), *paths],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.returncode == 0, child.stderr
    return int(child.stdout)


#: The child's work: inspect the log in blocks of 64 KiB (so that both logs span many
#: blocks; at the default 1 MiB the small one would be read in one) and print the peak.
_MEASURE = """
import gc, sys, tracemalloc
from pathlib import Path
from slts.remote import kafka_formats as kf
from slts.remote.inspection import inspect_segment
from slts.remote.rsm import LogSegmentData
kf.SCAN_BLOCK_BYTES = 64 << 10
batches, log, index, time_index, checkpoint = int(sys.argv[1]), *sys.argv[2:]
data = LogSegmentData(log, index, time_index, Path(checkpoint).read_bytes())
gc.collect()
tracemalloc.start()
inspected = inspect_segment(data, label="measured")
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
assert inspected.batches == batches, inspected
print(peak)
"""


def test_memory_does_not_grow_with_the_number_of_batches(tmp_path: Path) -> None:
    """Ten times the batches (and the same number of index entries): the peak of Python
    allocations stays the same within a few KB. Keeping every batch's header (about 380
    bytes each) would add some 30 MB here."""
    small = peak_bytes_inspecting(tmp_path / "small", 10_000)
    large = peak_bytes_inspecting(tmp_path / "large", 100_000)
    assert large - small < 16 << 10, (small, large)
    assert large < 1 << 20, large  # two blocks, the index files, a few objects
