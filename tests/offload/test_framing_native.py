"""The compiled framer (``slts.offload._framing``) against the pure-Python one, which is the
reference: the same frames, payloads, outcomes and errors for every block, whole, cut short or
damaged; its ``Payload``, the zero-copy view an entry leaves as: bytes-like, read-only,
equal to and hashed as its bytes, untracked by the garbage collector, and valid after its
object is deleted and collected; its ``Block``, which takes and encodes a streaming block's
entries as ``PendingBlock`` does; and its ``Offers``, which answers offers and takes as
``OfferBuffer`` does. Bad input to the compiled calls raises and changes nothing."""

from __future__ import annotations

import copy
import gc
import os
import pickle
import random
import struct
import threading
import time
import uuid
import weakref
from typing import Any

import pytest

from slts.offload import formats, framing
from slts.offload.framing import Runs, parse_frames
from slts.offload.ledgers import ENTRY_TYPES, Entry, MemoryLedger
from slts.offload.names import data_name
from slts.offload.offloader import LedgerOffloader
from slts.offload.pending import (
    HANDED,
    PAUSE,
    PAUSE_EVERY,
    TAKEN,
    UNORDERED,
    OfferBuffer,
    OfferGate,
    OfferLimits,
    PendingBlock,
    encode,
)
from tests.offload.conftest import BUILT
from tests.support.engine import Env, env_fixture

env = env_fixture([("filesystem", "lmdb")])


@pytest.fixture
def native() -> object:
    if BUILT is None:
        if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
            pytest.fail("SLTS_REQUIRE_NATIVE=1, but slts.offload._framing is not built")
        pytest.skip("slts.offload._framing is not built (no C compiler at install)")
    return BUILT


def test_the_compiled_framer_is_in_use_where_built() -> None:
    """Built means used (unless SLTS_PURE_PYTHON=1), and CI builds it."""
    if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
        assert BUILT is not None, "CI installs with a C compiler: the extension must be built"
    if os.environ.get("SLTS_PURE_PYTHON") != "1":
        assert framing.NATIVE is BUILT


# -- the same answers as the reference -------------------------------------------------------------


def block_of(sizes: list[int], first: int, rng: random.Random) -> bytes:
    body = b"".join(struct.pack(">iq", size, first + i) + rng.randbytes(size) for i, size in enumerate(sizes))
    return bytes(formats.HEADER_SIZE) + body + formats.PADDING * rng.randrange(3)


def outcome(
    monkeypatch: pytest.MonkeyPatch,
    implementation: object,
    block: bytes,
    first: int,
    count: int | None,
    limit: int,
    block_end: int,
) -> tuple[object, ...]:
    """What ``parse_frames`` finds with ``implementation`` (None: pure Python): the frames,
    the error's text and offset, and the payloads of the entries found."""
    monkeypatch.setattr(framing, "NATIVE", implementation)
    runs = Runs()
    view = memoryview(block)
    found = parse_frames(view, formats.HEADER_SIZE, limit, block_end, first, count, runs, name="o", base=7)
    payloads: list[Entry] = []
    if len(runs):
        runs.payloads(view, first, first + len(runs) - 1, payloads)
    error = found.error
    return (
        found.found,
        found.position,
        found.done,
        None if error is None else (str(error), error.offset),
        [bytes(p) for p in payloads],
    )


