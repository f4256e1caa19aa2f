"""Group commit: concurrent callers share one write transaction (and one fsync).

A caller queues its item. If no leader is running, it becomes the leader at once (so an
uncontended call waits for nothing: no timer, no sleep), takes up to ``group_size_max``
queued items in arrival order, runs them as one group with ``run_group``, publishes
every item's result and wakes the waiters. Callers that queued meanwhile wait; when the
leader finishes, one of them leads the next group. The leader's own item is in its group.

Invariants:

* At most one group runs at a time (``_leading``).
* Every submitted item gets exactly one result: the one ``run_group`` returned for it
  (a value, or an exception raised to that caller only), or the exception ``run_group``
  itself raised (then raised to every caller of that group).
* Items are run in the order they were queued.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

#: The most items one group carries (bounds one write transaction's size).
GROUP_SIZE_MAX_DEFAULT = 256


class _Ticket(Generic[Item, Result]):
    """One queued item and, once its group ran, its outcome."""

    __slots__ = ("done", "error", "item", "value")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.done = False
        self.value: Result | None = None
        self.error: BaseException | None = None


class GroupCommitter(Generic[Item, Result]):
    """Runs submitted items in groups, one group at a time, led by one of the callers.

    ``run_group(items)`` returns one entry per item, in order: the item's result, or an
    exception instance that is raised to that item's caller alone.
    """

    def __init__(
        self,
        run_group: Callable[[Sequence[Item]], Sequence[Result | BaseException]],
        group_size_max: int = GROUP_SIZE_MAX_DEFAULT,
    ) -> None:
        assert group_size_max >= 1
        self._run_group = run_group
        self._group_size_max = group_size_max
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Ticket[Item, Result]] = []
        self._leading = False
        self._groups = 0

    @property
    def groups(self) -> int:
        """How many groups have run."""
        return self._groups

    def submit(self, item: Item) -> Result:
        """Run ``item`` in some group and return its result (or raise its exception)."""
        ticket: _Ticket[Item, Result] = _Ticket(item)
        with self._cond:
            self._queue.append(ticket)
        while True:
            with self._cond:
                while not ticket.done and self._leading:
                    self._cond.wait()
                if ticket.done:
                    break
                # No leader: lead the next group. It holds this ticket unless more than
                # group_size_max tickets were queued ahead; then lead again (loop).
                self._leading = True
                group = self._queue[: self._group_size_max]
                del self._queue[: len(group)]
            assert group
            self._lead(group)
        assert ticket.done
        if ticket.error is not None:
            raise ticket.error
        return ticket.value  # type: ignore[return-value]

    def _lead(self, group: list[_Ticket[Item, Result]]) -> None:
        """Run one group, publish its results, hand leadership over."""
        try:
            results = self._run_group([ticket.item for ticket in group])
            assert len(results) == len(group), "run_group must return one result per item"
            for ticket, result in zip(group, results, strict=True):
                if isinstance(result, BaseException):
                    ticket.error = result
                else:
                    ticket.value = result
        except BaseException as exc:  # noqa: BLE001 - every caller of the group learns that the group failed
            for ticket in group:
                ticket.error = exc
        finally:
            with self._cond:
                for ticket in group:
                    ticket.done = True
                self._groups += 1
                self._leading = False
                self._cond.notify_all()
