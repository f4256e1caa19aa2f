"""Client-side transforms in the engine (docs/security.md): what a bucket reader sees of an
encrypted store's segment chunks, tampering found by reads and by scrub, keys missing or
rotated, concat and native defrag over frames under several keys, restore from tier-2,
appends never reusing a nonce after a failed append, and what compression saves."""

from __future__ import annotations

import json
import os
import random

import pytest
from slts.bindings.base import ChunkStorage
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.journal.restore import restore

from slts.admin.scrub import scrub
from slts.config import StorageConfig
from slts.errors import ChunkCorrupted, InvalidConfig, KeyUnavailable, StorageUnavailable
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.segment_names import SYSTEM_PREFIX
from slts.transforms.frames import FrameMap
from slts.transforms.keys import FolderKeyRing
from slts.transforms.sealed import RecordSeal
from tests.support.engine import key_ring
from tests.support.s3 import s3_storage_binding
from tests.support.s3server import shared_server_or_skip

SECRET = b"card=4111-1111-1111-1111;"
NAMES = ("orders/secret-alpha", "payments/secret-beta")
QUIET = {"gc_delay_s": 10.0, "gc_interval_s": 0.0, "metadata_log_flush_interval_s": 0.0}


def json_values(count: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return b"".join(
        json.dumps({"user": f"u{rng.randrange(900)}", "event": rng.choice(["view", "buy"]), "n": i}).encode()
        + b"\n"
        for i in range(count)
    )


def open_store(
    tmp_path, ring: FolderKeyRing | None, *, binding: ChunkStorage | None = None, **config: object
) -> ChunkedSegmentStorage:
    """A store in ``tmp_path`` (its chunks on ``binding``; by default files in ``chunks``)."""
    binding = binding or FileSystemChunkStorage(str(tmp_path / "chunks"))
    store = LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)
    settings = StorageConfig(**{**QUIET, **config})  # type: ignore[arg-type]
    return ChunkedSegmentStorage(0, None, binding, store, settings, owns_resources=True, key_ring=ring)


def fill(
    storage: ChunkedSegmentStorage, names=NAMES, writes: int = 12, rolling: int = 20_000
) -> dict[str, bytes]:
    rng = random.Random(5)
    written = {}
    for name in names:
        storage.create(name, max_rolling_length=rolling)
        handle = storage.open_write(name)
        data = b""
        for _ in range(writes):
            piece = SECRET * rng.randrange(1, 200) + json_values(rng.randrange(1, 50), rng.randrange(99))
            storage.write(handle, len(data), piece)
            data += piece
        written[name] = data
    return written


def stored_files(tmp_path, *, system: bool = True) -> list[str]:
    """Every file the chunk storage holds (``system``: the journal, the metadata's copy and
    the other system objects too)."""
    root = str(tmp_path / "chunks")
    found = []
    for folder, _, files in os.walk(root):
        for file in files:
            path = os.path.join(folder, file)
            if system or SYSTEM_PREFIX.strip("/") not in os.path.relpath(path, root):
                found.append(path)
    return found


def bucket_objects(bucket: str) -> list[tuple[str, bytes]]:
    """Every object of S3 bucket ``bucket`` on the session's server: (key, contents)."""
    client = shared_server_or_skip().client()
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            found.append((item["Key"], client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()))
    return found


def file_objects(tmp_path) -> list[tuple[str, bytes]]:
    """Every file of the chunk storage in ``tmp_path``: (path, contents)."""
    found = []
    for path in stored_files(tmp_path):
        with open(path, "rb") as file:
            found.append((path, file.read()))
    return found


