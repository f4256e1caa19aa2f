"""A fault-injecting wrapper with the binding interface, driven by one seed.

``FaultyChunkStorage(inner, seed)`` forwards every call to ``inner`` unless a fault
rule fires first. Rules (any number, checked in order):

* ``fail_nth(op, n, error, prefix)``: the n-th call (1-based, counted from when the rule
  is added) of operation ``op`` on a chunk whose name starts with ``prefix`` (default:
  any) raises ``error`` instead of running.
* ``fail_probability(op, p, error)``: each call of ``op`` fails with probability ``p``,
  drawn from the wrapper's own ``random.Random(seed)``; the same seed replays the
  same faults.
* ``partial_write(n)``: the n-th ``write`` or ``create`` stores only a strict prefix
  of its bytes (its length drawn from the seed; a torn ``create`` leaves a chunk holding
  it) and then raises ``StorageUnavailable``: the torn write a crash or a broken
  connection leaves behind.

* ``lose_reply_probability(op, p)``: each call of ``op`` runs on ``inner`` and then,
  with probability ``p``, raises ``StorageUnavailable`` all the same: the answer of a
  call that took effect was lost (a timeout after the server acted).
* ``latency(advance, p, seconds_max)``: each call, with probability ``p``, first
  advances a fake clock by up to ``seconds_max`` (``advance(seconds)``): a slow call.
* ``kill()``: from now on every call raises ``StorageUnavailable`` (the process that
  used this wrapper died; a new process wraps ``inner`` again).
* ``lose_power()``: from now on every call raises ``StorageUnavailable``, and it returns
  what a power loss leaves on the storage: each chunk holds the bytes of the calls that
  returned (the binding contract: a write is durable when it returns), plus, for a call
  still running, a seeded torn prefix of what it wrote (the page cache of a file whose
  ``fdatasync`` had not returned, dropped); a chunk whose ``create`` never returned is
  gone or torn, one whose ``delete`` never returned is still there.

``before(ops, action, nth, prefix)`` is a hook, for tests that need a moment rather than
a fault: ``action()`` runs right before the ``nth`` next call of one of ``ops`` on a chunk
whose name starts with ``prefix``, once, before any rule sees that call (another instance
starts there, a writer waits there for a signal, or the process dies there: ``kill``).
For ``list`` the name is the listed prefix, for ``concat`` the target.

Rules see only calls with valid arguments: ``ChunkStorage`` checks them before the hooks
(``_do_*``) here run, so a bad name, range, handle or data raises its usual error before
any counting, random draw or fault, as a real binding refuses bad input before any request.
Each hook forwards to the inner binding's public method, which checks the arguments again.

Every matching rule counts every call, so rules added together fire independently; a
call that several rules would fail fails once. Rules and counters are thread-safe; the
order of faults across threads is only as reproducible as the threads' schedule.

``faults`` counts the injected faults by kind (``fail``, ``torn``, ``lost-reply``,
``latency``, ``dead``); ``calls`` counts the (valid) calls per operation; tests use it to sweep
"fail call 1, 2, ... N" of an operation as SQLite's I/O-error tests do.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from slts.errors import SltsError, StorageUnavailable

from .base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource, WrappedChunkStorage

OPERATIONS = (
    "exists",
    "create",
    "delete",
    "open_read",
    "open_write",
    "get_info",
    "read",
    "write",
    "list",
    "concat",
    "truncate",
    "set_readonly",
)


@dataclass
class _Rule:
    op: str
    error: type[SltsError]
    nth: int | None = None
    probability: float = 0.0
    partial: bool = False
    lost: bool = False  # the call runs, then its answer is lost
    seen: int = 0
    prefix: str = ""  # only calls on chunks whose name starts with this


@dataclass
class _Hook:
    ops: frozenset[str]
    action: Callable[[], None]
    nth: int
    prefix: str


class FaultyChunkStorage(WrappedChunkStorage):
    """Wraps a binding; injects failures by rule. Capability flags are the inner ones."""

    def __init__(self, inner: ChunkStorage, seed: int = 0) -> None:
        super().__init__(inner)
        self.seed = seed
        self.random = random.Random(seed)
        self.calls: Counter[str] = Counter()
        self.faults_injected = 0
        self.faults: Counter[str] = Counter()
        self.dead = False
        self._latency: tuple[Callable[[float], None], float, float] | None = None
        self._rules: list[_Rule] = []
        self._hooks: list[_Hook] = []
        self._lock = threading.Lock()
        #: What the power-loss model keeps: chunk -> length acknowledged (calls returned).
        self._acknowledged: dict[str, int] = {}
        self._touched: set[str] = set()  # chunks a mutating call started on (the rest predate the model)
        self._powered = True

    # -- rules ----------------------------------------------------------------------------------

    def fail_nth(
        self, op: str, n: int, error: type[SltsError] = StorageUnavailable, *, prefix: str = ""
    ) -> None:
        """Make the ``n``-th next call of ``op`` (on a chunk whose name starts with
        ``prefix``) raise ``error``."""
        assert op in OPERATIONS and n >= 1, (op, n)
        with self._lock:
            self._rules.append(_Rule(op, error, nth=n, prefix=prefix))

    def before(
        self, ops: str | Sequence[str], action: Callable[[], None], *, nth: int = 1, prefix: str = ""
    ) -> None:
        """Run ``action()`` right before the ``nth`` next call of one of ``ops`` on a chunk
        whose name starts with ``prefix``, once (see the module doc)."""
        chosen = frozenset([ops] if isinstance(ops, str) else ops)
        assert chosen and chosen <= set(OPERATIONS) and nth >= 1, (ops, nth)
        with self._lock:
            self._hooks.append(_Hook(chosen, action, nth, prefix))

    def fail_probability(
        self, op: str, probability: float, error: type[SltsError] = StorageUnavailable
    ) -> None:
        """Make every call of ``op`` fail with ``probability`` (seeded)."""
        assert op in OPERATIONS and 0.0 <= probability <= 1.0, (op, probability)
        with self._lock:
            self._rules.append(_Rule(op, error, probability=probability))

    def partial_write(self, n: int) -> None:
        """The ``n``-th next ``write``/``create`` stores a prefix of its bytes, then raises."""
        assert n >= 1
        with self._lock:
            self._rules.append(_Rule("write", StorageUnavailable, nth=n, partial=True))

    def lose_reply_probability(self, op: str, probability: float) -> None:
        """Make every call of ``op`` take effect and then, with ``probability``, raise
        ``StorageUnavailable`` (seeded): the answer was lost."""
        assert op in OPERATIONS and 0.0 <= probability <= 1.0, (op, probability)
        with self._lock:
            self._rules.append(_Rule(op, StorageUnavailable, probability=probability, lost=True))

    def latency(self, advance: Callable[[float], None], probability: float, seconds_max: float) -> None:
        """Before each call, with ``probability``, call ``advance(s)`` with ``s`` drawn from
        ``[0, seconds_max)`` (a fake clock: a slow call costs no real time)."""
        assert 0.0 <= probability <= 1.0 and seconds_max >= 0, (probability, seconds_max)
        with self._lock:
            self._latency = (advance, probability, seconds_max)

    def kill(self) -> None:
        """Every later call raises ``StorageUnavailable``: the process using this died."""
        with self._lock:
            self.dead = True

    def lose_power(self) -> dict[str, bytes]:
        """Stop every later call (as ``kill``) and return the chunks a power loss leaves,
        name -> bytes (see the module doc). The inner binding is left as it was."""
        with self._lock:
            self.dead = True
            self._powered = False
            acknowledged = dict(self._acknowledged)
            touched = set(self._touched)
        image: dict[str, bytes] = {}
        for name in sorted(self.inner.list("")):
            stored = self.inner.read(self.inner.open_read(name), 0, self.inner.get_info(name).length)
            durable = acknowledged.get(name, None if name in touched else len(stored))
            in_flight = stored[durable or 0 :]
            torn = in_flight[: self.random.randrange(len(in_flight) + 1)] if in_flight else b""
            if durable is not None:
                image[name] = stored[:durable] + torn
            elif torn and self.random.random() < 0.5:  # a create that never returned, torn
                image[name] = torn
        return image

    def _start(self, name: str, durable_before: int | None = None) -> None:
        """A mutating call on ``name`` starts (the power-loss model); ``durable_before``: the
        length it had (an append to a chunk this wrapper has not seen written)."""
        with self._lock:
            if name not in self._touched and durable_before is not None:
                self._acknowledged.setdefault(name, durable_before)
            self._touched.add(name)

    def _acknowledge(self, name: str, length: int | None) -> None:
        """A mutating call on ``name`` returned: it is durable (None: deleted).

        Raises:
            StorageUnavailable: the power went while it ran. Its caller never learns that it
                returned (the machine is off), so nothing of it is known durable and nothing
                may build on it: a caller told "done" here would commit a layout naming a
                chunk the power-loss image left out.
        """
        with self._lock:
            if not self._powered:
                raise StorageUnavailable(f"the power went during a call on chunk {name!r}")
            if length is None:
                self._acknowledged.pop(name, None)
            else:
                self._acknowledged[name] = length

    def clear(self) -> None:
        """Remove every rule, hook and the latency (counters stay; a killed wrapper stays dead)."""
        with self._lock:
            self._rules.clear()
            self._hooks.clear()
            self._latency = None

    def _run_hooks(self, op: str, name: str) -> None:
        """Run the hooks this call reaches (outside the lock: an action may block)."""
        due: list[Callable[[], None]] = []
        with self._lock:
            for hook in list(self._hooks):
                if op in hook.ops and name.startswith(hook.prefix):
                    hook.nth -= 1
                    if hook.nth == 0:
                        self._hooks.remove(hook)
                        due.append(hook.action)
        for action in due:
            action()

    def _fault(self, op: str, name: str) -> _Rule | None:
        """Run the hooks, count the call (and slow it down if latency is on); return the
        rule that makes it fail, if any.

        Every matching rule counts the call, also when an earlier rule already fired,
        so each ``fail_nth`` fires on its own n-th call. Several rules firing on one
        call make it fail once (the first rule's error) and are all used up.
        """
        self._run_hooks(op, name)
        slow = 0.0
        with self._lock:
            if self.dead:
                self.faults["dead"] += 1
                raise StorageUnavailable(
                    f"injected: the process died before {op} (seed {self.seed})", injected=True
                )
            self.calls[op] += 1
            latency = self._latency
            if latency is not None and self.random.random() < latency[1]:
                slow = self.random.random() * latency[2]
                self.faults["latency"] += 1
        if slow and latency is not None:
            latency[0](slow)
        return self._fire(op, name, lost=False)

    def _fire(self, op: str, name: str, *, lost: bool) -> _Rule | None:
        """The rule (among the lost-reply ones if ``lost``, else the others) that fires."""
        with self._lock:
            fired: _Rule | None = None
            for rule in list(self._rules):
                if rule.lost != lost or not (rule.op == op or (rule.partial and op == "create")):
                    continue
                if not name.startswith(rule.prefix):
                    continue
                rule.seen += 1
                if rule.nth is not None:
                    if rule.seen == rule.nth:
                        self._rules.remove(rule)
                        fired = fired or rule
                elif fired is None and rule.probability and self.random.random() < rule.probability:
                    fired = rule
            if fired is not None:
                self.faults_injected += 1
                self.faults["lost-reply" if lost else "torn" if fired.partial else "fail"] += 1
            return fired

    def _after(self, op: str, name: str) -> None:
        """The call took effect: lose its answer if a lost-reply rule says so."""
        rule = self._fire(op, name, lost=True)
        if rule is not None:
            raise rule.error(
                f"injected: the answer of {op} was lost after it took effect (seed {self.seed})",
                injected=True,
                reply_lost=True,
            )

    def _torn_length(self, data: bytes) -> int:
        """How much of ``data`` a torn write keeps: a strict prefix (seeded)."""
        with self._lock:
            return self.random.randrange(len(data)) if data else 0

    def _check(self, op: str, name: str) -> None:
        rule = self._fault(op, name)
        if rule is not None:
            raise rule.error(f"injected fault in {op} (seed {self.seed})", injected=True)

    # -- hooks: ChunkStorage checked the arguments; the inner binding checks them again -----

    def _do_exists(self, name: str) -> bool:
        self._check("exists", name)
        result = self.inner.exists(name)
        self._after("exists", name)
        return result

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        self._start(name)
        rule = self._fault("create", name)
        if rule is not None:
            if rule.partial:
                self.inner.create(name, data[: self._torn_length(data)])
            raise rule.error(f"injected fault in create (seed {self.seed})", injected=True)
        handle = self.inner.create(name, data)
        self._acknowledge(name, len(data))
        self._after("create", name)
        return handle

    def _do_delete(self, handle: ChunkHandle) -> None:
        self._check("delete", handle.name)
        self.inner.delete(handle)
        self._acknowledge(handle.name, None)
        self._after("delete", handle.name)

    def _do_open_read(self, name: str) -> ChunkHandle:
        self._check("open_read", name)
        return self.inner.open_read(name)

    def _do_open_write(self, name: str) -> ChunkHandle:
        self._check("open_write", name)
        return self.inner.open_write(name)

    def _do_get_info(self, name: str) -> ChunkInfo:
        self._check("get_info", name)
        return self.inner.get_info(name)

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        self._check("read", handle.name)
        data = self.inner.read(handle, offset, length)
        self._after("read", handle.name)
        return data

    def _do_read_view(self, handle: ChunkHandle, offset: int, length: int) -> memoryview:
        self._check("read", handle.name)  # the same faults as ``read``: a view is a read
        view = self.inner.read_view(handle, offset, length)
        self._after("read", handle.name)
        return view

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        self._start(handle.name, offset)
        rule = self._fault("write", handle.name)
        if rule is not None:
            if rule.partial and data:
                self.inner.write(handle, offset, data[: self._torn_length(data)])
            raise rule.error(f"injected fault in write (seed {self.seed})", injected=True)
        written = self.inner.write(handle, offset, data)
        self._acknowledge(handle.name, offset + written)
        self._after("write", handle.name)
        return written

    def _do_list(self, prefix: str) -> Iterator[str]:
        self._check("list", prefix)
        return self.inner.list(prefix)

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        self._start(target)
        self._check("concat", target)
        info = self.inner.concat(target, sources)
        self._acknowledge(target, info.length)
        self._after("concat", target)
        return info

    def _do_truncate(self, handle: ChunkHandle, length: int) -> None:
        self._check("truncate", handle.name)
        self.inner.truncate(handle, length)
        self._acknowledge(handle.name, length)
        self._after("truncate", handle.name)

    def _do_set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        self._check("set_readonly", handle.name)
        self.inner.set_readonly(handle, readonly)
