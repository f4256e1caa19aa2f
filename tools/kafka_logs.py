"""Genuine Kafka log segments, built with kafka-python: the broker's side of tiered
storage (``slts.remote``) for ``slts demo --kafka``, ``slts bench`` and the tests.

The record batches are built by kafka-python's own v2 batch builder, and records are read
back with its own reader (``decode_records``, the check a consumer would do), so
``slts.remote.kafka_formats`` is checked against a Kafka client's bytes, not against
itself. kafka-python is the optional extra ``kafka`` (``pip install 'slts[kafka]'``);
without it every builder raises ``InvalidConfig`` naming the extra.

The offset and time indexes a broker would write next to the log are built here too,
from the batch sizes, offsets and timestamps with plain ``struct`` packing
(``kafka_index_bytes``), deliberately independent of ``slts.remote``: the tests compare
the library's indexes with these bytes.

* ``make_batch``: one batch at a given base offset and leader epoch;
* ``build_log``: a whole segment (``KafkaLog``): the ``.log`` bytes, every record, the
  indexes and the leader-epoch checkpoint;
* ``decode_records``: the records of concatenated batches, as kafka-python reads them;
* ``write_log_dir``: the segment's files as Kafka names them in a partition folder.
* ``write_uniform_log``: a segment of any size of equal one-record batches, streamed to
  its files with its indexes (the bench's 1 GiB segments of 100-byte batches).
"""

from __future__ import annotations

import itertools
import random
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slts.errors import InvalidConfig


def _kafka() -> tuple[Any, Any]:
    """kafka-python's ``default_records`` and ``memory_records`` modules."""
    try:
        with warnings.catch_warnings():
            # Importing any kafka module runs the package's __init__, which loads its protocol
            # schemas with importlib.resources calls deprecated since Python 3.11 (about 200
            # DeprecationWarnings): noise about kafka-python's client, which is not used here.
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka.record import default_records, memory_records
    except ImportError as exc:
        raise InvalidConfig(
            "Kafka-format logs are built with kafka-python: install the extra, pip install 'slts[kafka]'"
        ) from exc
    return default_records, memory_records


#: (offset, key, value, timestamp in ms) of one record.
Record = tuple[int, bytes | None, bytes, int]

#: Kafka's default ``index.interval.bytes``.
INDEX_INTERVAL_BYTES = 4096
#: Byte positions of the two header fields a broker fills in on append (see ``make_batch``).
_BASE_OFFSET_AT = 0
_LEADER_EPOCH_AT = 12
#: A timestamp around 2023-11, in ms, so the timestamps look like real ones.
_EPOCH_MS = 1_700_000_000_000


def make_batch(
    base_offset: int,
    records: Sequence[tuple[bytes | None, bytes, int]],
    *,
    leader_epoch: int = 0,
    compression: int = 0,
) -> bytes:
    """One magic-2 batch of ``records`` ((key, value, timestamp ms), no headers), as a
    broker stores it: offsets ``base_offset`` onwards, ``leader_epoch`` in the header.

    ``compression`` is kafka-python's codec number (0 none, 1 gzip).
    """
    assert records, "a batch holds at least one record"
    default_records, _ = _kafka()
    builder = default_records.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for delta, (key, value, timestamp) in enumerate(records):
        # The builder takes offsets relative to the batch (a producer's batch starts at 0).
        assert builder.append(delta, timestamp=timestamp, key=key, value=value, headers=[]) is not None
    batch = builder.build()
    # A producer sends base offset 0 and leader epoch 0; the broker assigns the real base
    # offset and its partition leader epoch when it appends the batch. Both fields lie before
    # the CRC's range (which starts at the attributes, byte 21), so, as on the broker, they
    # are set in place and the builder's CRC stays valid.
    struct.pack_into(">q", batch, _BASE_OFFSET_AT, base_offset)
    struct.pack_into(">i", batch, _LEADER_EPOCH_AT, leader_epoch)
    return bytes(batch)


@dataclass(frozen=True)
class BatchInfo:
    """Where one batch of a built log lies and what it holds (known from building it)."""

    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    leader_epoch: int


