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
from typing import Protocol

from slts.errors import MetadataCorrupted
from slts.metadata.records import ChunkRecord
from slts.metadata.schema import INDEX, index_key, index_key_offset, index_prefix
from slts.metadata.store import Delete, DeleteRange, Put, ReadView, Versioned

#: First byte of a link entry's value (chunk names never contain NUL).
LINK_TAG = b"\x00"
_LINK = struct.Struct(">QQ")
#: An index key: (namespace, offset), as ``schema.index_key`` packs it.
_KEY_OFFSET = struct.Struct(">QQ")
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


def split_key(key: bytes) -> tuple[int, int]:
    """(namespace, offset) of an index key."""
    namespace, offset = _LINK.unpack(key)
    return namespace, offset


def chunk_entry(chunk: ChunkRecord) -> Put:
    """The chunk's own index entry."""
    return Put(INDEX, index_key(chunk.index_id, chunk.index_offset), chunk.name.encode("utf-8"))


def chunk_entry_delete(chunk: ChunkRecord) -> Delete:
    """Removal of the chunk's own index entry."""
    return Delete(INDEX, index_key(chunk.index_id, chunk.index_offset))


class FloorReader(Protocol):
    """What a lookup needs: a ``ReadView``, or a ``MetadataStore`` (one read per call)."""

    def floor(self, table: str, key: bytes, lowest: bytes = b"") -> tuple[bytes, Versioned] | None: ...


def _floor(view: FloorReader, namespace: int, offset: int) -> tuple[int, str | None, tuple[int, int] | None]:
    found = view.floor(INDEX, index_key(namespace, offset), index_prefix(namespace))
    if found is None:  # a stale cached layout, or a damaged store
        raise MetadataCorrupted(f"index namespace {namespace} has no entry at or below {offset}")
    key, stored = found
    name, link = parse_value(stored.value)
    return index_key_offset(key), name, link


def resolve(view: FloorReader, segment_id: int, offset: int) -> tuple[str, int]:
    """(name, start offset in the segment) of the chunk holding ``offset``.

    ``offset`` must be readable (>= the segment's start, < its length) or the end of a
    chunk boundary the caller knows exists. O(log n) per link level; follows at most
    ``LINK_DEPTH_MAX`` links (``concat`` refuses to build deeper ones), so a deeper chain
    is a damaged store: ``MetadataCorrupted``.
    """
    namespace, at, shift = segment_id, offset, 0  # segment offset == namespace offset + shift
    for _ in range(LINK_DEPTH_MAX + 1):
        start, name, link = _floor(view, namespace, at)
        if name is not None:
            return name, start + shift
        assert link is not None
        target_namespace, target_offset = link
        shift += start - target_offset
        at = at - start + target_offset
        namespace = target_namespace
    raise MetadataCorrupted(
        f"index links of segment {segment_id} deeper than {LINK_DEPTH_MAX} at offset {offset}"
    )


def split_ops(view: ReadView, segment_id: int, offset: int) -> list[Put]:
    """Operations that give every namespace on the lookup path of ``offset`` (a chunk
    boundary) a key exactly at the offset it maps to, resolving as before, so that keys
    below it may be removed (``clear_ops``) in any of those namespaces."""
    ops: list[Put] = []
    namespace, at = segment_id, offset
    for _ in range(LINK_DEPTH_MAX + 1):
        start, name, link = _floor(view, namespace, at)
        if name is not None:
            assert start == at, f"offset {offset} of segment {segment_id} is inside chunk {name!r}"
            return ops
        assert link is not None
        target_namespace, target_offset = link
        mapped = target_offset + at - start
        if start != at:
            ops.append(Put(INDEX, index_key(namespace, at), link_value(target_namespace, mapped)))
        namespace, at = target_namespace, mapped
    raise MetadataCorrupted(
        f"index links of segment {segment_id} deeper than {LINK_DEPTH_MAX} at offset {offset}"
    )


def clear_bound(chunks: int) -> int:
    """Most keys ``clear_ops`` removes for a range holding ``chunks`` chunks: per link
    level, each key starts a chunk boundary and covers at least one whole chunk."""
    return (chunks + 1) * (LINK_DEPTH_MAX + 1)


