"""Truncate drops its head as a range: the range path equals the per-key path.

On random layouts (writes rolled at random sizes, concats nested into each other, earlier
truncates, defrags), for a random new start and batch size:

* the dropped run read from the offset index (``index.head_walk`` + ``_head_run``) is the
  run the linked list (the truth) gives, with the same first kept chunk and its start;
* the index keys the ``DeleteRange``s of ``index.clear_range_ops`` remove are exactly the
  keys ``index.clear_ops`` removes one by one;
* the truncate itself leaves a healthy container with the same bytes, and GC collects
  every dropped chunk (one queue entry per batch).
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slts.admin.verify import verify_container
from slts.metadata import index
from slts.metadata.records import GcEntry
from slts.metadata.schema import GC, INDEX, name_key
from slts.metadata.store import scan_all
from slts.storage.context import walk_chunks
from slts.storage.factory import open as open_storage
from slts.storage.layout_changes import _head_run

_names = itertools.count()


def _build(data: st.DataObject):  # type: ignore[no-untyped-def]
    storage = open_storage(
        f"memory://ranges-{next(_names)}", metadata=":memory:", gc_interval_s=0.0, gc_delay_s=0.0
    )
    content = bytearray()
    storage.create("s", max_rolling_length=data.draw(st.integers(1, 9)))
    handle = storage.open_write("s")
    for round_ in range(data.draw(st.integers(1, 4))):
        for _ in range(data.draw(st.integers(0, 4))):
            piece = bytes([round_ + 1]) * data.draw(st.integers(1, 12))
            storage.write(handle, len(content), piece)
            content += piece
        if data.draw(st.booleans()):  # a concat of a source that may hold concats itself
            source = f"c{round_}"
            storage.create(source, max_rolling_length=data.draw(st.integers(1, 9)))
            inner = storage.open_write(source)
            grown = bytearray()
            for _ in range(data.draw(st.integers(0, 3))):
                piece = bytes([100 + round_]) * data.draw(st.integers(1, 10))
                storage.write(inner, len(grown), piece)
                grown += piece
            if data.draw(st.booleans()):
                nested = f"n{round_}"
                storage.create(nested, max_rolling_length=4)
                deeper = storage.open_write(nested)
                storage.write(deeper, 0, b"N" * data.draw(st.integers(1, 9)))
                storage.seal(deeper)
                storage.concat(inner, len(grown), nested)
                added = storage.info(source).length - len(grown)
                grown += storage.read(storage.open_read(source), len(grown), added)
            storage.seal(inner)
            storage.concat(handle, len(content), source)
            content += grown
        if data.draw(st.booleans()) and len(content):
            storage.truncate(handle, data.draw(st.integers(0, len(content))))
        if data.draw(st.booleans()):
            storage.defrag("s")
    return storage, handle, bytes(content)


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_range_path_equals_per_key_path(data: st.DataObject) -> None:
    storage, handle, content = _build(data)
    try:
        store = storage.context.store
        record = storage.context.load("s")[0]
        new_start = data.draw(st.integers(record.start_offset, record.length))
        limit = data.draw(st.integers(1, 6))
        with store.snapshot() as view:
            listed, problems = walk_chunks(view, record)
            assert problems == []
            if record.first_chunk is not None:
                # The truth: the list's head, chunk by chunk.
                expected = []
                for start, chunk in listed:
                    if len(expected) == limit or start + chunk.length > new_start:
                        break
                    expected.append((start, chunk.name))
                rest = listed[len(expected) :]
                want_kept = (rest[0][1].name, rest[0][0]) if rest else (None, new_start)
                walked, spans = index.head_walk(
                    view, record.segment_id, record.first_chunk_start_offset, new_start, limit + 1
                )
                dropped, kept, start = _head_run(record, walked, new_start, limit)
                assert dropped == expected
                assert (kept, start) == want_kept
                if dropped:
                    end = start if kept is not None else record.length + 1
                    per_key = {
                        op.key
                        for op in index.clear_ops(
                            view, record.segment_id, record.first_chunk_start_offset, end, 10**6
                        )
                    }
                    ranged = {
                        key
                        for op in index.clear_range_ops(spans, record.first_chunk_start_offset, end)
                        for key, _ in scan_all(view, INDEX, op.start, op.stop)
                    }
                    assert ranged == per_key
        storage.truncate(handle, new_start)
        after = storage.info("s")
        assert after.start_offset == max(record.start_offset, new_start)
        kept = after.length - after.start_offset
        assert storage.read(storage.open_read("s"), after.start_offset, kept) == content[after.start_offset :]
        assert verify_container(storage).problems == []
        for _, stored in scan_all(store, GC):
            entry = GcEntry.decode(stored.value)
            assert store.get("chunks", name_key(entry.chunk)) is None
        while storage.gc.run_once().progressed:
            pass
        assert storage.check_leaks().chunk_records == 0
        assert verify_container(storage).problems == []
    finally:
        storage.close()