@pytest.mark.parametrize("binding", ["filesystem", "s3"])
@pytest.mark.parametrize("transforms", [{"encryption": True}, {"encryption": True, "compression_level": 3}])
def test_an_encrypted_store_holds_no_payload_or_name_in_clear_in_any_object(
    tmp_path, transforms, binding
) -> None:
    """Every object of the chunk storage (every file, every object of the store's bucket),
    segment chunks and system objects alike (the journal, the metadata log and a metadata
    snapshot), by its contents and its name: no byte pattern of the payloads, no segment
    name."""
    ring = key_ring(tmp_path)
    chunks = s3_storage_binding(tmp_path) if binding == "s3" else None
    storage = open_store(tmp_path, ring, binding=chunks, frame_bytes=4096, **transforms)
    written = fill(storage)
    storage.durable.flush()
    storage.durable.snapshot()
    assert all(storage.read(storage.open_read(n), 0, len(d)) == d for n, d in written.items())
    storage.close()
    objects = bucket_objects(chunks.bucket) if chunks is not None else file_objects(tmp_path)
    names = [name for name, _ in objects]
    assert len(objects) >= 8 and any("metadata-log" in name for name in names)
    assert any("metadata-snapshots" in name for name in names) and any("journal" in name for name in names)
    needles = [
        SECRET,
        b"4111-1111",
        b'"user"',
        *(part.encode() for name in NAMES for part in name.split("/")),
    ]
    for name, contents in objects:
        assert not any(needle.decode() in name for needle in needles), name
        assert not any(needle in contents for needle in needles), name


@pytest.mark.parametrize("binding", ["filesystem", "s3"])
def test_plain_stores_hold_the_bytes_as_written(tmp_path, binding) -> None:
    """The scan above can fail: without encryption it finds the payloads and the names."""
    chunks = s3_storage_binding(tmp_path) if binding == "s3" else None
    storage = open_store(tmp_path, None, binding=chunks)
    fill(storage, names=NAMES[:1], writes=2)
    storage.close()
    objects = bucket_objects(chunks.bucket) if chunks is not None else file_objects(tmp_path)
    assert any(SECRET in contents for _, contents in objects)
    assert any("secret-alpha" in name for name, _ in objects)


def test_a_flipped_stored_byte_is_chunk_corrupted_on_read_and_a_scrub_finding(tmp_path) -> None:
    ring = key_ring(tmp_path)
    storage = open_store(tmp_path, ring, encryption=True, compression_level=3, frame_bytes=4096)
    written = fill(storage, names=NAMES[:1])
    (_, chunk), *_ = storage.chunks(NAMES[0])
    path = next(p for p in stored_files(tmp_path) if p.endswith(chunk.name.rsplit("/", 1)[-1]))
    with open(path, "r+b") as file:
        file.seek(chunk.stored // 2)
        byte = file.read(1)
        file.seek(chunk.stored // 2)
        file.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ChunkCorrupted):
        storage.read(storage.open_read(NAMES[0]), 0, len(written[NAMES[0]]))
    report = scrub(storage)
    assert [a.kind for a in report.anomalies] == ["checksum"] and report.anomalies[0].chunk == chunk.name
    storage.close()


def test_a_large_read_decodes_its_frames_in_parts_at_once_and_checks_every_one(tmp_path) -> None:
    """A read of at least ``read_parallel_bytes_min`` decoded bytes decodes its frames in
    runs on the decode pool and in the caller's thread at once: the same bytes back, the
    first bad frame in the chunk's order reported, whichever run met one."""
    ring = key_ring(tmp_path)
    storage = open_store(
        tmp_path, ring, encryption=True, frame_bytes=4096, read_parallel_bytes_min=64 << 10, read_threads=4
    )
    data = random.Random(5).randbytes(300_000)
    storage.create("big")
    storage.write(storage.open_write("big"), 0, data)
    assert storage.read(storage.open_read("big"), 0, len(data)) == data
    assert storage.read(storage.open_read("big"), 12_345, 200_000) == data[12_345:212_345]
    (_, chunk), *_ = storage.chunks("big")
    path = next(p for p in stored_files(tmp_path) if p.endswith(chunk.name.rsplit("/", 1)[-1]))
    frames = FrameMap.unpack(chunk.frames)
    for index in (len(frames) - 3, 2):  # a late frame, then an early one too
        with open(path, "r+b") as file:
            file.seek(frames.stored_start(index) + 10)
            byte = file.read(1)
            file.seek(frames.stored_start(index) + 10)
            file.write(bytes([byte[0] ^ 1]))
        with pytest.raises(ChunkCorrupted) as caught:
            storage.read(storage.open_read("big"), 0, len(data))
        assert caught.value.context["offset"] == frames.stored_start(index)
    storage.close()


def test_without_the_key_an_encrypted_store_is_key_unavailable_naming_it_and_changes_nothing(
    tmp_path,
) -> None:
    """No ring, or another ring: opening the store (its journal is sealed) raises
    ``KeyUnavailable`` naming the key, before the epoch commit (nothing changes, nobody is
    fenced); with the ring it opens and reads back."""
    ring = key_ring(tmp_path)
    storage = open_store(tmp_path, ring, encryption=True)
    written = fill(storage, names=NAMES[:1], writes=2)
    key_id = ring.active_id()
    storage.close()
    other = FolderKeyRing.create(str(tmp_path / "other-ring"))
    other.activate(other.add())
    before = LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)
    state = before.dump()
    before.close()
    for wrong in (None, other):
        with pytest.raises(KeyUnavailable) as caught:
            open_store(tmp_path, wrong)
        assert caught.value.key_id == key_id and key_id in str(caught.value)
    after = LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)
    assert after.dump() == state, "no epoch commit, no record changed"
    after.close()
    again = open_store(tmp_path, ring)
    assert again.read(again.open_read(NAMES[0]), 0, len(written[NAMES[0]])) == written[NAMES[0]]
    again.close()


