"""Replay's batch path against the one-by-one path, and the compiled walk against its twin.

* ``SystemLayout.apply_appends`` takes runs of plain appends (most of a journal) without
  a Python object per record; ``framing.read_records`` + ``SystemLayout.apply`` (the
  one-by-one path, what ``replay`` does with ``on_record``) is the reference. Journals
  written by the real writer, then damaged (a flipped byte, a cut tail, a repeated frame,
  a foreign record), replay to the same layout and the same counts both ways.
* The compiled walk (``slts.journal._replay.appends``) against its pure-Python twin
  (``system_layout.appends_python``): the same answers, and the same attributes set, on
  frames whole, damaged or strange (every field of the wrong type, value or encoding).

``walker``: a test runs once with the compiled walk and once with the pure-Python twin.
Where the compiled walk is not built, its runs skip, saying so, unless
``SLTS_REQUIRE_NATIVE=1`` (tests/run.sh, so CI runs both): then they fail.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import crc32c
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slts.bindings.memory import MemoryChunkStorage
from slts.journal import framing, system_layout, system_names
from slts.journal.journal import JournalSettings, SystemJournal
from slts.journal.replay import Replay, read_object, replay
from slts.journal.system_layout import SystemLayout, appends_python
from slts.journal.system_segments import SystemSegments

from slts.transforms.sealed import MARKER

BUILT = system_layout.NATIVE
PYTHON = SimpleNamespace(appends=appends_python)
LOG, SNAPSHOTS = system_names.METADATA_LOG, system_names.METADATA_SNAPSHOTS


def _require_built() -> Any:
    if BUILT is None:
        if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
            pytest.fail("SLTS_REQUIRE_NATIVE=1, but slts.journal._replay is not built")
        pytest.skip("slts.journal._replay is not built (no C compiler at install)")
    return BUILT


@pytest.fixture(params=["native", "python"])
def walker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(system_layout, "NATIVE", _require_built() if request.param == "native" else PYTHON)
    yield request.param


def test_the_compiled_walk_is_in_use_where_built() -> None:
    """Built means used (unless SLTS_PURE_PYTHON=1), and CI builds it."""
    if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
        assert BUILT is not None, "CI installs with a C compiler: the extension must be built"
    if os.environ.get("SLTS_PURE_PYTHON") != "1":
        from slts.compiled import twin

        assert twin("slts.journal._replay") is BUILT


@given(st.binary(max_size=300))
def test_the_compiled_crc32c_is_the_crc32c_package_s(data: bytes) -> None:
    assert _require_built().crc32c(data) == crc32c.crc32c(data)


# -- the compiled walk and its twin: the same answers ------------------------------------------------

SEGMENT, CHUNK, EPOCH = "_system/metadata-log", "0/_system/metadata-log/E3.O0.abc", 3


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _map(pairs: list[tuple[Any, Any]], wide: bool = False) -> bytes:
    """A msgpack map of ``pairs`` as given (repeated keys kept), map16 if ``wide``."""
    header = b"\xde" + struct.pack(">H", len(pairs)) if wide else bytes([0x80 | len(pairs)])
    return header + b"".join(_pack(key) + _pack(value) for key, value in pairs)


def _frame(body: bytes) -> bytes:
    return framing.HEADER.pack(len(body), crc32c.crc32c(body)) + body


#: Ways one frame can differ from a plain append (``plain``: it does not).
VARIANTS = [
    "plain", "plain", "plain", "plain", "attrs_nil", "attrs_empty", "no_attrs", "wide", "key_order",
    "attrs_names", "attrs_names", "attrs_names",
    "kind", "segment", "chunk", "offset", "length_negative", "length_huge", "id_duplicate", "id_epoch",
    "id_three", "id_uint64", "extra_key", "repeated_key", "attrs_many", "attrs_bool", "attrs_huge",
    "attrs_repeated", "attrs_array", "attrs_not_utf8", "segment_bin", "chunk_not_utf8", "sealed",
    "checksum", "trailing", "not_a_map", "empty", "torn",
]  # fmt: skip


def _variant_frame(variant: str, length: int, number: int, rng: random.Random) -> tuple[bytes, int, int]:
    """The frame of ``variant`` at segment length ``length`` after record ``number``, and
    the (length, number) after it if it is taken."""
    added = rng.choice([0, 1, 64, 4096, 1 << 40])
    attrs: Any = {"last_sequence": number + 1, "n": rng.randrange(-5, 5)}
    fields: list[tuple[Any, Any]] = [
        ("k", "append"),
        ("seg", SEGMENT),
        ("chunk", CHUNK),
        ("offset", length),
        ("length", added),
        ("attrs", attrs),
        ("id", [EPOCH, number + rng.choice([1, 1, 2, 7])]),
    ]
    replace = {
        "attrs_nil": ("attrs", None),
        "attrs_empty": ("attrs", {}),
        "kind": ("k", "add"),
        "segment": ("seg", SEGMENT + "x"),
        "chunk": ("chunk", CHUNK[:-1]),
        "offset": ("offset", length + 1),
        "length_negative": ("length", -1),
        "length_huge": ("length", (1 << 63) - 1),
        "id_duplicate": ("id", [EPOCH, number]),
        "id_epoch": ("id", [EPOCH + 1, number + 1]),
        "id_three": ("id", [EPOCH, number + 1, 0]),
        "id_uint64": ("id", [EPOCH, 1 << 63]),
        "attrs_many": ("attrs", {f"a{i}": i for i in range(9)}),
        "attrs_bool": ("attrs", {"a": True}),
        "attrs_huge": ("attrs", {"a": 1 << 63}),
        "attrs_array": ("attrs", [1, 2]),
        "segment_bin": ("seg", SEGMENT.encode()),
    }
    if variant == "attrs_names":  # many names over a run: the compiled walk's fold of them fills up
        names = rng.sample([f"name{i}" for i in range(50)], rng.randint(1, 8))
        replace["attrs_names"] = ("attrs", {name: rng.randrange(-(1 << 63), 1 << 63) for name in names})
    if variant in replace:
        key, value = replace[variant]
        fields = [(k, value if k == key else v) for k, v in fields]
    if variant == "no_attrs":
        fields = [(k, v) for k, v in fields if k != "attrs"]
    if variant == "key_order":
        rng.shuffle(fields)
    if variant == "extra_key":
        fields.append(("prev", None))
    if variant == "repeated_key":
        fields.insert(0, ("offset", length))
        fields = fields[:7]
    body = _map(fields, wide=variant == "wide")
    if variant == "attrs_repeated":
        body = body.replace(_pack("attrs") + _pack(attrs), _pack("attrs") + _map([("a", 1), ("a", 2)]))
    if variant == "attrs_not_utf8":
        body = body.replace(_pack("attrs") + _pack(attrs), _pack("attrs") + b"\x81\xa2\xff\xfe\x01")
    if variant == "chunk_not_utf8":
        body = body.replace(_pack(CHUNK), b"\xa2\xff\xfe")
    if variant == "sealed":
        body = bytes([MARKER]) + body
    if variant == "trailing":
        body += b"\x00"
    if variant == "not_a_map":
        body = _pack([1, 2, 3])
    if variant == "empty":
        body = b""
    frame = _frame(body)
    if variant == "checksum":
        frame = frame[:5] + bytes([frame[5] ^ 1]) + frame[6:]
    if variant == "torn":
        frame = frame[: rng.randrange(len(frame))]
    new_number = dict(fields).get("id", [0, number])
    return frame, length + added, new_number[1] if isinstance(new_number, list) and new_number else number


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(VARIANTS), min_size=1, max_size=30), st.integers(0, 2**32))
def test_the_compiled_walk_gives_the_answers_of_its_twin(variants: list[str], seed: int) -> None:
    built = _require_built()
    rng = random.Random(seed)
    length, number, frames = rng.choice([0, 5, 1 << 33]), rng.choice([0, 1, 1000]), []
    for variant in variants:
        frame, length, number = _variant_frame(variant, length, number, rng)
        frames.append(frame)
    data = b"".join(frames)
    start = rng.choice([0, 0, 0, 1])
    first_length, first_number = rng.choice([(0, 0), (5, 1), (1 << 33, 1000)])
    python_attrs: dict[str, int] = {"kept": 1}
    native_attrs = dict(python_attrs)
    args = (data, start, SEGMENT, CHUNK, first_length, EPOCH, first_number)
    assert built.appends(*args, native_attrs) == appends_python(*args, python_attrs)
    assert native_attrs == python_attrs


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_after_plain_appends_gives_the_same_answer(walker: str, variant: str) -> None:
    """Three plain appends, then the variant: both twins take the three, and the variant as
    a plain append would be taken only if it is one."""
    rng = random.Random(variant)
    length, number, frames = 0, 0, []
    for name in ["plain", "plain", "plain", variant]:
        frame, length, number = _variant_frame(name, length, number, rng)
        frames.append(frame)
    data = b"".join(frames)
    attrs: dict[str, int] = {}
    stop, _, _, count = system_layout.NATIVE.appends(data, 0, SEGMENT, CHUNK, 0, EPOCH, 0, attrs)
    plain = variant in {"plain", "attrs_nil", "attrs_empty", "no_attrs", "wide", "key_order", "attrs_names"}
    assert count == (4 if plain else 3)
    assert stop == (len(data) if plain else len(data) - len(frames[-1]))
    expected = appends_python(data, 0, SEGMENT, CHUNK, 0, EPOCH, 0, {})
    assert (stop, count) == (expected[0], expected[3])


def test_bad_arguments_to_the_compiled_walk_raise() -> None:
    built = _require_built()
    with pytest.raises(TypeError):
        built.appends(b"", 0, SEGMENT, CHUNK, 0, EPOCH, 0)  # attrs missing
    with pytest.raises(TypeError):
        built.appends(b"", 0, SEGMENT, CHUNK, 0, EPOCH, 0, [])  # attrs not a dict
    with pytest.raises(TypeError):
        built.appends(b"", 0, b"seg", CHUNK, 0, EPOCH, 0, {})  # segment not a str
    with pytest.raises(TypeError):
        built.appends("not bytes", 0, SEGMENT, CHUNK, 0, EPOCH, 0, {})
    # Numbers beyond 64 bits, or negative lengths: nothing taken, nothing raised.
    frame, _, _ = _variant_frame("plain", 0, 0, random.Random(1))
    assert built.appends(frame, 0, SEGMENT, CHUNK, 1 << 70, EPOCH, 0, {}) == (0, 1 << 70, 0, 0)
    assert built.appends(frame, 0, SEGMENT, CHUNK, -1, EPOCH, 0, {}) == (0, -1, 0, 0)


# -- replay: the batch path against the one-by-one path ----------------------------------------------


def _write_journal(rng: random.Random, operations: int) -> MemoryChunkStorage:
    """Epoch 1 (then maybe epoch 2) writes appends, new chunks and truncates to the system
    segments with the real writer; small rolling size, so chunks roll."""
    binding = MemoryChunkStorage()
    for epoch in (1, 2)[: rng.choice([1, 2])]:
        journal = SystemJournal.boot(
            binding, 0, epoch, JournalSettings(snapshot_records=rng.choice([7, 10**9]))
        )
        segments = SystemSegments(journal, rng.choice([64, 1 << 20]), lambda: None)
        for i in range(operations):
            segment = LOG if rng.random() < 0.85 else SNAPSHOTS
            roll = rng.random()
            if roll < 0.08:
                layout = segments.layout(segment)
                segments.truncate(segment, rng.randint(layout.start_offset, layout.length), {"t": i})
            else:
                attrs = {"last_sequence": i} if rng.random() < 0.9 else None
                segments.append(segment, rng.randbytes(rng.randint(1, 40)), attrs, new_chunk=roll > 0.97)
    return binding


def _damage(binding: MemoryChunkStorage, rng: random.Random, how: str) -> None:
    files = sorted(binding.list(system_names.journal_prefix(0)))
    name = rng.choice(files)
    data = bytearray(read_object(binding, name))
    frames, offset = [], 0
    while offset < len(data):
        end = offset + framing.HEADER_BYTES + int.from_bytes(data[offset : offset + 4], "big")
        frames.append((offset, min(end, len(data))))  # a cut frame ends with the data
        offset = end
    if not frames:
        return
    start, end = rng.choice(frames)
    if how == "flip":
        data[rng.randrange(start, end)] ^= 1 << rng.randrange(8)
    elif how == "cut":
        del data[rng.randrange(start, end) :]
    elif how == "repeat":
        data[end:end] = data[start:end]
    elif how == "foreign":
        data[start:start] = _frame(_map([("k", "append"), ("seg", LOG), ("id", [1, 10**6])]))
    binding.delete(binding.open_write(name))
    binding.create(name, bytes(data))


def _outcome(found: Replay) -> tuple[object, ...]:
    return (
        {name: layout.encode() for name, layout in sorted(found.layout.segments.items())},
        found.layout.last_ids,
        found.max_record,
        found.records,
        found.duplicates,
        found.inconsistent,
        found.corrupt,
        found.torn,
        found.files,
    )


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 2**32),
    st.integers(1, 60),
    st.lists(st.sampled_from(["flip", "cut", "repeat", "foreign"]), max_size=3),
)
def test_replay_in_runs_gives_the_one_by_one_replay(seed: int, operations: int, damages: list[str]) -> None:
    rng = random.Random(seed)
    binding = _write_journal(rng, operations)
    for how in damages:
        _damage(binding, rng, how)
    one_by_one = _outcome(replay(binding, 0, on_record=lambda file, record: None))
    for implementation in (BUILT, PYTHON):
        if implementation is None:
            continue
        saved = system_layout.NATIVE
        system_layout.NATIVE = implementation
        try:
            assert _outcome(replay(binding, 0)) == one_by_one
        finally:
            system_layout.NATIVE = saved


def test_replay_takes_the_appends_in_runs(walker: str) -> None:
    """2,000 appends after the boot snapshot: all applied, the layout as one by one."""
    binding = MemoryChunkStorage()
    journal = SystemJournal.boot(binding, 0, 1, JournalSettings(snapshot_records=10**9))
    segments = SystemSegments(journal, 1 << 30, lambda: None)
    for i in range(2000):
        segments.append(LOG, b"x" * (1 + i % 7), {"last_sequence": i + 1})
    found = replay(binding, 0)
    assert found.records == 2000 and not (found.corrupt or found.torn or found.inconsistent)
    assert _outcome(found) == _outcome(replay(binding, 0, on_record=lambda file, record: None))
    assert found.layout.segment(LOG).encode() == journal.layout.segment(LOG).encode()


def test_a_layout_without_the_segment_takes_no_run() -> None:
    layout = SystemLayout()
    frame, _, _ = _variant_frame("plain", 0, 0, random.Random(2))
    assert layout.apply_appends(frame, 0, EPOCH, SEGMENT) == (0, 0)


@pytest.mark.parametrize("ending", ["plain", "attrs_not_utf8", "torn"])
def test_a_long_run_of_many_attribute_names_gives_the_twin_s_attributes(ending: str) -> None:
    """The compiled walk folds a run's attributes by name and sets them once; with more
    names than it folds at a time (32), and with a run that ends at a bad name, the
    attributes are still those of updates record by record, in the same order."""
    built = _require_built()
    rng = random.Random(ending)
    length, number, frames = 0, 0, []
    for name in ["attrs_names"] * 80 + [ending]:
        frame, length, number = _variant_frame(name, length, number, rng)
        frames.append(frame)
    data = b"".join(frames)
    native_attrs: dict[str, int] = {"name7": 0, "kept": 1}
    python_attrs = dict(native_attrs)
    args = (data, 0, SEGMENT, CHUNK, 0, EPOCH, 0)
    found = built.appends(*args, native_attrs)
    assert found == appends_python(*args, python_attrs)
    assert found[3] == (81 if ending == "plain" else 80)
    assert list(native_attrs.items()) == list(python_attrs.items())