def sizes_of(shape: str, count: int, rng: random.Random) -> list[int]:
    if shape == "one size":
        return [100] * count
    if shape == "sizes":
        return [rng.randrange(300) for _ in range(count)]
    if shape == "runs and strays":
        return [rng.choice([64, 64, 64, 65]) for _ in range(count)]
    if shape == "odd":
        return [33] * count  # a stride of 45: the pure-Python walk checks it byte by byte
    return [rng.choice([0, 0, 1]) for _ in range(count)]


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_walk_answers_as_the_python_one(
    monkeypatch: pytest.MonkeyPatch, native: object, seed: int
) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        count = rng.randrange(1, 200)
        shape = rng.choice(["one size", "sizes", "runs and strays", "odd", "empty payloads"])
        sizes = sizes_of(shape, count, rng)
        first = rng.choice([0, rng.randrange(1 << 40), (1 << 32) - rng.randrange(1, 300)])
        block = bytearray(block_of(sizes, first, rng))
        damage = rng.random()
        if damage < 0.3:  # a bit of a frame header flipped
            victim = rng.randrange(count)
            at = formats.HEADER_SIZE + sum(12 + size for size in sizes[:victim])
            block[at + rng.randrange(12)] ^= 1 << rng.randrange(8)
        block_end = len(block) if rng.random() < 0.8 else rng.randrange(formats.HEADER_SIZE, len(block) + 1)
        limit = block_end if rng.random() < 0.5 else rng.randrange(formats.HEADER_SIZE, block_end + 1)
        wanted = rng.choice([None, count, count - 1, count + 1, 0 if count > 1 else 1])
        answers = [
            outcome(monkeypatch, implementation, bytes(block), first, wanted, limit, block_end)
            for implementation in (native, None)
        ]
        assert answers[0] == answers[1], (seed, shape, wanted, limit, block_end)


def test_a_block_ending_before_the_position_walks_nothing_in_both(
    monkeypatch: pytest.MonkeyPatch, native: object
) -> None:
    block = block_of([10, 20], 5, random.Random(2))
    answers = [outcome(monkeypatch, i, block, 5, 2, len(block), 60) for i in (native, None)]
    assert answers[0] == answers[1] and answers[0][0] == 0 and answers[0][3] is not None


@pytest.mark.parametrize("count", [None, 2, 3])
def test_ids_at_the_top_of_the_range_walk_alike_in_both(
    monkeypatch: pytest.MonkeyPatch, native: object, count: int | None
) -> None:
    """Entry ids up to 2**63-1: nothing follows the last one (a frame after it is damage)."""
    top = (1 << 63) - 2
    body = b"".join(struct.pack(">iq", 4, i) + b"data" for i in (top, top + 1))
    block = bytes(formats.HEADER_SIZE) + body + struct.pack(">iq", 4, -(1 << 63)) + b"data"
    answers = [outcome(monkeypatch, i, block, top, count, len(block), len(block)) for i in (native, None)]
    assert answers[0] == answers[1] and answers[0][0] == 2 and answers[0][3] is not None


def test_a_frame_with_a_negative_length_ends_the_walk_in_both(
    monkeypatch: pytest.MonkeyPatch, native: object
) -> None:
    rng = random.Random(1)
    block = block_of([10, 20], 5, rng) + struct.pack(">iq", -7, 7) + bytes(30)
    answers = [outcome(monkeypatch, i, block, 5, None, len(block), len(block)) for i in (native, None)]
    assert answers[0] == answers[1] and answers[0][0] == 2 and answers[0][2] is True


# -- Payload ------------------------------------------------------------------------------------------


def payloads_of(native: object, data: bytes, at: int, stride: int, length: int, count: int) -> list[Entry]:
    out: list[Entry] = []
    native.views(memoryview(data), at, stride, length, count, out)  # type: ignore[attr-defined]
    return out


def test_a_payload_is_a_read_only_bytes_like_view_equal_to_its_bytes(native: object) -> None:
    data = bytes(range(256)) * 4
    (p, q) = payloads_of(native, data, 10, 300, 200, 2)
    want = data[10:210]
    assert p == want and want == p and p != data[11:211] and q == data[310:510]
    assert p != "not bytes" and (p == 5) is False
    assert p == memoryview(want) and p == bytearray(want)
    assert bytes(p) == want and p.tobytes() == want and bytearray(p) == want
    assert len(p) == 200 and p[0] == 10 and p[-1] == want[-1] and p[5:9] == want[5:9]
    assert hash(p) == hash(want) and {want: 1}[p] == 1
    assert b"".join([p, q]) == want + data[310:510]
    view = memoryview(p)
    assert view.readonly and view.tobytes() == want
    with pytest.raises(TypeError):
        view[0] = 1  # type: ignore[index]
    assert pickle.loads(pickle.dumps(p)) == want and type(pickle.loads(pickle.dumps(p))) is bytes
    assert copy.copy(p) == want
    assert repr(p).startswith("Payload(b'")
    assert isinstance(p, ENTRY_TYPES)
    with pytest.raises(TypeError):
        type(p)()
    assert not gc.is_tracked(p), "a payload is not tracked by the garbage collector"


