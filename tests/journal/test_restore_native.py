"""Restore's bulk path against the one-by-one path, and the compiled log walk against its twin.

* ``restore`` loads the metadata snapshot in batches and the metadata log in windows
  (``replicate_rows``, the last operation on a key winning), walking plain log records
  straight from the bytes. The one-by-one restore (each snapshot page one ``replicate``,
  each log commit one ``replicate`` with its own sequence, every record decoded) is the
  reference: both leave the same store, equal to the source, whatever the window size,
  the piece size the segments are read in (records cut across pieces) and the walk
  (compiled or pure Python).
* The compiled walk (``slts.journal._replay.changes``) against its pure-Python twin
  (``metadata_copy.changes_python``): the same answers and the same window on log records
  whole, damaged or strange.
* Damage to the log (a flipped byte, a cut tail, a missing record) raises
  ``MetadataCorrupted`` on every path.
"""

from __future__ import annotations

import os
import random
import struct
from types import SimpleNamespace
from typing import Any

import crc32c
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slts.journal import framing, metadata_copy, restore, system_segments
from slts.journal.metadata_copy import changes_python, decode_change, iter_snapshot, plain_change_python
from slts.journal.replay import replay
from slts.journal.system_names import METADATA_LOG, METADATA_SNAPSHOTS
from slts.journal.system_segments import iter_range

from slts.errors import MetadataCorrupted
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.metadata.store import MetadataStore, Put
from slts.transforms.sealed import MARKER
from tests.journal.test_durable_copy import MANUAL, churn, lose_machine
from tests.support.engine import Env, env_fixture

env = env_fixture([("memory", "memory"), ("filesystem", "lmdb"), ("no-append", "memory")])

BUILT = metadata_copy.NATIVE
PYTHON = SimpleNamespace(changes=changes_python)


def _require_built() -> Any:
    if BUILT is None:
        if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
            pytest.fail("SLTS_REQUIRE_NATIVE=1, but slts.journal._replay is not built")
        pytest.skip("slts.journal._replay is not built (no C compiler at install)")
    return BUILT


# -- the one-by-one reference -------------------------------------------------------------------------


def restore_one_by_one(env: Env, target: MetadataStore) -> None:
    """What restore did before it loaded in bulk: a ``replicate`` per snapshot page and per
    log commit, every record decoded by ``iter_records_strict`` (no epoch raised)."""
    found = replay(env.binding, 0)
    snapshots = found.layout.segment(METADATA_SNAPSHOTS)
    sequence = 0
    if "sequence" in snapshots.attrs:
        sequence = snapshots.attrs["sequence"]
        pieces = iter_range(env.binding, snapshots, snapshots.start_offset, snapshots.attrs["end"])
        for _, table, rows in iter_snapshot(pieces):
            if rows:
                target.replicate(sequence, [Put(table, k, v) for k, _, v in rows], [v for _, v, _ in rows])
        if target.last_sequence < sequence:
            target.replicate(sequence, [])
    log = found.layout.segment(METADATA_LOG)
    for record in framing.iter_records_strict(iter_range(env.binding, log, log.start_offset, log.length)):
        change_sequence, ops = decode_change(record)
        if change_sequence > sequence:
            assert change_sequence == sequence + 1
            target.replicate(change_sequence, ops)
            sequence = change_sequence


def _written(env: Env, seed: int) -> dict[str, Any]:
    """A container churned, snapshotted half-way, its log flushed; then the machine lost.
    Returns the source store's tables."""
    storage = env.open(**MANUAL)
    rng = random.Random(seed)
    churn(storage, rng, 60)
    storage.durable.snapshot()
    churn(storage, rng, 90)
    storage.durable.flush()
    source = env.store.dump()
    lose_machine(storage, env)
    return source


CONFIGURATIONS = [
    ("native", 20_000, None),
    ("native", 3, 97),
    ("python", 20_000, None),
    ("python", 1, 13),
    ("none", 20_000, None),  # no walk: every record one by one
    ("none", 2, 31),
]


