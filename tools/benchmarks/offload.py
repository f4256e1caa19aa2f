"""Pulsar-style ledger offload (``slts.offload``): offload and read back, each against raw
binding writes and reads of the same bytes, at two entry sizes (1 KiB: single small
messages; 64 KiB: batched messages, below Pulsar's 128 KiB batching limit); streaming
offload of 1 KiB entries in entries per second, and the streamed ledger read back."""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid
from array import array
from collections.abc import Iterator

import crc32c
import lmdb
from slts.tools.benchmarks.base import Benchmark, Folder, Workload, timed_raw_chunk_write

from slts.offload.ledgers import MemoryLedger
from slts.offload.names import data_name, segment_name
from slts.offload.offloader import (
    READ_AHEAD_BYTES_DEFAULT,
    WRITE_BYTES_DEFAULT,
    LedgerOffloader,
)
from slts.offload.pending import HANDED, PAUSE, TAKEN, OfferLimits, encode, new_offer_buffer, new_offer_gate
from slts.offload.streaming import BLOCK_BYTES_DEFAULT, OfferResult, StreamingOffloader

READ_ENTRIES = 1000


def _ledger(quick: bool, entry_bytes: int) -> MemoryLedger:
    total = (8 if quick else 64) << 20
    payload = os.urandom(entry_bytes)
    return MemoryLedger(1, [payload] * (total // entry_bytes))


def offload_write(
    parent: str, quick: bool, entry_bytes: int
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: ``offload`` of a closed in-memory ledger into a fresh store (filesystem
    binding, LMDB): blocks of 64 MiB built and written in 8 MiB writes, the attempt's two
    commits, the index object. Baseline: the data object's bytes written raw into a new
    chunk of the same binding in the same 8 MiB writes, each ``fdatasync``ed."""
    ledger = _ledger(quick, entry_bytes)
    folder = Folder(parent)
    data_bytes = 0

    def subject() -> float:
        nonlocal data_bytes
        with folder.fresh_store("subject") as storage:
            started = time.perf_counter()
            record = LedgerOffloader(storage).offload(ledger, uuid.uuid4())
            elapsed = time.perf_counter() - started
        data_bytes = record.data_length
        return elapsed

    def baseline() -> float:
        with folder.fresh("raw") as path:
            return timed_raw_chunk_write(path, data_bytes or ledger.length, WRITE_BYTES_DEFAULT)

    try:
        yield (
            f"offload of a ledger of {ledger.last_entry_id + 1} entries of {entry_bytes} B"
            f" ({ledger.length >> 20} MiB) vs. raw binding writes of the data object's bytes",
            subject,
            baseline,
            ledger.length / 1e6,
            "MB/s",
        )
    finally:
        folder.close()


def offload_read(
    parent: str, quick: bool, entry_bytes: int, against: str = "raw"
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: a sequential reader of the offloaded ledger, ``read`` of 1,000 entries at a
    time through the read handle (index lookup, header checks, ranges of 1 to 8 MiB read
    with ``read_view``, every SLTS block's CRC32C verified); a read's 1,000 entries are
    alive together when it returns. Baseline, by ``against``:

    - ``raw``: raw binding reads of the data object's chunks in 1 MiB pieces (no parsing,
      no verification), each dropped at once;
    - ``held``: the same, the pieces of 1,000 entries' bytes kept together until the next
      1,000's, as a read's entries are (every group takes fresh memory: the floor of
      handing 1,000 entries' bytes out as copies);
    - ``floor``: the least a reader that verifies what it returns and hands out each entry
      as a ``bytes`` copy does, with nothing to find out: the chunks viewed whole
      (``read_view``, mapped), each SLTS block's CRC32C computed in C iteration, and the
      entries copied out by one ``struct`` call per 1,000 at a uniform stride (the cost,
      not the content: block headers are not skipped), no header checks, no cache. It is
      the ceiling of a reader that copies small entries (the pure-Python framer); the
      compiled framer's zero-copy ``Payload`` views pass it."""
    ledger = _ledger(quick, entry_bytes)
    folder = Folder(parent)
    storage = folder.store("store")
    offloader = LedgerOffloader(storage)
    uid = uuid.uuid4()
    offloader.offload(ledger, uid)
    chunks = [(chunk.name, chunk.length) for _, chunk in storage.chunks(data_name(1, uid))]
    binding = storage.chunk_storage
    last = ledger.last_entry_id

    def subject() -> float:
        handle = offloader.read_offloaded(1, uid)
        started = time.perf_counter()
        for first in range(0, last + 1, READ_ENTRIES):
            handle.read(first, min(first + READ_ENTRIES - 1, last))
        return time.perf_counter() - started

    group_bytes = READ_ENTRIES * (entry_bytes + 12) if against == "held" else 0

    def raw() -> float:
        kept: list[bytes] = []
        kept_bytes = 0
        started = time.perf_counter()
        for name, length in chunks:
            chunk = binding.open_read(name)
            for offset in range(0, length, READ_AHEAD_BYTES_DEFAULT):
                piece = binding.read(chunk, offset, min(READ_AHEAD_BYTES_DEFAULT, length - offset))
                if kept_bytes >= group_bytes:
                    kept, kept_bytes = [], 0
                kept.append(piece)
                kept_bytes += len(piece)
        return time.perf_counter() - started

    block = storage.config.checksum_block_bytes
    copier = struct.Struct(f"12x{entry_bytes}s" * READ_ENTRIES)

    def floor() -> float:
        started = time.perf_counter()
        for name, length in chunks:
            view = binding.read_view(binding.open_read(name), 0, length)
            pieces = map(
                view.__getitem__, map(slice, range(0, length, block), range(block, length + block, block))
            )
            sums = array("I", map(crc32c.crc32c, pieces))
            assert len(sums) == -(-length // block)
            for at in range(0, length - copier.size, copier.size):
                copier.unpack_from(view, at)
        return time.perf_counter() - started

    shown = {
        "raw": "raw binding reads of the data object",
        "held": "raw binding reads of the data object, held as the entries are",
        "floor": "the least a verified read of them as bytes copies does",
    }[against]
    try:
        yield (
            f"sequential read-back of {last + 1} entries of {entry_bytes} B ({ledger.length >> 20} MiB)"
            f" vs. {shown}",
            subject,
            floor if against == "floor" else raw,
            ledger.length / 1e6,
            "MB/s",
        )
    finally:
        storage.close()
        folder.close()


def _pair(entry_bytes: int) -> dict[str, Benchmark]:
    label = {1024: "1k", 65536: "64k"}[entry_bytes]
    write = Benchmark(
        f"offload_write_{label}",
        f"ledger offload, {label}B entries, vs. raw binding writes",
        lambda parent, quick: offload_write(parent, quick, entry_bytes),
    )
    read = Benchmark(
        f"offload_read_{label}",
        f"offloaded ledger read back, {label}B entries, vs. raw binding reads",
        lambda parent, quick: offload_read(parent, quick, entry_bytes),
    )
    held = Benchmark(
        f"offload_read_{label}_held",
        f"offloaded ledger read back, {label}B entries, vs. raw binding reads held as long",
        lambda parent, quick: offload_read(parent, quick, entry_bytes, "held"),
    )
    return {write.name: write, read.name: read, held.name: held}


def offload_stream(
    parent: str, quick: bool, threads: bool = True
) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: a managed ledger offering 1 KiB entries to a streaming offload (PIP-76) one
    by one, waiting out back-pressure with ``wait_for_room``, then closing the segment: the
    offers frame blocks of 5 MiB (Pulsar's default), which the writer (the handle's thread,
    or with ``threads`` off the offering thread) writes, the full ones it finds in one atomic
    durable SLTS write whose commit records them, then the index object. Baseline: the
    segment's bytes written raw into a new chunk of the same binding in writes of one
    block, each ``fdatasync``ed."""
    count = (8 if quick else 64) << 10
    payload = os.urandom(1024)
    folder = Folder(parent)
    data_bytes = 0

    def subject() -> float:
        nonlocal data_bytes
        with folder.fresh_store("subject") as storage:
            offloader = StreamingOffloader(storage, "bench", threads=threads)
            started = time.perf_counter()
            handle = offloader.streaming_offload(uuid.uuid4())
            for entry_id in range(count):
                while (outcome := handle.offer_entry(0, entry_id, payload)) == OfferResult.FAIL_BUFFER_FULL:
                    handle.wait_for_room()
                assert outcome == OfferResult.OK, outcome
            handle.close()
            elapsed = time.perf_counter() - started
            data_bytes = offloader.segments()[0].data_length
        return elapsed

    def baseline() -> float:
        with folder.fresh("raw") as path:
            return timed_raw_chunk_write(path, data_bytes or count * 1036, BLOCK_BYTES_DEFAULT)

    try:
        yield (
            f"streaming offload of {count} entries of 1 KiB offered one by one"
            " vs. raw binding writes of the segment's bytes in 5 MiB blocks",
            subject,
            baseline,
            float(count),
            "entries/s",
        )
    finally:
        folder.close()


def offload_stream_floor(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: the least a streaming offload with a writer thread does in this runtime,
    SLTS's write path left out: the same offers through the same offer gate and compiled
    blocks (one C call per entry from the same loop, waiting out back-pressure alike, pausing
    as the handle's offers do while the writer writes), and a writer thread that writes each
    batch of full blocks to a plain file (``write`` and ``fdatasync``) and commits one record
    of it to LMDB (synced), nothing else: no chunk records, checksums, index object or close.
    Baseline: the raw writes of ``offload_stream_1k``. It bounds what ``offload_stream_1k``
    can reach with its design (an offering thread and a writer thread sharing one
    interpreter)."""
    count = (8 if quick else 64) << 10
    payload = os.urandom(1024)
    folder = Folder(parent)

    def subject() -> float:
        with folder.fresh("floor") as path:
            return _floor_run(path, count, payload)

    def baseline() -> float:
        with folder.fresh("raw") as path:
            return timed_raw_chunk_write(path, count * 1036, BLOCK_BYTES_DEFAULT)

    try:
        yield (
            f"the least a threaded streaming offload of {count} entries of 1 KiB does in this runtime"
            " vs. raw binding writes of its bytes in 5 MiB blocks",
            subject,
            baseline,
            float(count),
            "entries/s",
        )
    finally:
        folder.close()


def _floor_run(path: str, count: int, payload: bytes) -> float:
    """One run of ``offload_stream_floor``'s subject in folder ``path``; its seconds."""
    env = lmdb.open(os.path.join(path, "metadata"), map_size=1 << 30, metasync=False)
    fd = os.open(os.path.join(path, "data"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lock = threading.Lock()
    cond = threading.Condition(lock)
    limits = OfferLimits(10 << 20, BLOCK_BYTES_DEFAULT, 1 << 40, time.time(), 1e9, 0.0)
    offers = new_offer_buffer((0, 0), None, 0, limits, False)
    closing = [False]

    def locked(outcome: int, *_: object) -> object:
        if not outcome & TAKEN:
            return OfferResult.FAIL_BUFFER_FULL
        if outcome & HANDED:
            cond.notify_all()
        return None

    def after(outcome: int) -> None:
        if outcome & (HANDED | PAUSE):
            time.sleep(0)

    def writer() -> None:
        written = 0
        while True:
            with cond:
                while not offers.has_full and not closing[0]:
                    cond.wait()
                blocks = offers.take(64 << 20, closing[0])
                cond.notify_all()
            if not blocks:
                return
            offers.writing = True
            data = memoryview(b"".join(encode(block, BLOCK_BYTES_DEFAULT)[1] for block in blocks))
            while data:
                data = data[os.write(fd, data) :]
            os.fdatasync(fd)
            written += 1
            with env.begin(write=True) as txn:
                txn.put(b"blocks", struct.pack(">Q", written))
            env.sync(True)
            offers.writing = False

    offer = new_offer_gate(lock, offers, time.time, OfferResult.OK, locked, after)
    thread = threading.Thread(target=writer)
    try:
        started = time.perf_counter()
        thread.start()
        for entry_id in range(count):
            while (outcome := offer(0, entry_id, payload)) == OfferResult.FAIL_BUFFER_FULL:
                with cond:
                    cond.wait_for(lambda: offers.buffered < limits.buffer_bytes)
            assert outcome == OfferResult.OK, outcome
        with cond:
            closing[0] = True
            cond.notify_all()
        thread.join()
        return time.perf_counter() - started
    finally:
        os.close(fd)
        env.close()


def offload_stream_read(parent: str, quick: bool) -> Iterator[tuple[str, Workload, Workload, float, str]]:
    """Subject: a sequential reader of a streamed ledger (1 KiB entries in blocks of 5 MiB,
    Pulsar's default), ``read`` of 1,000 entries at a time through a new handle of
    ``read_ledger`` (each block read whole once, its header checked against the segment's
    record, its frames checked, every SLTS block's CRC32C verified). Baseline: raw binding
    reads of the segment's chunks in pieces of one block (no parsing, no verification)."""
    count = (8 if quick else 64) << 10
    payload = os.urandom(1024)
    folder = Folder(parent)
    storage = folder.store("store")
    offloader = StreamingOffloader(storage, "bench")
    writer = offloader.streaming_offload(uuid.uuid4())
    for entry_id in range(count):
        while (outcome := writer.offer_entry(0, entry_id, payload)) == OfferResult.FAIL_BUFFER_FULL:
            writer.wait_for_room()
        assert outcome == OfferResult.OK, outcome
    writer.close()
    (segment,) = offloader.segments()
    chunks = [(c.name, c.length) for _, c in storage.chunks(segment_name("bench", segment.id))]
    binding = storage.chunk_storage
    last = count - 1

    def subject() -> float:
        handle = offloader.read_ledger(0)
        started = time.perf_counter()
        for first in range(0, last + 1, READ_ENTRIES):
            handle.read(first, min(first + READ_ENTRIES - 1, last))
        elapsed = time.perf_counter() - started
        handle.close()
        return elapsed

    def baseline() -> float:
        started = time.perf_counter()
        for name, length in chunks:
            chunk = binding.open_read(name)
            for offset in range(0, length, BLOCK_BYTES_DEFAULT):
                binding.read(chunk, offset, min(BLOCK_BYTES_DEFAULT, length - offset))
        return time.perf_counter() - started

    try:
        yield (
            f"sequential read-back of a streamed ledger of {count} entries of 1 KiB"
            " vs. raw binding reads of its segment in 5 MiB pieces",
            subject,
            baseline,
            count * 1024 / 1e6,
            "MB/s",
        )
    finally:
        storage.close()
        folder.close()


_STREAM = Benchmark(
    "offload_stream_1k",
    "streaming offload (PIP-76), 1 KiB entries, vs. raw binding writes of its blocks",
    offload_stream,
)
_STREAM_INLINE = Benchmark(
    "offload_stream_1k_inline",
    "streaming offload (PIP-76), 1 KiB entries, the writer in the offering thread, vs. raw writes",
    lambda parent, quick: offload_stream(parent, quick, threads=False),
)
_STREAM_FLOOR = Benchmark(
    "offload_stream_1k_floor",
    "the least a threaded streaming offload of 1 KiB entries does here, vs. raw writes of its blocks",
    offload_stream_floor,
)
_READ_FLOOR = Benchmark(
    "offload_read_1k_floor",
    "offloaded ledger read back, 1 KiB entries, vs. the least a verified read of them as copies does",
    lambda parent, quick: offload_read(parent, quick, 1024, "floor"),
)
_STREAM_READ = Benchmark(
    "offload_stream_read_1k",
    "streamed ledger (PIP-76) read back, 1 KiB entries, vs. raw binding reads",
    offload_stream_read,
)
BENCHMARKS = {
    **_pair(64 << 10),
    **_pair(1 << 10),
    _STREAM.name: _STREAM,
    _STREAM_INLINE.name: _STREAM_INLINE,
    _STREAM_FLOOR.name: _STREAM_FLOOR,
    _STREAM_READ.name: _STREAM_READ,
    _READ_FLOOR.name: _READ_FLOOR,
}
