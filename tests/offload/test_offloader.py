"""The PIP-17 ledger offloader on SLTS, on the filesystem binding and on S3 (SeaweedFS):
ledgers from 1 to 100,000 entries written in Pulsar's block format and read back like the
source, attempts recorded before they write, crashes cleaned up, bad input refused."""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from slts.errors import (
    EntryOutOfRange,
    EntryTooLarge,
    Fenced,
    InvalidArgument,
    InvalidOffloadObject,
    MetadataError,
    OffloadNotFound,
    ReadOnlyInstance,
    StorageUnavailable,
)
from slts.metadata.schema import OFFLOAD_LEDGERS
from slts.metadata.store import Operation, Put
from slts.offload import formats
from slts.offload.ledger_metadata import LedgerMetadata
from slts.offload.ledgers import FileLedger, MemoryLedger, write_ledger_file
from slts.offload.names import data_name, index_name
from slts.offload.offloader import LedgerOffloader
from slts.offload.records import OffloadRecord, OffloadState
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, env_fixture
from tests.support.faults import die, faulty_owner

env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])
BLOCK = 64 << 10


def entries(count: int, seed: int = 0, largest: int = 300) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(largest)) for _ in range(count)]


def stored(offloader: LedgerOffloader, name: str) -> bytes:
    storage = offloader.storage
    return storage.read(storage.open_read(name), 0, storage.info(name).length)


def offload_names(storage: ChunkedSegmentStorage) -> list[str]:
    return list(storage.list("offload/"))


@pytest.mark.parametrize("count", [1, 7, 1000])
def test_offload_and_read_back_like_the_source(env: Env, count: int) -> None:
    ledger = MemoryLedger(42, entries(count, seed=count), metadata=LedgerMetadata(ctime=1_700_000_000_000))
    offloader = LedgerOffloader(env.open(), max_block_bytes=BLOCK, read_ahead_bytes=4096)
    uid = uuid.uuid4()
    record = offloader.offload(ledger, uid, {"ManagedLedgerName": "public/default/orders"})
    assert record.state == OffloadState.COMPLETE and record.entries == count
    handle = offloader.read_offloaded(42, uid)
    assert (handle.ledger_id, handle.last_entry_id, handle.length, handle.closed) == (
        42,
        count - 1,
        ledger.length,
        True,
    )
    assert handle.metadata == ledger.metadata
    assert handle.read(0, count - 1) == ledger.read(0, count - 1)
    rng = random.Random(count)
    for _ in range(100):
        first = rng.randrange(count)
        last = rng.randrange(first, min(count, first + 40))
        assert handle.read(first, last) == ledger.read(first, last), (first, last)


def test_the_data_object_is_pulsars_blocks_byte_for_byte(env: Env) -> None:
    """BlockAwareSegmentInputStreamTest's testHaveEndPadding as a whole ledger: 161 entries
    of 8 bytes in blocks of at most 3153 bytes: block 1 has 151 entries and 5 bytes of
    padding, block 2 the last 10 entries and no padding; the index says so."""
    payloads = [bytes([0x0B]) * 8] * 161
    offloader = LedgerOffloader(env.open(), max_block_bytes=3153)
    uid = uuid.uuid4()
    offloader.offload(MemoryLedger(3, payloads), uid)

    def block(first: int, count: int, size: int) -> bytes:
        body = b"".join(struct.pack(">iq", 8, first + i) + payloads[0] for i in range(count))
        header = struct.pack(">Iqqq", 0xFBDBABCB, 128, size, first) + bytes(100)
        return header + body + (b"\xfe\xdc\xde\xad" * 2)[: size - 128 - len(body)]

    by_hand = block(0, 151, 3153) + block(151, 10, 128 + 10 * 20)
    assert by_hand[3148:3153] == bytes.fromhex("fedcdeadfe")
    assert stored(offloader, data_name(3, uid)) == by_hand
    index = formats.parse_index(stored(offloader, index_name(3, uid)))
    assert list(index.entries) == [(0, 1, 0), (151, 2, 3153)]
    assert index.data_object_length == len(by_hand)
    handle = offloader.read_offloaded(3, uid)
    assert handle.read(0, 150) == payloads[:151], "up to the padding"
    assert handle.read(151, 151) == payloads[151:152], "a sequential reader goes on in the next block"
    assert handle.read(152, 160) == payloads[152:]


