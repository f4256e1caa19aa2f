"""The chunk cache's files on disk: one file per cached run of a chunk block, checked.

A *cache file* holds bytes ``[start, end)`` of one chunk, all inside one block of that
chunk (block ``block`` covers chunk offsets ``[block * block_bytes, (block + 1) *
block_bytes)``), followed by a trailer::

    data (end - start bytes)
    CRC32C of each check block of the data (4 bytes each, little-endian): the data cut
        every ``CHECK_BYTES`` from its first byte, the last one possibly shorter
    footer (``_FOOTER``): magic, format version, CHECK_BYTES, block, start, end,
        the key (``KEY_BYTES``), the file's version
    CRC32C of the check-block CRCs and the footer (4 bytes)

Invariants (asserted; ``tests/chunk_cache/test_files.py`` cites them):

1. **Whole or absent.** A file is written under a temporary name in ``tmp/`` and renamed
   into ``blocks/`` once complete, so ``blocks/`` never holds a file being written; a
   process killed mid-write leaves only a temporary file, which ``scan`` removes.
2. **Checked on every serve.** ``read_checked`` verifies the CRC32C of every check block
   it returns bytes of, against the CRCs taken from the bytes as they were received
   (kept in memory by the index, read from the trailer after a restart); a mismatch
   raises ``CacheFileDamaged`` and the caller drops the file. The one exception,
   ``read_unchecked_into``, serves a caller that checks the bytes itself (the engine's
   block checksums) and has the file dropped when they fail. No fsync: a file torn or
   zeroed by a power loss fails its trailer (``scan`` removes it) or its CRCs (dropped
   when read); the checksums, not the order of writes, are what make a served byte right.
3. **Self-describing.** The trailer names the key, block and range; ``scan`` rebuilds the
   index from the trailers alone and drops any file whose trailer, name or size
   disagree.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import crc32c

#: Check-block size: a serve reads and verifies whole check blocks around what it returns.
CHECK_BYTES = 64 << 10
#: Bytes of a cache key (a digest of the binding's URL and the chunk's name).
KEY_BYTES = 16
MAGIC = b"SLTSCCH1"
FORMAT_VERSION = 1
#: magic, format version, check bytes, block, start, end, key, file version.
_FOOTER = struct.Struct(f"<8sHIQQQ{KEY_BYTES}sQ")
_CRC = struct.Struct("<I")
BLOCKS_FOLDER = "blocks"
TMP_FOLDER = "tmp"
#: The protected files' names at the last close (``save_protected``): a hint for the next open.
PROTECTED_FILE = "protected"
#: Most entries ``scan`` looks at (a bound on its loop; far above any real cache).
SCAN_FILES_MAX = 100_000_000


class CacheFileDamaged(Exception):
    """A cache file's bytes are not the ones written (or it is gone): drop it. Never
    leaves the cache: a read then goes to the chunk storage."""


@dataclass(frozen=True, slots=True)
class CacheFile:
    """What the index knows of one cache file (``scan`` reads it back from the trailer)."""

    key: bytes
    block: int
    start: int  # chunk offset of the first data byte
    end: int  # chunk offset after the last data byte
    version: int  # unique among the cache's files, increasing
    crcs: bytes  # the check blocks' CRC32C, packed little-endian
    path: str
    size: int  # the file's length: data and trailer

    @property
    def length(self) -> int:
        return self.end - self.start


def trailer_bytes(length: int) -> int:
    """The trailer's size for ``length`` data bytes."""
    return 4 * check_blocks(length) + _FOOTER.size + _CRC.size


