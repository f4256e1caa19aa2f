"""GroupCommitter, driven deterministically: the first leader is held inside its group until
the other callers are queued (observed through the queue itself, never through time)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

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

    def run_group(items: Sequence[int]) -> list[int]:
        groups.append(list(items))
        if len(groups) == 1:
            assert queue.ready.wait(WAIT_S)
        return [item + 100 for item in items]

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