def clear_ops(view: ReadView, segment_id: int, low: int, high: int, limit: int) -> list[Delete]:
    """Removal of every index key that serves only offsets ``[low, high)`` of the segment.

    That is the segment namespace's keys in the range and, through every link that maps
    part of the range (a key in it, or the link at the floor of ``low``), the keys of the
    mapped range in the linked namespace, recursively: concat links lead into namespaces
    of segments that are gone, which nothing else reaches. Offsets at and above ``high``
    that stay readable need ``split_ops(view, segment_id, high)`` in the same commit.
    Removes at most ``limit`` keys (``clear_bound``); more is a broken index (assertion).
    """
    deletes: list[Delete] = []
    pending = [(segment_id, low, high, 0)]
    while pending:
        namespace, lo, hi, depth = pending.pop()
        if depth > LINK_DEPTH_MAX:
            raise MetadataCorrupted(f"index links of segment {segment_id} deeper than {LINK_DEPTH_MAX}")
        entries = view.scan(
            INDEX, index_key(namespace, lo), index_key(namespace, hi), limit=limit - len(deletes) + 1
        )
        assert len(deletes) + len(entries) <= limit, (
            f"more than {limit} index keys serve [{low}, {high}) of {segment_id}"
        )
        first = index_key_offset(entries[0][0]) if entries else hi
        if first > lo:  # a link below ``lo`` may map part of the range
            found = view.floor(INDEX, index_key(namespace, lo), index_prefix(namespace))
            if found is not None:
                start = index_key_offset(found[0])
                _, link = parse_value(found[1].value)
                if link is not None:
                    pending.append((link[0], link[1] + lo - start, link[1] + first - start, depth + 1))
        for i, (key, stored) in enumerate(entries):
            deletes.append(Delete(INDEX, key))
            _, link = parse_value(stored.value)
            if link is not None:
                start = index_key_offset(key)
                end = index_key_offset(entries[i + 1][0]) if i + 1 < len(entries) else hi
                pending.append((link[0], link[1], link[1] + end - start, depth + 1))
    return deletes


#: A stretch of one namespace a walk (``head_walk``) went through: namespace, first and
#: end offset (namespace coordinates, end excluded), and the shift to the segment's
#: coordinates (segment offset == namespace offset + shift).
Span = tuple[int, int, int, int]


def head_walk(
    view: ReadView, segment_id: int, low: int, high: int, limit: int
) -> tuple[list[tuple[int, str]], list[Span]]:
    """The chunks of the segment whose start lies in ``[low, high]`` (segment offsets;
    ``low`` a chunk boundary), in offset order, at most ``limit``: (start, name) each,
    read from the index alone (no chunk record), following links at any depth. With them,
    the spans of every namespace the walk went through, so that ``clear_range_ops`` can
    drop the keys serving a prefix of it with one ``DeleteRange`` per span.

    Reads about one index entry per chunk, so a truncate learns the names of the chunks it
    drops, and the first one it keeps, without decoding a chunk record.
    """
    assert limit >= 1 and low <= high, (low, high, limit)
    chunks: list[tuple[int, str]] = []
    spans: list[Span] = []

    def visit(namespace: int, lo: int, end: int, shift: int, depth: int) -> None:
        """Walk namespace offsets ``[lo, end)``."""
        if depth > LINK_DEPTH_MAX:
            raise MetadataCorrupted(f"index links of segment {segment_id} deeper than {LINK_DEPTH_MAX}")
        spans.append((namespace, lo, end, shift))
        entries = view.scan_values(
            INDEX, index_key(namespace, lo), index_key(namespace, end), limit=limit - len(chunks) + 1
        )
        first = index_key_offset(entries[0][0]) if entries else end
        if first > lo:  # the stretch before the first key: a link below ``lo`` maps it
            found = view.floor(INDEX, index_key(namespace, lo), index_prefix(namespace))
            if found is not None:
                start = index_key_offset(found[0])
                _, link = parse_value(found[1].value)
                if link is not None:
                    target, at = link
                    visit(target, at + lo - start, at + first - start, shift + start - at, depth + 1)
        for i, (key, value) in enumerate(entries):
            if len(chunks) >= limit:
                return
            start = _KEY_OFFSET.unpack(key)[1]
            if value[:1] != LINK_TAG:  # a chunk entry (parse_value, written out: one per chunk)
                chunks.append((start + shift, value.decode("utf-8")))
                continue
            target, at = _LINK.unpack(value[1:])
            stop = index_key_offset(entries[i + 1][0]) if i + 1 < len(entries) else end
            visit(target, at, at + stop - start, shift + start - at, depth + 1)

    visit(segment_id, low, high + 1, 0, 0)
    return chunks, spans


