"""The one seam every source of randomness and time of a simulated run goes through.

``Seam(seed)`` holds ``random.Random(seed)`` (every other generator of the run is seeded
from it, in a fixed order), the fake clock the engine, GC, the journal and the batch
driver read, and the source of the random part of chunk names (``names()``: installs
it with ``slts.chunk_names.unique_source`` for the block). Background workers are off
(``gc_interval_s=0``, ``metadata_log_flush_interval_s=0``, ``usage_flush_interval_s=0``):
the simulator calls GC, flushes and snapshots itself, so no thread schedule enters the run.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

from slts.chunk_names import unique_source


class FakeClock:
    """Time that moves only when told (seconds since the epoch, as ``time.time``)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0)."""
        assert seconds >= 0, seconds
        self.now += seconds


class Seam:
    """Randomness and time of one run, all from ``seed``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.random = random.Random(seed)
        self.clock = FakeClock()
        self._name_random = random.Random(self.random.getrandbits(64))
        self._names_made = 0

    def derive(self) -> random.Random:
        """A new generator seeded from the run's (the next one in a fixed order)."""
        return random.Random(self.random.getrandbits(64))

    def _unique(self) -> str:
        self._names_made += 1  # a counter in the name: unique whatever the draws
        return f"{self._names_made:08x}{self._name_random.getrandbits(96):024x}"

    @contextlib.contextmanager
    def names(self) -> Iterator[None]:
        """Inside the block, new chunk names take their random part from this seam."""
        with unique_source(self._unique):
            yield
