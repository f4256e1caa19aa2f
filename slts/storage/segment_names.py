"""Segment name rules and chunk naming.

A segment name is 1..256 UTF-8 bytes of '/'-separated parts. Each part is 1..80 bytes
(so the chunk names built from it fit every binding's limits, even percent-encoded),
no part is ``.`` or ``..``, the name does not start or end with ``/``, contains no
NUL or other control character (C0, DEL or C1: U+0080-U+009F, which terminals read
as escape sequences), and does not start with the reserved prefix
``_system/`` (system segments, DESIGN.md §6).

Chunk names (``chunk_name``) are ``<container>/<segment>/E<epoch>.O<offset>.<random>``:
globally unique and never reused (the random part is 128 bits from ``uuid4``), they
carry the container (so the orphan reconciler can list one container's prefix), the
epoch of the instance that created the chunk and the segment offset where it starts.
"""

from __future__ import annotations

import re

from slts.chunk_names import chunk_leaf, leaf_epoch
from slts.errors import InvalidName

SEGMENT_NAME_BYTES_MAX = 256
NAME_PART_BYTES_MAX = 80
SYSTEM_PREFIX = "_system/"
#: Unicode's control characters (category Cc): C0, DEL and C1.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def check_segment_name(name: object, *, system: bool = False) -> str:
    """Return ``name`` if it is a valid segment name, else raise ``InvalidName``.

    ``system=True`` is for the engine's own system segments, which must carry the
    reserved prefix that user names may not.
    """
    if not isinstance(name, str):
        raise InvalidName(f"segment name must be a string, got {type(name).__name__}", segment=name)
    if not name:
        raise InvalidName("segment name is empty", segment=name)
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidName(f"segment name is not valid Unicode text: {name!r}", segment=name) from exc
    if len(encoded) > SEGMENT_NAME_BYTES_MAX:
        raise InvalidName(
            f"segment name is {len(encoded)} bytes, more than {SEGMENT_NAME_BYTES_MAX}",
            segment=name[:60] + "...",
        )
    if _CONTROL.search(name):
        raise InvalidName(f"segment name contains NUL or a control character: {name!r}", segment=name)
    if name.startswith("/") or name.endswith("/"):
        raise InvalidName(f"segment name must not start or end with '/': {name!r}", segment=name)
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise InvalidName(f"segment name has an empty, '.' or '..' part: {name!r}", segment=name)
        if len(part.encode("utf-8")) > NAME_PART_BYTES_MAX:
            raise InvalidName(
                f"a '/'-separated part of the segment name is longer than {NAME_PART_BYTES_MAX} bytes",
                segment=name,
            )
    if name.startswith(SYSTEM_PREFIX) != system:
        reason = "is reserved for system segments" if not system else "is required for system segments"
        raise InvalidName(f"the prefix {SYSTEM_PREFIX!r} {reason}: {name!r}", segment=name)
    return name


def chunk_prefix(container_id: int) -> str:
    """Every chunk of a container has a name starting with this."""
    return f"{container_id}/"


def chunk_name(container_id: int, segment: str, epoch: int, offset: int, opaque_id: int | None = None) -> str:
    """A new, globally unique chunk name for ``segment`` starting at ``offset``. With
    ``opaque_id`` (the segment's id; a store with encryption on, docs/security.md) the name
    holds that id, not the segment's name: a reader of the bucket's listing learns no names."""
    assert container_id >= 0
    part = segment if opaque_id is None else f"~{opaque_id:x}"
    return f"{container_id}/{part}/{chunk_leaf(epoch, offset)}"


#: The epoch encoded in a chunk name made by ``chunk_name``, or None for other names.
chunk_epoch = leaf_epoch
