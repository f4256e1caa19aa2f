"""Client-side transforms on the HDFS binding (the WebHDFS test double): an encrypted,
compressed store's segments round-trip through appends, concat and a defrag that copies
frames (HDFS has no native concat here), no file of the store holds a payload pattern or
a segment name in clear, and a flipped stored byte is ``ChunkCorrupted``."""

from __future__ import annotations

import random

import pytest
from slts.bindings.hdfs import chunk_relpath

from slts.config import StorageConfig
from slts.errors import ChunkCorrupted
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import key_ring

SECRET = b"iban=DE89-3704-0044-0532-0130-00;"
NAMES = ("ledger/secret-gamma", "ledger/secret-delta")


def files(server, folder: str) -> dict[str, bytes]:
    """Every file under ``folder`` on the server, by path."""
    found = {}
    for name in server.raw_list(folder):
        path = f"{folder}/{name}"
        if server.raw_exists(path):
            found[path] = server.raw_read(path)
        else:
            found.update(files(server, path))
    return found


def test_an_encrypted_store_on_hdfs_round_trips_and_keeps_nothing_in_clear(storage, server, root, tmp_path):
    ring = key_ring(tmp_path)
    config = StorageConfig(
        encryption=True,
        compression_level=3,
        frame_bytes=4096,
        gc_interval_s=0.0,
        defrag_small_chunk_bytes=1 << 20,
    )
    store = LmdbMetadataStore(str(tmp_path / "metadata"), TABLES)
    engine = ChunkedSegmentStorage(0, None, storage, store, config, key_ring=ring)
    try:
        check_round_trip(engine, server, root)
    finally:
        engine.close()
        store.close()


def check_round_trip(engine: ChunkedSegmentStorage, server, root: str) -> None:
    rng = random.Random(3)
    written = {}
    for name in NAMES:
        engine.create(name, max_rolling_length=20_000)
        data = b""
        for _ in range(8):  # appends to the chunk under its key, new chunks past 20,000 bytes
            piece = SECRET * rng.randrange(1, 60) + rng.randbytes(rng.randrange(1, 3000))
            engine.write(engine.open_write(name), len(data), piece)
            data += piece
        written[name] = data
    engine.seal(engine.open_write(NAMES[1]))
    engine.concat(engine.open_write(NAMES[0]), len(written[NAMES[0]]), NAMES[1])
    whole = written[NAMES[0]] + written[NAMES[1]]
    engine.defrag(NAMES[0])
    chunks = [chunk for _, chunk in engine.chunks(NAMES[0])]
    assert len(chunks) < 8 and all(chunk.data_keys for chunk in chunks)
    assert engine.read(engine.open_read(NAMES[0]), 0, len(whole)) == whole
    assert engine.read(engine.open_read(NAMES[0]), 777, 12_345) == whole[777 : 777 + 12_345]

    stored = files(server, root)
    assert len(stored) >= len(chunks)
    needles = [SECRET, b"DE89-3704", *(part.encode() for name in NAMES for part in name.split("/"))]
    for path, contents in stored.items():
        assert not any(needle.decode() in path for needle in needles), path
        assert not any(needle in contents for needle in needles), path

    victim = f"{root}/{chunk_relpath(chunks[0].name)}"
    flipped = bytearray(stored[victim])
    flipped[len(flipped) // 2] ^= 1
    server.raw_write(victim, bytes(flipped))
    with pytest.raises(ChunkCorrupted):
        engine.read(engine.open_read(NAMES[0]), 0, len(whole))