def test_payloads_keep_what_they_were_cut_from_alive(native: object) -> None:
    data = bytearray(b"abcdefgh" * 100)
    out = payloads_of(native, bytes(data), 0, 8, 8, 100)
    del data
    gc.collect()
    assert all(p == b"abcdefgh" for p in out)
    source = memoryview(b"x" * 64)
    kept = payloads_of(native, source, 0, 16, 16, 4)
    source.release()  # the payloads hold their own hold on the bytes
    assert kept == [b"x" * 16] * 4


@pytest.mark.parametrize(
    ("at", "stride", "length", "count"),
    [(-1, 10, 5, 1), (0, 4, 5, 2), (0, 10, -1, 1), (0, 10, 5, -1), (95, 10, 6, 1), (0, 10, 5, 11)],
)
def test_views_out_of_the_buffer_raise_and_append_nothing(
    native: object, at: int, stride: int, length: int, count: int
) -> None:
    out: list[Entry] = [b"before"]
    with pytest.raises(ValueError, match="views"):
        native.views(memoryview(bytes(100)), at, stride, length, count, out)  # type: ignore[attr-defined]
    assert out == [b"before"]
    with pytest.raises(TypeError):
        native.views(memoryview(bytes(100)), 0, 10, 5, 1, ("not", "a list"))  # type: ignore[attr-defined]


@pytest.mark.parametrize(("position", "limit", "block_end"), [(-1, 10, 10), (0, 101, 200), (0, 50, 40)])
def test_a_walk_outside_the_buffer_raises(native: object, position: int, limit: int, block_end: int) -> None:
    with pytest.raises(ValueError, match="walk"):
        native.walk(memoryview(bytes(100)), position, limit, block_end, 0, -1)  # type: ignore[attr-defined]


def test_entries_stay_readable_after_their_object_is_deleted_and_collected(env: Env, native: object) -> None:
    """Entries of a mapped chunk file hold its mapping: deleting the offloaded ledger and
    collecting its chunks leaves them whole (the file's space goes with the last of them)."""
    storage = env.open(gc_delay_s=0)
    rng = random.Random(3)
    payloads = [rng.randbytes(rng.randrange(1, 2000)) for _ in range(500)]
    offloader = LedgerOffloader(storage, max_block_bytes=64 << 10)
    uid = uuid.uuid4()
    offloader.offload(MemoryLedger(1, payloads), uid)
    handle = offloader.read_offloaded(1, uid)
    entries = handle.read(0, 499)
    assert all(type(entry) is native.Payload for entry in entries)  # type: ignore[attr-defined]
    handle.close()
    offloader.delete_offloaded(1, uid)
    while storage.gc.run_once().progressed:
        pass
    assert not list(storage.list("offload/"))
    assert entries == payloads


# -- Block: the streaming block an offer frames its entry into -----------------------------------


