"""The seeded fault-injection wrapper (bindings/faulty.py).

Its transparency without rules is checked by the whole conformance suite (the
``faulty-memory`` binding); here: each rule fires exactly when it says, from its seed,
and leaves the inner binding in the state it claims.
"""

from __future__ import annotations

import pytest
from slts.bindings.faulty import OPERATIONS, FaultyChunkStorage
from slts.bindings.memory import MemoryChunkStorage

from slts.errors import ChunkNotFound, StorageUnavailable
from tests.support.conformance import pattern

DATA = pattern(100)


@pytest.fixture
def inner() -> MemoryChunkStorage:
    return MemoryChunkStorage("memory://faulty-test")


@pytest.fixture
def faulty(inner) -> FaultyChunkStorage:
    return FaultyChunkStorage(inner, seed=1234)


def outcomes(call, count: int) -> list[bool]:
    """``True`` for each of ``count`` calls that raised ``StorageUnavailable``."""
    failed = []
    for _ in range(count):
        try:
            call()
            failed.append(False)
        except StorageUnavailable:
            failed.append(True)
    return failed


# -- fail_nth ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5])
def test_fail_nth_fires_exactly_on_the_nth_call(faulty, n):
    handle = faulty.create("c", DATA)
    faulty.fail_nth("read", n)
    failed = outcomes(lambda: faulty.read(handle, 0, 10), n + 3)
    assert failed == [i == n - 1 for i in range(n + 3)]
    assert faulty.faults_injected == 1


def test_fail_nth_counts_from_when_the_rule_is_added(faulty):
    handle = faulty.create("c", DATA)
    for _ in range(4):
        faulty.read(handle, 0, 1)
    faulty.fail_nth("read", 2)
    assert outcomes(lambda: faulty.read(handle, 0, 1), 3) == [False, True, False]


def test_fail_nth_rules_on_one_operation_count_independently(faulty):
    handle = faulty.create("c", DATA)
    faulty.fail_nth("read", 2)
    faulty.fail_nth("read", 3)
    faulty.fail_nth("read", 2)  # two rules for one call: it fails once
    assert outcomes(lambda: faulty.read(handle, 0, 1), 5) == [False, True, True, False, False]


def test_fail_nth_counts_only_its_own_operation(faulty):
    handle = faulty.create("c", DATA)
    faulty.fail_nth("get_info", 2)
    faulty.read(handle, 0, 1)
    faulty.exists("c")
    assert faulty.get_info("c").length == len(DATA)
    with pytest.raises(StorageUnavailable):
        faulty.get_info("c")


def test_fail_nth_raises_the_error_given_and_marks_it_injected(faulty):
    faulty.fail_nth("open_read", 1, ChunkNotFound)
    faulty.create("c", DATA)
    with pytest.raises(ChunkNotFound) as caught:
        faulty.open_read("c")
    assert caught.value.injected is True
    assert "seed 1234" in str(caught.value)
    assert caught.value.retryable is False


def test_an_injected_fault_does_not_reach_the_inner_binding(faulty, inner):
    handle = faulty.create("c", DATA)
    faulty.fail_nth("create", 1)
    faulty.fail_nth("delete", 1)
    faulty.fail_nth("write", 1)
    with pytest.raises(StorageUnavailable):
        faulty.create("d", b"x")
    with pytest.raises(StorageUnavailable):
        faulty.delete(handle)
    with pytest.raises(StorageUnavailable):
        faulty.write(handle, len(DATA), b"more")
    assert list(inner.list()) == ["c"]
    assert inner.read(handle, 0, 1000) == DATA


def test_a_sweep_fails_each_call_in_turn():
    # SQLite-style: fail call 1, 2, ... N of ``write`` in turn; the others land.
    for n in range(1, 6):
        faulty = FaultyChunkStorage(MemoryChunkStorage(), seed=n)
        handle = faulty.create("c")
        faulty.fail_nth("write", n)
        written = bytearray()
        for piece in range(5):
            data = bytes([piece]) * 3
            try:
                faulty.write(handle, len(written), data)
                written += data
            except StorageUnavailable:
                assert piece == n - 1
        assert faulty.read(handle, 0, 100) == written
        assert len(written) == 12


# -- fail_probability --------------------------------------------------------------------------


def _pattern_for(seed: int, probability: float, count: int = 200) -> list[bool]:
    faulty = FaultyChunkStorage(MemoryChunkStorage(), seed=seed)
    faulty.create("c")
    faulty.fail_probability("exists", probability)
    return outcomes(lambda: faulty.exists("c"), count)


def test_fail_probability_replays_from_the_seed():
    first = _pattern_for(7, 0.3)
    assert _pattern_for(7, 0.3) == first
    assert 0 < sum(first) < len(first)
    assert _pattern_for(8, 0.3) != first


@pytest.mark.parametrize(("probability", "expected"), [(0.0, False), (1.0, True)])
def test_fail_probability_extremes(probability, expected):
    assert _pattern_for(3, probability, 50) == [expected] * 50


