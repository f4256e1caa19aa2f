"""GroupCommitter, driven deterministically: the first leader is held inside its group until
the other callers are queued (observed through the queue itself, never through time)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from slts.metadata.group_commit import GroupCommitter

WAIT_S = 30  # a bound so that a broken committer fails the test instead of hanging it


class SignallingQueue(list):
    """The committer's queue, setting ``ready`` once it holds ``want`` tickets."""

    def __init__(self, want: int) -> None:
        super().__init__()
        self.want = want
        self.ready = threading.Event()

    def append(self, ticket: object) -> None:
        super().append(ticket)
        if len(self) >= self.want:
            self.ready.set()


class AppendCountingQueue(list):
    """The committer's queue, setting ``ready`` once ``want`` tickets were ever appended."""

    def __init__(self, want: int) -> None:
        super().__init__()
        self.want = want
        self.appended = 0
        self.ready = threading.Event()

    def append(self, ticket: object) -> None:
        super().append(ticket)
        self.appended += 1
        if self.appended >= self.want:
            self.ready.set()


def run_callers(committer: GroupCommitter, items: list[int]) -> dict[int, object]:
    """Submit items[0] first, then the others from their own threads; outcome per item."""
    outcomes: dict[int, object] = {}

    def call(item: int) -> None:
        try:
            outcomes[item] = committer.submit(item)
        except Exception as exc:  # recorded for the assertions
            outcomes[item] = exc

    first = threading.Thread(target=call, args=(items[0],))
    first.start()
    others = [threading.Thread(target=call, args=(item,)) for item in items[1:]]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(WAIT_S)
        assert not thread.is_alive()
    return outcomes


def holding_first(
    queue: SignallingQueue | AppendCountingQueue, groups: list[list[int]], result: Callable[[int], object]
) -> Callable[[Sequence[int]], list[object]]:
    """A ``run_group`` that records each group and holds the first until ``queue`` is ready."""

    def run_group(items: Sequence[int]) -> list[object]:
        groups.append(list(items))
        if len(groups) == 1:
            assert queue.ready.wait(WAIT_S)
        return [result(item) for item in items]

    return run_group


def test_uncontended_submit_runs_at_once_in_the_callers_thread() -> None:
    seen: list[tuple[list[int], int]] = []

    def run_group(items: Sequence[int]) -> list[int]:
        seen.append((list(items), threading.get_ident()))
        return [item * 2 for item in items]

    committer: GroupCommitter[int, int] = GroupCommitter(run_group)
    assert committer.submit(21) == 42
    assert seen == [([21], threading.get_ident())]
    assert committer.groups == 1


def test_waiting_callers_form_one_group_and_fail_alone() -> None:
    groups: list[list[int]] = []
    queue = SignallingQueue(want=7)

    def run_group(items: Sequence[int]) -> list[object]:
        groups.append(list(items))
        if len(groups) == 1:
            assert queue.ready.wait(WAIT_S)  # the seven others are queued behind this group
        return [ValueError(item) if item == 3 else item * 10 for item in items]

    committer: GroupCommitter[int, object] = GroupCommitter(run_group)
    committer._queue = queue
    outcomes = run_callers(committer, list(range(8)))
    assert groups[0] == [0]
    assert sorted(groups[1]) == list(range(1, 8)) and len(groups) == 2
    assert committer.groups == 2
    for item in range(8):
        if item == 3:
            assert isinstance(outcomes[item], ValueError) and outcomes[item].args == (3,)
        else:
            assert outcomes[item] == item * 10


def test_group_size_is_bounded_and_every_item_runs_once() -> None:
    groups: list[list[int]] = []
    queue = SignallingQueue(want=9)
    run_group = holding_first(queue, groups, lambda item: item + 100)

    committer: GroupCommitter[int, int] = GroupCommitter(run_group, group_size_max=4)
    committer._queue = queue
    outcomes = run_callers(committer, list(range(10)))
    assert outcomes == {item: item + 100 for item in range(10)}
    ran = [item for group in groups for item in group]
    assert sorted(ran) == list(range(10))  # exactly once each
    assert [len(group) for group in groups] == [1, 4, 4, 1]