def test_the_compiled_block_takes_and_encodes_as_pending_block(native: object) -> None:
    """The same entries offered to both: the same answers from ``add`` and the same bytes
    (and header) from ``encode``, whole blocks, short ones and blocks cut by a new ledger."""
    rng = random.Random(5)
    for _ in range(300):
        block_bytes = rng.choice([200, 1000, 4096, 20000])
        ledger, entry = rng.randrange(3), rng.randrange(1 << 40)
        first = rng.randbytes(rng.randrange(block_bytes + 100))
        blocks = [
            native.Block(ledger, entry, first, block_bytes),  # type: ignore[attr-defined]
            PendingBlock(ledger, entry, first, block_bytes),
        ]
        for _ in range(rng.randrange(60)):
            step = rng.random()
            ledger_id = ledger + (1 if step < 0.05 else 0)
            entry_id = entry + (2 if 0.05 <= step < 0.1 else 1)
            data = rng.randbytes(rng.choice([0, 1, rng.randrange(300)]))
            taken = [b.add(ledger_id, entry_id, data, block_bytes) for b in blocks]
            assert taken[0] == taken[1], (ledger_id, entry_id, len(data))
            if taken[0]:
                entry = entry_id
            fields = [(b.ledger_id, b.first, b.last, b.count, b.payload, b.used) for b in blocks]
            assert fields[0] == fields[1]
        assert encode(blocks[0], block_bytes) == encode(blocks[1], block_bytes)


def test_a_compiled_block_refuses_bad_input_and_a_second_use(native: object) -> None:
    block = native.Block(1, 0, b"abc", 1000)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="bytes"):
        block.add(1, 1, bytearray(b"x"), 1000)
    with pytest.raises(TypeError):
        block.add(1, 1, b"x")
    with pytest.raises(OverflowError):
        block.add(1 << 70, 1, b"x", 1000)
    assert (block.count, block.last, block.used) == (1, 0, formats.HEADER_SIZE + 12 + 3), "nothing taken"
    with pytest.raises(ValueError, match="header"):
        block.finish(b"short", b"")
    data = block.finish(bytes(formats.HEADER_SIZE), formats.padding(1000 - block.used))
    assert (
        len(data) == 1000
        and data[formats.HEADER_SIZE : formats.HEADER_SIZE + 15] == struct.pack(">iq", 3, 0) + b"abc"
    )
    with pytest.raises(ValueError, match="finished"):
        block.add(1, 1, b"x", 1000)
    with pytest.raises(ValueError, match="finished"):
        block.finish(bytes(formats.HEADER_SIZE), b"")
    with pytest.raises(ValueError, match="Block"):
        native.Block(-1, 0, b"", 1000)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        native.Block(1, 0, "text", 1000)  # type: ignore[attr-defined]


# -- Offers: the entries offered to a streaming segment ------------------------------------------


class Id(int):
    """An int subclass: an id as good as an int (bools are not)."""


def test_the_compiled_offer_buffer_answers_as_offer_buffer(native: object) -> None:
    """The same offers, ages, closings and takes applied to both: the same answers, the
    same state after each step, and blocks that encode to the same bytes."""
    rng = random.Random(11)
    for _ in range(60):
        block_bytes = rng.choice([300, 1000, 4096])
        limits = OfferLimits(
            buffer_bytes=rng.choice([500, 2000, 10_000]),
            block_bytes=block_bytes,
            max_segment_bytes=rng.choice([2000, 20_000, 1 << 40]),
            assigned_s=100.0,
            max_age_s=rng.choice([50.0, 1000.0]),
            min_age_s=rng.choice([0.0, 10.0]),
        )
        begin = (rng.randrange(3), rng.randrange(5))
        last = rng.choice([None, (begin[0], begin[1] + rng.randrange(4))])
        state = (begin, last, rng.randrange(1000), limits, False)
        buffers = [native.Offers(*state), OfferBuffer(*state)]  # type: ignore[attr-defined]
        ledger, entry = last if last is not None else (begin[0], begin[1] - 1)
        for _ in range(rng.randrange(200)):
            step = rng.random()
            if step < 0.08:  # the writer takes
                batch, filling = rng.choice([1, 700, 5000]), rng.random() < 0.5
                taken = [b.take(batch, filling) for b in buffers]
                encoded = [[encode(x, block_bytes) for x in blocks] for blocks in taken]
                assert encoded[0] == encoded[1]
            elif step < 0.1:
                for b in buffers:
                    b.closing = not b.closing
            elif step < 0.13:
                for b in buffers:
                    b.writing = not b.writing
            else:
                ledger_id, entry_id = rng.choice(
                    [(ledger, entry + 1)] * 8 + [(ledger + 1, 0), (ledger, entry + 2), (ledger, entry), begin]
                )
                args: tuple[object, ...] = (ledger_id, entry_id, rng.randbytes(rng.choice([0, 10, 200, 900])))
                if rng.random() < 0.05:
                    args = rng.choice(
                        [
                            (True, 1, b"x"),
                            (1, -1, b"x"),
                            (1 << 63, 1, b"x"),
                            (1, 1, "text"),
                            (Id(ledger_id), Id(entry_id), b"an int subclass is an int"),
                        ]
                    )
                now = 100.0 + rng.choice([0.0, 5.0, 20.0, 60.0])
                answers = [b.offer(*args, now) for b in buffers]
                assert answers[0] == answers[1], (args, now)
                if answers[0] & TAKEN:
                    ledger, entry = ledger_id, entry_id
            fields = [
                (b.closing, b.writing, b.last, b.buffered, b.segment_bytes, b.has_full, b.has_filling)
                for b in buffers
            ]
            assert fields[0] == fields[1]


