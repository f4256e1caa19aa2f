"""The chunk cache's index: which cache files exist, in eviction order, and the bytes
they hold on disk. Memory only: it performs no I/O, and tells its caller which files to
remove (``Victims``); thread-safe (one lock, held for dictionary work only).

Byte accounting. Every byte of a cache file on disk is counted in ``committed`` (files in
the index) or ``claimed`` (bytes a fill has reserved: its file being written, files it
evicted to make room and has not removed yet, a file it made but may not keep, files
dropped and not yet removed). A fill ``claim``s its file's size first, taking the room
from free bytes and from the least recently used files (evicted: out of the index, their
bytes moved into the claim until the caller has removed them); it writes its file only
after removing them.

Invariants (asserted after every change; ``tests/chunk_cache/test_index.py``):

1. **Strict size limit.** ``committed + claimed <= capacity_bytes`` at all times, so the
   files on disk (which are always counted, see above) never exceed it.
2. **Never stale.** A fill reads its bytes from the chunk storage after ``begin`` gave it a
   token; ``invalidate(key)`` (a delete, write, truncate... through the cache) drops the
   key's files, and a fill whose token is older than the key's last invalidation is
   refused at ``commit``. So no bytes read before a change of a chunk are ever served
   after it.
3. **One file per block.** At most one file per (key, block) is in the index; a fill that
   finds another file committed for its block since it looked refuses its own.
4. **Scan resistance** (segmented LRU). A file enters *probation*. It moves to the
   *protected* segment when a hit asks again for bytes that hits of it served before
   (a re-use; a one-pass reader, which reads a block's bytes once, in order, never
   does). Protected files keep at most ``PROTECTED_SHARE`` of the capacity: past it, the
   least recently used of them goes back to probation. Eviction takes probation's least
   recently used first, and the protected ones only once probation is empty and no other
   fill holds a claim: while fills are in flight, one that could only make room from
   protected files is dropped instead (their claims, and a merge's old run, hold room for
   a while; a lone fill is always admitted, however small the cache). So a scan of any
   size evicts only what was not re-used, and while everything fits nothing is evicted
   at all (plain LRU when the working set fits). After a restart the files the last
   close left protected are protected again (``files.save_protected``, a hint taken
   once); after a crash every file starts in probation. Each segment is ordered by the
   files' modification times.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from .files import CacheFile

#: Seconds between two updates of a file's modification time on hits: a restart orders
#: files by it (least recently used first), so the order it rebuilds is this coarse.
TOUCH_INTERVAL_S = 10.0
#: Invalidation records kept before pruning those no open token needs.
INVALIDATIONS_PRUNE_AT = 4096
#: The most of the capacity protected files (used again after their fill) keep; the
#: rest is probation's, where a scan's files stay (invariant 4).
PROTECTED_SHARE = 0.8

Slot = tuple[bytes, int]  # (key, block)


@dataclass(frozen=True, slots=True)
class Token:
    """A fill's start: the invalidation sequence number when its read began."""

    sequence: int


@dataclass(slots=True)
class Claim:
    """Bytes reserved by one fill: ``bytes`` in all, some of them the ``victims``'
    (evicted files the fill must remove before writing its own)."""

    bytes: int
    victims: list[CacheFile] = field(default_factory=list)


@dataclass(slots=True)
class _Entry:
    """A file in the index; ``served_start``/``served_end``: the span of the bytes hits of
    it served while in probation (empty while ``served_start >= served_end``)."""

    file: CacheFile
    touched_s: float
    protected: bool = False
    served_start: int = 0
    served_end: int = 0


