"""The walk of an LMDB data file that ``lmdb_file.walk_in_child`` runs in a child process.

Run as ``python -P lmdb_walk.py FOLDER`` (it imports only the standard library and
``lmdb``, so the child starts in a few tens of milliseconds). It opens the environment
read-only and, inside one read transaction (which pins the snapshot it walks, so a live
writer beside it changes nothing it reads):

* reads every record of the main database and of every named database through LMDB
  itself: each branch, leaf and overflow page is touched the way the store will touch it,
  so damage that would make LMDB fault (a page number past the end of the file, a node
  or value size past its page) kills this child, not the process that asked;
* checks that each database holds as many records as its header says (``md_entries``);
* walks LMDB's free-page database, which only writers read and no LMDB call exposes, with
  ``os.pread`` and explicit bounds (see ``_FreeListWalk``): every page number in range,
  every page header naming its own number and kind, every node inside its page, every
  freed page number in range, and the page and record counts equal to its header's.

It prints one JSON object on stdout: ``{"txnid", "records", "pages"}`` and exits 0 when
the file is whole; ``{"problem": ...}`` and exit 1 when it found damage; exit 2 with
``{"error": ...}`` when it could not check (no permission, no memory): not damage.
A signal (SIGBUS, SIGSEGV) is damage too: the parent sees the child die of it.
Layout constants: LMDB 0.9 on a 64-bit build (``lmdb_file``'s module doc).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from array import array

import lmdb

#: LMDB errors that mean the file is damaged (any other error: the check could not run).
DAMAGE = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.InvalidError,
    lmdb.VersionMismatchError,
    lmdb.CursorFullError,
    lmdb.IncompatibleError,
    lmdb.BadTxnError,
    lmdb.BadValsizeError,
    lmdb.PanicError,
)
#: Named databases one environment may hold for this check (SLTS uses a few dozen).
DATABASES_MAX = 4096
#: Read transactions retried when a writer moved two transactions on before the meta
#: page of the one just begun could be read (the free-list walk needs its root).
META_ATTEMPTS_MAX = 50

_PAGE_HEADER = struct.Struct("=QHHHH")  # pgno, pad, flags, lower, upper
_OVERFLOW_PAGES = struct.Struct("=I")  # @12 of an overflow page
_NODE = struct.Struct("=HHHH")  # lo, hi, flags, key size
_DB = struct.Struct("=IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
_LAST_TXN = struct.Struct("=QQ")  # last page, txnid @136 of a meta page
_PAGE_HEADER_BYTES = 16
_NODE_BYTES = 8
_FREE_DB_AT, _MAIN_DB_AT = 40, 88
P_BRANCH, P_LEAF, P_OVERFLOW, P_LEAF2, P_SUBP = 0x01, 0x02, 0x04, 0x20, 0x40
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
P_INVALID = (1 << 64) - 1
DEPTH_MAX = 32  # LMDB's cursor stack


class Damaged(Exception):
    """The file is damaged; the message says where."""


def main(argv: list[str]) -> int:
    """Walk the environment in folder ``argv[1]``; print the outcome (module doc)."""
    folder = argv[1]
    try:
        outcome = walk(folder)
    except Damaged as damage:
        print(json.dumps({"problem": str(damage)}))
        return 1
    except DAMAGE as exc:
        print(json.dumps({"problem": f"LMDB reports {type(exc).__name__}: {exc}"}))
        return 1
    except (lmdb.Error, OSError, MemoryError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 2
    print(json.dumps(outcome))
    return 0


def walk(folder: str) -> dict[str, int]:
    """Walk every database of the environment in ``folder`` (module doc)."""
    path = os.path.join(folder, "data.mdb")
    env = lmdb.Environment(folder, readonly=True, create=False, max_dbs=DATABASES_MAX, lock=True)
    try:
        page_bytes = int(env.stat()["psize"])
        with open(path, "rb") as file:
            for _ in range(META_ATTEMPTS_MAX):
                try:
                    txn = env.begin()
                except lmdb.MapResizedError:  # a writer in another process grew the map: adopt it
                    env.set_mapsize(0)
                    continue
                with txn:
                    meta = _meta_of(file.fileno(), page_bytes, txn.id())
                    if meta is None:
                        continue  # a writer reused that meta page meanwhile: begin again
                    size = os.fstat(file.fileno()).st_size  # a writer beside us grows the file
                    records_max = size // (_NODE_BYTES + 2) + 1  # a node and its pointer: more is a cycle
                    records = _walk_databases(env, txn, records_max)
                    last_page = _LAST_TXN.unpack_from(meta, 136)[0]
                    if (last_page + 1) * page_bytes > size:
                        raise Damaged(f"the meta page of transaction {txn.id()} uses pages up to {last_page}")
                    free = _FreeListWalk(file.fileno(), page_bytes, last_page)
                    free.walk(_DB.unpack_from(meta, _FREE_DB_AT))
                    return {"txnid": txn.id(), "records": records, "pages": last_page + 1}
        raise OSError(
            f"a writer moved on faster than the check could read a meta page ({META_ATTEMPTS_MAX} times)"
        )
    finally:
        env.close()


def _meta_of(fd: int, page_bytes: int, txnid: int) -> bytes | None:
    """The meta page (from its page header on) of transaction ``txnid``, or None."""
    for number in (0, 1):
        page = os.pread(fd, 152, number * page_bytes)
        if len(page) == 152 and _LAST_TXN.unpack_from(page, 136)[1] == txnid:
            return page
    return None


def _walk_databases(env: lmdb.Environment, txn: lmdb.Transaction[bytes], records_max: int) -> int:
    """Read every record of the main database and of each named database it lists."""
    names: list[bytes] = []
    total = 0
    for key, value in txn.cursor():
        names.append(bytes(key))
        total += len(value)
    records = _check_count(
        "the main database", len(names), txn.stat(env.open_db(None, txn=txn, create=False))["entries"]
    )
    for name in names:
        db = env.open_db(name, txn=txn, create=False)
        count = 0
        for value in txn.cursor(db).iternext(keys=False, values=True):
            count += 1
            total += len(value)
            if count > records_max:
                raise Damaged(f"database {name!r} yields more records than the file can hold (a cycle)")
        records += _check_count(repr(name), count, txn.stat(db)["entries"])
    assert total >= 0
    return records


def _check_count(what: str, count: int, entries: int) -> int:
    if count != entries:
        raise Damaged(f"{what} holds {count} records, its header says {entries}")
    return count


class _FreeListWalk:
    """A bounded walk of LMDB's free-page database by ``os.pread`` (module doc)."""

    def __init__(self, fd: int, page_bytes: int, last_page: int) -> None:
        self.fd = fd
        self.page_bytes = page_bytes
        self.last_page = last_page
        self.seen = bytearray((last_page >> 3) + 1)
        self.counts = {"branch": 0, "leaf": 0, "overflow": 0, "entries": 0}

    def walk(self, header: tuple[int, ...]) -> None:
        _, _, depth, branch, leaf, overflow, entries, root = header
        if root == P_INVALID:
            if entries or depth:
                raise Damaged(f"the free list is empty but its header says {entries} records, depth {depth}")
            return
        if not 1 <= depth <= DEPTH_MAX:
            raise Damaged(f"the free list's depth is {depth}")
        self._page(root, depth)
        expected = {"branch": branch, "leaf": leaf, "overflow": overflow, "entries": entries}
        if self.counts != expected:
            raise Damaged(f"the free list holds {self.counts}, its header says {expected}")

    def _in_range(self, number: int, pages: int) -> None:
        if not 2 <= number <= self.last_page or number + pages - 1 > self.last_page:
            raise Damaged(f"the free list points at page {number}, outside pages 2..{self.last_page}")

    def _read(self, number: int, pages: int = 1) -> bytes:
        """Pages ``number`` .. ``number + pages - 1``, each reached once, read whole."""
        self._in_range(number, pages)
        for page in range(number, number + pages):
            if self.seen[page >> 3] & (1 << (page & 7)):
                raise Damaged(f"the free list reaches page {page} twice")
            self.seen[page >> 3] |= 1 << (page & 7)
        data = os.pread(self.fd, pages * self.page_bytes, number * self.page_bytes)
        if len(data) != pages * self.page_bytes:
            raise Damaged(f"page {number} lies past the end of the file")
        if _PAGE_HEADER.unpack_from(data)[0] != number:
            raise Damaged(f"page {number}'s header names page {_PAGE_HEADER.unpack_from(data)[0]}")
        return data

    def _page(self, number: int, depth: int) -> None:
        page = self._read(number)
        _, _, flags, lower, upper = _PAGE_HEADER.unpack_from(page)
        kind = P_LEAF if depth == 1 else P_BRANCH
        if flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_LEAF2 | P_SUBP) != kind:
            raise Damaged(f"free-list page {number} has flags {flags:#x}, expected a {_KIND[kind]} page")
        if not _PAGE_HEADER_BYTES <= lower <= upper <= self.page_bytes or lower % 2:
            raise Damaged(f"free-list page {number} has bounds {lower}..{upper}")
        keys = (lower - _PAGE_HEADER_BYTES) // 2
        if keys == 0:
            raise Damaged(f"free-list page {number} holds no node")
        self.counts["branch" if kind == P_BRANCH else "leaf"] += 1
        for offset in struct.unpack_from(f"={keys}H", page, _PAGE_HEADER_BYTES):
            if not upper <= offset <= self.page_bytes - _NODE_BYTES:
                raise Damaged(
                    f"free-list page {number} has a node at {offset}, outside {upper}..{self.page_bytes}"
                )
            low, high, node_flags, key_bytes = _NODE.unpack_from(page, offset)
            data_at = offset + _NODE_BYTES + key_bytes
            if kind == P_BRANCH:
                if data_at > self.page_bytes:
                    raise Damaged(f"free-list page {number} has a key past its end")
                self._page(low | high << 16 | node_flags << 32, depth - 1)
            else:
                if key_bytes != 8:
                    raise Damaged(
                        f"free-list page {number} has a key of {key_bytes} bytes, not a transaction id"
                    )
                self._record(number, page, data_at, low | high << 16, node_flags)

    def _record(self, number: int, page: bytes, data_at: int, data_bytes: int, flags: int) -> None:
        """One free-list record: a transaction id's list of freed page numbers."""
        if flags & (F_SUBDATA | F_DUPDATA):
            raise Damaged(f"free-list page {number} has a node with flags {flags:#x}")
        if flags & F_BIGDATA:
            if data_at + 8 > self.page_bytes:
                raise Damaged(f"free-list page {number} has a node past its end")
            (first,) = struct.unpack_from("=Q", page, data_at)
            self._in_range(first, 1)
            head = os.pread(self.fd, _PAGE_HEADER_BYTES, first * self.page_bytes)
            if len(head) != _PAGE_HEADER_BYTES or _PAGE_HEADER.unpack(head)[2] & P_OVERFLOW == 0:
                raise Damaged(f"free-list value at page {first} is not an overflow page")
            (pages,) = _OVERFLOW_PAGES.unpack_from(head, 12)
            if pages < 1 or data_bytes > pages * self.page_bytes - _PAGE_HEADER_BYTES:
                raise Damaged(f"free-list overflow page {first} spans {pages} pages for {data_bytes} bytes")
            value = self._read(first, pages)[_PAGE_HEADER_BYTES : _PAGE_HEADER_BYTES + data_bytes]
            self.counts["overflow"] += pages
        else:
            if data_at + data_bytes > self.page_bytes:
                raise Damaged(f"free-list page {number} has a value past its end")
            value = page[data_at : data_at + data_bytes]
        self.counts["entries"] += 1
        if len(value) < 8 or len(value) % 8:
            raise Damaged(f"a free-list record of {len(value)} bytes is not a page list")
        freed = array("Q", value)
        if freed[0] != len(freed) - 1:
            raise Damaged(f"a free-list record counts {freed[0]} pages and holds {len(freed) - 1}")
        if len(freed) > 1 and not (min(freed[1:]) >= 2 and max(freed[1:]) <= self.last_page):
            raise Damaged(f"a free-list record frees a page outside 2..{self.last_page}")


_KIND = {P_BRANCH: "branch", P_LEAF: "leaf"}

if __name__ == "__main__":
    sys.exit(main(sys.argv))
