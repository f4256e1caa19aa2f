"""The simulator's ``nonce_reuse`` invariant (``checks.NonceLedger``) can fail: a frame
stored under a data key and ordinal that another frame used before is found, also when
the first frame's chunk is gone."""

from __future__ import annotations

import pytest
from slts.bindings.memory import MemoryChunkStorage
from slts.tools.simulation.checks import NonceLedger, Violation

from slts.config import StorageConfig
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import CHUNKS, TABLES, name_key
from slts.metadata.store import Expect, Put
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import MemoryKeyRing


def test_a_second_frame_under_one_key_and_ordinal_is_nonce_reuse() -> None:
    ring = MemoryKeyRing()
    ring.activate(ring.add())
    binding, store = MemoryChunkStorage(), MemoryMetadataStore(TABLES)
    config = StorageConfig(encryption=True, frame_bytes=64, gc_interval_s=0.0, journal=False)
    storage = ChunkedSegmentStorage(0, None, binding, store, config, key_ring=ring)
    storage.create("a")
    for i in range(4):
        storage.write(storage.open_write("a"), i * 100, bytes([i]) * 100)
    ledger = NonceLedger()
    ledger.check(store, binding)  # appends under one key: ordinals all distinct
    ledger.check(store, binding)  # read again: nothing new, nothing found
    (_, chunk), *_ = storage.chunks("a")
    stored = binding.read(binding.open_read(chunk.name), 0, chunk.stored)
    # What a retry without the taint rule would store: the chunk's key and ordinals again,
    # over other bytes, in a chunk of its own; and the first chunk gone meanwhile.
    binding.delete(binding.open_write(chunk.name))
    binding.create("0/again", bytes([stored[0] ^ 1]) + stored[1:])
    retry = chunk.replace(name="0/again")
    store.commit([Put(CHUNKS, name_key("0/again"), retry.encode())], [Expect(CHUNKS, name_key("0/again"), 0)])
    with pytest.raises(Violation) as caught:
        ledger.check(store, binding)
    assert caught.value.kind == "nonce_reuse" and "0/again" in caught.value.detail
    storage.close()