def test_encryption_without_a_key_ring_is_refused_before_anything_is_written(tmp_path) -> None:
    store = MemoryMetadataStore(TABLES)
    binding = FileSystemChunkStorage(str(tmp_path / "chunks"))
    with pytest.raises(InvalidConfig, match="key ring"):
        ChunkedSegmentStorage(0, None, binding, store, StorageConfig(encryption=True, **QUIET))
    assert all(not rows for rows in store.dump().values()), "no epoch, no record"
    assert list(binding.list("")) == []


def test_rotation_wraps_new_chunks_with_the_new_key_and_old_ones_stay_readable(tmp_path) -> None:
    ring = key_ring(tmp_path)
    first = ring.active_id()
    storage = open_store(tmp_path, ring, encryption=True)
    written = fill(storage, names=NAMES[:1], writes=3)
    ring.activate(ring.add("second"))
    written.update(fill(storage, names=NAMES[1:], writes=3))
    used = {n: {key[0] for _, c in storage.chunks(n) for key in c.data_keys} for n in NAMES}
    assert used == {NAMES[0]: {first}, NAMES[1]: {"second"}}
    assert all(storage.read(storage.open_read(n), 0, len(d)) == d for n, d in written.items())
    storage.close()


def test_concat_and_native_defrag_move_frames_under_their_own_keys(tmp_path) -> None:
    """Two segments under two keys, concatenated (metadata only) and defragged natively
    (the filesystem binding concatenates): the merged chunk holds both keys' frames, no
    byte went through the client, and everything reads back."""
    ring = key_ring(tmp_path)
    storage = open_store(
        tmp_path,
        ring,
        encryption=True,
        compression_level=3,
        frame_bytes=1024,
        defrag_small_chunk_bytes=1 << 20,
        concat_merge_seam=False,
    )
    target, donor = NAMES
    written = fill(storage, names=[target], writes=3, rolling=1 << 20)
    ring.activate(ring.add("second"))
    written.update(fill(storage, names=[donor], writes=3, rolling=1 << 20))
    storage.seal(storage.open_write(donor))
    storage.concat(storage.open_write(target), len(written[target]), donor)
    storage.seal(storage.open_write(target))
    whole = written[target] + written[donor]
    result = storage.defrag(target)
    assert result.runs_committed >= 1 and result.bytes_copied == 0
    merged = [c for _, c in storage.chunks(target) if c.data_keys and len(c.data_keys) > 1]
    assert merged and {k[0] for c in merged for k in c.data_keys} >= {ring.ids()[0], "second"}
    assert {f.key_index for c in merged for f in FrameMap.unpack(c.frames)} == set(
        range(len(merged[0].data_keys))
    )
    assert storage.read(storage.open_read(target), 0, len(whole)) == whole
    storage.close()


