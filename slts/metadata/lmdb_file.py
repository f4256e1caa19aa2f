"""A check of an LMDB data file against LMDB's own meta pages, before it is mapped.

LMDB maps ``data.mdb`` into memory and trusts it: a file cut short (a failed copy, a
full disk, a truncation by hand) makes the first access past its end kill the process
with SIGBUS, which no Python code can catch. So before an existing file is mapped, its
two meta pages (pages 0 and 1; LMDB writes both when it creates the file and the newer
one at each commit) are read and checked:

* each starts, after the 16-byte page header, with the magic ``0xBEEFC0DE`` and data
  format version 1;
* the page size LMDB recorded (kept in the free-list database's ``md_pad`` field) is a
  power of two the file can hold two pages of;
* the file holds every page up to the last one each meta page says is in use
  (``mm_last_pg``): ``(last_pg + 1) * page_size <= file size``.

A file that fails raises ``MetadataCorrupted`` naming it and the way back
(``slts restore`` rebuilds the metadata from tier-2). Layout (native byte order, 64-bit
build): page header 16 bytes; meta: magic u32 @16, version u32 @20, address @24,
map size @32, two ``MDB_db`` of 48 bytes @40 (the first one's ``md_pad`` is the page
size), ``mm_last_pg`` u64 @136, ``mm_txnid`` u64 @144.
"""

from __future__ import annotations

import os
import struct

from slts.errors import MetadataCorrupted

DATA_FILE = "data.mdb"
_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_META = struct.Struct("=II")  # magic, version @16
_PAGE_SIZE = struct.Struct("=I")  # @40
_LAST_PAGE = struct.Struct("=QQ")  # last page, txnid @136
_META_BYTES = 152
_PAGE_BYTES_MIN, _PAGE_BYTES_MAX = 512, 1 << 16


def check_data_file(folder: str) -> None:
    """Raise ``MetadataCorrupted`` if ``folder``'s ``data.mdb`` exists and is not a whole
    LMDB file (see module doc). No file yet: nothing to check."""
    path = os.path.join(folder, DATA_FILE)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            head = file.read(_META_BYTES)
            page_bytes = _PAGE_SIZE.unpack_from(head, 40)[0] if len(head) == _META_BYTES else 0
            if _PAGE_BYTES_MIN <= page_bytes <= _PAGE_BYTES_MAX and page_bytes & (page_bytes - 1) == 0:
                file.seek(page_bytes)
                second = file.read(_META_BYTES)
            else:
                second = b""
    except FileNotFoundError:
        return
    except OSError as exc:
        raise MetadataCorrupted(f"cannot read the metadata file {path!r}: {exc}", path=path) from exc
    problem = _problem(head, second, page_bytes, size)
    if problem:
        raise MetadataCorrupted(
            f"the metadata file {path!r} is damaged ({problem}); it cannot be opened safely. "
            "Rebuild the metadata from tier-2 with `slts restore --to NEW_FOLDER`",
            path=path,
        )


def _problem(first: bytes, second: bytes, page_bytes: int, size: int) -> str | None:
    if len(first) < _META_BYTES:
        return f"{size} bytes, shorter than LMDB's meta page"
    if not (_PAGE_BYTES_MIN <= page_bytes <= _PAGE_BYTES_MAX and page_bytes & (page_bytes - 1) == 0):
        return f"page size {page_bytes} is not a valid LMDB page size"
    if size < 2 * page_bytes or len(second) < _META_BYTES:
        return f"{size} bytes, shorter than LMDB's two meta pages"
    for number, page in enumerate((first, second)):
        magic, version = _META.unpack_from(page, 16)
        if magic != _MAGIC or version != _DATA_VERSION:
            return f"meta page {number} has magic {magic:#x} version {version}, not an LMDB meta page"
        last_page, _ = _LAST_PAGE.unpack_from(page, 136)
        if (last_page + 1) * page_bytes > size:
            return f"meta page {number} uses pages up to {last_page}, but the file holds {size // page_bytes}"
    return None
