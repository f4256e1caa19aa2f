"""The chunk cache's index (``slts.bindings.chunk_cache.index``), invariants 1-4, with a
model of the files on disk: a random program of claims, commits, drops, invalidations,
lookups and restarts never lets the counted bytes (and so the files) pass the limit, nor
the protected files their share."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from slts.bindings.chunk_cache.files import CacheFile
from slts.bindings.chunk_cache.index import CacheIndex, Token

KEYS = [bytes([k]) * 16 for k in range(3)]
CAPACITY = 1000


def make(key: bytes, block: int, start: int, end: int, version: int) -> CacheFile:
    return CacheFile(key, block, start, end, version, b"", f"{key.hex()}-{block}-{version}", end - start + 20)


class Disk:
    """The files a correct caller would have on disk, driven through the index."""

    def __init__(self, index: CacheIndex) -> None:
        self.index = index
        self.on_disk: dict[str, int] = {}
        self.version = 0

    def fill(self, key: bytes, block: int, length: int, token: Token, invalidate_first: bool) -> bool:
        self.version += 1
        replaced = self.index.current(key, block)
        file = make(key, block, block * 100, block * 100 + length, self.version)
        claim = self.index.claim(file.size)
        if claim is None:
            return False
        for victim in claim.victims:
            del self.on_disk[victim.path]
        self.check()
        self.on_disk[file.path] = file.size
        self.check()
        if invalidate_first:
            self.remove(self.index.invalidate(key))
        accepted, stale = self.index.commit(file, token, claim, replaced, 0.0)
        self.check()
        self.remove(stale)
        return accepted

    def remove(self, dropped: list[CacheFile]) -> None:
        for file in dropped:
            del self.on_disk[file.path]
        self.index.unclaim(sum(file.size for file in dropped))
        self.check()

    def check(self) -> None:
        """Invariant 1: what is on disk is counted, and the count is within the limit."""
        assert sum(self.on_disk.values()) <= self.index.committed + self.index.claimed <= CAPACITY
        held = {file.path for file in self.index.files()}
        assert held <= set(self.on_disk)
        assert self.index.committed == sum(self.on_disk[path] for path in held)


operation = st.one_of(
    st.tuples(st.just("fill"), st.integers(0, 2), st.integers(0, 9), st.integers(1, 400), st.booleans()),
    st.tuples(st.just("invalidate"), st.integers(0, 2)),
    st.tuples(st.just("drop"), st.integers(0, 2), st.integers(0, 9)),
    st.tuples(st.just("lookup"), st.integers(0, 2), st.integers(0, 9), st.integers(0, 3)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=60))
def test_counted_bytes_never_pass_the_limit_and_stale_fills_are_refused(program) -> None:
    index = CacheIndex(CAPACITY)
    disk = Disk(index)
    for step in program:
        kind, key = step[0], KEYS[step[1]]
        if kind == "fill":
            _, _, block, length, invalidate_first = step
            token = index.begin()
            accepted = disk.fill(key, block, length, token, invalidate_first)
            index.end(token)
            if invalidate_first:
                assert not accepted  # invariant 2
            if accepted:
                assert index.current(key, block) is not None  # invariant 3: it is the one
        elif kind == "invalidate":
            disk.remove(index.invalidate(key))
            assert all(file.key != key for file in index.files())
        elif kind == "drop":
            file = index.current(key, step[2])
            if file is not None:
                assert index.drop(file)
                disk.remove([file])
        else:
            _, _, block, at = step  # one of a few places: a hit asks again, or another place
            file = index.current(key, block)
            start = block * 100 + at
            found = index.lookup(key, [(block, start, start + 1)], 100.0)
            assert (found is None) == (file is None or file.end < start + 1)
            if found is not None:  # now the most recently used of its segment (invariant 4)
                protected = index.protected()
                probation = [held for held in index.files() if held not in protected]
                assert (protected if file in protected else probation)[-1] is file
    assert index.protected_bytes <= index.protected_bytes_max
    assert index.protected_bytes == sum(file.size for file in index.protected())
    slots = [(file.key, file.block) for file in index.files()]
    assert len(slots) == len(set(slots))  # invariant 3


def test_eviction_takes_the_least_recently_used_first() -> None:
    index = CacheIndex(300)
    token = index.begin()
    made = []
    for block in range(3):
        file = make(KEYS[0], block, block * 100, block * 100 + 80, block)
        claim = index.claim(file.size)
        assert claim is not None and not claim.victims
        assert index.commit(file, token, claim, None, 0.0)[0]
        made.append(file)
    assert index.lookup(KEYS[0], [(0, 0, 10)], 0.0) is not None  # block 0 is now the most recent
    claim = index.claim(100)
    assert claim is not None and claim.victims == [made[1]]


def test_a_restart_keeps_the_newest_version_and_the_most_recent_files_within_capacity() -> None:
    index = CacheIndex(250)
    old = make(KEYS[0], 0, 0, 80, 1)
    newer = make(KEYS[0], 0, 0, 60, 2)  # a crash between a merge's rename and the old file's removal
    a = make(KEYS[1], 0, 0, 80, 3)
    b = make(KEYS[2], 0, 0, 80, 4)
    removed = index.load([(old, 5.0), (a, 1.0), (newer, 6.0), (b, 7.0)], 0.0)
    assert set(removed) == {old, a}  # the duplicate, then the least recently used over capacity
    assert index.files() == [newer, b]
    assert index.committed == newer.size + b.size and index.claimed == 0


def test_a_claim_fails_rather_than_pass_the_limit_when_other_fills_hold_the_room() -> None:
    index = CacheIndex(100)
    first = index.claim(90)
    assert first is not None
    assert index.claim(50) is None
    index.abandon(first)
    assert index.claim(50) is not None


def fill(index: CacheIndex, key: bytes, block: int, length: int = 80) -> CacheFile:
    """One file committed for (``key``, ``block``) holding ``[block*100, block*100+length)``."""
    token = index.begin()
    file = make(key, block, block * 100, block * 100 + length, index.committed + block + 1000 * len(index))
    claim = index.claim(file.size)
    assert claim is not None  # its victims are covered by the claim until the commit
    accepted, stale = index.commit(file, token, claim, index.current(key, block), 0.0)
    assert accepted
    index.unclaim(sum(old.size for old in stale))  # a merge's replaced file, removed
    index.end(token)
    return file


def test_a_scan_evicts_only_what_was_not_used_again() -> None:
    """Invariant 4: a working set read twice is protected; a one-pass scan far larger
    than the cache (each block read in three pieces, in order, as a sequential reader
    does) then evicts only its own files."""
    index = CacheIndex(1000)  # ten 100-byte files
    working = [fill(index, KEYS[0], block) for block in range(4)]
    for _ in range(2):
        for file in working:
            assert index.lookup_one(file.key, file.block, file.start, file.start + 30, 0.0) is not None
    assert index.protected() == working
    for block in range(40):
        scanned = fill(index, KEYS[1], block)
        for piece in range(3):
            start = scanned.start + 20 * piece
            assert index.lookup_one(scanned.key, scanned.block, start, start + 20, 0.0) is not None
    assert index.protected() == working
    assert all(index.current(file.key, file.block) is file for file in working)
    assert len(index) == 10 and index.committed == 1000


def test_while_everything_fits_nothing_is_evicted_and_the_protected_keep_their_share() -> None:
    index = CacheIndex(1000)
    made = [fill(index, KEYS[0], block) for block in range(10)]
    for _ in range(2):
        for file in made:  # every file used again: more than the protected share
            index.lookup_one(file.key, file.block, file.start, file.end, 0.0)
    assert len(index) == 10  # nothing left the cache
    assert index.protected() == made[2:]  # the two least recently promoted went back to probation
    assert index.protected_bytes == 800 == index.protected_bytes_max
    assert index.files() == made  # probation first: made[0] and made[1] are evicted next
    victims = index.claim(100)
    assert victims is not None and victims.victims == [made[0]]


def test_a_merge_keeps_the_blocks_segment_and_a_restart_starts_all_in_probation() -> None:
    index = CacheIndex(1000)
    first = fill(index, KEYS[0], 0, 40)
    for _ in range(2):
        index.lookup_one(first.key, 0, 0, 10, 0.0)
    assert index.protected() == [first]
    merged = fill(index, KEYS[0], 0, 90)  # a longer run of the same block
    assert index.protected() == [merged] and index.protected_bytes == merged.size
    restarted = CacheIndex(1000)
    assert restarted.load([(merged, 1.0)], 0.0) == []
    assert restarted.protected() == [] and restarted.files() == [merged]


def test_while_other_fills_hold_claims_a_fill_never_takes_a_protected_file_s_room() -> None:
    """Invariant 4 with fills in flight: a claim that could only evict protected files is
    refused while another claim is held (the scan's fill is dropped, the working set
    stays); once none is held, a fill is admitted even at a protected file's expense."""
    index = CacheIndex(1000)
    working = [fill(index, KEYS[0], block) for block in range(8)]
    for _ in range(2):
        for file in working:
            index.lookup_one(file.key, file.block, file.start, file.start + 10, 0.0)
    assert index.protected() == working and index.protected_bytes == 800
    in_flight = index.claim(200)  # probation's whole room: nothing is evicted for it
    assert in_flight is not None and not in_flight.victims
    assert index.claim(100) is None  # it would take a protected file's room
    assert index.protected() == working
    index.abandon(in_flight)
    alone = index.claim(300)
    assert alone is not None and alone.victims == [working[0]]  # 200 bytes free, 100 more


def test_a_restart_protects_again_what_the_last_close_left_protected_within_the_share() -> None:
    """``load`` with the last close's protected names: those files are protected again,
    the oldest going back to probation past the share; the others are in probation."""
    index = CacheIndex(1000)
    made = [make(KEYS[0], block, block * 100, block * 100 + 80, block) for block in range(10)]
    named = {os.path.basename(file.path) for file in made[1:10]}  # nine files: 900 bytes
    assert index.load([(file, float(age)) for age, file in enumerate(made)], 0.0, named) == []
    assert index.protected() == made[2:10] and index.protected_bytes == 800
    assert index.files() == [made[0], made[1], *made[2:10]]  # made[1] demoted, after made[0]