def test_while_the_writer_writes_every_pause_every_th_offer_taken_pauses(native: object) -> None:
    """``writing``: the offering thread is told to give the interpreter up every
    ``PAUSE_EVERY`` offers taken, and only then; both twins count alike."""
    limits = OfferLimits(1 << 40, 1 << 20, 1 << 40, 0.0, 1e9, 0.0)
    compiled: Any = native
    for buffer in [
        compiled.Offers((0, 0), None, 0, limits, False),
        OfferBuffer((0, 0), None, 0, limits, False),
    ]:
        paused = [i for i in range(PAUSE_EVERY * 2) if buffer.offer(0, i, b"x", 1.0) & PAUSE]
        assert paused == [], "no pause while the writer does not write"
        buffer.writing = True
        first = PAUSE_EVERY * 2
        answers = [buffer.offer(0, first + i, b"x", 1.0) for i in range(PAUSE_EVERY * 3)]
        assert all(answer & TAKEN for answer in answers)
        assert [i for i, answer in enumerate(answers) if answer & PAUSE] == [
            PAUSE_EVERY - 1,
            2 * PAUSE_EVERY - 1,
            3 * PAUSE_EVERY - 1,
        ]
        buffer.writing = False
        assert not buffer.offer(0, first + PAUSE_EVERY * 3, b"x", 1.0) & PAUSE


def test_the_compiled_offer_buffer_refuses_bad_construction(native: object) -> None:
    limits = OfferLimits(100, 100, 100, 0.0, 1.0, 0.0)
    for bad in [
        ((1,), None, 0, limits, False),
        ((0, 0), (1,), 0, limits, False),
        ((0, 0), None, 0, (1, 2), False),
    ]:
        with pytest.raises(TypeError):
            native.Offers(*bad)  # type: ignore[attr-defined]
    offers = native.Offers((0, 0), None, 0, limits, False)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        offers.offer(0, 0, b"x")
    with pytest.raises(TypeError):
        offers.offer(0, 0, b"x", "not a time")
    with pytest.raises(TypeError):
        del offers.closing
    with pytest.raises(TypeError):
        del offers.writing
    assert (offers.buffered, offers.last, offers.has_filling) == (0, None, False), "nothing taken"


# -- the offer gate: a handle's offer_entry in one call ----------------------------------------------