@pytest.mark.parametrize(("walker", "window", "piece"), CONFIGURATIONS)
def test_restore_in_bulk_gives_the_one_by_one_restore(
    env: Env, monkeypatch: pytest.MonkeyPatch, walker: str, window: int, piece: int | None
) -> None:
    walkers = {"python": PYTHON, "none": None}
    monkeypatch.setattr(metadata_copy, "NATIVE", _require_built() if walker == "native" else walkers[walker])
    monkeypatch.setattr(restore, "LOG_OPS_PER_WINDOW", window)
    monkeypatch.setattr(restore, "SNAPSHOT_ROWS_PER_LOAD", max(window, 2))
    if piece is not None:  # records cut across pieces, also on a binding that maps its objects
        monkeypatch.setattr(env.binding, "maps_reads", False, raising=False)
        monkeypatch.setattr(
            restore,
            "iter_range",
            lambda *args, **kwargs: system_segments.iter_range(*args[:4], piece, views=True),
        )
    source = _written(env, seed=window)
    bulk, one_by_one = MemoryMetadataStore(TABLES), MemoryMetadataStore(TABLES)
    try:
        report = restore.restore(env.binding, 0, bulk)
        restore_one_by_one(env, one_by_one)
        assert report.log_records > 50 and report.sequence == one_by_one.last_sequence
        expected, found = one_by_one.dump(), bulk.dump()
        for table in TABLES:
            if table != "container":  # restore raises the epoch in a commit of its own
                assert found[table] == expected[table] == source[table], table
    finally:
        bulk.close()
        one_by_one.close()


def _log_chunk(env: Env) -> tuple[str, bytes]:
    found = replay(env.binding, 0)
    log = found.layout.segment(METADATA_LOG)
    chunk = log.chunks[-1]
    data = env.binding.read(env.binding.open_read(chunk.name), 0, chunk.length)
    return chunk.name, data


def _replace(env: Env, name: str, data: bytes) -> None:
    env.binding.delete(env.binding.open_write(name))
    env.binding.create(name, data)


@pytest.mark.parametrize("walker", ["native", "python", "none"])
@pytest.mark.parametrize("damage", ["flip", "cut", "gap"])
def test_a_damaged_log_raises_metadata_corrupted(
    env: Env, monkeypatch: pytest.MonkeyPatch, walker: str, damage: str
) -> None:
    walkers = {"python": PYTHON, "none": None}
    monkeypatch.setattr(metadata_copy, "NATIVE", _require_built() if walker == "native" else walkers[walker])
    _written(env, seed=5)
    name, data = _log_chunk(env)
    frames, offset = [], 0
    while offset < len(data):
        end = offset + framing.HEADER_BYTES + int.from_bytes(data[offset : offset + 4], "big")
        frames.append((offset, end))
        offset = end
    start, end = frames[len(frames) // 2]
    if damage == "flip":
        data = data[: end - 2] + bytes([data[end - 2] ^ 0x10]) + data[end - 1 :]
    elif damage == "cut":
        data = data[: end - 1]  # the journal says the chunk holds more: too short
    else:
        data = data[:start] + data[end:]
        data += os.urandom(end - start)  # the length the journal knows, a record missing
    _replace(env, name, data)
    target = MemoryMetadataStore(TABLES)
    try:
        with pytest.raises(MetadataCorrupted):
            restore.restore(env.binding, 0, target)
    finally:
        target.close()


# -- the compiled walk and its twin ---------------------------------------------------------------------

WINDOW_TABLES = ("segments", "chunks", "gc")


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _frame(body: bytes) -> bytes:
    return framing.HEADER.pack(len(body), crc32c.crc32c(body)) + body


VARIANTS = [
    "plain", "plain", "plain", "plain", "plain", "covered", "wide", "reversed", "big", "delete",
    "gap", "sealed", "checksum", "extra_key", "repeated_key", "sequence_str", "sequence_huge", "ops_map",
    "op_two", "op_four", "unknown_table", "table_bin", "key_str", "value_str", "trailing", "empty", "torn",
]  # fmt: skip


def _variant_frame(variant: str, sequence: int, rng: random.Random) -> tuple[bytes, int]:
    """A log record of ``variant`` after ``sequence``, and the sequence after it if taken."""
    count = 40 if variant == "big" else rng.randint(0, 4)
    ops: list[Any] = [
        [rng.choice(WINDOW_TABLES), rng.randbytes(rng.randint(1, 3)), rng.choice([None, rng.randbytes(5)])]
        for _ in range(count)
    ]
    if variant == "delete":
        ops = [[WINDOW_TABLES[0], b"k", None]]
    number: Any = sequence + 1
    if variant == "covered":
        number = sequence - rng.randint(0, 3)
    if variant == "gap":
        number = sequence + 2
    if variant == "sequence_str":
        number = str(sequence + 1)
    if variant == "sequence_huge":
        number = (1 << 64) - 1  # beyond int64: the walks leave it
    replaced = {
        "op_two": ["segments", b"k"],
        "op_four": ["segments", b"k", b"v", b"w"],
        "unknown_table": ["nope", b"k", b"v"],
        "table_bin": [b"segments", b"k", b"v"],
        "key_str": ["segments", "k", b"v"],
        "value_str": ["segments", b"k", "v"],
    }
    if variant in replaced:
        ops = [*ops, replaced[variant]]
    fields: list[tuple[Any, Any]] = [("s", number), ("o", ops)]
    if variant == "ops_map":
        fields = [("s", number), ("o", {"a": 1})]
    if variant == "reversed":
        fields.reverse()
    if variant == "extra_key":
        fields.append(("x", 1))
    if variant == "repeated_key":
        fields = [("s", number), ("s", number)]
    header = b"\xde" + struct.pack(">H", len(fields)) if variant == "wide" else bytes([0x80 | len(fields)])
    body = header + b"".join(_pack(key) + _pack(value) for key, value in fields)
    if variant == "sealed":
        body = bytes([MARKER]) + body
    if variant == "trailing":
        body += b"\xc0"
    if variant == "empty":
        body = b""
    frame = _frame(body)
    if variant == "checksum":
        frame = frame[:6] + bytes([frame[6] ^ 4]) + frame[7:]
    if variant == "torn":
        frame = frame[: rng.randrange(len(frame))]
    taken = type(number) is int and number == sequence + 1
    return frame, number if taken else sequence


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(VARIANTS), min_size=1, max_size=25),
    st.integers(0, 2**32),
    st.sampled_from([1, 5, 50, 10**6]),
)
def test_the_compiled_log_walk_gives_the_answers_of_its_twin(
    variants: list[str], seed: int, ops_max: int
) -> None:
    built = _require_built()
    rng = random.Random(seed)
    sequence = rng.choice([0, 10, 1000])
    frames = []
    position = sequence
    for variant in variants:
        frame, position = _variant_frame(variant, position, rng)
        frames.append(frame)
    data = b"".join(frames)
    native_tables: dict[str, dict[bytes, Any]] = {table: {} for table in WINDOW_TABLES}
    python_tables: dict[str, dict[bytes, Any]] = {table: {} for table in WINDOW_TABLES}
    native_tables["segments"][b"old"] = python_tables["segments"][b"old"] = (b"old", 1, b"v")
    start = rng.choice([0, 0, 1])
    found = built.changes(data, start, sequence, native_tables, ops_max)
    assert found == changes_python(data, start, sequence, python_tables, ops_max)
    assert native_tables == python_tables


