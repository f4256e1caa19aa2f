"""Damage for the tests of the metadata file check: an engine-made store, and ways to
break its ``data.mdb`` in place the way a bad disk, a bad copy or a hand edit would.

The targeted kinds find their spot with LMDB's page layout (64-bit build; see
``slts.metadata.lmdb_file``): the newest meta page names the main database's root, whose
leaf lists every named database with its root page and depth.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import lmdb

import slts
from slts.metadata.lmdb_file import MARKER_FILE

PAGE_HEADER = struct.Struct("=QHHHH")  # pgno, pad, flags, lower, upper
NODE = struct.Struct("=HHHH")  # lo, hi, flags, key size
P_BRANCH, P_LEAF = 0x01, 0x02


def engine_store(root: Path, segments: int = 120) -> None:
    """A store made by the engine under ``root`` (chunks, metadata): ``segments`` segments
    ``s0``... with a few small chunks each, so that its tables span several pages."""
    storage = slts.open(f"file://{root / 'chunks'}", metadata=str(root / "metadata"), gc_interval_s=0)
    try:
        for i in range(segments):
            name = f"s{i}"
            storage.create(name, max_rolling_length=64)
            storage.write(storage.open_write(name), 0, bytes([i % 256]) * 200)
    finally:
        storage.close()


def data_file(root: Path) -> Path:
    return root / "metadata" / "data.mdb"


def _layout(data: bytes) -> tuple[int, int, int]:
    """(page bytes, last page, main database root) of the newest meta page."""
    page_bytes = struct.unpack_from("=I", data, 40)[0]
    metas = [struct.unpack_from("=QQ", data, number * page_bytes + 136) for number in (0, 1)]
    newest = max((0, 1), key=lambda number: metas[number][1])
    main_root = struct.unpack_from("=Q", data, newest * page_bytes + 128)[0]
    return page_bytes, metas[newest][0], main_root


def _nodes(data: bytes, page_bytes: int, number: int) -> list[int]:
    """Offsets in the file of the nodes of page ``number``."""
    at = number * page_bytes
    lower = PAGE_HEADER.unpack_from(data, at)[3]
    pointers = struct.unpack_from(f"={(lower - 16) // 2}H", data, at + 16)
    return [at + pointer for pointer in pointers]


def database_root(data: bytes, name: bytes) -> tuple[int, int]:
    """(depth, root page) of named database ``name`` (the main database is one leaf)."""
    page_bytes, _, main_root = _layout(data)
    assert PAGE_HEADER.unpack_from(data, main_root * page_bytes)[2] & P_LEAF
    for node in _nodes(data, page_bytes, main_root):
        key_bytes = NODE.unpack_from(data, node)[3]
        if data[node + 8 : node + 8 + key_bytes] == name:
            record = node + 8 + key_bytes
            return struct.unpack_from("=H", data, record + 6)[0], struct.unpack_from("=Q", data, record + 40)[
                0
            ]
    raise AssertionError(f"no database {name!r}")


def leaves(data: bytes, table: bytes) -> list[int]:
    """The leaf pages of named database ``table``, in key order."""
    page_bytes = _layout(data)[0]
    depth, root = database_root(data, table)
    found: list[int] = []

    def descend(number: int, level: int) -> None:
        if level == 1:
            found.append(number)
            return
        for node in _nodes(data, page_bytes, number):
            low, high, flags, _ = NODE.unpack_from(data, node)
            descend(low | high << 16 | flags << 32, level - 1)

    descend(root, depth)
    return found


def compact(root: Path) -> None:
    """Replace the store's data file by LMDB's compacted copy of it (what ``mdb_copy -c``
    writes for a backup): the pages of each database in turn, named databases in name
    order, so the last ones (``segments``, ``usage``) end the file."""
    folder = root / "metadata"
    copy = root / "compacted"
    copy.mkdir()
    env = lmdb.Environment(str(folder), readonly=True, max_dbs=64)
    try:
        env.copy(str(copy), compact=True)
    finally:
        env.close()
    os.replace(copy / "data.mdb", folder / "data.mdb")
    copy.rmdir()
    for leftover in ("lock.mdb", MARKER_FILE):
        (folder / leftover).unlink(missing_ok=True)


def break_last_leaf(root: Path, table: bytes) -> list[str]:
    """Point every node of ``table``'s last leaf page (its highest keys) 0xFFF8 bytes into
    the page: past the end of the file when the page is one of its last 15, so that
    reading any of its records runs off the file. Returns those records' keys."""
    path = data_file(root)
    data = bytearray(path.read_bytes())
    page_bytes = _layout(data)[0]
    last = leaves(data, table)[-1]
    assert last * page_bytes + 0xFFF8 > len(data), "the leaf is not among the file's last pages"
    keys = []
    for index, node in enumerate(_nodes(data, page_bytes, last)):
        key_bytes = NODE.unpack_from(data, node)[3]
        keys.append(data[node + 8 : node + 8 + key_bytes].decode())
        struct.pack_into("=H", data, last * page_bytes + 16 + 2 * index, 0xFFF8)
    path.write_bytes(data)
    return keys