def clear_range_ops(spans: list[Span], low: int, high: int) -> list[DeleteRange]:
    """``clear_ops(view, segment_id, low, high, ...)`` as ranges: one ``DeleteRange`` per
    stretch of a namespace that ``head_walk`` went through (from ``low``, to ``high`` or
    beyond) that serves offsets of ``[low, high)``. Removes exactly the keys ``clear_ops``
    removes; offsets at and above ``high`` that stay readable need
    ``split_ops(view, segment_id, high)`` in the same commit, before these."""
    ops: list[DeleteRange] = []
    for namespace, lo, end, shift in spans:
        first, stop = max(lo, low - shift), min(end, high - shift)
        if first < stop:
            ops.append(DeleteRange(INDEX, index_key(namespace, first), index_key(namespace, stop)))
    return ops


def concat_link(target_id: int, target_offset: int, source_id: int, source_offset: int) -> Put:
    """The link that splices the source's namespace into the target's at ``target_offset``."""
    return Put(INDEX, index_key(target_id, target_offset), link_value(source_id, source_offset))


def namespace_tree_keys(view: ReadView, segment_id: int, limit: int) -> tuple[list[bytes], bool]:
    """Up to ``limit`` keys of the namespace and of the namespaces its links lead to, in
    post-order: a link's key comes only after every key of the namespace it leads to, so
    deleting any prefix of the list never cuts a namespace off while it still has keys.
    Returns (keys, whether they are all of them). For the collection of a deleted segment
    in bounded batches: each batch deletes what the previous one left, starting again from
    the top, and reaches every namespace that is left.
    """
    keys: list[bytes] = []
    emptied: set[int] = set()

    def visit(namespace: int, depth: int) -> bool:
        if depth > LINK_DEPTH_MAX:
            raise MetadataCorrupted(f"index links of segment {segment_id} deeper than {LINK_DEPTH_MAX}")
        cursor, stop = index_prefix(namespace), _namespace_stop(namespace)
        while len(keys) < limit:
            entries = view.scan(INDEX, cursor, stop, limit - len(keys))
            if not entries:
                return True
            for key, stored in entries:
                _, link = parse_value(stored.value)
                if link is not None and link[0] not in emptied:
                    if not visit(link[0], depth + 1):
                        return False
                    emptied.add(link[0])
                if len(keys) == limit:
                    return False
                keys.append(key)
            cursor = entries[-1][0] + b"\x00"
        return False

    done = visit(segment_id, 0)
    return keys, done


def namespace_depth(view: ReadView, segment_id: int) -> int:
    """Most links a lookup in the segment's namespace follows, read from the index (for
    records written before ``SegmentRecord.index_depth`` was kept). Reads every key of
    the namespace and of those it links to."""

    def depth_below(namespace: int, level: int) -> int:
        if level > LINK_DEPTH_MAX:
            raise MetadataCorrupted(f"index links of segment {segment_id} deeper than {LINK_DEPTH_MAX}")
        deepest, cursor, stop = 0, index_prefix(namespace), _namespace_stop(namespace)
        while entries := view.scan(INDEX, cursor, stop):
            for _, stored in entries:
                _, link = parse_value(stored.value)
                if link is not None:
                    deepest = max(deepest, 1 + depth_below(link[0], level + 1))
            cursor = entries[-1][0] + b"\x00"
        return deepest

    return depth_below(segment_id, 0)


def _namespace_stop(namespace: int) -> bytes | None:
    """The first key after every key of ``namespace`` (None past the last namespace)."""
    return index_prefix(namespace + 1) if namespace + 1 < 1 << 64 else None
