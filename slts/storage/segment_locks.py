"""Per-segment locks of one container instance: ``SegmentLocks``.

Every segment in use has two locks, created on first use and dropped when its last
holder or waiter leaves (memory follows the segments in use, not the segments that
exist; unrelated segments never wait for each other):

* the **change** lock: one changer of the segment at a time (write, seal, concat,
  truncate, delete, a defrag's swap), held for the whole operation, tier-2 I/O
  included: a segment has one writer and its writes apply in order;
* the **layout** lock: held while the segment's records are read as a whole (a read
  resolving its pieces) or committed; never across tier-2 I/O. A read therefore waits
  for a commit of the same segment, never for its data write or ``fdatasync``.

Rules (no deadlock): a thread takes change locks before layout locks, and several
segments' locks in name order. ``exclusive`` takes both kinds (for the changers that do
no tier-2 I/O under the lock); ``write`` takes ``changing`` for the operation and
``layout`` around its commit; readers take ``layout`` alone.
"""

from __future__ import annotations

import threading


class _Entry:
    """The two locks of one segment, and how many threads hold or wait for either."""

    __slots__ = ("change", "layout", "users")

    def __init__(self) -> None:
        self.change = threading.Lock()
        self.layout = threading.Lock()
        self.users = 0


class SegmentLocks:
    """The change and layout locks of every segment in use (see the module doc)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        """How many segments have an entry now (in use or waited for)."""
        with self._guard:
            return len(self._entries)

    def _enter(self, names: tuple[str, ...]) -> list[_Entry]:
        """Register as a user of the entries of ``names`` (sorted, no repeats)."""
        with self._guard:
            entries = []
            for name in names:
                entry = self._entries.get(name)
                if entry is None:
                    entry = self._entries[name] = _Entry()
                entry.users += 1
                entries.append(entry)
        return entries

    def _leave(self, names: tuple[str, ...], entries: list[_Entry]) -> None:
        """Stop using the entries; an entry nobody uses any more is dropped."""
        with self._guard:
            for name, entry in zip(names, entries, strict=True):
                entry.users -= 1
                assert entry.users >= 0, name
                if entry.users == 0:
                    del self._entries[name]

    def exclusive(self, *names: str) -> _Holding:
        """Both locks of every segment in ``names``: no other changer and no reader of
        them runs meanwhile."""
        return _Holding(self, tuple(sorted(set(names))), change=True, layout=True)

    def changing(self, name: str) -> _Holding:
        """The change lock of ``name``: no other changer of it runs meanwhile; readers
        do, so every commit inside must hold ``layout(name)``."""
        return _Holding(self, (name,), change=True, layout=False)

    def layout(self, *names: str) -> _Holding:
        """The layout locks of ``names`` (in name order): their records do not change
        meanwhile."""
        return _Holding(
            self, (names[0],) if len(names) == 1 else tuple(sorted(set(names))), change=False, layout=True
        )


class _Holding:
    """``with locks.exclusive(...)`` / ``changing`` / ``layout``: a plain context manager
    (no generator: every read and write passes here)."""

    __slots__ = ("_entries", "_held", "_locks", "_names", "_which")

    def __init__(self, locks: SegmentLocks, names: tuple[str, ...], *, change: bool, layout: bool) -> None:
        self._locks = locks
        self._names = names  # sorted, no repeats
        self._which = ("change",) * change + ("layout",) * layout  # change locks first
        self._entries: list[_Entry] = []
        self._held: list[threading.Lock] = []

    def __enter__(self) -> None:
        self._entries = self._locks._enter(self._names)  # noqa: SLF001 - the table's own helper
        try:
            for kind in self._which:
                for entry in self._entries:
                    lock: threading.Lock = getattr(entry, kind)
                    lock.acquire()
                    self._held.append(lock)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc_info: object) -> None:
        for lock in reversed(self._held):
            lock.release()
        self._held = []
        self._locks._leave(self._names, self._entries)  # noqa: SLF001 - the table's own helper
