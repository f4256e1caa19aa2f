"""Export and import of one segment's metadata (PDP-34 backup/restore)."""

from __future__ import annotations

from slts.admin.backup import export_segment, import_segment, parse_export
from slts.admin.verify import verify_container, verify_segment
from slts.errors import ChunkNotFound, InvalidArgument, MetadataCorrupted, SegmentExists
from tests.support.engine import Env

from .test_bad_input import expect_unchanged
from .test_layout_changes import content, fill


def test_export_then_import_into_a_store_that_lost_it(env: Env) -> None:
    storage = env.open(concat_merge_seam=False)
    fill(storage, "s", b"head" * 10, piece=5, rolling=8)
    fill(storage, "tx", b"tail" * 5, piece=5, rolling=8, seal=True)
    storage.concat(storage.open_write("s"), 40, "tx")  # a link in the index
    handle = storage.open_write("s")
    storage.truncate(handle, 9)
    expected = content(storage, "s")
    document = export_segment(storage, "s")
    record, chunks = parse_export(document)
    assert record.name == "s" and len(chunks) == record.chunk_count

    # Lose the segment's metadata (not its chunks): drop its records by hand.
    from slts.metadata.schema import CHUNKS, SEGMENTS, name_key
    from slts.metadata.store import Delete

    env.store.commit(
        [Delete(SEGMENTS, name_key("s"))] + [Delete(CHUNKS, name_key(c.name)) for _, c in chunks]
    )
    fresh = env.reopen()
    assert not fresh.exists("s")
    info = import_segment(fresh, document)
    assert (info.start_offset, info.length) == (9, 60)
    assert content(fresh, "s") == expected
    assert verify_segment(fresh, "s") == []
    handle = fresh.open_write("s")
    fresh.write(handle, 60, b"+more")
    assert content(fresh, "s") == expected + b"+more"


def test_bad_imports_change_nothing(env: Env) -> None:
    storage = env.open()
    fill(storage, "s", b"0123456789", piece=5, rolling=5)
    document = export_segment(storage, "s")
    expect_unchanged(env, SegmentExists, lambda: import_segment(storage, document))
    expect_unchanged(
        env, MetadataCorrupted, lambda: import_segment(storage, document[:-1] + b"\x00", name="t")
    )
    expect_unchanged(env, MetadataCorrupted, lambda: import_segment(storage, b"nonsense", name="t"))
    # The chunks are referenced by "s" already: an import under another name must fail whole.
    expect_unchanged(env, InvalidArgument, lambda: import_segment(storage, document, name="t"))
    assert verify_container(storage).problems == []
    storage.delete(storage.open_write("s"))
    env.clock.advance(100)
    while storage.gc.run_once().progressed:  # the chunks the export names are gone
        pass
    expect_unchanged(env, ChunkNotFound, lambda: import_segment(storage, document, name="u"))