class GateLog:
    """What a gate's callables saw, and whether the lock was held when they were called."""

    def __init__(self, lock: threading.Lock, fail_on: int | None) -> None:
        self.lock = lock
        self.calls: list[tuple[object, ...]] = []
        self.fail_on = fail_on
        self.now = 100.0

    def clock(self) -> float:
        self.calls.append(("clock", self.lock.locked()))
        return self.now

    def locked(self, outcome: int, ledger_id: object, entry_id: object, data: object) -> object:
        self.calls.append(
            ("locked", outcome, ledger_id, entry_id, len(data) if isinstance(data, bytes) else data)
        )
        assert self.lock.locked(), "locked() runs under the lock"
        if self.fail_on is not None and outcome & self.fail_on:
            raise RuntimeError(f"refused {outcome}")
        if not outcome & TAKEN:
            return ("refused", outcome)
        return None

    def after(self, outcome: int) -> None:
        self.calls.append(("after", outcome))
        assert not self.lock.locked(), "after() runs once the lock is released"


def gates(native: object, seed: int) -> tuple[list[object], list[GateLog], list[object]]:
    """The compiled gate and its Python twin over twin offer buffers, each with its own log."""
    rng = random.Random(seed)
    limits = OfferLimits(
        rng.choice([500, 3000]), rng.choice([300, 1000]), rng.choice([4000, 1 << 40]), 100.0, 1000.0, 0.0
    )
    fail_on = rng.choice([None, HANDED, UNORDERED])
    made, logs, offers = [], [], []
    for offers_type, gate_type in [(native.Offers, native.OfferGate), (OfferBuffer, OfferGate)]:  # type: ignore[attr-defined]
        lock = threading.Lock()
        log = GateLog(lock, fail_on)
        buffer = offers_type((0, 0), None, 0, limits, False)
        made.append(gate_type(lock, buffer, log.clock, "OK", log.locked, log.after))
        logs.append(log)
        offers.append(buffer)
    return made, logs, offers


@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_offer_gate_answers_and_calls_as_offer_gate(native: object, seed: int) -> None:
    """The same offers through both gates: the same answers or errors, the same calls to
    the clock, ``locked`` (under the lock) and ``after`` (after it), and the lock free
    after every offer, whatever happened."""
    rng = random.Random(seed)
    pair, logs, buffers = gates(native, seed)
    entry = -1
    for step in range(300):
        entry_id = rng.choice([entry + 1] * 6 + [entry + 3, 0])
        data = rng.randbytes(rng.choice([10, 200, 700]))
        if step % 40 == 39:
            for buffer in buffers:
                buffer.take(1 << 20, True)
        how = rng.random()
        answers: list[object] = []
        for gate in pair:
            try:
                if how < 0.1:
                    answers.append(gate(ledger_id=0, data=data, entry_id=entry_id))  # type: ignore[operator]
                else:
                    answers.append(gate(0, entry_id, data))  # type: ignore[operator]
            except RuntimeError as exc:
                answers.append(("raised", str(exc)))
        assert answers[0] == answers[1], (step, answers)
        assert logs[0].calls == logs[1].calls, step
        assert not any(log.lock.locked() for log in logs), "the lock is free after every offer"
        assert (buffers[0].last, buffers[0].buffered) == (buffers[1].last, buffers[1].buffered)
        entry = buffers[0].last[1] if buffers[0].last is not None else -1
    seen = {call[0] for call in logs[0].calls}
    assert {"clock", "locked", "after"} <= seen, "taken, refused and handed offers all ran"


def test_the_compiled_offer_gate_refuses_bad_calls_and_takes_nothing(native: object) -> None:
    pair, logs, buffers = gates(native, 1)
    for gate in pair:
        with pytest.raises(TypeError):
            gate(0, 0)  # type: ignore[operator]
        with pytest.raises(TypeError):
            gate(0, 0, b"x", b"y")  # type: ignore[operator]
        with pytest.raises(TypeError):
            gate(0, 0, b"x", ledger_id=1)  # type: ignore[operator]
        with pytest.raises(TypeError):
            gate(0, 0, size=1)  # type: ignore[operator]
    assert all(buffer.last is None and buffer.buffered == 0 for buffer in buffers)
    assert not any(log.lock.locked() for log in logs)
    limits = OfferLimits(100, 100, 100, 0.0, 1.0, 0.0)
    offers = native.Offers((0, 0), None, 0, limits, False)  # type: ignore[attr-defined]
    lock = threading.Lock()
    for bad in [
        (lock, OfferBuffer((0, 0), None, 0, limits, False), time.time, "OK", print, print),  # not compiled
        (lock, offers, "not callable", "OK", print, print),
        (object(), offers, time.time, "OK", print, print),  # no acquire/release
    ]:
        with pytest.raises((TypeError, AttributeError)):
            native.OfferGate(*bad)  # type: ignore[attr-defined]


