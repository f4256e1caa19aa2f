"""A fault-injecting metadata store, driven by one seed (the simulator's, STYLE.md practice 10).

``FaultyMetadataStore(inner, seed)`` forwards every call to ``inner``; only ``commit``
is subject to faults:

* ``fail_probability(p)``: a commit fails with ``MetadataError`` *before* it lands
  (nothing applied), with probability ``p`` drawn from ``random.Random(seed)``;
* ``fail_nth(n, table)``: the ``n``-th next commit (of those that write ``table``, if
  given) fails before it lands, once;
* ``lose_reply_probability(p)``: a commit lands and then raises ``MetadataError`` all
  the same (its answer was lost: the caller cannot tell whether it took effect);
* ``crash_at(n, landed, table)``: the ``n``-th next commit (of those that write
  ``table``, if given) is the moment the process dies: it lands or not, raises
  ``MetadataError``, and from then on every call raises ``MetadataError`` (``dead``):
  a dead process does nothing more; ``on_crash`` (if set) is called right then (the
  simulator kills the process's binding with it). A new process wraps ``inner`` in a
  new object.
* ``kill()``: the process dies now, between two calls (``on_crash`` is not called).

Hooks, for tests that need a moment rather than a fault:

* ``before(call, action, nth, table)``: ``action()`` runs right before the ``nth`` next
  call of ``call`` (``commit``, ``discard_changes``, ``changes``, ``snapshot``, ...;
  for ``commit``, of those that write ``table`` if given), once, before any rule sees
  that call: another instance starts there, or a test waits there for a signal.
* ``before_commit`` (if set) is called with every commit's ops and expectations before
  anything else happens to it: the simulator lands another process's commit there,
  between the caller's reads and its commit.
* ``on_read`` (if set) is called with ``(method, table, key)`` for every ``get``,
  ``floor`` and ``scan`` (``key``: the start) of a read view: what the store was asked.

Errors carry ``injected=True`` (and ``reply_lost=True`` when the commit landed), so a
checker tells an injected fault from a real one. ``faults`` counts them by kind
(``commit-fail``, ``commit-lost-reply``, ``crash``); ``calls`` counts calls by name.
Reads are never failed: a read of the local LMDB file fails only with the machine,
which ``crash_at`` and ``kill`` stand for. Rules, hooks and counters are thread-safe
(actions run outside the lock); the order of faults across threads is only as
reproducible as the threads' schedule.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from slts.errors import MetadataError
from slts.metadata.delegating import DelegatingStore
from slts.metadata.store import (
    SCAN_LIMIT_DEFAULT,
    Change,
    CommitOp,
    Expect,
    MetadataStore,
    Operation,
    ReadView,
    Row,
    Versioned,
)

#: The calls ``before`` can hook.
CALLS = (
    "commit",
    "snapshot",
    "changes",
    "discard_changes",
    "replicate",
    "replicate_rows",
    "make_durable",
    "enable_change_capture",
)


@dataclass
class _Countdown:
    """The ``nth`` next call of ``call`` (writing ``table``, for a commit, if given)."""

    call: str
    nth: int
    table: str | None = None

    def reached(self, call: str, ops: Sequence[CommitOp]) -> bool:
        """Count this call if it matches; True if it is the one."""
        if call != self.call or (self.table is not None and all(op.table != self.table for op in ops)):
            return False
        self.nth -= 1
        return self.nth == 0


class FaultyMetadataStore(DelegatingStore):
    """Wraps a metadata store; injects commit failures by rule (see module doc)."""

    def __init__(self, inner: MetadataStore, seed: int = 0) -> None:
        super().__init__(inner)
        self.seed = seed
        self.random = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.dead = False
        self._lock = threading.Lock()
        self._fail_p = 0.0
        self._lose_p = 0.0
        self._fail_nth: list[_Countdown] = []
        self._crash: tuple[_Countdown, bool] | None = None  # (countdown, landed)
        self._hooks: list[tuple[_Countdown, Callable[[], None]]] = []
        self.on_crash: Callable[[], None] | None = None
        self.before_commit: Callable[[Sequence[CommitOp], Sequence[Expect]], None] | None = None
        self.on_read: Callable[[str, str, bytes], None] | None = None

    # -- rules ----------------------------------------------------------------------------------

    def fail_probability(self, probability: float) -> None:
        """Each commit fails before landing with ``probability``."""
        assert 0.0 <= probability <= 1.0, probability
        self._fail_p = probability

    def fail_nth(self, nth: int, table: str | None = None) -> None:
        """The ``nth`` next commit (writing ``table``, if given) fails before landing."""
        assert nth >= 1, nth
        with self._lock:
            self._fail_nth.append(_Countdown("commit", nth, table))

    def lose_reply_probability(self, probability: float) -> None:
        """Each commit lands, then raises with ``probability``."""
        assert 0.0 <= probability <= 1.0, probability
        self._lose_p = probability

    def crash_at(self, nth: int, landed: bool, table: str | None = None) -> None:
        """The ``nth`` next commit (writing ``table``, if given; landed or not) is where
        the process dies."""
        assert nth >= 1, nth
        with self._lock:
            self._crash = (_Countdown("commit", nth, table), landed)

    def kill(self) -> None:
        """The process dies now: every later call raises ``MetadataError``."""
        with self._lock:
            self.dead = True
            self.faults["crash"] += 1

    def before(
        self, call: str, action: Callable[[], None], *, nth: int = 1, table: str | None = None
    ) -> None:
        """Run ``action()`` right before the ``nth`` next call of ``call`` (for a commit:
        of those writing ``table``, if given), once."""
        assert call in CALLS and nth >= 1, (call, nth)
        assert table is None or call == "commit", "only commits write tables"
        with self._lock:
            self._hooks.append((_Countdown(call, nth, table), action))

    def clear(self) -> None:
        """Remove every rule and hook (a dead store stays dead; counters stay)."""
        with self._lock:
            self._fail_p = self._lose_p = 0.0
            self._fail_nth.clear()
            self._crash = None
            self._hooks.clear()

    def _enter(self, call: str, ops: Sequence[CommitOp] = ()) -> None:
        """A call begins: run the hooks it reaches, then raise if the process is dead."""
        with self._lock:
            due = [action for countdown, action in self._hooks if countdown.reached(call, ops)]
            self._hooks = [(countdown, action) for countdown, action in self._hooks if countdown.nth > 0]
        for action in due:
            action()
        with self._lock:
            if self.dead:
                raise MetadataError("injected: the process died", injected=True, dead=True)
            self.calls[call] += 1

    # -- the store ------------------------------------------------------------------------------

    def commit(self, ops: Sequence[CommitOp], expect: Sequence[Expect] = ()) -> int:
        self._enter("commit", ops)
        if self.before_commit is not None:
            self.before_commit(ops, expect)
        with self._lock:
            crash, landed = self._crash if self._crash is not None else (None, False)
            crashing = crash is not None and crash.reached("commit", ops)
            failing = False
            if crashing:
                self._crash = None
                self.dead = True
                self.faults["crash"] += 1
            else:
                reached = [countdown for countdown in self._fail_nth if countdown.reached("commit", ops)]
                self._fail_nth = [countdown for countdown in self._fail_nth if countdown.nth > 0]
                failing = bool(reached) or (bool(self._fail_p) and self.random.random() < self._fail_p)
                if failing:
                    self.faults["commit-fail"] += 1
        if crashing:
            if self.on_crash is not None:
                self.on_crash()
            if landed:
                self.inner.commit(ops, expect)
            raise MetadataError("injected crash at a commit", injected=True, crash=True, reply_lost=landed)
        if failing:
            raise MetadataError("injected: commit failed before it landed", injected=True)
        sequence = self.inner.commit(ops, expect)
        with self._lock:
            lost = bool(self._lose_p) and self.random.random() < self._lose_p
            if lost:
                self.faults["commit-lost-reply"] += 1
        if lost:
            raise MetadataError(
                "injected: the commit landed, its answer was lost", injected=True, reply_lost=True
            )
        return sequence

    @contextlib.contextmanager
    def _observed(self) -> Iterator[ReadView]:
        with self.inner.snapshot() as view:
            yield view if self.on_read is None else _ObservedView(view, self.on_read)

    def snapshot(self) -> contextlib.AbstractContextManager[ReadView]:
        self._enter("snapshot")
        return self._observed()

    def count(self, table: str) -> int:
        self._enter("count")
        return self.inner.count(table)

    def close(self) -> None:
        """Closes ``inner`` unless this process died (the store outlives a dead process)."""
        if not self.dead:
            self.inner.close()

    def make_durable(self) -> None:
        self._enter("make_durable")
        self.inner.make_durable()

    def enable_change_capture(self) -> None:
        self._enter("enable_change_capture")
        self.inner.enable_change_capture()

    def changes(self, after: int, limit: int = 1000) -> list[Change]:
        self._enter("changes")
        return self.inner.changes(after, limit)

    def encoded_changes(self, after: int, limit: int = 1000) -> list[tuple[int, bytes]]:
        self._enter("changes")  # the same fault point as ``changes``: one read of the change log
        return self.inner.encoded_changes(after, limit)

    def discard_changes(self, through: int, expect: Sequence[Expect] = ()) -> int:
        self._enter("discard_changes")
        return self.inner.discard_changes(through, expect)

    def replicate(
        self, sequence: int, ops: Sequence[Operation], versions: Sequence[int] | None = None
    ) -> None:
        self._enter("replicate", ops)
        self.inner.replicate(sequence, ops, versions)

    def replicate_rows(self, sequence: int, rows: Mapping[str, Sequence[Row]]) -> None:
        self._enter("replicate_rows")
        self.inner.replicate_rows(sequence, rows)


class _ObservedView(ReadView):
    """A read view that reports every read to ``on_read`` first."""

    def __init__(self, view: ReadView, on_read: Callable[[str, str, bytes], None]) -> None:
        self._view = view
        self._on_read = on_read

    @property
    def sequence(self) -> int:
        return self._view.sequence

    def get(self, table: str, key: bytes) -> Versioned | None:
        self._on_read("get", table, key)
        return self._view.get(table, key)

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None:
        self._on_read("floor", table, key)
        return self._view.floor(table, key, lowest)

    def scan(
        self,
        table: str,
        start: bytes = b"",
        stop: bytes | None = None,
        limit: int = SCAN_LIMIT_DEFAULT,
        reverse: bool = False,
    ) -> list[tuple[bytes, Versioned]]:
        self._on_read("scan", table, start)
        return self._view.scan(table, start, stop, limit, reverse)

    def count(self, table: str) -> int:
        self._on_read("count", table, b"")
        return self._view.count(table)
