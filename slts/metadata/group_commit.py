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
* A finishing leader wakes only the callers whose outcome is final and the first queued
  caller, which leads next (each caller waits on a lock of its own): no herd of callers
  woken to find they must wait again, which cost a quarter of the interpreter's time with
  eight writers.

**Returning callers** (``linger_s`` > 0; ``slts.storage.chunked``'s combined writes): the
callers a group answers usually queue again at once (a writer's loop), while the next group,
formed of those that queued during the run, is already running. Left alone, groups then
alternate between two halves of the callers. So a new leader first waits, at most
``linger_s``, until as many submissions have arrived as the previous group answered
callers: a group then holds every caller that came back in time. The wait ends at the
last expected submission (or at once when none is expected); a caller that does not come
back costs each later group nothing and one group at most ``linger_s``.

**Shared syncs** (``sync`` given; ``slts.metadata.lmdb_store`` with a durable store): a
group's run *applies* its items without making them durable, and makes durable every
item applied by earlier runs (in LMDB: the commit's data sync also writes the previous
commit's meta page to disk). So a group's items are held, applied but not yet
acknowledged, until a later run that reports so (``run_group`` returns ``(results,
flushed_earlier)``), or until ``sync()``, which a leader calls when it finds nobody
queued behind it (no later run is coming to share). Under load each group then costs one
sync instead of two; alone, a caller pays both, as without sharing. More invariants:

* An item's result is published only once it is durable: after a ``sync()`` or a
  run reporting ``flushed_earlier`` that started after the item's run ended. A failed
  item (an exception result) changed nothing and is published at once.
* If ``sync()`` raises, every held item gets that exception: applied, its durability
  unknown (a failed sync may have lost the dirty pages: the caller must treat the store
  as broken, see ``lmdb_store``).
* Nobody waits for a sync that no one will run: a leader leaves held items behind only
  when a queued caller will lead next (the queue is not empty), and a caller whose item
  is held leads itself (an empty group: just the sync) once no one else leads.

**Pipelined** (shared syncs): a leader that must sync (nobody queued to share it) first
hands the lead on, or gives it up, and then syncs outside the lead, with the tickets it
took from the held list. So the next group is applied, and its transaction synced, while
this sync runs: a commit never queues behind another group's sync. Two syncs may run at
once; each settles only the tickets that were applied before it started (the held list
is taken under the leader's turn, before the lead is handed on), so a ticket is still
never published before a sync or a run that started after its own run ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

#: The most items one group carries (bounds one write transaction's size).
GROUP_SIZE_MAX_DEFAULT = 256


class _Ticket(Generic[Item, Result]):
    """One queued item, its outcome once its group ran, and its caller's wake-up: a lock
    held from creation and released by whoever wakes the caller (once per wait: to lead
    the next group, or because the outcome is final)."""

    __slots__ = ("done", "error", "item", "lead", "value", "wake")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.done = False
        self.lead = False  # chosen to lead the next group
        self.value: Result | None = None
        self.error: BaseException | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


class GroupCommitter(Generic[Item, Result]):
    """Runs submitted items in groups, one group at a time, led by one of the callers.

    ``run_group(items)`` returns one entry per item, in order: the item's result, or an
    exception instance that is raised to that item's caller alone. With ``sync`` (shared
    syncs, see the module doc) it returns ``(results, flushed_earlier)``.
    """

    def __init__(
        self,
        run_group: Callable[[Sequence[Item]], Any],
        group_size_max: int = GROUP_SIZE_MAX_DEFAULT,
        *,
        sync: Callable[[], None] | None = None,
        linger_s: float = 0.0,
    ) -> None:
        assert group_size_max >= 1
        assert linger_s >= 0.0
        self._run_group = run_group
        self._group_size_max = group_size_max
        self._sync = sync
        self._linger_s = linger_s
        self._lock = threading.Lock()  # the queue's; a plain ``with`` costs no Python frame
        self._returned = threading.Condition(self._lock)  # a lingering leader waits on it
        self._awaited = 0  # submissions expected from the callers the last group answered
        self._lingering = False
        self._queue: list[_Ticket[Item, Result]] = []
        self._held: list[_Ticket[Item, Result]] = []  # applied, waiting for a sync (leader's only)
        self._leading = False
        self._groups = 0
        self._syncs = 0
        self._lingers = 0

    @property
    def syncs(self) -> int:
        """How many times ``sync`` ran (shared syncs only)."""
        return self._syncs

    @property
    def lingers(self) -> int:
        """How many times a leader waited for returning callers (``linger_s`` > 0)."""
        return self._lingers

    @property
    def groups(self) -> int:
        """How many groups have run."""
        return self._groups

    def submit(self, item: Item) -> Result:
        """Run ``item`` in some group and return its result (or raise its exception)."""
        ticket: _Ticket[Item, Result] = _Ticket(item)
        with self._lock:
            self._queue.append(ticket)
            if self._awaited:
                self._awaited -= 1
                if self._lingering and not self._awaited:
                    self._returned.notify()
            lead = not self._leading
            self._leading = True
        while True:
            if lead:
                # Lead the next group: it holds this ticket unless more than group_size_max
                # tickets were queued ahead (then this ticket waits to be handed the lead
                # again, or its outcome). A held ticket waits for the run that settles it.
                with self._lock:
                    if self._awaited:  # only ever set with linger_s > 0
                        self._linger()
                    group = self._queue[: self._group_size_max]
                    del self._queue[: len(group)]
                self._lead(group)
            if ticket.done:
                break
            ticket.wake.acquire()  # woken once: to lead, or with the outcome
            if ticket.done:
                break
            assert ticket.lead, "a ticket is woken to lead or when done"
            ticket.lead, lead = False, True
        if ticket.error is not None:
            raise ticket.error
        return ticket.value  # type: ignore[return-value]

    def _linger(self) -> None:
        """Wait, at most ``linger_s``, for the submissions the last group's answered callers
        are expected to make (see the module doc). Lock held (released while waiting)."""
        deadline = time.monotonic() + self._linger_s
        self._lingering = True
        try:
            while self._awaited:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._returned.wait(left)
        finally:
            self._lingering = False
        self._awaited = 0  # who has not come back by now is not waited for again
        self._lingers += 1

    def _lead(self, group: list[_Ticket[Item, Result]]) -> None:
        """Run one group (with shared syncs, the held tickets are settled by it, or taken
        to be synced), publish what is final, hand the lead to the first queued caller (or
        give it up), and then sync the taken tickets outside the lead (pipelined: the next
        group runs meanwhile). Only the callers whose outcome is final and that one
        successor are woken: a caller that waits on is not (no herd of wake-ups per group)."""
        final: list[_Ticket[Item, Result]] = []
        to_sync: list[_Ticket[Item, Result]] = []
        successor: _Ticket[Item, Result] | None = None
        try:
            if group:
                final += self._run(group)
            if self._held:
                with self._lock:
                    sharing = bool(self._queue)  # a queued caller leads next and flushes these
                if not sharing:
                    to_sync, self._held = self._held, []
        finally:
            with self._lock:
                for ticket in final:
                    ticket.done = True
                if group:
                    self._groups += 1
                self._awaited = len(final) if self._linger_s else 0
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                else:  # no held ticket is left behind: the run settled them, or they sync below
                    self._leading = False
            self._publish(final)
            if successor is not None:
                assert not successor.done, "a queued ticket has not run"
                successor.wake.release()
        if to_sync:
            self._publish(self._sync_taken(to_sync), final=True)

    def _publish(self, tickets: list[_Ticket[Item, Result]], *, final: bool = False) -> None:
        """Wake the callers of ``tickets``, whose outcome is set (``final``: mark them done
        first; a leader marks its group's under the queue's lock)."""
        if final:
            with self._lock:
                for ticket in tickets:
                    ticket.done = True
        for ticket in tickets:
            assert ticket.done
            ticket.wake.release()

    def _run(self, group: list[_Ticket[Item, Result]]) -> list[_Ticket[Item, Result]]:
        """Run ``group``; the tickets whose outcome is final now (the rest are held)."""
        try:
            outcome = self._run_group([ticket.item for ticket in group])
        except BaseException as exc:  # noqa: BLE001 - every caller of the group learns that the group failed
            for ticket in group:
                ticket.error = exc
            return group
        results, flushed_earlier = outcome if self._sync is not None else (outcome, True)
        assert len(results) == len(group), "run_group must return one result per item"
        final: list[_Ticket[Item, Result]] = []
        if flushed_earlier:
            final, self._held = self._held, []
        for ticket, result in zip(group, results, strict=True):
            if isinstance(result, BaseException):
                ticket.error = result
                final.append(ticket)  # it changed nothing: nothing to make durable
            else:
                ticket.value = result
                (final if self._sync is None else self._held).append(ticket)
        return final

    def _sync_taken(self, held: list[_Ticket[Item, Result]]) -> list[_Ticket[Item, Result]]:
        """Sync now, outside the lead (nobody queued would have shared it); ``held``, the
        tickets applied before this sync started, final."""
        assert self._sync is not None and held
        with self._lock:
            self._syncs += 1
        try:
            self._sync()
        except BaseException as exc:  # noqa: BLE001 - each held caller learns its commit's durability is unknown
            for ticket in held:
                ticket.error = exc
        return held
