"""A fault-injecting wrapper with the binding interface, driven by one seed.

``FaultyChunkStorage(inner, seed)`` forwards every call to ``inner`` unless a fault
rule fires first. Rules (any number, checked in order):

* ``fail_nth(op, n, error)``: the n-th call (1-based, counted from when the rule is
  added) of operation ``op`` raises ``error`` instead of running.
* ``fail_probability(op, p, error)``: each call of ``op`` fails with probability ``p``,
  drawn from the wrapper's own ``random.Random(seed)``; the same seed replays the
  same faults.
* ``partial_write(n)``: the n-th ``write`` or ``create`` stores only a strict prefix
  of its bytes (its length drawn from the seed; a torn ``create`` leaves a chunk holding
  it) and then raises ``StorageUnavailable``: the torn write a crash or a broken
  connection leaves behind.

Every matching rule counts every call, so rules added together fire independently; a
call that several rules would fail fails once. Rules and counters are thread-safe; the
order of faults across threads is only as reproducible as the threads' schedule.

``calls`` counts the calls per operation; tests use it to sweep "fail call 1, 2, ... N"
of an operation as SQLite's I/O-error tests do.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from slts.errors import SltsError, StorageUnavailable

from .base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource

OPERATIONS = (
    "exists", "create", "delete", "open_read", "open_write", "get_info",
    "read", "write", "list", "concat", "truncate", "set_readonly",
)  # fmt: skip


@dataclass
class _Rule:
    op: str
    error: type[SltsError]
    nth: int | None = None
    probability: float = 0.0
    partial: bool = False
    seen: int = 0


class FaultyChunkStorage(ChunkStorage):
    """Wraps a binding; injects failures by rule. Capability flags are the inner ones."""

    def __init__(self, inner: ChunkStorage, seed: int = 0) -> None:
        self.inner = inner
        self.url = inner.url
        self.supports_append = inner.supports_append
        self.supports_concat = inner.supports_concat
        self.supports_truncate = inner.supports_truncate
        self.supports_readonly = inner.supports_readonly
        self.seed = seed
        self.random = random.Random(seed)
        self.calls: Counter[str] = Counter()
        self.faults_injected = 0
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()

    # -- rules ----------------------------------------------------------------------------------

    def fail_nth(self, op: str, n: int, error: type[SltsError] = StorageUnavailable) -> None:
        """Make the ``n``-th next call of ``op`` raise ``error``."""
        assert op in OPERATIONS and n >= 1, (op, n)
        with self._lock:
            self._rules.append(_Rule(op, error, nth=n))

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

    def clear(self) -> None:
        """Remove every rule (counters stay)."""
        with self._lock:
            self._rules.clear()

    def _fault(self, op: str) -> _Rule | None:
        """Count the call; return the rule that makes it fail, if any.

        Every matching rule counts the call, also when an earlier rule already fired,
        so each ``fail_nth`` fires on its own n-th call. Several rules firing on one
        call make it fail once (the first rule's error) and are all used up.
        """
        with self._lock:
            self.calls[op] += 1
            fired: _Rule | None = None
            for rule in list(self._rules):
                if not (rule.op == op or (rule.partial and op == "create")):
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
            return fired

    def _torn_length(self, data: bytes) -> int:
        """How much of ``data`` a torn write keeps: a strict prefix (seeded)."""
        with self._lock:
            return self.random.randrange(len(data)) if data else 0

    def _check(self, op: str) -> None:
        rule = self._fault(op)
        if rule is not None:
            raise rule.error(f"injected fault in {op} (seed {self.seed})", injected=True)

    # -- contract -------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        self._check("exists")
        return self.inner.exists(name)

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        rule = self._fault("create")
        if rule is not None:
            if rule.partial:
                self.inner.create(name, data[: self._torn_length(data)])
            raise rule.error(f"injected fault in create (seed {self.seed})", injected=True)
        return self.inner.create(name, data)

    def delete(self, handle: ChunkHandle) -> None:
        self._check("delete")
        self.inner.delete(handle)

    def open_read(self, name: str) -> ChunkHandle:
        self._check("open_read")
        return self.inner.open_read(name)

    def open_write(self, name: str) -> ChunkHandle:
        self._check("open_write")
        return self.inner.open_write(name)

    def get_info(self, name: str) -> ChunkInfo:
        self._check("get_info")
        return self.inner.get_info(name)

    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        self._check("read")
        return self.inner.read(handle, offset, length)

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        rule = self._fault("write")
        if rule is not None:
            if rule.partial and data:
                self.inner.write(handle, offset, data[: self._torn_length(data)])
            raise rule.error(f"injected fault in write (seed {self.seed})", injected=True)
        return self.inner.write(handle, offset, data)

    def list(self, prefix: str = "") -> Iterator[str]:
        self._check("list")
        return self.inner.list(prefix)

    def concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        self._check("concat")
        return self.inner.concat(target, sources)

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        self._check("truncate")
        self.inner.truncate(handle, length)

    def set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        self._check("set_readonly")
        self.inner.set_readonly(handle, readonly)

    def close(self) -> None:
        self.inner.close()