def test_a_clock_that_raises_leaves_the_lock_free_and_takes_nothing(native: object) -> None:
    limits = OfferLimits(1000, 1000, 1 << 40, 0.0, 1000.0, 0.0)
    for offers_type, gate_type in [(native.Offers, native.OfferGate), (OfferBuffer, OfferGate)]:  # type: ignore[attr-defined]
        lock = threading.Lock()
        buffer = offers_type((0, 0), None, 0, limits, False)

        def broken() -> float:
            raise OSError("no clock")

        gate = gate_type(lock, buffer, broken, "OK", print, print)
        with pytest.raises(OSError, match="no clock"):
            gate(0, 0, b"x")
        assert not lock.locked() and buffer.last is None


def test_a_gate_in_a_cycle_with_its_owner_is_collected(native: object) -> None:
    """A handle holds its gate, whose callables are the handle's bound methods: a cycle the
    garbage collector must be able to break."""

    class Owner:
        def __init__(self) -> None:
            limits = OfferLimits(1000, 1000, 1 << 40, 0.0, 1000.0, 0.0)
            self.lock = threading.Lock()
            self.gate = native.OfferGate(  # type: ignore[attr-defined]
                self.lock,
                native.Offers((0, 0), None, 0, limits, False),
                time.time,
                "OK",
                self.locked,
                self.after,  # type: ignore[attr-defined]
            )

        def locked(self, *args: object) -> None:
            return None

        def after(self, outcome: int) -> None:
            pass

    owner = Owner()
    assert owner.gate(0, 0, b"x") == "OK"
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None


# -- frame_entries: the PIP-17 offloader's framing loop -------------------------------------------


def framed_by(frame: object, payloads: list[Entry], first: int, start: int, room: int, enough: int) -> object:
    """What ``frame`` (a twin) appends and returns, the pieces as bytes, or its error's type."""
    pieces: list[Entry] = [b"before"]
    try:
        answer = frame(pieces, first, payloads, start, room, enough)  # type: ignore[operator]
    except (ValueError, TypeError) as error:
        return type(error), [bytes(piece) for piece in pieces]
    return answer, [bytes(piece) for piece in pieces]


@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_entry_framing_answers_as_the_python_one(native: object, seed: int) -> None:
    """For payloads of every kind an entry may be (bytes, memoryview, Payload) and sizes
    from 0 up, any start, room and enough: the same pieces and the same answer, and the
    pieces are the frames ``formats.entry_header`` makes, each payload itself (no copy)."""
    rng = random.Random(seed)
    for _ in range(200):
        count = rng.randrange(0, 40)
        payloads: list[Entry] = []
        for _ in range(count):
            data = rng.randbytes(rng.choice([0, 1, 12, rng.randrange(2000)]))
            kind = rng.randrange(3)
            payloads.append(
                data if kind == 0 else memoryview(data) if kind == 1 else _payload_of(native, data)
            )
        first = rng.choice([0, 5, 2**62])
        start = rng.randrange(0, count + 2)
        room = rng.choice([0, 11, 12, 500, rng.randrange(0, 40_000), formats.INT32_MAX])
        enough = rng.choice([1, 12, 1000, rng.randrange(1, 50_000), 2**40])
        compiled = framed_by(native.frame_entries, payloads, first, start, room, enough)  # type: ignore[attr-defined]
        python = framed_by(framing.frame_entries_python, payloads, first, start, room, enough)
        assert compiled == python, (seed, count, first, start, room, enough)
        (taken, framed), pieces = python  # type: ignore[misc]
        expected: list[bytes] = [b"before"]
        used = 0
        for index in range(start, start + taken):
            expected += [
                formats.entry_header(first + index - start, len(payloads[index])),
                bytes(payloads[index]),
            ]
            used += formats.ENTRY_HEADER_SIZE + len(payloads[index])
        assert pieces == expected and framed == used <= room
        stopped_early = start + taken < count and used < enough
        if stopped_early:  # only because the next frame did not fit
            assert used + formats.ENTRY_HEADER_SIZE + len(payloads[start + taken]) > room


