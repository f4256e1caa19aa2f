"""``ChunkCache``: chunk bytes on local disk, up to a size limit, least recently used out
first, shared by every reader of the process (docs/chunk_cache.md).

A chunk is cached in *blocks* of ``block_bytes`` (block ``b`` of a chunk is its bytes
``[b * block_bytes, (b + 1) * block_bytes)``); a block's file holds one contiguous run of
them (``files.CacheFile``). The cache is filled only from bytes readers fetched anyway:
a read that misses gets its bytes from the chunk storage as before, and hands them to
``offer``; background threads (``filler.Filler``) write each block's run, merged with the
run the block held if the two touch. A read is served from the cache only when files
hold every byte it asks for.

Invariants (the index's and the files' modules list theirs; asserted there):

1. **Never stale.** Bytes of a chunk below a length it once had never change while it
   exists (the binding contract; chunk names are never reused), and every change that
   could break that (``delete``, ``write``, ``truncate``, ``create``, a concat target,
   a chunk found missing) goes through ``invalidate``, which drops the chunk's files and
   refuses the fills of reads begun before it.
2. **Never wrong.** Every byte served passed a CRC32C computed from the bytes as they
   were received (``files.read_checked``); a file that fails is dropped and the read
   goes to the chunk storage. A read whose caller checks the bytes against checksums of
   its own (``read_into(..., checked=False)``: the engine's block checksums) is served
   without the cache's check, one CRC32C pass instead of two; a caller whose check fails
   calls ``distrust``, which drops the files, and reads again from the chunk storage.
3. **Bounded.** The cache's files never hold more than ``capacity_bytes`` on disk
   (``index.CacheIndex``, invariant 1), the fills in flight never more than
   ``fill_bytes_max`` (``filler.Filler``). The descriptors kept open between hits
   (``open_files.OpenFiles``) are closed when their files are removed, or when the read
   holding one ends, so a removed file's space is given back then.
4. **Errors stay inside.** A disk error while filling is counted (``fill_errors``) and
   logged; the read it came from has its bytes already. A read of the cache that fails
   becomes a miss.
5. **One process per folder** (an exclusive ``flock`` on ``lock``): two processes never
   evict each other's files or count each other's bytes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from slts.errors import InvalidConfig

from .. import checked_reads
from . import files
from .files import CacheFile, CacheFileDamaged
from .filler import Filler
from .index import CacheIndex, Token
from .open_files import OpenFiles

_log = logging.getLogger(__name__)

LOCK_FILE = "lock"
#: Descriptors of the files read last kept open between hits (``open_files``): 64 files
#: of the default 8 MiB blocks are a 512 MiB working set, and far below any file limit.
OPEN_FILES_KEPT = 64


@dataclass(frozen=True, slots=True)
class ChunkCacheStatistics:
    """Counters since the cache opened, and what it holds now (a frozen snapshot)."""

    hits: int  # reads served whole from the cache
    hit_bytes: int
    misses: int  # reads that went to the chunk storage
    miss_bytes: int
    fills: int  # files written
    fill_bytes: int  # chunk bytes in them
    fills_dropped: int  # block runs not cached: fills in flight full, or no room free of claims
    fill_errors: int  # fills that failed (disk errors): nothing cached, nothing raised
    stale_fills: int  # fills refused: their chunk changed after their read began
    evictions: int  # files removed to make room (probation's least recently used first)
    evicted_bytes: int
    invalidations: int  # files dropped because their chunk was deleted or changed
    corruptions: int  # files dropped because bytes failed their CRC32C (or the caller's check)
    caller_checked_hits: int  # hits served unchecked: the caller checks them (its own checksums)
    files: int  # files held now
    bytes: int  # their size on disk now (data and trailers)
    capacity_bytes: int
    protected_bytes: int = 0  # of ``bytes``, the files' used again since their fill (``index``, invariant 4)


_COUNTERS = (
    "hits",
    "hit_bytes",
    "misses",
    "miss_bytes",
    "fills",
    "fill_bytes",
    "fills_dropped",
    "fill_errors",
    "stale_fills",
    "evictions",
    "evicted_bytes",
    "invalidations",
    "corruptions",
    "caller_checked_hits",
)


class ChunkCache:
    """A chunk cache in folder ``root`` (see the module doc). Thread-safe.

    ``capacity_bytes``: most bytes of files on disk; ``block_bytes``: the block size
    (a run larger than a block is cut at block bounds); ``fill_threads`` and
    ``fill_bytes_max`` bound the background fills; ``direct_fills``: fills are written
    with ``O_DIRECT`` where the folder's file system takes it (``files._write_direct``).
    Opening rebuilds the index from the
    folder (temporary and damaged files removed, least recently used order from the files'
    modification times) and removes the oldest files while they exceed ``capacity_bytes``.

    Raises ``InvalidConfig`` if ``root`` cannot be made or used as a folder, or if another
    process has the cache open.
    """

    def __init__(
        self,
        root: str,
        capacity_bytes: int,
        block_bytes: int,
        *,
        fill_threads: int = 2,
        fill_bytes_max: int = 64 << 20,
        direct_fills: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert block_bytes > 0 and capacity_bytes >= block_bytes + files.trailer_bytes(block_bytes), (
            capacity_bytes,
            block_bytes,
        )
        self.root = os.path.abspath(root)
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self._clock = clock
        self._lock_fd = _lock_folder(self.root)
        try:
            files.prepare(self.root)
            self.index = CacheIndex(capacity_bytes)
            found = [(file, _mtime(file.path)) for file in files.scan(self.root)]
            misplaced = [file for file, _ in found if not self._fits(file)]
            for file in misplaced:  # cut with another block size
                _unlink(file.path)
            now = clock()
            protected = files.take_protected(self.root)
            for file in self.index.load([pair for pair in found if self._fits(pair[0])], now, protected):
                _unlink(file.path)
        except OSError as exc:
            os.close(self._lock_fd)
            raise InvalidConfig(f"chunk cache folder {self.root!r} cannot be used: {exc}") from exc
        except BaseException:
            os.close(self._lock_fd)
            raise
        try:
            #: Fills written with ``O_DIRECT`` (``files._write_direct``): asked for
            #: (``direct_fills``) and taken by the folder's file system.
            self.direct_writes = direct_fills and files.direct_writes_work(self.root)
        except OSError as exc:
            os.close(self._lock_fd)
            raise InvalidConfig(f"chunk cache folder {self.root!r} cannot be used: {exc}") from exc
        self._versions = itertools.count(max((file.version for file, _ in found), default=0) + 1)
        self._filler = Filler(fill_threads, fill_bytes_max)
        self._open_files = OpenFiles(
            OPEN_FILES_KEPT, lambda file: self.index.current(file.key, file.block) is file
        )
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._counts_lock = threading.Lock()
        self._closed = False
        _log.info(
            "chunk cache %s opened: %d files, %d of %d bytes",
            self.root,
            len(self.index),
            self.index.committed,
            capacity_bytes,
        )

    # -- keys ----------------------------------------------------------------------------------

    @staticmethod
    def key_of(url: str, name: str) -> bytes:
        """The cache key of chunk ``name`` of the binding at ``url``: two stores sharing a
        cache folder never share a key."""
        digest = hashlib.blake2b(digest_size=files.KEY_BYTES)
        digest.update(url.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
        digest.update(name.encode("utf-8", "surrogatepass"))
        return digest.digest()

    # -- reads ---------------------------------------------------------------------------------

    def read(self, key: bytes, offset: int, length: int) -> bytes | None:
        """Chunk bytes ``[offset, offset + length)`` if the cache holds all of them, every
        one verified (invariant 2); else None (counted as a miss: the caller reads the
        chunk storage, and may ``offer`` what it got)."""
        assert offset >= 0 and length > 0, (offset, length)
        # More than the cache can hold is never held whole (and may be a read clipped at
        # the chunk's end, asking for far more than the chunk has).
        found = None
        if length <= self.capacity_bytes:
            found = self.index.lookup(key, self._ranges(offset, length), self._clock())
        if found is not None:
            held, touch = found
            pieces: list[bytes] = []
            for file, start, end in held:
                try:
                    pieces.append(files.read_checked(file, start, end - start))
                except CacheFileDamaged as exc:
                    self._damaged(file, exc)
                    break
                except FileNotFoundError:  # evicted or dropped between the lookup and the read
                    break
            if len(pieces) == len(held):
                for path in touch:  # the restart's LRU order (index.TOUCH_INTERVAL_S)
                    with contextlib.suppress(OSError):
                        os.utime(path)
                self._count(hits=1, hit_bytes=length)
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self._count(misses=1, miss_bytes=length)
        return None

    def read_into(self, key: bytes, offset: int, view: memoryview, *, checked: bool = True) -> bool:
        """``read``'s bytes written into ``view`` (``len(view)`` of them, at ``offset``):
        True if the cache held and verified all of them; False (counted as a miss, and
        ``view`` holds nothing the caller may use) otherwise.

        ``checked=False``: the bytes are read straight into ``view`` without the cache's
        CRC32C (``files.read_unchecked_into``), for a caller that checks every one of
        them against checksums of its own before using any, and calls ``distrust`` on
        the range when they fail (invariant 2 rests on that check for these bytes)."""
        serve = files.read_checked_into if checked else files.read_unchecked_into
        return self._serve_into(
            key, offset, view, lambda held: self._serve_files(held, offset, view, serve), not checked
        )

    def read_into_blocks(
        self, key: bytes, offset: int, view: memoryview, blocks: bytes, *, count_miss: bool = True
    ) -> bool:
        """``read_into``'s bytes checked against the caller's block list instead of the
        cache's own CRC32Cs (``blocks``: ``ChunkStorage.read_into_checked``'s), in the
        same pass as the copy where one file holds the range (``checked_reads``): True
        if the cache held them all and every block passed; False (a miss) otherwise. A
        block that fails drops the files holding the range (counted as a corruption):
        the caller then reads the chunk storage (invariant 2). ``count_miss=False``: a
        False is not counted as a miss (the caller's next read, which is, asks again)."""
        length = len(view)
        assert offset >= 0 and length > 0, (offset, length)
        block = offset // self.block_bytes
        if (offset + length - 1) // self.block_bytes != block or length > self.capacity_bytes:
            return self._serve_into(
                key,
                offset,
                view,
                lambda held: self._serve_blocks(key, held, offset, view, blocks),
                True,
                count_miss,
            )
        # One block (a read's common case): one file, read and checked in one compiled pass.
        found = self.index.lookup_one(key, block, offset, offset + length, self._clock())
        if found is not None and self._serve_file(key, found[0], offset, view, blocks):
            self._served([found[0].path] if found[1] else [], length, True)
            return True
        if count_miss:
            self._count(misses=1, miss_bytes=length)
        return False

    def _serve_blocks(
        self, key: bytes, held: list[tuple[CacheFile, int, int]], offset: int, view: memoryview, blocks: bytes
    ) -> bool:
        """``read_into_blocks``' serve of the files ``held`` (the range's, in order): False
        if one is gone or damaged, or a block fails (its files dropped)."""
        if len(held) == 1:
            return self._serve_file(key, held[0][0], offset, view, blocks)
        if not self._serve_files(held, offset, view, files.read_unchecked_into):
            return False
        return self._passed(key, offset, blocks, checked_reads.first_bad(view, blocks))

    def _serve_file(self, key: bytes, file: CacheFile, offset: int, view: memoryview, blocks: bytes) -> bool:
        """``_serve_blocks`` of one file: read and checked in one compiled pass."""
        try:
            fd = self._open_files.borrow(file)
        except FileNotFoundError:  # evicted or dropped after the lookup
            return False
        try:
            count, bad = checked_reads.read_checked(fd, view, offset - file.start, blocks)
        finally:
            self._open_files.give_back(file, fd)
        if count != len(view):
            self._damaged(file, CacheFileDamaged(f"cache file {file.path} is shorter than its trailer says"))
            return False
        return self._passed(key, offset, blocks, bad)

    def _passed(self, key: bytes, offset: int, blocks: bytes, bad: int) -> bool:
        """Whether no block failed (``bad`` < 0); else the files holding the first bad one
        (one, or the two it straddles) are dropped: False."""
        if bad < 0:
            return True
        self.distrust(
            key, offset + checked_reads.block_offset(blocks, bad), checked_reads.block_length(blocks, bad)
        )
        return False

    def _serve_into(
        self,
        key: bytes,
        offset: int,
        view: memoryview,
        serve: Callable[[list[tuple[CacheFile, int, int]]], bool],
        caller_checked: bool,
        count_miss: bool = True,
    ) -> bool:
        """Look up ``[offset, offset + len(view))``; if files hold it all, ``serve`` them
        into ``view`` (False: not served). Counts the hit or (``count_miss``) the miss."""
        length = len(view)
        assert offset >= 0 and length > 0, (offset, length)
        found = None
        if length <= self.capacity_bytes:
            found = self.index.lookup(key, self._ranges(offset, length), self._clock())
        if found is not None:
            held, touch = found
            if serve(held):
                self._served(touch, length, caller_checked)
                return True
        if count_miss:
            self._count(misses=1, miss_bytes=length)
        return False

    def _served(self, touch: list[str], length: int, caller_checked: bool) -> None:
        """A hit of ``length`` bytes: the files in ``touch`` marked used (the restart's LRU
        order, ``index.TOUCH_INTERVAL_S``), the hit counted."""
        for path in touch:
            with contextlib.suppress(OSError):
                os.utime(path)
        with self._counts_lock:
            counts = self._counts
            counts["hits"] += 1
            counts["hit_bytes"] += length
            counts["caller_checked_hits"] += caller_checked

    def _serve_files(
        self,
        held: list[tuple[CacheFile, int, int]],
        offset: int,
        view: memoryview,
        serve: Callable[[CacheFile, int, memoryview], None],
    ) -> bool:
        """Each held file's part of ``view`` filled by ``serve``: False at the first file
        that is damaged (dropped) or gone."""
        for file, start, end in held:
            part = view[start - offset : end - offset]
            try:
                serve(file, start, part)
            except CacheFileDamaged as exc:
                self._damaged(file, exc)
                return False
            except FileNotFoundError:  # evicted or dropped between the lookup and the read
                return False
            finally:
                part.release()
        return True

    def holds(self, key: bytes, offset: int, length: int) -> bool:
        """Whether the cache holds every byte of ``[offset, offset + length)`` now (a hint:
        a later read may still miss, if the files are evicted meanwhile)."""
        if length <= 0 or length > self.capacity_bytes:
            return False
        return self.index.covers(key, self._ranges(offset, length))

    def distrust(self, key: bytes, offset: int, length: int) -> bool:
        """Bytes ``[offset, offset + length)`` of chunk ``key``, served unchecked
        (``read_into(..., checked=False)``), failed the caller's checksums: drop every
        file holding any of them (counted as ``corruptions``). True if one was dropped (a
        read again goes to the chunk storage), False if none is held now."""
        assert offset >= 0 and length > 0, (offset, length)
        dropped = False
        for block, _, _ in self._ranges(offset, length):
            file = self.index.current(key, block)
            if file is not None and file.start < offset + length and offset < file.end:
                self._damaged(file, CacheFileDamaged(f"cache file {file.path} fails its reader's checksums"))
                dropped = True
        return dropped

    def begin(self) -> Token:
        """Call before reading the chunk storage for bytes to ``offer`` (then ``offer``
        them, or ``end`` the token): invalidations from here on refuse them."""
        return self.index.begin()

    def end(self, token: Token) -> None:
        self.index.end(token)

    def offer(self, key: bytes, token: Token, offset: int, data: bytes | memoryview) -> None:
        """Cache ``data``, chunk ``key``'s bytes from ``offset``, read after ``begin`` gave
        ``token`` (which this ends): each block's run goes to a background fill, or is
        dropped if the fills in flight are full. Never raises for the cache's sake."""
        try:
            view = memoryview(data)
            for block, start, end in self._ranges(offset, len(view)):
                if end > self.capacity_bytes:
                    break  # a chunk larger than the cache: held whole it would flush all else
                current = self.index.current(key, block)
                if current is not None and current.start <= start and end <= current.end:
                    continue  # held already
                piece = view[start - offset : end - offset]
                self.index.retain(token)
                accepted = self._filler.submit(
                    end - start,
                    functools.partial(self._fill, key, block, start, piece, token),
                    functools.partial(self.index.end, token),
                )
                if not accepted:
                    self.index.end(token)
                    self._count(fills_dropped=1)
        finally:
            self.index.end(token)

    def invalidate(self, key: bytes) -> None:
        """Chunk ``key`` was deleted or changed (or found missing): drop its files and
        refuse the fills of reads begun before now (invariant 1)."""
        dropped = self.index.invalidate(key)
        if dropped:
            self._count(invalidations=len(dropped))
            self._remove(dropped)

    # -- life cycle ----------------------------------------------------------------------------

    def statistics(self) -> ChunkCacheStatistics:
        with self._counts_lock:
            counts = dict(self._counts)
        return ChunkCacheStatistics(
            **counts,
            files=len(self.index),
            bytes=self.index.committed,
            capacity_bytes=self.capacity_bytes,
            protected_bytes=self.index.protected_bytes,
        )

    def drain(self) -> None:
        """Wait until every fill offered so far has ended: its file written (or dropped).
        For tests and benchmarks, which then know what the cache holds."""
        self._filler.drain()

    def close(self) -> None:
        """Finish the running fills, drop the queued ones, release the folder. Files stay
        for the next open. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._filler.close()
        self.index.close()
        self._open_files.close()
        try:  # the next open protects them again (index, invariant 4)
            files.save_protected(self.root, [os.path.basename(file.path) for file in self.index.protected()])
        except OSError as exc:
            _log.warning("chunk cache %s: the protected files' list not saved: %s", self.root, exc)
        os.close(self._lock_fd)

    # -- inside --------------------------------------------------------------------------------

    def _ranges(self, offset: int, length: int) -> Iterator[tuple[int, int, int]]:
        """(block, start, end) of each block ``[offset, offset + length)`` touches."""
        end = offset + length
        block = offset // self.block_bytes
        while block * self.block_bytes < end:
            low = block * self.block_bytes
            yield block, max(offset, low), min(end, low + self.block_bytes)
            block += 1

    def _fits(self, file: CacheFile) -> bool:
        low = file.block * self.block_bytes
        return low <= file.start and file.end <= low + self.block_bytes

    def _fill(self, key: bytes, block: int, start: int, data: memoryview, token: Token) -> None:
        """A fill thread: cache ``data`` (bytes ``[start, ...)`` of block ``block``),
        merged with the run the block holds if they touch (the longer run wins if not)."""
        end = start + len(data)
        existing = self.index.current(key, block)
        parts: list[bytes | memoryview] = [data]
        low = start
        if existing is not None:
            if existing.start <= start and end <= existing.end:
                return
            if existing.start <= end and start <= existing.end:  # they touch: one run
                try:
                    if existing.start < start:
                        parts.insert(0, files.read_checked(existing, existing.start, start - existing.start))
                        low = existing.start
                    if existing.end > end:
                        parts.append(files.read_checked(existing, end, existing.end - end))
                except CacheFileDamaged as exc:
                    self._damaged(existing, exc)
                    parts, low, existing = [data], start, None
                except FileNotFoundError:
                    parts, low, existing = [data], start, None
            elif existing.length >= len(data):
                return
        length = sum(len(part) for part in parts)
        size = length + files.trailer_bytes(length)
        claim = self.index.claim(size)
        if claim is None:
            self._count(fills_dropped=1)
            return
        if claim.victims:
            self._count(evictions=len(claim.victims), evicted_bytes=sum(v.size for v in claim.victims))
            for victim in claim.victims:  # counted in the claim: no unclaim
                self._open_files.forget(victim.path)
                _unlink(victim.path)
        try:
            file = files.write(
                self.root, key, block, low, parts, next(self._versions), direct=self.direct_writes
            )
        except OSError as exc:
            self.index.abandon(claim)
            self._count(fill_errors=1)
            _log.warning("chunk cache %s: a fill failed, nothing cached: %s", self.root, exc)
            return
        assert file.size == size, (file.size, size)
        accepted, stale = self.index.commit(file, token, claim, existing, self._clock())
        if accepted:
            self._count(fills=1, fill_bytes=length)
        else:
            self._count(stale_fills=1)
        self._remove(stale)

    def _damaged(self, file: CacheFile, error: CacheFileDamaged) -> None:
        """Drop a file whose bytes failed their checks (invariant 2)."""
        _log.warning("chunk cache %s: %s; file dropped, read from the chunk storage", self.root, error)
        if self.index.drop(file):
            self._count(corruptions=1)
            self._remove([file])

    def _remove(self, dropped: list[CacheFile]) -> None:
        """Remove files the index handed out, then give back their bytes. A file that
        cannot be removed (a disk error) is counted as gone all the same: it is no longer
        in the index, so it is never served, and the next open removes or reuses it."""
        for file in dropped:
            self._open_files.forget(file.path)
            _unlink(file.path)
        if dropped:
            self.index.unclaim(sum(file.size for file in dropped))

    def _count(self, **increments: int) -> None:
        with self._counts_lock:
            for name, value in increments.items():
                self._counts[name] += value


def _lock_folder(root: str) -> int:
    """An exclusive ``flock`` on ``root/lock`` (invariant 5): its descriptor, or
    ``InvalidConfig`` naming the holder's pid."""
    try:
        os.makedirs(root, exist_ok=True)
        fd = os.open(os.path.join(root, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise InvalidConfig(f"chunk cache folder {root!r} cannot be used: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise InvalidConfig(
                f"chunk cache folder {root!r} is in use by another process (pid {holder}); "
                "give each process its own chunk_cache_dir"
            ) from exc
        raise InvalidConfig(f"chunk cache folder {root!r} cannot be locked: {exc}") from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        try:
            os.unlink(path)
        except OSError as exc:
            _log.warning("chunk cache: could not remove %s: %s", path, exc)
