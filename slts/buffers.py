"""New ``bytes`` filled in place: one allocation for a result built piece by piece.

A read that decodes frames (decrypts, decompresses) into its result would otherwise fill a
``bytearray`` and copy it into the ``bytes`` it returns: two buffers of the read's size,
both new. On a machine whose fresh memory is costly (a virtual machine that hands free
pages back to its host pays a host fault on each first touch, about the cost of copying the
page several times), the second buffer is what a large decoded read spends most of its
time on (docs/benchmarks.md, "Client-side transforms").

``filled_bytes(size, fill)`` returns a new ``bytes`` of ``size`` bytes after ``fill(view)``
wrote them through ``view``, a writable ``memoryview`` of exactly those bytes, released when
``fill`` returns. ``fill`` must write every byte (what it leaves is unspecified) and must not
keep ``view`` or a view made from it; if it raises, nothing is returned and the error passes
through. The compiled twin (``slts._buffers``, built at install where a C compiler is at
hand) fills the bytes object itself; this module's code, the reference, fills a
``bytearray`` and copies it. ``NATIVE`` says which one is in use (``SLTS_PURE_PYTHON=1``
turns the compiled one off).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from slts.compiled import twin

Fill = Callable[[memoryview], object]


#: The compiled twin, or None: the Python code does the work.
NATIVE = twin("slts._buffers")  # optional: compiled at install


def filled_bytes_python(size: int, fill: Fill) -> bytes:
    """The reference ``filled_bytes`` (module doc): a ``bytearray`` filled, then copied."""
    if size < 0:
        raise ValueError(f"filled_bytes: size must be >= 0, got {size}")
    out = bytearray(size)
    view = memoryview(out)
    try:
        fill(view)
        kept = sys.getrefcount(view) > 2  # this frame's name and getrefcount's argument
    finally:
        view.release()
    if kept:
        raise RuntimeError("filled_bytes: fill kept its view")
    return bytes(out)


#: ``filled_bytes(size, fill) -> bytes`` (module doc): the compiled twin where built.
filled_bytes: Callable[[int, Fill], bytes] = (
    NATIVE.filled_bytes if NATIVE is not None else filled_bytes_python
)