@dataclass(frozen=True)
class KafkaLog:
    """A Kafka log segment built by ``build_log`` and the files a broker keeps beside it."""

    base_offset: int
    #: The ``.log`` file's bytes.
    data: bytes
    #: (offset, key, value, timestamp) of every record, in offset order.
    records: list[Record]
    #: The last record's offset (inclusive).
    end_offset: int
    batches: list[BatchInfo]
    #: (epoch, start offset) of every leader epoch in the log.
    leader_epochs: list[tuple[int, int]]
    interval_bytes: int
    #: The ``.index`` and ``.timeindex`` a broker writes for ``data`` (``kafka_index_bytes``).
    offset_index: bytes
    time_index: bytes
    leader_epoch_checkpoint: bytes


def kafka_index_bytes(
    batches: Sequence[BatchInfo], base_offset: int, interval_bytes: int = INDEX_INTERVAL_BYTES
) -> tuple[bytes, bytes]:
    """The ``.index`` and ``.timeindex`` bytes a broker writes for a rolled segment of ``batches``.

    Kafka's LogSegment, batch by batch: the greatest batch max timestamp so far (and the
    last offset of the first batch reaching it) is updated first; then, if the byte counter
    (bytes appended since the last index entry) exceeds ``interval_bytes``, the offset index
    gets (the batch's last offset, the batch's position), the time index gets (max timestamp
    so far, its offset) if that timestamp is above the time index's last one (-1 when
    empty), and the counter restarts; then the counter grows by the batch's size. When the
    segment rolls, the time index is offered the final maximum once more, same rule.
    """
    offset_index = bytearray()
    time_index = bytearray()
    counter = 0
    max_timestamp, offset_of_max = -1, base_offset
    last_indexed_timestamp = -1
    for batch in batches:
        if batch.max_timestamp > max_timestamp:
            max_timestamp, offset_of_max = batch.max_timestamp, batch.last_offset
        if counter > interval_bytes:
            offset_index += struct.pack(">ii", batch.last_offset - base_offset, batch.position)
            if max_timestamp > last_indexed_timestamp:
                time_index += struct.pack(">qi", max_timestamp, offset_of_max - base_offset)
                last_indexed_timestamp = max_timestamp
            counter = 0
        counter += batch.size
    if max_timestamp > last_indexed_timestamp:  # the entry added when the segment rolls
        time_index += struct.pack(">qi", max_timestamp, offset_of_max - base_offset)
    return bytes(offset_index), bytes(time_index)


def leader_epoch_checkpoint_bytes(entries: Sequence[tuple[int, int]]) -> bytes:
    """A ``leader-epoch-checkpoint`` file: version 0, the count, one "epoch offset" line each."""
    lines = ["0", str(len(entries)), *(f"{epoch} {offset}" for epoch, offset in entries)]
    return "".join(f"{line}\n" for line in lines).encode()


def build_log(
    base_offset: int,
    batch_count: int,
    *,
    records_per_batch: int = 3,
    leader_epochs: Sequence[tuple[int, int]] | None = None,
    seed: int = 0,
    value_bytes: int = 100,
    interval_bytes: int = INDEX_INTERVAL_BYTES,
) -> KafkaLog:
    """A segment of ``batch_count`` batches of ``records_per_batch`` records from ``base_offset``.

    Offsets are contiguous. Values are random bytes of about ``value_bytes`` (varying, so
    batch sizes vary); every fifth key is None; timestamps grow about 10 ms per record with
    random jitter of a few hundred ms, so they are not monotonic within or across batches.
    ``leader_epochs`` ((epoch, start offset), increasing; default: epoch 0 from the start)
    must start at batch boundaries within the log; each batch carries the epoch in force at
    its base offset. Deterministic for a given ``seed``.
    """
    epochs = list(leader_epochs) if leader_epochs is not None else [(0, base_offset)]
    _check_epochs(epochs, base_offset, batch_count, records_per_batch)
    rng = random.Random(seed)
    data = bytearray()
    records: list[Record] = []
    batches: list[BatchInfo] = []
    for number in range(batch_count):
        first = base_offset + number * records_per_batch
        content = [_record(rng, first + delta, value_bytes) for delta in range(records_per_batch)]
        epoch = max(epoch for epoch, start in epochs if start <= first)
        batch = make_batch(first, [(key, value, ts) for _, key, value, ts in content], leader_epoch=epoch)
        last = first + records_per_batch - 1
        batches.append(BatchInfo(len(data), len(batch), first, last, max(ts for *_, ts in content), epoch))
        data += batch
        records += content
    offset_index, time_index = kafka_index_bytes(batches, base_offset, interval_bytes)
    return KafkaLog(
        base_offset=base_offset,
        data=bytes(data),
        records=records,
        end_offset=records[-1][0],
        batches=batches,
        leader_epochs=epochs,
        interval_bytes=interval_bytes,
        offset_index=offset_index,
        time_index=time_index,
        leader_epoch_checkpoint=leader_epoch_checkpoint_bytes(epochs),
    )