class CacheIndex:
    """Segmented-LRU index of cache files with strict byte accounting (see the module doc)."""

    def __init__(self, capacity_bytes: int) -> None:
        assert capacity_bytes > 0, capacity_bytes
        self.capacity_bytes = capacity_bytes
        self.protected_bytes_max = int(capacity_bytes * PROTECTED_SHARE)
        self._lock = threading.Lock()
        self._entries: dict[Slot, _Entry] = {}
        # Each segment in LRU order, least recently used first (invariant 4).
        self._probation: OrderedDict[Slot, _Entry] = OrderedDict()
        self._protected: OrderedDict[Slot, _Entry] = OrderedDict()
        self._blocks: dict[bytes, set[int]] = {}
        self.committed = 0
        self.claimed = 0
        self.protected_bytes = 0
        self._sequence = 0
        self._invalidated: dict[bytes, int] = {}
        self._open: Counter[int] = Counter()
        self._closed = False

    # -- lookups -----------------------------------------------------------------------------

    def lookup(
        self, key: bytes, ranges: Iterable[tuple[int, int, int]], now_s: float
    ) -> tuple[list[tuple[CacheFile, int, int]], list[str]] | None:
        """For each (block, start, end) range of chunk ``key``, the file holding it whole
        and the range (all marked recently used), and the paths whose modification time is
        due for an update (``TOUCH_INTERVAL_S``); None at the first range not held whole
        (``ranges`` is consumed no further)."""
        with self._lock:
            found: list[tuple[_Entry, int, int]] = []
            for block, start, end in ranges:
                entry = self._entries.get((key, block))
                if entry is None or entry.file.start > start or entry.file.end < end:
                    return None
                found.append((entry, start, end))
            touch = []
            for entry, start, end in found:
                self._use((key, entry.file.block), entry, start, end)
                if now_s - entry.touched_s >= TOUCH_INTERVAL_S:
                    entry.touched_s = now_s
                    touch.append(entry.file.path)
            return [(entry.file, start, end) for entry, start, end in found], touch

    def lookup_one(
        self, key: bytes, block: int, start: int, end: int, now_s: float
    ) -> tuple[CacheFile, bool] | None:
        """``lookup`` of one range inside one block (a read's common case, without the
        lists): the file holding ``[start, end)`` of ``block`` whole (marked recently
        used) and whether its modification time is due for an update; else None."""
        with self._lock:
            entry = self._entries.get((key, block))
            if entry is None or entry.file.start > start or entry.file.end < end:
                return None
            self._use((key, block), entry, start, end)
            touch = now_s - entry.touched_s >= TOUCH_INTERVAL_S
            if touch:
                entry.touched_s = now_s
            return entry.file, touch

    def covers(self, key: bytes, ranges: Iterable[tuple[int, int, int]]) -> bool:
        """Whether files hold every (block, start, end) range of chunk ``key`` whole (no
        LRU change: a question, not a use)."""
        with self._lock:
            for block, start, end in ranges:
                entry = self._entries.get((key, block))
                if entry is None or entry.file.start > start or entry.file.end < end:
                    return False
            return True

    def current(self, key: bytes, block: int) -> CacheFile | None:
        """The file held for (``key``, ``block``), if any (its LRU place unchanged)."""
        with self._lock:
            entry = self._entries.get((key, block))
            return None if entry is None else entry.file

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def files(self) -> list[CacheFile]:
        """Every file in the index, in eviction order: probation's least recently used
        first, the protected files (least recently used first) last."""
        with self._lock:
            return [entry.file for entry in (*self._probation.values(), *self._protected.values())]

    def protected(self) -> list[CacheFile]:
        """The protected files (invariant 4), least recently used first."""
        with self._lock:
            return [entry.file for entry in self._protected.values()]

    # -- tokens and invalidation -------------------------------------------------------------

    def begin(self) -> Token:
        """A token for a read about to fetch bytes from the chunk storage (invariant 2);
        ``end`` it (each ``retain`` too) when no fill will use it any more."""
        with self._lock:
            token = Token(self._sequence)
            self._open[token.sequence] += 1
            return token

    def retain(self, token: Token) -> None:
        """One more user of ``token`` (a fill that will ``end`` it)."""
        with self._lock:
            assert self._open[token.sequence] > 0, token
            self._open[token.sequence] += 1

    def end(self, token: Token) -> None:
        with self._lock:
            assert self._open[token.sequence] > 0, token
            self._open[token.sequence] -= 1
            if not self._open[token.sequence]:
                del self._open[token.sequence]
            if not self._open:
                self._invalidated.clear()  # no fill can be refused by them any more

    def invalidate(self, key: bytes) -> list[CacheFile]:
        """Drop every file of ``key`` and refuse fills begun before now (invariant 2).
        Returns the dropped files: their bytes stay claimed until the caller removed
        them and called ``unclaim``."""
        with self._lock:
            self._sequence += 1
            if self._open:
                self._invalidated[key] = self._sequence
                if len(self._invalidated) > INVALIDATIONS_PRUNE_AT:
                    oldest = min(self._open)
                    self._invalidated = {k: s for k, s in self._invalidated.items() if s > oldest}
            dropped = [self._remove((key, block)) for block in sorted(self._blocks.get(key, ()))]
            self.claimed += sum(file.size for file in dropped)
            self._check()
            return dropped

    # -- fills -------------------------------------------------------------------------------

    def claim(self, size: int) -> Claim | None:
        """Reserve ``size`` bytes for a fill, evicting files as needed, probation's least
        recently used first (``Claim.victims``: remove them before writing). None if the
        room is held by other fills' claims, or could only come from protected files
        while other fills hold claims (invariant 4): the fill is dropped."""
        assert 0 < size <= self.capacity_bytes, size
        with self._lock:
            if self._closed:
                return None
            free = self.capacity_bytes - self.committed - self.claimed
            if free + self.committed < size:
                return None
            if self.claimed and free + self.committed - self.protected_bytes < size:
                return None  # only protected files could make room, and other fills are in flight
            claim = Claim(0)
            victim_bytes = 0
            while free + victim_bytes < size:
                slot, entry = next(iter((self._probation or self._protected).items()))
                self._remove(slot)
                claim.victims.append(entry.file)
                victim_bytes += entry.file.size
            # The victims' bytes left ``committed``; they are part of the claim until removed.
            claim.bytes = max(size, victim_bytes)
            self.claimed += claim.bytes
            self._check()
            return claim

    def commit(
        self, file: CacheFile, token: Token, claim: Claim, replaced: CacheFile | None, now_s: float
    ) -> tuple[bool, list[CacheFile]]:
        """Put ``file`` (written under ``claim``, merging ``replaced`` if not None) in the
        index as the most recently used, unless its key was invalidated since ``token``
        or another file of its block came in meanwhile (invariants 2, 3). Returns whether
        it went in and the files the caller must remove (and ``unclaim``): the one it
        replaced, or itself."""
        assert file.size <= claim.bytes, (file.size, claim.bytes)
        slot = (file.key, file.block)
        with self._lock:
            current = self._entries.get(slot)
            fresh = self._invalidated.get(file.key, -1) <= token.sequence
            accepted = fresh and not self._closed and (current is None or current.file is replaced)
            self.claimed -= claim.bytes
            if not accepted:
                self.claimed += file.size  # until the caller removed it
                self._check()
                return False, [file]
            stale: list[CacheFile] = []
            entry = _Entry(file, now_s)
            if current is not None:  # a merge: the block keeps its segment and what it served
                stale.append(self._remove(slot))
                self.claimed += current.file.size
                entry.protected = current.protected
                entry.served_start, entry.served_end = current.served_start, current.served_end
            self._insert(slot, entry)
            self._check()
            return True, stale

    def abandon(self, claim: Claim) -> None:
        """Give back a claim whose fill made no file (its victims were removed)."""
        with self._lock:
            self.claimed -= claim.bytes
            self._check()

    def drop(self, file: CacheFile) -> bool:
        """Take ``file`` out of the index (damaged): True if it was there; its bytes stay
        claimed until the caller removed it and called ``unclaim``."""
        with self._lock:
            entry = self._entries.get((file.key, file.block))
            if entry is None or entry.file is not file:
                return False
            self._remove((file.key, file.block))
            self.claimed += file.size
            self._check()
            return True

    def unclaim(self, size: int) -> None:
        """The caller removed files of ``size`` bytes it was handed (or failed to, and
        they are gone for good all the same: see ``ChunkCache._remove``)."""
        with self._lock:
            self.claimed -= size
            self._check()

    # -- restart and close -------------------------------------------------------------------

    def load(
        self, files: Iterable[tuple[CacheFile, float]], now_s: float, protected: Collection[str] = ()
    ) -> list[CacheFile]:
        """Fill the empty index from files found on disk, with their modification times:
        oldest first in LRU order; of two files of one block the newer version wins; the
        files whose names are in ``protected`` (the last close's protected files) are
        protected again, within the share, the rest in probation (invariant 4).
        Returns the files to remove (duplicates, and the oldest while over capacity),
        which the caller removes before the cache is used (they are not counted: only
        while a cache opens with less capacity than its files hold can the disk hold
        more than ``capacity_bytes``)."""
        with self._lock:
            assert not self._entries and not self.committed and not self.claimed
            ordered = sorted(files, key=lambda pair: (pair[1], pair[0].version))
            best: dict[Slot, CacheFile] = {}
            for file, _ in ordered:
                slot = (file.key, file.block)
                if slot not in best or best[slot].version < file.version:
                    best[slot] = file
            extra = [file for file, _ in ordered if best[(file.key, file.block)] is not file]
            kept = [file for file, _ in ordered if best[(file.key, file.block)] is file]
            total = sum(file.size for file in kept)
            while kept and total > self.capacity_bytes:
                oldest = kept.pop(0)
                extra.append(oldest)
                total -= oldest.size
            for file in kept:  # oldest first: past the share, the oldest protected go back
                entry = _Entry(file, now_s, protected=os.path.basename(file.path) in protected)
                self._insert((file.key, file.block), entry)
            self._check()
            return extra

    def close(self) -> None:
        """Refuse every later claim and commit."""
        with self._lock:
            self._closed = True

    # -- inside (lock held) ------------------------------------------------------------------

    def _insert(self, slot: Slot, entry: _Entry) -> None:
        """Put ``entry`` in the index as its segment's most recently used."""
        assert slot not in self._entries, slot
        self._entries[slot] = entry
        self._blocks.setdefault(slot[0], set()).add(slot[1])
        self.committed += entry.file.size
        if entry.protected:
            self._protected[slot] = entry
            self.protected_bytes += entry.file.size
            self._demote_over_share()
        else:
            self._probation[slot] = entry

    def _use(self, slot: Slot, entry: _Entry, start: int, end: int) -> None:
        """A hit of ``[start, end)`` of ``entry``'s file: the most recently used of its
        segment, promoted to protected if hits served some of those bytes before."""
        if entry.protected:
            self._protected.move_to_end(slot)
        elif start < entry.served_end and entry.served_start < end:
            del self._probation[slot]
            entry.protected = True
            self._protected[slot] = entry
            self.protected_bytes += entry.file.size
            self._demote_over_share()
        else:
            self._probation.move_to_end(slot)
            if entry.served_start >= entry.served_end:
                entry.served_start, entry.served_end = start, end
            else:
                entry.served_start = min(entry.served_start, start)
                entry.served_end = max(entry.served_end, end)

    def _demote_over_share(self) -> None:
        """Protected files past ``protected_bytes_max`` go back to probation, least
        recently used first, as its most recently used (to be re-used again to return)."""
        while self.protected_bytes > self.protected_bytes_max:
            slot, entry = self._protected.popitem(last=False)
            self.protected_bytes -= entry.file.size
            entry.protected = False
            entry.served_start = entry.served_end = 0
            self._probation[slot] = entry

    def _remove(self, slot: Slot) -> CacheFile:
        entry = self._entries.pop(slot)
        if entry.protected:
            del self._protected[slot]
            self.protected_bytes -= entry.file.size
        else:
            del self._probation[slot]
        blocks = self._blocks[slot[0]]
        blocks.discard(slot[1])
        if not blocks:
            del self._blocks[slot[0]]
        self.committed -= entry.file.size
        return entry.file

    def _check(self) -> None:
        assert self.committed >= 0 and self.claimed >= 0, (self.committed, self.claimed)
        assert 0 <= self.protected_bytes <= self.protected_bytes_max, self.protected_bytes
        assert len(self._entries) == len(self._probation) + len(self._protected)
        assert self.committed + self.claimed <= self.capacity_bytes, (
            self.committed,
            self.claimed,
            self.capacity_bytes,
        )