def test_a_failing_group_fails_each_of_its_callers() -> None:
    queue = SignallingQueue(want=3)
    calls = 0

    def run_group(items: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            assert queue.ready.wait(WAIT_S)
            return [item for item in items]
        raise OSError("disk gone")

    committer: GroupCommitter[int, int] = GroupCommitter(run_group)
    committer._queue = queue
    outcomes = run_callers(committer, [0, 1, 2, 3])
    assert outcomes[0] == 0
    assert all(isinstance(outcomes[item], OSError) for item in (1, 2, 3))
    with pytest.raises(OSError):  # and the committer stays usable
        committer.submit(9)


# -- returning callers: a leader lingers for those the last group answered --------------------


class SignallingLinger(GroupCommitter[int, int]):
    """A committer that sets ``lingering`` when a leader starts to wait for returning callers."""

    def __init__(self, run_group, linger_s: float) -> None:
        super().__init__(run_group, linger_s=linger_s)
        self.lingering = threading.Event()

    def _linger(self) -> None:
        self.lingering.set()
        super()._linger()


def _answered_then_queued(linger_s: float, come_back: bool) -> tuple[list[list[int]], SignallingLinger]:
    """Caller A's item 0 runs alone while B's item 1 queues; once A is answered, B leads the
    next group and A (if ``come_back``) submits item 2 as soon as B lingers."""
    groups: list[list[int]] = []
    queue = AppendCountingQueue(want=2)  # A's ticket, then B's: B queued behind the first group
    run_group = holding_first(queue, groups, lambda item: item)

    committer = SignallingLinger(run_group, linger_s)
    committer._queue = queue
    outcomes: dict[int, int] = {}

    def caller_a() -> None:
        outcomes[0] = committer.submit(0)
        if come_back:
            assert committer.lingering.wait(WAIT_S)
            outcomes[2] = committer.submit(2)

    def caller_b() -> None:
        outcomes[1] = committer.submit(1)

    first = threading.Thread(target=caller_a)
    first.start()
    second = threading.Thread(target=caller_b)
    second.start()
    for thread in (first, second):
        thread.join(WAIT_S)
        assert not thread.is_alive()
    assert outcomes == ({0: 0, 1: 1, 2: 2} if come_back else {0: 0, 1: 1})
    return groups, committer


def test_a_leader_lingers_for_the_caller_the_last_group_answered_and_runs_it_in_its_group() -> None:
    groups, committer = _answered_then_queued(linger_s=WAIT_S, come_back=True)
    assert groups == [[0], [1, 2]]  # not [[0], [1], [2]]: the two halves do not alternate
    assert committer.lingers == 1 and committer.groups == 2


def test_a_caller_that_does_not_come_back_delays_one_group_at_most_linger_s() -> None:
    groups, committer = _answered_then_queued(linger_s=0.01, come_back=False)
    assert groups == [[0], [1]]
    assert committer.lingers == 1
    assert committer.submit(3) == 3  # B came back: its submission ended the wait at once
    assert committer.lingers == 1 and groups[-1] == [3]


def test_without_linger_a_leader_never_waits() -> None:
    groups: list[list[int]] = []
    queue = SignallingQueue(want=7)
    run_group = holding_first(queue, groups, lambda item: item)

    committer: GroupCommitter[int, int] = GroupCommitter(run_group)
    committer._queue = queue
    run_callers(committer, list(range(8)))
    assert committer.lingers == 0 and [len(group) for group in groups] == [1, 7]


# -- shared syncs: a group's items wait for a later run's sync, or for sync() ---------------


class Durability:
    """A model of a store with shared syncs: what was applied, what is durable, and the
    events in order; ``run_group`` reports ``flushed_earlier`` when it wrote anything."""

    def __init__(self, hold_first_until: SignallingQueue | None = None, fail_sync: bool = False) -> None:
        self.applied: list[int] = []
        self.durable: set[int] = set()
        self.events: list[str] = []
        self.hold = hold_first_until
        self.fail_sync = fail_sync

    def run_group(self, items: Sequence[int]) -> tuple[list[object], bool]:
        self.events.append(f"run {sorted(items)}")
        if self.hold is not None and len(self.events) == 1:
            assert self.hold.ready.wait(WAIT_S)
        flushed = self.applied[:]  # the run's own sync covers what ran before it
        results: list[object] = [ValueError(item) if item < 0 else item for item in items]
        self.applied += [item for item in items if item >= 0]
        self.durable.update(flushed)
        return results, any(item >= 0 for item in items)

    def sync(self) -> None:
        self.events.append("sync")
        if self.fail_sync:
            raise OSError("fdatasync failed")
        self.durable.update(self.applied)

    def committer(self) -> GroupCommitter[int, object]:
        committer: GroupCommitter[int, object] = GroupCommitter(self.run_group, sync=self.sync)
        if self.hold is not None:
            committer._queue = self.hold
        return committer


def test_shared_syncs_alone_a_caller_pays_its_own_sync() -> None:
    model = Durability()
    committer = model.committer()
    assert committer.submit(5) == 5
    assert model.events == ["run [5]", "sync"] and model.durable == {5}
    assert committer.syncs == 1


def test_shared_syncs_a_group_is_acknowledged_after_the_next_run_and_one_sync_settles_the_last() -> None:
    model = Durability(hold_first_until=SignallingQueue(want=7))
    committer = model.committer()
    acknowledged_durable: dict[int, bool] = {}
    original_submit = committer.submit

    def submit_and_check(item: int) -> object:
        result = original_submit(item)
        acknowledged_durable[item] = item in model.durable  # at the moment its caller learns it
        return result

    committer.submit = submit_and_check  # type: ignore[method-assign]
    outcomes = run_callers(committer, list(range(8)))
    assert outcomes == {item: item for item in range(8)}
    assert all(acknowledged_durable.values()) and len(acknowledged_durable) == 8
    # Two groups, one sync: the second run synced the first group; the sync settled the second.
    assert model.events == ["run [0]", "run [1, 2, 3, 4, 5, 6, 7]", "sync"]
    assert committer.groups == 2 and committer.syncs == 1


def test_shared_syncs_failed_items_return_at_once_and_a_run_that_wrote_nothing_flushes_nothing() -> None:
    model = Durability(hold_first_until=SignallingQueue(want=2))
    committer = model.committer()
    outcomes = run_callers(committer, [0, -1, -2])
    assert outcomes[0] == 0 and isinstance(outcomes[-1], ValueError) and isinstance(outcomes[-2], ValueError)
    # The second run applied nothing, so it could not make item 0 durable: a sync did.
    assert model.events == ["run [0]", "run [-2, -1]", "sync"] and model.durable == {0}


def test_shared_syncs_a_failed_sync_fails_every_caller_it_covered() -> None:
    model = Durability(hold_first_until=SignallingQueue(want=2), fail_sync=True)
    committer = model.committer()
    outcomes = run_callers(committer, [0, 1, 2])
    # 0 was made durable by the second run's own sync; 1 and 2 needed the failed sync.
    assert outcomes[0] == 0
    assert isinstance(outcomes[1], OSError) and isinstance(outcomes[2], OSError)


def test_shared_syncs_under_contention_every_item_runs_once_and_is_acknowledged_durable() -> None:
    """Many callers at once (the hand-over wakes only finished callers and one successor):
    each item runs exactly once, in queue order within its group, and no caller learns
    its outcome before its item is durable; nobody is left waiting."""
    model = Durability()
    committer: GroupCommitter[int, object] = GroupCommitter(
        model.run_group, group_size_max=5, sync=model.sync
    )
    acknowledged: dict[int, object] = {}
    lock = threading.Lock()

    def caller(first: int) -> None:
        for item in range(first, first + 40):
            value = -item if item % 7 == 3 else item  # some items fail alone
            try:
                result: object = committer.submit(value)
                assert value in model.durable, f"{value} acknowledged before it was durable"
            except ValueError as exc:
                result = exc
            with lock:
                acknowledged[value] = result

    threads = [threading.Thread(target=caller, args=(1000 * (n + 1),)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive(), "a caller was left waiting"
    assert len(acknowledged) == 16 * 40
    assert sorted(model.applied) == sorted(item for item in acknowledged if item >= 0), "each once"
    assert all(isinstance(result, ValueError) for item, result in acknowledged.items() if item < 0)


def test_pipelined_the_next_group_runs_while_a_sync_is_in_progress() -> None:
    """A leader that syncs (nobody queued) does it after giving up the lead: a caller that
    arrives meanwhile runs its group at once instead of queueing behind that sync, and each
    caller still learns its outcome only once its item is durable."""
    model = Durability()
    second_ran = threading.Event()
    first_syncing = threading.Event()
    original_run, original_sync = model.run_group, model.sync

    def run_group(items: Sequence[int]) -> tuple[list[object], bool]:
        outcome = original_run(items)
        if 1 in items:
            second_ran.set()
        return outcome

    def sync() -> None:
        if not first_syncing.is_set():
            first_syncing.set()
            assert second_ran.wait(WAIT_S), "the second group waited for the first group's sync"
        original_sync()

    committer: GroupCommitter[int, object] = GroupCommitter(run_group, sync=sync)
    acknowledged_durable: dict[int, bool] = {}

    def call(item: int) -> None:
        committer.submit(item)
        acknowledged_durable[item] = item in model.durable

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert first_syncing.wait(WAIT_S)
    second = threading.Thread(target=call, args=(1,))
    second.start()
    for thread in (first, second):
        thread.join(WAIT_S)
        assert not thread.is_alive()
    assert acknowledged_durable == {0: True, 1: True}
    # Item 0's sync was still blocked when item 1's group ran (and then synced item 1).
    assert model.events[:2] == ["run [0]", "run [1]"]
    assert committer.groups == 2


def test_lmdb_store_acknowledges_a_commit_only_once_a_flush_that_started_after_it_ended(tmp_path) -> None:
    """The real LMDB store under 8 committing threads, its flushes watched: a commit is
    durable once a sync, or a later transaction's flush (LMDB's commit syncs the meta pages
    of every transaction before it), *started* after it was applied. No ``commit`` may
    return before that: the pipelined syncs run beside the next group, never ahead of
    what they cover."""
    from slts.metadata.lmdb_store import LmdbMetadataStore
    from slts.metadata.schema import SEGMENTS, TABLES
    from slts.metadata.store import Expect, Put

    store = LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)
    committer = store._env.committer
    lock = threading.Lock()
    state = {"applied": 0, "durable": 0}
    run_group, sync = committer._run_group, committer._sync
    assert sync is not None

    def flushing(action, wrote):
        with lock:
            covered = state["applied"]  # what this flush covers: applied before it started
        outcome = action()
        if wrote(outcome):
            with lock:
                state["durable"] = max(state["durable"], covered)
        return outcome

    def watched_run(group):
        results, flushed = flushing(lambda: run_group(group), lambda outcome: outcome[1])
        with lock:
            state["applied"] = max([state["applied"], *(r for r in results if isinstance(r, int))])
        return results, flushed

    committer._run_group = watched_run
    committer._sync = lambda: flushing(sync, lambda _: True)
    early: list[int] = []

    def writer(n: int) -> None:
        key, version = f"w{n}".encode(), 0
        for _ in range(150):
            version = store.commit([Put(SEGMENTS, key, b"v" * 64)], [Expect(SEGMENTS, key, version)])
            with lock:
                if version > state["durable"]:
                    early.append(version)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
        assert not thread.is_alive()
    store.close()
    assert early == [], f"acknowledged before durable: {early[:10]}"
    assert committer.groups < 8 * 150, "the callers never shared a group"