def test_fail_probability_touches_only_its_operation(faulty):
    faulty.fail_probability("list", 1.0)
    handle = faulty.create("c", DATA)
    assert faulty.read(handle, 0, 3) == DATA[:3]
    with pytest.raises(StorageUnavailable):
        faulty.list()


# -- partial writes ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_partial_write_leaves_a_strict_prefix_and_raises(seed):
    inner = MemoryChunkStorage()
    faulty = FaultyChunkStorage(inner, seed=seed)
    handle = faulty.create("c", b"head")
    faulty.partial_write(1)
    with pytest.raises(StorageUnavailable) as caught:
        faulty.write(handle, 4, DATA)
    assert caught.value.retryable
    stored = inner.read(handle, 0, 1000)
    assert stored.startswith(b"head")
    torn = stored[4:]
    assert len(torn) < len(DATA)
    assert DATA.startswith(torn)
    # The next write is a normal one, at the torn end.
    faulty.write(handle, len(stored), b"!")
    assert inner.read(handle, 0, 1000) == stored + b"!"


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("data", [DATA, b"abc"], ids=["100-bytes", "3-bytes"])
def test_partial_create_leaves_a_strict_prefix_and_raises(seed, data):
    inner = MemoryChunkStorage()
    faulty = FaultyChunkStorage(inner, seed=seed)
    faulty.partial_write(1)
    with pytest.raises(StorageUnavailable):
        faulty.create("c", data)
    stored = inner.read(inner.open_read("c"), 0, 1000)
    assert len(stored) < len(data)
    assert data.startswith(stored)


def test_partial_write_fires_on_the_nth_write_or_create(faulty, inner):
    handle = faulty.create("c")
    faulty.partial_write(3)
    faulty.write(handle, 0, b"one")
    faulty.create("d", b"two")
    with pytest.raises(StorageUnavailable):
        faulty.write(handle, 3, DATA)
    assert len(inner.read(handle, 0, 1000)) < 3 + len(DATA)
    assert faulty.faults_injected == 1


def test_partial_write_is_reproducible_from_the_seed():
    def torn_length(seed: int) -> int:
        inner = MemoryChunkStorage()
        faulty = FaultyChunkStorage(inner, seed=seed)
        handle = faulty.create("c")
        faulty.partial_write(1)
        with pytest.raises(StorageUnavailable):
            faulty.write(handle, 0, DATA)
        return inner.get_info("c").length

    lengths = [torn_length(seed) for seed in range(10)]
    assert lengths == [torn_length(seed) for seed in range(10)]
    assert len(set(lengths)) > 1


# -- counters and rules ------------------------------------------------------------------------


def test_calls_count_every_call_of_every_operation(faulty):
    handle = faulty.create("c", DATA)
    faulty.read(handle, 0, 1)
    faulty.read(handle, 1, 1)
    with pytest.raises(ChunkNotFound):
        faulty.open_read("missing")  # a call that fails in the inner binding still counts
    faulty.fail_nth("exists", 1)
    with pytest.raises(StorageUnavailable):
        faulty.exists("c")  # so does an injected failure
    list(faulty.list())
    assert faulty.calls == {"create": 1, "read": 2, "open_read": 1, "exists": 1, "list": 1}
    assert set(faulty.calls) <= set(OPERATIONS)


def test_clear_removes_every_rule_and_keeps_the_counters(faulty):
    faulty.create("c")
    faulty.fail_nth("exists", 1)
    faulty.fail_probability("get_info", 1.0)
    faulty.partial_write(1)
    faulty.clear()
    assert faulty.exists("c")
    assert faulty.get_info("c").length == 0
    faulty.write(faulty.open_write("c"), 0, DATA)
    assert faulty.read(faulty.open_read("c"), 0, 1000) == DATA
    assert faulty.faults_injected == 0
    assert faulty.calls["exists"] == 1


def test_the_wrapper_announces_the_inner_capabilities():
    minimal = MemoryChunkStorage(supports_append=False, supports_concat=False)
    faulty = FaultyChunkStorage(minimal)
    assert (faulty.supports_append, faulty.supports_concat) == (False, False)
    assert (faulty.supports_truncate, faulty.supports_readonly) == (True, True)
    assert faulty.url == minimal.url


class _PowerGoesDuringCreate(MemoryChunkStorage):
    """Loses the wrapper's power while a ``create`` runs (after the bytes are stored)."""

    wrapper: FaultyChunkStorage

    def _do_create(self, name, data):
        handle = super()._do_create(name, data)
        self.wrapper.lose_power()
        return handle


def test_a_call_that_ends_after_the_power_went_never_returns():
    """A caller told "done" by a call the power cut would build on bytes the power-loss
    image need not hold (a layout committed naming a chunk that is gone)."""
    inner = _PowerGoesDuringCreate("memory://power")
    faulty = FaultyChunkStorage(inner, seed=1)
    inner.wrapper = faulty
    with pytest.raises(StorageUnavailable, match="power"):
        faulty.create("c", b"abc")
