"""The simulator's fault injectors: ``FaultyMetadataStore`` and ``FaultyChunkStorage``'s
lost replies, latency and kill, rules that pick a table or chunk names, and the hooks
tests use for a moment rather than a fault (STYLE.md practice 10)."""

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


def test_commit_rules_can_pick_the_commits_of_one_table() -> None:
    inner = MemoryMetadataStore(TABLES)
    store = FaultyMetadataStore(inner, seed=1)
    other = Put(TABLES[1], KEY, b"o")
    store.fail_nth(2, table=TABLES[0])
    store.commit([put(b"1")])
    store.commit([other])  # another table: not counted
    with pytest.raises(MetadataError):
        store.commit([put(b"2")])
    assert inner.get(TABLES[0], KEY).value == b"1"  # type: ignore[union-attr]
    store.commit([put(b"3")])  # used up
    store.crash_at(1, landed=False, table=TABLES[0])
    store.commit([other])
    with pytest.raises(MetadataError):
        store.commit([put(b"4")])
    assert store.dead and inner.get(TABLES[0], KEY).value == b"3"  # type: ignore[union-attr]


def test_kill_stops_every_call_and_keeps_the_inner_store() -> None:
    inner = MemoryMetadataStore(TABLES)
    store = FaultyMetadataStore(inner, seed=1)
    store.commit([put(b"1")])
    store.kill()
    for call in (
        lambda: store.commit([put(b"2")]),
        lambda: store.get(TABLES[0], KEY),
        lambda: store.changes(0),
    ):
        with pytest.raises(MetadataError) as caught:
            call()
        assert caught.value.context["dead"]
    store.close()
    assert inner.get(TABLES[0], KEY).value == b"1"  # type: ignore[union-attr]


def test_hooks_run_once_right_before_the_chosen_call() -> None:
    inner = MemoryMetadataStore(TABLES)
    store = FaultyMetadataStore(inner, seed=1)
    seen: list[int] = []
    store.before("commit", lambda: seen.append(inner.last_sequence), nth=2, table=TABLES[0])
    store.commit([Put(TABLES[1], KEY, b"o")])
    store.commit([put(b"1")])
    store.commit([put(b"2")])  # the second commit of the table: the hook sees the one before it
    store.commit([put(b"3")])
    assert seen == [2]
    reads: list[tuple[str, str, bytes]] = []
    store.on_read = lambda *read: reads.append(read)
    store.get(TABLES[0], KEY)
    store.floor(TABLES[0], b"z")
    assert reads == [("get", TABLES[0], KEY), ("floor", TABLES[0], b"z")]


def test_chunk_hooks_and_rules_can_pick_chunks_by_name() -> None:
    binding = FaultyChunkStorage(MemoryChunkStorage(), seed=3)
    seen: list[bool] = []
    binding.before(("create", "write"), lambda: seen.append(binding.inner.exists("a/1")), nth=2, prefix="a/")
    binding.fail_nth("create", 1, prefix="b/")
    binding.create("c/1", b"x")  # neither prefix
    binding.create("a/1", b"x")
    with pytest.raises(StorageUnavailable):
        binding.create("b/1", b"x")
    assert not binding.inner.exists("b/1")
    binding.create("b/2", b"x")  # the rule is used up
    assert seen == []
    binding.write(binding.open_write("a/1"), 1, b"y")  # the second call under a/: the hook
    assert seen == [True]
    binding.create("a/2", b"x")
    assert seen == [True], "a hook runs once"
