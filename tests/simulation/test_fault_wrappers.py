"""The simulator's fault injectors: ``FaultyMetadataStore`` and ``FaultyChunkStorage``'s
lost replies, latency and kill (STYLE.md practice 10)."""

from __future__ import annotations

import pytest
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.memory import MemoryChunkStorage

from slts.errors import MetadataError, StorageUnavailable
from slts.metadata.faulty_store import FaultyMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.metadata.store import Put

KEY = b"k"


def put(value: bytes) -> Put:
    return Put(TABLES[0], KEY, value)


def test_failed_commit_applies_nothing() -> None:
    store = FaultyMetadataStore(MemoryMetadataStore(TABLES), seed=1)
    store.fail_probability(1.0)
    with pytest.raises(MetadataError) as caught:
        store.commit([put(b"v")])
    assert caught.value.context["injected"] and store.get(TABLES[0], KEY) is None
    assert store.faults["commit-fail"] == 1


def test_lost_reply_applies_then_raises() -> None:
    store = FaultyMetadataStore(MemoryMetadataStore(TABLES), seed=1)
    store.lose_reply_probability(1.0)
    with pytest.raises(MetadataError) as caught:
        store.commit([put(b"v")])
    assert caught.value.context["reply_lost"]
    stored = store.get(TABLES[0], KEY)
    assert stored is not None and stored.value == b"v"


@pytest.mark.parametrize("landed", [False, True])
def test_crash_at_nth_commit_kills_the_process(landed: bool) -> None:
    inner = MemoryMetadataStore(TABLES)
    store = FaultyMetadataStore(inner, seed=1)
    binding = FaultyChunkStorage(MemoryChunkStorage())
    store.on_crash = binding.kill
    store.crash_at(2, landed)
    store.commit([put(b"1")])
    with pytest.raises(MetadataError):
        store.commit([put(b"2")])
    assert inner.get(TABLES[0], KEY).value == (b"2" if landed else b"1")  # type: ignore[union-attr]
    with pytest.raises(MetadataError):  # a dead process does nothing more
        store.commit([put(b"3")])
    with pytest.raises(StorageUnavailable):
        binding.create("c", b"x")
    assert not binding.inner.exists("c")


def test_lost_reply_on_create_leaves_the_chunk() -> None:
    binding = FaultyChunkStorage(MemoryChunkStorage(), seed=3)
    binding.lose_reply_probability("create", 1.0)
    with pytest.raises(StorageUnavailable) as caught:
        binding.create("c", b"abc")
    assert caught.value.context["reply_lost"] and binding.inner.exists("c")
    assert binding.faults["lost-reply"] == 1


def test_latency_moves_the_fake_clock_only() -> None:
    moved: list[float] = []
    binding = FaultyChunkStorage(MemoryChunkStorage(), seed=3)
    binding.latency(moved.append, 1.0, 5.0)
    binding.create("c", b"abc")
    assert len(moved) == 1 and 0 <= moved[0] < 5.0 and binding.faults["latency"] == 1
    binding.clear()
    binding.exists("c")
    assert len(moved) == 1