def test_a_ledger_of_100000_entries_across_blocks(env: Env) -> None:
    ledger = MemoryLedger(7, entries(100_000, seed=1, largest=40))
    offloader = LedgerOffloader(env.open(), max_block_bytes=256 << 10)
    uid = uuid.uuid4()
    record = offloader.offload(ledger, uid)
    assert record.blocks > 10
    handle = offloader.read_offloaded(7, uid)
    for first in range(0, 100_000, 5000):  # a sequential reader, 5,000 entries per read
        assert handle.read(first, first + 4999) == ledger.read(first, first + 4999)
    assert handle.read(99_999, 99_999) == ledger.read(99_999, 99_999)


def test_a_file_ledger_is_offloaded_like_a_memory_one(env: Env, tmp_path: Path) -> None:
    payloads = entries(500, seed=3)
    write_ledger_file(tmp_path / "ledger-5", payloads)
    offloader = LedgerOffloader(env.open(), max_block_bytes=BLOCK)
    with FileLedger(5, tmp_path / "ledger-5") as ledger:
        assert ledger.read(0, 499) == payloads
        uid = uuid.uuid4()
        offloader.offload(ledger, uid)
    assert offloader.read_offloaded(5, uid).read(0, 499) == payloads


def test_reads_outside_the_ledger_and_unknown_attempts_are_typed_errors(env: Env) -> None:
    offloader = LedgerOffloader(env.open(), max_block_bytes=BLOCK)
    uid = uuid.uuid4()
    offloader.offload(MemoryLedger(1, entries(10)), uid)
    handle = offloader.read_offloaded(1, uid)
    for first, last in ((-1, 3), (3, 10), (5, 4), (10, 10)):
        with pytest.raises(EntryOutOfRange, match=r"outside 0\.\.9"):
            handle.read(first, last)
    with pytest.raises(InvalidArgument):
        handle.read(0, "3")  # type: ignore[arg-type]
    for ledger_id, attempt in ((2, uid), (1, uuid.uuid4())):
        with pytest.raises(OffloadNotFound):
            offloader.read_offloaded(ledger_id, attempt)
        with pytest.raises(OffloadNotFound):
            offloader.delete_offloaded(ledger_id, attempt)