def _check_epochs(
    epochs: list[tuple[int, int]], base_offset: int, batch_count: int, records_per_batch: int
) -> None:
    """ValueError unless the epochs increase and start at batch boundaries of the log."""
    assert batch_count > 0 and records_per_batch > 0
    if not epochs or epochs[0][1] != base_offset:
        raise ValueError(f"the first leader epoch must start at the base offset {base_offset}")
    for (epoch, start), (next_epoch, next_start) in itertools.pairwise(epochs):
        if next_epoch <= epoch or next_start <= start:
            raise ValueError(f"leader epochs must increase: {epochs}")
    for _, start in epochs:
        batch, rest = divmod(start - base_offset, records_per_batch)
        if rest or not 0 <= batch < batch_count:
            raise ValueError(f"leader epoch start {start} is not a batch's base offset")


def _record(rng: random.Random, offset: int, value_bytes: int) -> Record:
    """One record at ``offset``: key, value and timestamp drawn from ``rng``."""
    key = None if offset % 5 == 0 else b"key-%d" % rng.randrange(1000)
    value = rng.randbytes(rng.randint(value_bytes // 2, value_bytes * 3 // 2))
    timestamp = _EPOCH_MS + offset * 10 + rng.randint(-300, 300)
    return offset, key, value, timestamp


def decode_records(data: bytes, *, allow_partial: bool = False) -> list[Record]:
    """The records of ``data`` (batches back to back), read by kafka-python as a consumer
    reads a fetch response: each batch's CRC checked, then its records decoded.

    Raises AssertionError for a CRC mismatch, or for bytes left after the last whole batch
    unless ``allow_partial`` (a fetch may end inside a batch).
    """
    default_records, memory_records = _kafka()
    memory = memory_records.MemoryRecords(bytes(data))
    records: list[Record] = []
    while memory.has_next():
        batch = memory.next_batch()
        assert isinstance(batch, default_records.DefaultRecordBatch), "only magic 2 batches are expected"
        assert batch.validate_crc(), f"kafka-python finds a CRC mismatch at offset {batch.base_offset}"
        records += [(record.offset, record.key, record.value, record.timestamp) for record in batch]
    assert allow_partial or memory.valid_bytes() == len(data), "bytes left after the last batch"
    return records


def segment_file_stem(base_offset: int) -> str:
    """Kafka's name for a segment's files: the base offset, zero-padded to 20 digits."""
    return f"{base_offset:020d}"


def write_log_dir(folder: Path | str, kafka_log: KafkaLog) -> dict[str, Path]:
    """Write ``kafka_log`` into ``folder`` as a partition folder holds it: ``<stem>.log``,
    ``<stem>.index``, ``<stem>.timeindex`` and ``leader-epoch-checkpoint``.

    Returns the paths by kind: ``log``, ``index``, ``timeindex``, ``leader-epoch-checkpoint``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = segment_file_stem(kafka_log.base_offset)
    contents = {
        "log": (f"{stem}.log", kafka_log.data),
        "index": (f"{stem}.index", kafka_log.offset_index),
        "timeindex": (f"{stem}.timeindex", kafka_log.time_index),
        "leader-epoch-checkpoint": ("leader-epoch-checkpoint", kafka_log.leader_epoch_checkpoint),
    }
    paths: dict[str, Path] = {}
    for kind, (name, content) in contents.items():
        paths[kind] = folder / name
        paths[kind].write_bytes(content)
    return paths


@dataclass(frozen=True)
class UniformLog:
    """A segment of ``batch_count`` equal one-record batches written by ``write_uniform_log``."""

    #: The files by kind, as ``write_log_dir`` names them.
    paths: dict[str, Path]
    base_offset: int
    end_offset: int
    batch_size: int
    batch_count: int
    size_bytes: int
    #: The one ``maxTimestamp`` every batch has.
    timestamp: int


def uniform_batch(batch_bytes: int, base_offset: int = 0, timestamp: int = _EPOCH_MS) -> bytes:
    """A magic-2 batch of exactly ``batch_bytes`` bytes holding one record (no key; its
    value fills the rest). ValueError below the smallest such batch (about 70 bytes)."""
    value_bytes = max(0, batch_bytes - 80)
    for _ in range(8):  # the record's varints grow with the value: converge on the size
        batch = make_batch(base_offset, [(None, b"v" * value_bytes, timestamp)])
        if len(batch) == batch_bytes:
            return batch
        value_bytes += batch_bytes - len(batch)
        if value_bytes < 0:
            break
    raise ValueError(f"no one-record batch of exactly {batch_bytes} bytes")


def write_uniform_log(
    folder: Path | str,
    *,
    batch_bytes: int,
    total_bytes: int,
    base_offset: int = 0,
    interval_bytes: int = INDEX_INTERVAL_BYTES,
) -> UniformLog:
    """Write a segment of ``total_bytes // batch_bytes`` copies of one ``uniform_batch``
    with consecutive offsets from ``base_offset`` (only the base offset differs between
    them: it lies before the CRC's range, so each copy's CRC holds), with the offset and
    time indexes a broker writes for it (the rule of ``kafka_index_bytes``, computed for
    equal batches without a list of them) and a one-epoch checkpoint, into ``folder`` as
    ``write_log_dir`` does. Streams the log in blocks of about 4 MiB: any size, in bounded
    memory (the bench's 1 GiB segments)."""
    timestamp = _EPOCH_MS
    batch = uniform_batch(batch_bytes, timestamp=timestamp)
    count = total_bytes // batch_bytes
    if count < 1:
        raise ValueError(f"{total_bytes} bytes hold no batch of {batch_bytes}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = segment_file_stem(base_offset)
    per_block = max(1, (4 << 20) // batch_bytes)
    paths = {
        "log": folder / f"{stem}.log",
        "index": folder / f"{stem}.index",
        "timeindex": folder / f"{stem}.timeindex",
        "leader-epoch-checkpoint": folder / "leader-epoch-checkpoint",
    }
    with open(paths["log"], "wb") as file:
        block = bytearray(batch * per_block)
        for first in range(0, count, per_block):
            in_block = min(per_block, count - first)
            for number in range(in_block):
                struct.pack_into(
                    ">q", block, number * batch_bytes + _BASE_OFFSET_AT, base_offset + first + number
                )
            file.write(memoryview(block)[: in_block * batch_bytes])
    # Kafka's rule for equal batches: after an entry (or from the start) the counter grows
    # by one batch at a time, and the batch that finds it above the interval gets the next
    # entry, so every ``step``-th batch is indexed. Every batch has the same max timestamp,
    # reached by the first batch: the time index holds that one entry.
    step = interval_bytes // batch_bytes + 1
    paths["index"].write_bytes(
        b"".join(struct.pack(">ii", number, number * batch_bytes) for number in range(step, count, step))
    )
    paths["timeindex"].write_bytes(struct.pack(">qi", timestamp, 0))
    paths["leader-epoch-checkpoint"].write_bytes(leader_epoch_checkpoint_bytes([(0, base_offset)]))
    return UniformLog(
        paths, base_offset, base_offset + count - 1, batch_bytes, count, count * batch_bytes, timestamp
    )