def _payload_of(native: object, data: bytes) -> Entry:
    """``data`` as a compiled ``Payload`` (the kind an offloaded entry is read back as)."""
    out: list[Entry] = []
    native.views(data, 0, len(data), len(data), 1, out)  # type: ignore[attr-defined]
    return out[0]


def test_the_compiled_entry_framing_appends_the_payload_objects_themselves(native: object) -> None:
    """A payload goes into the pieces as the same object (the write joins them once)."""
    payload = os.urandom(100)
    pieces: list[Entry] = []
    assert native.frame_entries(pieces, 7, [payload], 0, 1000, 1) == (1, 112)  # type: ignore[attr-defined]
    assert pieces[1] is payload and pieces[0] == struct.pack(">iq", 100, 7)


@pytest.mark.parametrize(
    ("first", "start", "room", "enough"),
    [(-1, 0, 100, 1), (0, -1, 100, 1), (0, 0, -1, 1), (0, 0, formats.INT32_MAX + 1, 1), (0, 0, 100, 0)],
)
def test_entry_framing_refuses_bad_bounds_alike_and_frames_nothing(
    native: object, first: int, start: int, room: int, enough: int
) -> None:
    payloads: list[Entry] = [b"x" * 10]
    for frame in (native.frame_entries, framing.frame_entries_python):  # type: ignore[attr-defined]
        pieces: list[Entry] = []
        with pytest.raises(ValueError, match="frame_entries"):
            frame(pieces, first, payloads, start, room, enough)
        assert pieces == []


def test_the_compiled_entry_framing_refuses_what_is_not_a_list_or_a_sequence(native: object) -> None:
    with pytest.raises(TypeError):
        native.frame_entries((), 0, [b"x"], 0, 100, 1)  # type: ignore[attr-defined]
    pieces: list[Entry] = []
    with pytest.raises(TypeError, match="sequence"):
        native.frame_entries(pieces, 0, 5, 0, 100, 1)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        native.frame_entries(pieces, 0, [b"x", 5], 0, 100, 1000)  # type: ignore[attr-defined]
    assert pieces[:2] == [struct.pack(">iq", 1, 0), b"x"] and len(pieces) == 2, "framed up to the bad one"


def test_an_offload_writes_the_same_bytes_with_either_framing(env: Env, native: object, monkeypatch) -> None:
    """The data object of a ledger of mixed sizes, blocks and writes cut mid-run, is the
    same whichever twin frames it, and reads back entry for entry."""
    storage = env.open()
    rng = random.Random(11)
    payloads = [rng.randbytes(rng.choice([0, 1, rng.randrange(3000)])) for _ in range(3000)]
    objects = []
    for frame in (native.frame_entries, framing.frame_entries_python):  # type: ignore[attr-defined]
        monkeypatch.setattr(framing, "frame_entries", frame)
        offloader = LedgerOffloader(storage, max_block_bytes=40_000, write_bytes=7_000)
        uid = uuid.uuid4()
        record = offloader.offload(MemoryLedger(1, payloads), uid)
        objects.append(storage.read(storage.open_read(data_name(1, uid)), 0, record.data_length))
        handle = offloader.read_offloaded(1, uid)
        assert [bytes(entry) for entry in handle.read(0, len(payloads) - 1)] == payloads
        handle.close()
    assert objects[0] == objects[1]