def test_bad_offloads_are_refused_and_change_nothing(env: Env) -> None:
    offloader = LedgerOffloader(env.open(), max_block_bytes=BLOCK)
    used = uuid.uuid4()
    offloader.offload(MemoryLedger(1, entries(10)), used)
    before = env.snapshot()
    for bad, message in (
        (lambda: offloader.offload(MemoryLedger(2, entries(3), closed=False), uuid.uuid4()), "not closed"),
        (lambda: offloader.offload(MemoryLedger(2, []), uuid.uuid4()), "no entries"),
        (lambda: offloader.offload(MemoryLedger(1, entries(10)), used), "used before"),
        (lambda: offloader.offload(MemoryLedger(2, entries(3)), "not-a-uuid"), "uuid"),  # type: ignore[arg-type]
        (lambda: offloader.offload(object(), uuid.uuid4()), "read handle"),  # type: ignore[arg-type]
        (lambda: offloader.offload(MemoryLedger(2, entries(3)), uuid.uuid4(), {"k": 1}), "extra"),  # type: ignore[dict-item]
        (lambda: LedgerOffloader(offloader.storage, max_block_bytes=100), "max_block_bytes"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            bad()
    assert env.snapshot() == before


def test_an_entry_larger_than_a_block_fails_the_offload_and_leaves_nothing(env: Env) -> None:
    """Pulsar uploads a block of padding and reports success with the ledger's tail lost;
    SLTS refuses the offload and removes what it wrote."""
    offloader = LedgerOffloader(env.open(), max_block_bytes=1128)
    payloads = [b"a" * 900] * 5 + [b"b" * 1000]
    with pytest.raises(EntryTooLarge, match="entry 5 of 1000 bytes") as caught:
        offloader.offload(MemoryLedger(4, payloads), uuid.uuid4())
    assert (caught.value.ledger, caught.value.entry) == (4, 5)
    assert offloader.attempts() == [] and offload_names(offloader.storage) == []


def test_a_failed_attempt_cleans_up_after_itself(env: Env) -> None:
    class FailingLedger(MemoryLedger):
        def read(self, first: int, last: int) -> list[bytes]:
            if first >= 300:
                raise OSError("the bookie went away")
            return super().read(first, last)

    offloader = LedgerOffloader(env.open(), max_block_bytes=4096, write_bytes=4096)
    with pytest.raises(OSError, match="bookie"):
        offloader.offload(FailingLedger(8, entries(1000)), uuid.uuid4())
    assert offloader.attempts() == [] and offload_names(offloader.storage) == []


def test_a_failed_attempt_whose_object_creation_landed_unanswered_leaves_nothing(env: Env) -> None:
    """The data object's creation lands but its answer is lost (the commit raises): the
    attempt fails, and the object it could not know it had made goes with it (found by
    ``slts simulate``, seed 32 of the offload room: an object of no record, left forever)."""
    storage, _, store = faulty_owner(env)
    offloader = LedgerOffloader(storage, max_block_bytes=4096)
    uid = uuid.uuid4()
    creation = data_name(9, uid).encode()
    lost: list[bool] = []

    def lose_the_creation_reply(ops: Sequence[Operation], expect: object) -> None:
        creating = any(isinstance(op, Put) and op.key == creation for op in ops)
        store.lose_reply_probability(1.0 if creating and not any(lost) else 0.0)
        lost.append(creating)

    store.before_commit = lose_the_creation_reply
    with pytest.raises(MetadataError, match="answer was lost"):
        offloader.offload(MemoryLedger(9, entries(20)), uid)
    store.before_commit = None
    assert any(lost)
    assert offloader.attempts() == [] and offload_names(storage) == []


def test_a_crashed_attempt_is_cleaned_up_by_the_next_owner_and_a_live_one_is_left_alone(env: Env) -> None:
    """The offloading process dies half-way through the data object (its chunk storage
    and metadata store stop answering, so it cannot clean up). While the attempt was
    running, a cleanup by the same owner left it alone; the next owner removes it."""
    storage, binding, store = faulty_owner(env)
    first_owner = LedgerOffloader(storage, max_block_bytes=4096, write_bytes=4096)
    while_running: list[tuple[list[OffloadRecord], list[OffloadRecord]]] = []

    class Watched(MemoryLedger):
        def read(self, first: int, last: int) -> list[bytes]:
            if first >= 300 and not while_running:
                while_running.append((first_owner.cleanup(), first_owner.attempts(8)))
                die(binding, store)  # the process dies here
            return super().read(first, last)

    crashed = uuid.uuid4()
    with pytest.raises(StorageUnavailable) as caught:
        first_owner.offload(Watched(8, entries(1000)), crashed)
    assert caught.value.context["injected"]
    (cleaned, running), *_ = while_running
    assert cleaned == [], "an attempt of this epoch may still be running: left alone"
    assert [(r.id, r.state) for r in running] == [(crashed, OffloadState.STARTED)]

    follower_storage = ChunkedSegmentStorage(0, None, env.binding, env.store, read_only=True)
    env.instances.append(follower_storage)
    follower = LedgerOffloader(follower_storage)
    (left,) = follower.attempts(8)
    assert left.state == OffloadState.STARTED, "the dead process could not clean up"
    assert offload_names(follower_storage) == [data_name(8, crashed)]

    second_owner = LedgerOffloader(env.open(), max_block_bytes=4096)
    ledger = MemoryLedger(8, entries(1000))
    retry = uuid.uuid4()
    second_owner.offload(ledger, retry)
    assert [r.id for r in second_owner.attempts(8)] == [retry]
    assert offload_names(second_owner.storage) == sorted([data_name(8, retry), index_name(8, retry)])
    assert second_owner.read_offloaded(8, retry).read(0, 999) == ledger.read(0, 999)


def test_delete_removes_both_objects_and_the_record(env: Env) -> None:
    offloader = LedgerOffloader(env.open(), max_block_bytes=BLOCK)
    kept, deleted = uuid.uuid4(), uuid.uuid4()
    offloader.offload(MemoryLedger(6, entries(50)), kept)
    offloader.offload(MemoryLedger(6, entries(50, seed=9)), deleted)
    offloader.delete_offloaded(6, deleted)
    assert [r.id for r in offloader.attempts(6)] == [kept]
    assert offload_names(offloader.storage) == sorted([data_name(6, kept), index_name(6, kept)])
    assert offloader.read_offloaded(6, kept).read(0, 49) == entries(50)


def test_a_damaged_block_header_is_a_typed_error_naming_object_and_offset(env: Env) -> None:
    storage = env.open(checksums=False, verify_checksums_on_read=False)  # SLTS's own check would come first
    offloader = LedgerOffloader(storage, max_block_bytes=4096)
    uid = uuid.uuid4()
    record = offloader.offload(MemoryLedger(2, entries(200)), uid)
    assert record.blocks >= 3
    index = formats.parse_index(stored(offloader, index_name(2, uid)))
    second = index.entries[1]
    (chunk_start, chunk), *_ = [
        (start, c)
        for start, c in storage.chunks(data_name(2, uid))
        if start <= second.offset < start + c.length
    ]
    binding = storage.chunk_storage
    data = bytearray(binding.read(binding.open_read(chunk.name), 0, chunk.length))
    data[second.offset - chunk_start] ^= 0xFF
    binding.delete(binding.open_write(chunk.name))
    binding.create(chunk.name, bytes(data))
    handle = offloader.read_offloaded(2, uid)
    assert handle.read(0, second.entry_id - 1) == entries(200)[: second.entry_id]
    with pytest.raises(InvalidOffloadObject, match="bad block header") as caught:
        handle.read(second.entry_id, second.entry_id)
    assert caught.value.object == data_name(2, uid) and caught.value.offset == second.offset


def test_objects_of_an_unknown_format_version_are_refused(env: Env) -> None:
    storage = env.open()
    offloader = LedgerOffloader(storage, max_block_bytes=BLOCK)
    uid = uuid.uuid4()
    record = offloader.offload(MemoryLedger(4, entries(20)), uid)
    assert record.format_version == formats.FORMAT_VERSION == "1"
    newer = record.replace(format_version="2")
    storage.context.ownership.commit([Put(OFFLOAD_LEDGERS, record.key, newer.encode())], [])
    with pytest.raises(InvalidOffloadObject, match="format version '2'") as caught:
        offloader.read_offloaded(4, uid)
    assert caught.value.object == index_name(4, uid)


def test_a_fenced_instance_changes_nothing_and_a_follower_reads(env: Env) -> None:
    old = LedgerOffloader(env.open(), max_block_bytes=BLOCK)
    uid = uuid.uuid4()
    old.offload(MemoryLedger(1, entries(20)), uid)
    LedgerOffloader(env.open())  # a newer owner
    before = env.snapshot()
    with pytest.raises(Fenced):
        old.offload(MemoryLedger(2, entries(20)), uuid.uuid4())
    with pytest.raises(Fenced):
        old.delete_offloaded(1, uid)
    assert env.snapshot() == before
    follower_storage = ChunkedSegmentStorage(0, None, env.binding, env.store, read_only=True)
    env.instances.append(follower_storage)
    follower = LedgerOffloader(follower_storage)
    assert follower.read_offloaded(1, uid).read(0, 19) == entries(20)
    with pytest.raises(ReadOnlyInstance):
        follower.offload(MemoryLedger(2, entries(20)), uuid.uuid4())
    assert env.snapshot() == before


def test_restore_from_tier2_alone_brings_the_offloaded_ledgers_back(env: Env) -> None:
    storage = env.open(metadata_log_flush_interval_s=0.0)
    offloader = LedgerOffloader(storage, max_block_bytes=BLOCK)
    uid = uuid.uuid4()
    offloader.offload(MemoryLedger(11, entries(300)), uid)
    expected = offloader.attempts()
    revived = env.lose_machine_and_restore(storage)
    offloader = LedgerOffloader(revived)
    assert offloader.attempts() == expected
    assert offloader.read_offloaded(11, uid).read(0, 299) == entries(300)