def check_blocks(length: int) -> int:
    return -(-length // CHECK_BYTES)


def file_name(key: bytes, block: int, version: int) -> str:
    """``<key hex>-<block>-<version>``: what ``scan`` parses back."""
    return f"{key.hex()}-{block}-{version}"


def block_path(root: str, key: bytes, block: int, version: int) -> str:
    """Where the file of (``key``, ``block``) at ``version`` lives: 256 sub-folders."""
    hexed = key.hex()
    return os.path.join(root, BLOCKS_FOLDER, hexed[:2], file_name(key, block, version))


def prepare(root: str) -> None:
    """Make the folders a cache needs in ``root`` (``OSError`` if it cannot)."""
    os.makedirs(os.path.join(root, TMP_FOLDER), exist_ok=True)
    for index in range(256):
        os.makedirs(os.path.join(root, BLOCKS_FOLDER, f"{index:02x}"), exist_ok=True)


def save_protected(root: str, names: Sequence[str]) -> None:
    """Write the names of the protected files (``index``, invariant 4), one a line, for
    the next open: written under ``tmp/`` and renamed, not synced (a hint: a crash that
    loses it only starts every file in probation). ``OSError`` if it cannot."""
    tmp = os.path.join(root, TMP_FOLDER, PROTECTED_FILE)
    with open(tmp, "w", encoding="ascii") as out:
        out.writelines(f"{name}\n" for name in names)
    os.replace(tmp, os.path.join(root, PROTECTED_FILE))


def take_protected(root: str) -> set[str]:
    """The names ``save_protected`` wrote, and the file removed (used once: after a crash
    the next open finds none). Empty if there is none or it cannot be read."""
    path = os.path.join(root, PROTECTED_FILE)
    try:
        with open(path, encoding="ascii") as lines:
            names = {line.strip() for line in lines if line.strip()}
    except (OSError, UnicodeDecodeError):
        names = set()
    with contextlib.suppress(OSError):
        os.unlink(path)
    return names


def write(
    root: str,
    key: bytes,
    block: int,
    start: int,
    parts: Sequence[bytes | memoryview],
    version: int,
    *,
    direct: bool = False,
) -> CacheFile:
    """Write ``parts`` (the bytes ``[start, start + total)`` of the chunk) as a cache file
    (temporary name, then renamed, invariant 1); return it. ``OSError`` on a disk error
    (the temporary file is removed). ``direct``: written with ``O_DIRECT``
    (``_write_direct``), for a folder where ``direct_writes_work``."""
    length = sum(len(part) for part in parts)
    assert length > 0 and start >= 0 and block >= 0, (length, start, block)
    crcs = _checksums(parts)
    footer = _FOOTER.pack(MAGIC, FORMAT_VERSION, CHECK_BYTES, block, start, start + length, key, version)
    sealed = _CRC.pack(crc32c.crc32c(footer, crc32c.crc32c(crcs)))
    temporary = os.path.join(root, TMP_FOLDER, f"{version}.tmp")
    final = block_path(root, key, block, version)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (_O_DIRECT if direct else 0)
    fd = os.open(temporary, flags, 0o600)
    try:
        try:
            if direct:
                _write_direct(fd, [*parts, crcs, footer, sealed])
            else:
                _write_all(fd, [*parts, crcs, footer, sealed])
        finally:
            os.close(fd)
        os.rename(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    size = length + len(crcs) + len(footer) + len(sealed)
    assert size == length + trailer_bytes(length), size
    return CacheFile(key, block, start, start + length, version, crcs, final, size)


def read_checked(entry: CacheFile, offset: int, length: int) -> bytes:
    """Chunk bytes ``[offset, offset + length)``, inside ``[entry.start, entry.end)``,
    read from the entry's file with every check block they touch verified (invariant 2).
    ``CacheFileDamaged`` if a CRC fails or the file is short; ``FileNotFoundError`` if
    the file is gone (evicted meanwhile: not damage)."""
    assert entry.start <= offset and offset + length <= entry.end and length > 0, (entry, offset, length)
    first = (offset - entry.start) // CHECK_BYTES
    stop = check_blocks(offset + length - entry.start)
    low = first * CHECK_BYTES
    high = min(stop * CHECK_BYTES, entry.length)
    fd = os.open(entry.path, os.O_RDONLY)
    try:
        data = os.pread(fd, high - low, low)
    finally:
        os.close(fd)
    if len(data) != high - low:
        raise CacheFileDamaged(f"cache file {entry.path} is shorter than its trailer says")
    view = memoryview(data)
    expected = memoryview(entry.crcs).cast("I") if _LITTLE else None
    for index in range(first, stop):
        piece = view[(index - first) * CHECK_BYTES : (index - first + 1) * CHECK_BYTES]
        want = expected[index] if expected is not None else _CRC.unpack_from(entry.crcs, 4 * index)[0]
        if crc32c.crc32c(piece) != want:
            raise CacheFileDamaged(f"cache file {entry.path}: check block {index} fails its CRC32C")
    cut = offset - entry.start - low
    return data if cut == 0 and len(data) == length else data[cut : cut + length]


def read_checked_into(entry: CacheFile, offset: int, view: memoryview) -> None:
    """``read_checked``'s bytes ``[offset, offset + len(view))`` written into ``view``:
    the check blocks the range covers whole are read straight into it (one ``preadv``),
    the partial ones at its edges through ``read_checked``; every block verified before
    this returns. Same errors as ``read_checked``; on one, ``view`` holds unverified bytes
    (the caller discards them)."""
    length = len(view)
    assert entry.start <= offset and offset + length <= entry.end and length > 0, (entry, offset, length)
    relative = offset - entry.start
    first = check_blocks(relative)  # the first check block that starts inside the range
    end = relative + length
    last = end // CHECK_BYTES if end < entry.length else check_blocks(end)  # blocks ending inside
    low, high = first * CHECK_BYTES, min(last * CHECK_BYTES, entry.length)
    if first >= last:  # no whole check block inside: the copying read
        view[:] = read_checked(entry, offset, length)
        return
    if low > relative:
        view[: low - relative] = read_checked(entry, offset, low - relative)
    middle = view[low - relative : high - relative]
    try:
        fd = os.open(entry.path, os.O_RDONLY)
        try:
            got = os.preadv(fd, [middle], low)
        finally:
            os.close(fd)
        if got != len(middle):
            raise CacheFileDamaged(f"cache file {entry.path} is shorter than its trailer says")
        expected = memoryview(entry.crcs).cast("I") if _LITTLE else None
        for index in range(first, last):
            piece = middle[(index - first) * CHECK_BYTES : (index - first + 1) * CHECK_BYTES]
            want = expected[index] if expected is not None else _CRC.unpack_from(entry.crcs, 4 * index)[0]
            if crc32c.crc32c(piece) != want:
                raise CacheFileDamaged(f"cache file {entry.path}: check block {index} fails its CRC32C")
    finally:
        middle.release()
    if high < end:
        view[high - relative :] = read_checked(entry, entry.start + high, end - high)


def read_unchecked_into(entry: CacheFile, offset: int, view: memoryview) -> None:
    """Chunk bytes ``[offset, offset + len(view))``, inside ``[entry.start, entry.end)``,
    read straight into ``view`` (one ``preadv``) and *not* verified: only for a caller
    that checks them against checksums of its own (the engine's block checksums) and
    drops the file if they fail (invariant 2 then rests on that check). A short file
    raises ``CacheFileDamaged``; a gone one ``FileNotFoundError``."""
    length = len(view)
    assert entry.start <= offset and offset + length <= entry.end and length > 0, (entry, offset, length)
    fd = os.open(entry.path, os.O_RDONLY)
    try:
        got = os.preadv(fd, [view], offset - entry.start)
    finally:
        os.close(fd)
    if got != length:
        raise CacheFileDamaged(f"cache file {entry.path} is shorter than its trailer says")


def scan(root: str) -> Iterator[CacheFile]:
    """Every sound cache file under ``root`` (a restart): temporary files are removed, and
    so is every file whose name, size or trailer is wrong (invariant 3). Data bytes are
    not read here: ``read_checked`` verifies them when they are served."""
    tmp = os.path.join(root, TMP_FOLDER)
    with contextlib.suppress(FileNotFoundError), os.scandir(tmp) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    blocks = os.path.join(root, BLOCKS_FOLDER)
    seen = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(blocks) as folders:
        for folder in folders:
            if not folder.is_dir(follow_symlinks=False):
                continue
            with os.scandir(folder.path) as files:
                for entry in files:
                    seen += 1
                    assert seen <= SCAN_FILES_MAX, seen
                    found = _read_trailer(entry.path, entry.name)
                    if found is None:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
                    else:
                        yield found


def _read_trailer(path: str, name: str) -> CacheFile | None:
    """The file's description from its trailer, or None if anything disagrees."""
    parts = name.split("-")
    if len(parts) != 3:
        return None
    try:
        key, block, version = bytes.fromhex(parts[0]), int(parts[1]), int(parts[2])
        fd = os.open(path, os.O_RDONLY)
    except (ValueError, OSError):
        return None
    try:
        size = os.fstat(fd).st_size
        tail = _FOOTER.size + _CRC.size
        if size < tail:
            return None
        footer = os.pread(fd, tail, size - tail)
        magic, version_, check, block_, start, end, key_, file_version = _FOOTER.unpack_from(footer)
        if (magic, version_, check) != (MAGIC, FORMAT_VERSION, CHECK_BYTES) or end <= start:
            return None
        if (key_, block_, file_version) != (key, block, version) or size != end - start + trailer_bytes(
            end - start
        ):
            return None
        crcs = os.pread(fd, 4 * check_blocks(end - start), end - start)
        (sealed,) = _CRC.unpack_from(footer, _FOOTER.size)
        if crc32c.crc32c(footer[: _FOOTER.size], crc32c.crc32c(crcs)) != sealed:
            return None
        return CacheFile(key, block, start, end, version, crcs, path, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _checksums(parts: Sequence[bytes | memoryview]) -> bytes:
    """The packed CRC32C of each ``CHECK_BYTES`` of the concatenated ``parts``."""
    crcs = bytearray()
    running, filled = 0, 0
    for part in parts:
        view = memoryview(part)
        while view:
            take = min(len(view), CHECK_BYTES - filled)
            running = crc32c.crc32c(view[:take], running)
            filled += take
            view = view[take:]
            if filled == CHECK_BYTES:
                crcs += _CRC.pack(running)
                running, filled = 0, 0
    if filled:
        crcs += _CRC.pack(running)
    return bytes(crcs)


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    for part in parts:
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view) :]


#: ``O_DIRECT`` (0 where the platform has none: ``direct_writes_work`` is then False).
_O_DIRECT = getattr(os, "O_DIRECT", 0)
#: Alignment of an ``O_DIRECT`` write's memory, offset and length (a page: above every
#: logical block size in use).
DIRECT_ALIGN_BYTES = 4096
_buffers = threading.local()


def direct_writes_work(root: str) -> bool:
    """Whether files in ``root`` can be written with ``O_DIRECT`` (not on tmpfs, for one):
    a probe file is written under ``tmp/`` and removed. ``OSError`` other than the
    refusal of ``O_DIRECT`` itself passes through."""
    if not _O_DIRECT:
        return False
    probe = os.path.join(root, TMP_FOLDER, "direct-probe.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(probe)
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    try:
        _write_direct(fd, [b"SLTS"])
        return True
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def _write_direct(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write ``parts`` to ``fd`` (opened with ``O_DIRECT``, empty) from this thread's
    page-aligned buffer, padded to ``DIRECT_ALIGN_BYTES``, then cut to their length.

    Why: written through the page cache, a fill's bytes land in page-cache pages the
    kernel takes fresh; on a virtual machine whose fresh memory faults to its host, that
    cost more CPU than the read that fetched them (2.2 ms per MiB measured here, against
    0.2 ms direct), and took it from the reader on a 2-core machine. Written directly,
    a fill costs one copy into a buffer the thread reuses, and a file's pages enter the
    page cache only when a hit reads them (docs/chunk_cache.md)."""
    size = sum(len(part) for part in parts)
    padded = -(-size // DIRECT_ALIGN_BYTES) * DIRECT_ALIGN_BYTES
    buffer: mmap.mmap | None = getattr(_buffers, "buffer", None)
    if buffer is None or len(buffer) < padded:
        if buffer is not None:
            buffer.close()
        buffer = _buffers.buffer = mmap.mmap(-1, padded)  # page-aligned, kept by the thread
    view = memoryview(buffer)
    try:
        position = 0
        for part in parts:
            view[position : position + len(part)] = part
            position += len(part)
        written = 0
        while written < padded:
            done = os.pwrite(fd, view[written:padded], written)
            if done <= 0 or done % DIRECT_ALIGN_BYTES:
                raise OSError(errno.EIO, f"a direct write wrote {done} of {padded - written} bytes")
            written += done
    finally:
        view.release()
    os.ftruncate(fd, size)


_LITTLE = struct.pack("=I", 1) == struct.pack("<I", 1)