def free_list_root(data: bytes) -> tuple[int, int]:
    """(depth, root page) of LMDB's free-page database in the newest meta page."""
    page_bytes = _layout(data)[0]
    metas = [struct.unpack_from("=Q", data, number * page_bytes + 144)[0] for number in (0, 1)]
    at = max((0, 1), key=lambda number: metas[number]) * page_bytes + 40
    return struct.unpack_from("=H", data, at + 6)[0], struct.unpack_from("=Q", data, at + 40)[0]


def break_free_list(root: Path) -> int:
    """Make the first record of the free-page list (a one-leaf list, its record in the
    page) free a page past the file's last one; returns that page number. Only a writer
    reads this list: no read through LMDB sees the damage."""
    path = data_file(root)
    data = bytearray(path.read_bytes())
    page_bytes, last_page, _ = _layout(data)
    depth, free_root = free_list_root(data)
    assert depth == 1, f"the free list has {depth} levels"
    node = _nodes(data, page_bytes, free_root)[0]
    _, _, flags, key_bytes = NODE.unpack_from(data, node)
    assert flags == 0 and key_bytes == 8, "the first free-list record is not in its page"
    record = node + 8 + key_bytes
    assert struct.unpack_from("=Q", data, record)[0] >= 1, "an empty free-list record"
    struct.pack_into("=Q", data, record + 8, last_page + 5)
    path.write_bytes(data)
    return last_page + 5


def enlarge_value(root: Path, key: bytes, size: int = 64 << 20) -> int:
    """Make the record ``key`` of every table that holds it (in place, no overflow page)
    claim ``size`` bytes: reading it runs past the end of the file. Returns how many
    nodes were changed."""
    path = data_file(root)
    data = bytearray(path.read_bytes())
    changed = 0
    start = 0
    while (found := data.find(key, start)) != -1:
        start = found + 1
        node = found - NODE.size
        if node >= 0 and NODE.unpack_from(data, node)[2:] == (0, len(key)):
            NODE.pack_into(data, node, size & 0xFFFF, size >> 16, 0, len(key))
            changed += 1
    path.write_bytes(data)
    return changed


def break_branch(root: Path, table: bytes) -> int:
    """Point the last child of ``table``'s root branch page past the end of the file;
    returns that page number."""
    path = data_file(root)
    data = bytearray(path.read_bytes())
    page_bytes, last_page, _ = _layout(data)
    depth, table_root = database_root(data, table)
    assert depth >= 2, f"{table!r} has one level: no branch page to break"
    node = _nodes(data, page_bytes, table_root)[-1]
    target = last_page + 1000
    struct.pack_into("=HHH", data, node, target & 0xFFFF, (target >> 16) & 0xFFFF, target >> 32)
    path.write_bytes(data)
    return target


def flip_later_pages(root: Path, seed: int, flips: int = 8) -> int:
    """Flip ``flips`` random bytes of one leaf page of the engine's tables in the later
    half of the file, within its first 64 bytes (page header, node pointers, first node)
    for odd seeds, anywhere in it for even ones; returns the page number."""
    path = data_file(root)
    data = bytearray(path.read_bytes())
    page_bytes = _layout(data)[0]
    pages = len(data) // page_bytes
    used = sorted(page for table in (b"segments", b"chunks", b"index") for page in leaves(data, table))
    rng = random.Random(seed)
    page = rng.choice([page for page in used if page >= pages // 2] or used)
    for _ in range(flips):
        at = page * page_bytes + (rng.randrange(64) if seed % 2 else rng.randrange(page_bytes))
        data[at] ^= rng.randrange(1, 256)
    path.write_bytes(data)
    return page