def test_bad_arguments_to_the_compiled_log_walk() -> None:
    built = _require_built()
    with pytest.raises(TypeError):
        built.changes(b"", 0, 0, {"t": []}, 10)  # a table's rows must be a dict
    with pytest.raises(TypeError):
        built.changes(b"", 0, 0, [], 10)
    with pytest.raises(TypeError):
        built.changes(b"", 0, 0, {}, 10, 11)
    frame, _ = _variant_frame("plain", 0, random.Random(3))
    assert built.changes(frame, 0, -1, {}, 10) == (0, -1, 0, 0, False)  # nothing taken
    assert built.changes(frame, 0, 1 << 70, {}, 10) == (0, 1 << 70, 0, 0, False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(VARIANTS), min_size=1, max_size=10), st.integers(0, 2**32))
def test_the_compiled_commit_check_gives_the_answers_of_its_twin(variants: list[str], seed: int) -> None:
    """``plain_change`` (what the metadata log checks each shipped commit with) against
    ``plain_change_python``, on payloads whole, damaged or strange."""
    built = _require_built()
    rng = random.Random(seed)
    tables: dict[str, dict[bytes, Any]] = {table: {} for table in WINDOW_TABLES}
    for variant in variants:
        frame, _ = _variant_frame(variant, rng.choice([0, 10, 1000]), rng)
        body = frame[framing.HEADER_BYTES :]
        answer = built.plain_change(body, tables)
        assert answer == plain_change_python(body, tables), variant
        plain = variant in ("plain", "covered", "wide", "reversed", "big", "delete", "gap", "checksum")
        assert (answer is not None) == plain, variant  # the frame's CRC is not the payload's business
        if answer is not None:
            assert answer == (msgpack.unpackb(body)["s"], len(msgpack.unpackb(body)["o"]))


def test_bad_arguments_to_the_compiled_commit_check() -> None:
    built = _require_built()
    for tables in ({"t": []}, [], {1: {}}):
        with pytest.raises(TypeError):
            built.plain_change(b"\x80", tables)
    with pytest.raises(TypeError):
        built.plain_change(b"\x80")
    with pytest.raises(TypeError):
        built.plain_change("text", {})
    assert built.plain_change(b"", {}) is None
