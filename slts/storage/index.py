"""The offset index: from a segment offset to the chunk holding it in O(log n), with O(1) concat.

Every segment has an index *namespace* (its ``segment_id``); offsets in a namespace are
the offsets of the segment that owns it. The ``index`` table holds two kinds of entry,
keyed ``(namespace, offset)``:

* a **chunk entry** (value: the chunk's name): a chunk starts at ``offset``;
* a **link entry** (value: ``LINK_TAG`` + namespace + offset, see ``link_value``): from
  ``offset`` on, up to the namespace's next key, offsets continue in another
  namespace at the given offset.

``resolve`` takes the ``floor`` entry at the wanted offset and follows links, so a
lookup costs one O(log n) seek per link level. ``concat`` adds one link in the
target's namespace to the (sealed, gone) source's namespace instead of rewriting the
source's entries: its cost does not depend on the number of chunks.

Rules every layout change keeps (``tests/storage`` check them through ``verify``):

* A chunk's own entry is at ``(chunk.index_id, chunk.index_offset)``, written when the
  chunk joins a segment and never moved; namespace coordinates never shift.
* Resolving any readable offset of a segment yields the chunk the linked list puts
  there. Changes that remove keys first *split* the namespace at the new boundary
  (``split_ops``), so offsets above it resolve as before.
"""

from __future__ import annotations

import struct

from slts.errors import MetadataCorrupted
from slts.metadata.layout import INDEX, index_key, index_key_offset, index_prefix
from slts.metadata.records import ChunkRecord
from slts.metadata.store import Delete, Put, ReadView

#: First byte of a link entry's value (chunk names never contain NUL).
LINK_TAG = b"\x00"
_LINK = struct.Struct(">QQ")
#: Deepest chain of links a lookup follows (concat of a concat of a concat ...).
LINK_DEPTH_MAX = 64


def link_value(namespace: int, offset: int) -> bytes:
    """The value of a link entry to ``offset`` of ``namespace``."""
    return LINK_TAG + _LINK.pack(namespace, offset)


def parse_value(raw: bytes) -> tuple[str | None, tuple[int, int] | None]:
    """(chunk name, None) for a chunk entry, (None, (namespace, offset)) for a link."""
    if raw[:1] == LINK_TAG:
        namespace, offset = _LINK.unpack(raw[1:])
        return None, (namespace, offset)
    return raw.decode("utf-8"), None


def chunk_entry(chunk: ChunkRecord) -> Put:
    """The chunk's own index entry."""
    return Put(INDEX, index_key(chunk.index_id, chunk.index_offset), chunk.name.encode("utf-8"))


def chunk_entry_delete(chunk: ChunkRecord) -> Delete:
    """Removal of the chunk's own index entry."""
    return Delete(INDEX, index_key(chunk.index_id, chunk.index_offset))


def _floor(view: ReadView, namespace: int, offset: int) -> tuple[int, str | None, tuple[int, int] | None]:
    found = view.floor(INDEX, index_key(namespace, offset), index_prefix(namespace))
    if found is None:  # a stale cached layout, or a damaged store
        raise MetadataCorrupted(f"index namespace {namespace} has no entry at or below {offset}")
    key, stored = found
    name, link = parse_value(stored.value)
    return index_key_offset(key), name, link


def resolve(view: ReadView, segment_id: int, offset: int) -> tuple[str, int]:
    """(name, start offset in the segment) of the chunk holding ``offset``.

    ``offset`` must be readable (>= the segment's start, < its length) or the end of a
    chunk boundary the caller knows exists. O(log n) per link level.
    """
    namespace, at, shift = segment_id, offset, 0  # segment offset == namespace offset + shift
    for _ in range(LINK_DEPTH_MAX):
        start, name, link = _floor(view, namespace, at)
        if name is not None:
            return name, start + shift
        assert link is not None
        target_namespace, target_offset = link
        shift += start - target_offset
        at = at - start + target_offset
        namespace = target_namespace
    raise AssertionError(f"index links of segment {segment_id} deeper than {LINK_DEPTH_MAX}")


def split_ops(view: ReadView, segment_id: int, offset: int) -> list[Put]:
    """Operations that give the segment's namespace a key exactly at ``offset`` (a chunk
    boundary) resolving as before, so that keys below it may be removed."""
    start, name, link = _floor(view, segment_id, offset)
    if start == offset:
        return []
    assert link is not None, f"offset {offset} of segment {segment_id} is inside chunk {name!r}"
    namespace, target_offset = link
    return [Put(INDEX, index_key(segment_id, offset), link_value(namespace, target_offset + offset - start))]


def clear_ops(view: ReadView, segment_id: int, low: int, high: int, limit: int) -> list[Delete]:
    """Removal of the segment namespace's keys in ``[low, high)`` (at most ``limit``)."""
    entries = view.scan(INDEX, index_key(segment_id, low), index_key(segment_id, high), limit=limit + 1)
    assert len(entries) <= limit, f"more than {limit} index keys in [{low}, {high}) of segment {segment_id}"
    return [Delete(INDEX, key) for key, _ in entries]


def concat_link(target_id: int, target_offset: int, source_id: int, source_offset: int) -> Put:
    """The link that splices the source's namespace into the target's at ``target_offset``."""
    return Put(INDEX, index_key(target_id, target_offset), link_value(source_id, source_offset))


def linked_namespaces(view: ReadView, segment_id: int, limit: int) -> tuple[list[bytes], list[int]]:
    """Up to ``limit`` keys of the namespace, and the namespaces its links point to."""
    start = index_prefix(segment_id)
    entries = view.scan(INDEX, start, index_key(segment_id + 1, 0) if segment_id + 1 < 1 << 64 else None, limit)
    keys, targets = [], []
    for key, stored in entries:
        keys.append(key)
        _, link = parse_value(stored.value)
        if link is not None:
            targets.append(link[0])
    return keys, targets
