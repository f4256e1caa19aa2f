"""A fault-injecting metadata store, driven by one seed (the simulator's, STYLE.md practice 10).

``FaultyMetadataStore(inner, seed)`` forwards every call to ``inner``; only ``commit``
is subject to faults:

* ``fail_probability(p)``: a commit fails with ``MetadataError`` *before* it lands
  (nothing applied), with probability ``p`` drawn from ``random.Random(seed)``;
* ``lose_reply_probability(p)``: a commit lands and then raises ``MetadataError`` all
  the same (its answer was lost: the caller cannot tell whether it took effect);
* ``crash_at(n, landed)``: the ``n``-th next commit is the moment the process dies:
  it lands or not, raises ``MetadataError``, and from then on every call raises
  ``MetadataError`` (``dead``): a dead process does nothing more; ``on_crash`` (if
  set) is called right then (the simulator kills the process's binding with it). A new process wraps
  ``inner`` in a new object.

``before_commit`` (if set) is called with every commit's ops and expectations before
anything else happens to it: the simulator lands another process's commit there, between
the caller's reads and its commit.

Errors carry ``injected=True`` (and ``reply_lost=True`` when the commit landed), so a
checker tells an injected fault from a real one. ``faults`` counts them by kind
(``commit-fail``, ``commit-lost-reply``, ``crash``). Reads are never failed: a read of
the local LMDB file fails only with the machine, which ``crash_at`` stands for.
Not thread-safe beyond ``inner``'s guarantees: meant for single-threaded, seeded runs.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Callable, Sequence

from slts.errors import MetadataError
from slts.metadata.delegating import DelegatingStore
from slts.metadata.store import Change, Expect, MetadataStore, Operation, ReadView


class FaultyMetadataStore(DelegatingStore):
    """Wraps a metadata store; injects commit failures by rule (see module doc)."""

    def __init__(self, inner: MetadataStore, seed: int = 0) -> None:
        super().__init__(inner)
        self.seed = seed
        self.random = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.dead = False
        self._fail_p = 0.0
        self._lose_p = 0.0
        self._crash: tuple[int, bool] | None = None  # (countdown, landed)
        self.on_crash: Callable[[], None] | None = None
        self.before_commit: Callable[[Sequence[Operation], Sequence[Expect]], None] | None = None

    # -- rules ----------------------------------------------------------------------------------

    def fail_probability(self, probability: float) -> None:
        """Each commit fails before landing with ``probability``."""
        assert 0.0 <= probability <= 1.0, probability
        self._fail_p = probability

    def lose_reply_probability(self, probability: float) -> None:
        """Each commit lands, then raises with ``probability``."""
        assert 0.0 <= probability <= 1.0, probability
        self._lose_p = probability

    def crash_at(self, nth: int, landed: bool) -> None:
        """The ``nth`` next commit (landed or not) is where the process dies."""
        assert nth >= 1, nth
        self._crash = (nth, landed)

    def clear(self) -> None:
        """Remove every rule (a dead store stays dead; counters stay)."""
        self._fail_p = self._lose_p = 0.0
        self._crash = None

    def _check_alive(self) -> None:
        if self.dead:
            raise MetadataError("injected: the process died", injected=True, dead=True)

    # -- the store ------------------------------------------------------------------------------

    def commit(self, ops: Sequence[Operation], expect: Sequence[Expect] = ()) -> int:
        self._check_alive()
        if self.before_commit is not None:
            self.before_commit(ops, expect)
        if self._crash is not None:
            countdown, landed = self._crash
            if countdown > 1:
                self._crash = (countdown - 1, landed)
            else:
                self._crash = None
                self.dead = True
                self.faults["crash"] += 1
                if self.on_crash is not None:
                    self.on_crash()
                if landed:
                    self.inner.commit(ops, expect)
                raise MetadataError(
                    "injected crash at a commit", injected=True, crash=True, reply_lost=landed
                )
        if self._fail_p and self.random.random() < self._fail_p:
            self.faults["commit-fail"] += 1
            raise MetadataError("injected: commit failed before it landed", injected=True)
        sequence = self.inner.commit(ops, expect)
        if self._lose_p and self.random.random() < self._lose_p:
            self.faults["commit-lost-reply"] += 1
            raise MetadataError(
                "injected: the commit landed, its answer was lost", injected=True, reply_lost=True
            )
        return sequence

    def snapshot(self) -> contextlib.AbstractContextManager[ReadView]:
        self._check_alive()
        return self.inner.snapshot()

    def count(self, table: str) -> int:
        self._check_alive()
        return self.inner.count(table)

    def close(self) -> None:
        """Closes ``inner`` unless this process died (the store outlives a dead process)."""
        if not self.dead:
            self.inner.close()

    def enable_change_capture(self) -> None:
        self._check_alive()
        self.inner.enable_change_capture()

    def changes(self, after: int, limit: int = 1000) -> list[Change]:
        self._check_alive()
        return self.inner.changes(after, limit)

    def discard_changes(self, through: int) -> int:
        self._check_alive()
        return self.inner.discard_changes(through)

    def replicate(
        self, sequence: int, ops: Sequence[Operation], versions: Sequence[int] | None = None
    ) -> None:
        self._check_alive()
        self.inner.replicate(sequence, ops, versions)
