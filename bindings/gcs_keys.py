"""Object names of the GCS binding: one path component per chunk, and its reserved names.

Kept apart from ``gcs.py`` (which needs the SDK) so that the name mapping can be checked,
and reused by tools, without ``google-cloud-storage`` installed.

A chunk is the object ``<prefix>/<leaf>``. The leaf is the chunk name with ``%``, ``/``,
``\\``, ``~``, control characters and a leading ``.`` percent-encoded (UTF-8, uppercase
hex), everything else kept. GCS itself takes any UTF-8 name of at most 1024 bytes, but
``/`` is a folder to many tools and to the emulator (which stores each object as a file:
``a`` and ``a/b`` could not coexist there), so a leaf never holds one. A leaf longer than
``LEAF_BYTES_MAX`` becomes ``<its first <= 190 bytes>~<sha256 of the name>`` and the name
goes into the object's custom metadata (``slts-name``, base64url); listings return custom
metadata, so reading such names back costs no extra request.

Reserved leaves start with ``.`` (never a chunk's: a leading ``.`` is always encoded):
``.tmp~<unix ms>~<id>~<n>`` are a concat's temporary objects (ranges copied through the
client, intermediate composes), ``.probe~<id>`` the precondition probe's object.

Invariants (checked by ``tests/gcs/test_gcs_unit.py``):

1. ``object_leaf`` is injective, and ``decode_plain_leaf`` returns a name only for its own leaf.
2. Every leaf is one path component of 1 to ``LEAF_BYTES_MAX`` bytes, never ``.``/``..``,
   and never starts with ``.`` (so it never meets a reserved leaf).
3. The leaves of all names starting with ``p`` start with ``list_head(p)``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from urllib.parse import unquote

from slts.errors import ChunkNameInvalid

from .base import check_name

#: Longest leaf: one file name on the emulator's disk (GCS's own limit is 1024 for the whole name).
LEAF_BYTES_MAX = 255
_HASH_CHARS = 64  # sha256 in hex
_HASHED_HEAD_BYTES_MAX = LEAF_BYTES_MAX - 1 - _HASH_CHARS
#: Longest prefix (``prefix/``): leaves up to ``LEAF_BYTES_MAX`` keep names <= 1024 bytes.
PREFIX_BYTES_MAX = 512
OBJECT_NAME_BYTES_MAX = 1024
#: The leaf prefix of a concat's temporary objects and of the precondition probe.
TMP_LEAF_PREFIX = ".tmp~"
PROBE_LEAF_PREFIX = ".probe~"

_ESCAPED = frozenset("%/\\~") | frozenset(chr(c) for c in range(0x20)) | {"\x7f"}


def _escape_char(ch: str) -> str:
    return "".join(f"%{byte:02X}" for byte in ch.encode("utf-8"))


def _encoded_units(name: str) -> list[str]:
    return [_escape_char(ch) if ch in _ESCAPED or (i == 0 and ch == ".") else ch for i, ch in enumerate(name)]


def _cut(units: Sequence[str], bytes_max: int) -> str:
    """The longest run of whole leading units of at most ``bytes_max`` UTF-8 bytes."""
    out, size = [], 0
    for unit in units:
        size += len(unit.encode("utf-8"))
        if size > bytes_max:
            break
        out.append(unit)
    return "".join(out)


def object_leaf(name: str) -> str:
    """The last path component of chunk ``name``'s object (invariants 1 and 2)."""
    units = _encoded_units(check_name(name))
    leaf = "".join(units)
    if len(leaf.encode("utf-8")) > LEAF_BYTES_MAX:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
        leaf = f"{_cut(units, _HASHED_HEAD_BYTES_MAX)}~{digest}"
    assert 0 < len(leaf.encode("utf-8")) <= LEAF_BYTES_MAX, leaf
    assert "/" not in leaf and not leaf.startswith("."), leaf
    return leaf


def is_hashed(leaf: str) -> bool:
    """A leaf that holds only the head of its name (the name is in the object's metadata)."""
    return "~" in leaf and not is_reserved(leaf)


def is_reserved(leaf: str) -> bool:
    """A leaf no chunk has: a temporary object or a probe."""
    return leaf.startswith(".")


def decode_plain_leaf(leaf: str) -> str | None:
    """The chunk name of a plain (not hashed) leaf, or None if no name has this leaf."""
    try:
        name = unquote(leaf, encoding="utf-8", errors="strict")
        return name if name and object_leaf(name) == leaf else None
    except (UnicodeError, ChunkNameInvalid):
        return None


def decode_hashed_leaf(leaf: str, encoded_name: str | None) -> str | None:
    """The chunk name of a hashed leaf from its ``slts-name`` metadata, or None."""
    if not encoded_name:
        return None
    try:
        name = base64.urlsafe_b64decode(encoded_name.encode("ascii")).decode("utf-8")
        return name if object_leaf(name) == leaf else None
    except (ValueError, UnicodeError, ChunkNameInvalid):
        return None


def list_head(prefix: str) -> str:
    """A leaf prefix shared by the leaves of every name starting with ``prefix`` (invariant 3)."""
    return _cut(_encoded_units(prefix), _HASHED_HEAD_BYTES_MAX)


def name_metadata(name: str) -> str:
    """``slts-name``: the chunk name, base64url, for hashed leaves."""
    return base64.urlsafe_b64encode(name.encode("utf-8")).decode("ascii")


def tmp_leaf(now_ms: int, token: str, number: int) -> str:
    """The leaf of a concat's ``number``-th temporary object (``token``: unique per concat)."""
    assert now_ms >= 0 and number >= 0 and token.isalnum(), (now_ms, token, number)
    return f"{TMP_LEAF_PREFIX}{now_ms}~{token}~{number}"


def tmp_leaf_time_ms(leaf: str) -> int | None:
    """When the temporary object ``leaf`` was named (unix ms), None for other leaves."""
    if not leaf.startswith(TMP_LEAF_PREFIX):
        return None
    stamp = leaf[len(TMP_LEAF_PREFIX) :].partition("~")[0]
    return int(stamp) if stamp.isdigit() else None
