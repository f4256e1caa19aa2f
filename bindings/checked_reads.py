"""Reads of a local file checked against block CRC32Cs in the same pass as the copy.

A verified read copies bytes (page cache to the caller's buffer) and checks every block's
CRC32C: two passes over memory at about the same speed each, so done one after the other
a verified read runs at half the speed of a plain one. ``read_checked`` does both in one
call, and on two cores where the range is large: the compiled twin
(``slts.bindings._checked_reads``) cuts the blocks in two runs, one read and checked by the
caller's thread, the other by a thread of its own, each checking a piece right after
reading it (while it sits in that core's cache). Thread hand-offs through Python locks cost
tens of microseconds on the virtual machines measured, as much as the work: the compiled
twin's thread spins between jobs and never takes the interpreter lock (docs/benchmarks.md,
"Issue 29, ninth session").

``read_checked(fd, view, offset, blocks) -> (count, bad)``:

* ``blocks``: the blocks ``view`` covers, packed big-endian ``(length u32, crc32c u32)``
  pairs whose lengths sum to ``len(view)``; ``ValueError`` otherwise (a caller's bug);
* reads ``fd``'s bytes ``[offset, offset + len(view))`` into ``view``; ``count`` is how
  many were read (fewer only at the end of the file);
* checks every block read whole; ``bad`` is the index of the first that fails, or -1.
  A block cut short by the end of the file is not checked (the caller reports the short
  read);
* a failed read raises its ``OSError``; ``view`` may then hold some bytes.

The pure-Python function is the reference and stays; the compiled twin needs a CRC32C
library with a C function, called from the twin's own thread, where no Python function can
be: ISA-L's ``crc32_iscsi`` (exported by the ``isal`` package's extension module) or else
Google's ``crc32c_extend`` (shipped by ``google-crc32c`` beside its module), whichever
loads and gives the known answer first (``_LIBRARIES``; ``CRC32C_LIBRARY`` says which).
``NATIVE`` is the twin when it was built and a library found, else None
(``SLTS_PURE_PYTHON=1`` turns it off, as for every twin).
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import struct
from collections.abc import Callable
from types import ModuleType

import crc32c

from slts.errors import ChunkCorrupted

_PAIR = struct.Struct(">II")


def read_checked_python(fd: int, view: memoryview, offset: int, blocks: bytes) -> tuple[int, int]:
    """The reference ``read_checked`` (module doc): the range read whole, then checked."""
    if fd < 0 or offset < 0 or covered(blocks) != len(view):
        raise ValueError(
            f"read_checked: fd {fd}, offset {offset}, and a block list of {len(blocks)} bytes"
            f" for a buffer of {len(view)}"
        )
    count = pread_into(fd, view, offset)
    return count, first_bad(view[:count], blocks)


def pread_into(fd: int, view: memoryview, offset: int) -> int:
    """``fd``'s bytes from ``offset`` read into ``view`` until it is full or the file ends;
    how many were read. ``OSError`` as ``preadv``."""
    count = 0
    while count < len(view):
        got = os.preadv(fd, [view[count:]], offset + count)
        if not got:
            break
        count += got
    return count


def _isal_library() -> str | None:
    """Path of an ``isal`` extension module that exports ISA-L's ``crc32_iscsi``, or None."""
    spec = importlib.util.find_spec("isal")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "igzip_lib*.so")))
        if found:
            return found[0]
    return None


def _google_library() -> str | None:
    """Path of the CRC32C library the ``google-crc32c`` package ships, or None."""
    spec = importlib.util.find_spec("google_crc32c")
    if spec is None or spec.origin is None:
        return None
    package = os.path.dirname(spec.origin)
    for pattern in (  # a wheel's bundled library, or one installed beside the module
        os.path.join(os.path.dirname(package), "google_crc32c.libs", "libcrc32c*.so*"),
        os.path.join(package, "libcrc32c*.so*"),
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


#: The CRC32C libraries the compiled twin can call, fastest first: ISA-L's (AVX-512 and
#: carry-less multiplication where the CPU has them: 38-54 GB/s on one core of the machine
#: measured) from the ``isal`` package's extension module, which exports it; Google's
#: (SSE 4.2: about 27 GB/s) from ``google-crc32c``. ``SLTS_CRC32C_LIBRARY`` names one kind.
_LIBRARIES: tuple[tuple[str, Callable[[], str | None]], ...] = (
    ("isal", _isal_library),
    ("google", _google_library),
)


def _native() -> ModuleType | None:
    if os.environ.get("SLTS_PURE_PYTHON") == "1":  # as slts.compiled.twin (not imported here:
        return None  # bindings import nothing of the core but its errors)
    try:
        module = importlib.import_module("slts.bindings._checked_reads")
    except ImportError:
        return None
    wanted = os.environ.get("SLTS_CRC32C_LIBRARY")
    if module.configured() is None:
        for kind, find in _LIBRARIES:
            library = find() if wanted in (None, "", kind) else None
            if library is None:
                continue
            try:
                module.configure(library, kind)
            except OSError:  # not loadable, no such function, or a wrong answer
                continue
            break
        else:
            return None
    return module


#: The compiled twin, or None: the Python code does the work (module doc).
NATIVE = _native()

#: The CRC32C library the compiled twin calls: "isal", "google", or None (no twin).
CRC32C_LIBRARY: str | None = NATIVE.configured() if NATIVE is not None else None

#: ``read_checked(fd, view, offset, blocks) -> (count, bad)`` (module doc): the compiled
#: twin where it is at hand.
read_checked: Callable[[int, memoryview, int, bytes], tuple[int, int]] = (
    NATIVE.read_checked if NATIVE is not None else read_checked_python
)


def covered_python(blocks: bytes) -> int | None:
    """How many bytes ``blocks`` covers, or None if it is not a block list."""
    if type(blocks) is not bytes or len(blocks) % _PAIR.size:
        return None
    return sum(struct.unpack(f">{len(blocks) // 4}I", blocks)[0::2])


#: ``covered(blocks) -> int | None`` (``covered_python``): the compiled twin's where at hand
#: (every checked read's argument check asks it).
covered: Callable[[bytes], int | None] = NATIVE.covered if NATIVE is not None else covered_python


def block_offset(blocks: bytes, index: int) -> int:
    """Offset of block ``index`` from the start of the range ``blocks`` covers."""
    return covered(blocks[: index * _PAIR.size]) or 0


def block_length(blocks: bytes, index: int) -> int:
    """Length of block ``index`` of ``blocks``."""
    return int(_PAIR.unpack_from(blocks, index * _PAIR.size)[0])


def corrupted(chunk: str, start: int, blocks: bytes, index: int) -> ChunkCorrupted:
    """The error for block ``index`` of ``blocks`` (a range from chunk offset ``start``)
    failing its CRC32C."""
    at = block_offset(blocks, index)
    length = block_length(blocks, index)
    return ChunkCorrupted(
        f"chunk {chunk!r} fails the CRC32C of its block at offset {start + at} ({length} bytes):"
        " its bytes are not the ones written",
        chunk=chunk,
        offset=start + at,
    )


def first_bad(view: memoryview, blocks: bytes) -> int:
    """Index of the first block of ``blocks`` that ``view`` holds whole and that fails its
    CRC32C (bytes read some other way), or -1."""
    at = 0
    for index, (length, crc) in enumerate(_PAIR.iter_unpack(blocks)):
        if at + length > len(view):
            break
        if crc32c.crc32c(view[at : at + length]) != crc:
            return index
        at += length
    return -1