def test_restore_from_tier2_reads_the_encrypted_chunks_with_the_key_ring(tmp_path) -> None:
    ring = key_ring(tmp_path)
    storage = open_store(tmp_path, ring, encryption=True, compression_level=3)
    written = fill(storage)
    storage.durable.flush()
    binding = storage.chunk_storage
    storage.close()
    plain = FileSystemChunkStorage(str(tmp_path / "chunks"))
    with pytest.raises(KeyUnavailable):  # the copy is sealed: nothing restores without the ring
        restore(plain, 0, MemoryMetadataStore(TABLES))
    restored = MemoryMetadataStore(TABLES)
    restore(plain, 0, restored, seal=RecordSeal(ring, sealing=False))
    revived = ChunkedSegmentStorage(0, None, plain, restored, StorageConfig(**QUIET), key_ring=ring)
    assert all(revived.read(revived.open_read(n), 0, len(d)) == d for n, d in written.items())
    revived.close()
    assert binding is not None


def test_after_a_failed_append_the_next_write_starts_a_new_chunk_under_a_new_key(tmp_path) -> None:
    """An append whose stored bytes may have landed past the recorded ones used ordinals
    that are then unknown: the instance never appends to that chunk again, so no nonce is
    used twice under its key."""
    ring = key_ring(tmp_path)
    binding = FaultyChunkStorage(FileSystemChunkStorage(str(tmp_path / "chunks")), seed=1)
    storage = ChunkedSegmentStorage(
        0, None, binding, MemoryMetadataStore(TABLES), StorageConfig(encryption=True, **QUIET), key_ring=ring
    )
    storage.create("s")
    handle = storage.open_write("s")
    storage.write(handle, 0, b"a" * 5000)
    binding.partial_write(1)  # the next write stores part of its frames, then fails
    with pytest.raises(StorageUnavailable):
        storage.write(handle, 5000, b"b" * 5000)
    storage.write(handle, 5000, b"c" * 5000)
    chunks = [c for _, c in storage.chunks("s")]
    assert len(chunks) == 2 and chunks[0].data_keys != chunks[1].data_keys
    assert all(c.data_keys and len(c.data_keys) == 1 and c.data_keys[0][2] == c.name for c in chunks)
    assert storage.read(handle, 0, 10_000) == b"a" * 5000 + b"c" * 5000
    storage.close()


def test_compression_stores_json_values_in_at_most_a_third_and_skips_compressed_ones(tmp_path) -> None:
    import zstandard

    storage = open_store(tmp_path, None, compression_level=3)
    storage.create("json")
    handle = storage.open_write("json")
    data = json_values(40_000, 1)
    storage.write(handle, 0, data)
    stored = sum(c.stored for _, c in storage.chunks("json"))
    assert stored <= 0.35 * len(data), (stored, len(data))
    storage.create("zstd")
    packed = zstandard.ZstdCompressor().compress(json_values(40_000, 2))
    storage.write(storage.open_write("zstd"), 0, packed)
    assert sum(c.stored for _, c in storage.chunks("zstd")) == len(packed)
    assert storage.read(handle, 0, len(data)) == data
    storage.close()


def test_the_cost_report_prices_the_stored_bytes_and_shows_the_logical_ones(tmp_path) -> None:
    """With zstd and AES-GCM on, the chunks store fewer bytes than their segments hold:
    ``slts cost`` prices what is stored (what the storage bills) and shows both."""
    from slts.cost import cost_report
    from slts.prices import GiB, Prices

    ring = key_ring(tmp_path)
    storage = open_store(tmp_path, ring, encryption=True, compression_level=3, frame_bytes=4096)
    written = fill(storage, names=NAMES[:1], writes=6)
    stored = sum(chunk.stored for _, chunk in storage.chunks(NAMES[0]))
    report = cost_report(storage, Prices(storage_gb_month=1.0))
    assert report.stored.bytes == stored < report.stored.logical_bytes == len(written[NAMES[0]])
    assert report.storage_per_month == pytest.approx(stored / GiB)
    assert report.as_json()["stored"]["logical_bytes"] == len(written[NAMES[0]])
    assert "of segment data" in report.as_text()
    storage.close()
