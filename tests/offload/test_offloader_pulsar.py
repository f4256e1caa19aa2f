"""The PIP-17 ledger offloader held to Pulsar's ``BlobStoreManagedLedgerOffloaderTest``, on
the filesystem binding and S3: an offload that fails at any of its steps (the data
object's start, a part, the index, the completion) leaves neither object nor record; a
failed delete leaves both objects for ``cleanup``; random ranges read back exactly; a
reader goes back to an earlier entry after reading to the end."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable

import pytest
from slts.bindings.faulty import FaultyChunkStorage

from slts.errors import MetadataError, OffloadNotFound, SltsError, StorageUnavailable
from slts.metadata.faulty_store import FaultyMetadataStore
from slts.metadata.schema import OFFLOAD_LEDGERS, SEGMENTS
from slts.offload.ledgers import MemoryLedger
from slts.offload.names import data_name, index_name
from slts.offload.offloader import LedgerOffloader
from slts.offload.records import OffloadState
from tests.support.engine import Env, env_fixture
from tests.support.faults import faulty_owner

env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])
LEDGER = 9


def entries(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randrange(1, 600)) for _ in range(count)]


def injected() -> None:
    raise StorageUnavailable("injected failure", injected=True)


def fail_data_start(binding: FaultyChunkStorage, store: FaultyMetadataStore, uid: uuid.UUID) -> None:
    binding.before(("create", "write"), injected, nth=1, prefix=f"0/{data_name(LEDGER, uid)}")


def fail_a_data_part(binding: FaultyChunkStorage, store: FaultyMetadataStore, uid: uuid.UUID) -> None:
    binding.before(("create", "write"), injected, nth=3, prefix=f"0/{data_name(LEDGER, uid)}")


def fail_the_index(binding: FaultyChunkStorage, store: FaultyMetadataStore, uid: uuid.UUID) -> None:
    binding.before(("create", "write"), injected, nth=1, prefix=f"0/{index_name(LEDGER, uid)}")


def fail_the_completion(binding: FaultyChunkStorage, store: FaultyMetadataStore, uid: uuid.UUID) -> None:
    store.fail_nth(2, table=OFFLOAD_LEDGERS)  # STARTED, then COMPLETE


@pytest.mark.parametrize(
    "fail", [fail_data_start, fail_a_data_part, fail_the_index, fail_the_completion], ids=lambda f: f.__name__
)
def test_an_offload_failing_at_any_step_leaves_neither_object_nor_record(
    env: Env, fail: Callable[[FaultyChunkStorage, FaultyMetadataStore, uuid.UUID], None]
) -> None:
    """testOffloadFailInitDataBlockUpload, testOffloadFailDataBlockPartUpload,
    testOffloadFailDataBlockUploadComplete, testOffloadFailPutIndexBlock: the error
    reaches the caller and neither object exists after it."""
    storage, binding, store = faulty_owner(env)
    offloader = LedgerOffloader(storage, max_block_bytes=4096, write_bytes=4096)
    uid = uuid.uuid4()
    fail(binding, store, uid)
    with pytest.raises((StorageUnavailable, MetadataError)):
        offloader.offload(MemoryLedger(LEDGER, entries(200, seed=1)), uid)
    assert list(storage.list("offload/")) == []
    assert offloader.attempts() == []
    with pytest.raises(OffloadNotFound):
        offloader.read_offloaded(LEDGER, uid)
    payloads = entries(200, seed=2)  # the ledger offloads afterwards under another uid
    again = uuid.uuid4()
    offloader.offload(MemoryLedger(LEDGER, payloads), again)
    assert offloader.read_offloaded(LEDGER, again).read(0, 199) == payloads


def test_a_failed_delete_leaves_both_objects_and_cleanup_finishes_it(env: Env) -> None:
    """testDeleteOffloadedFail: the objects are still there after the failed delete; the
    attempt is DELETING (no longer readable) and ``cleanup`` removes it."""
    storage, _, store = faulty_owner(env)
    offloader = LedgerOffloader(storage, max_block_bytes=4096)
    uid = uuid.uuid4()
    offloader.offload(MemoryLedger(LEDGER, entries(50, seed=3)), uid)
    store.fail_nth(1, table=SEGMENTS)  # the delete of the data object
    with pytest.raises(SltsError):
        offloader.delete_offloaded(LEDGER, uid)
    assert sorted(storage.list("offload/")) == sorted([data_name(LEDGER, uid), index_name(LEDGER, uid)])
    assert [a.state for a in offloader.attempts()] == [OffloadState.DELETING]
    with pytest.raises(OffloadNotFound):
        offloader.read_offloaded(LEDGER, uid)
    assert [a.id for a in offloader.cleanup()] == [uid]
    assert list(storage.list("offload/")) == [] and offloader.attempts() == []


def test_random_ranges_and_a_reread_after_the_end_read_back_exactly(env: Env) -> None:
    """testOffloadReadRandomAccess and testReadEOFException: ten random ranges of a ledger
    of several blocks, then the whole ledger, then its first entry again."""
    offloader = LedgerOffloader(env.open(), max_block_bytes=4096)
    payloads = entries(400, seed=4)
    uid = uuid.uuid4()
    offloader.offload(MemoryLedger(LEDGER, payloads), uid)
    handle = offloader.read_offloaded(LEDGER, uid)
    rng = random.Random(0)
    for _ in range(10):
        first, last = sorted((rng.randrange(399), rng.randrange(399)))
        assert handle.read(first, last) == payloads[first : last + 1]
    assert handle.read(0, 399) == payloads
    assert handle.read(0, 0) == payloads[:1]


def test_a_failed_attempt_whose_record_could_not_go_is_cleaned_by_the_same_owner(env: Env) -> None:
    """The data write fails and so does the removal of the attempt's record: the STARTED
    record of this very epoch is no attempt in progress, and ``cleanup`` takes it now (not
    only after a takeover)."""
    storage, binding, store = faulty_owner(env)
    offloader = LedgerOffloader(storage, max_block_bytes=4096, write_bytes=4096)
    uid = uuid.uuid4()
    fail_a_data_part(binding, store, uid)
    store.fail_nth(2, table=OFFLOAD_LEDGERS)  # STARTED lands, its removal does not
    with pytest.raises(StorageUnavailable):
        offloader.offload(MemoryLedger(LEDGER, entries(200, seed=5)), uid)
    assert [(a.id, a.state) for a in offloader.attempts()] == [(uid, OffloadState.STARTED)]
    assert [a.id for a in offloader.cleanup()] == [uid]
    assert offloader.attempts() == [] and list(storage.list("offload/")) == []
