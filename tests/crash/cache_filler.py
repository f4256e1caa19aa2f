"""Crash-test child: reads random ranges of deterministic chunks through a chunk cache,
so that fills are being written all the time, and reports each read on stdout.

Run as ``python cache_filler.py FOLDER SEED``; it never stops by itself (the parent kills
it with SIGKILL). The chunks (``chunk_bytes``) live in a memory binding flagged remote:
the parent regenerates them to check what the cache holds after the kill.
"""

from __future__ import annotations

import random
import sys

CHUNKS = 6
CHUNK_BYTES_MAX = 3 << 20
BLOCK_BYTES = 256 << 10
#: Room for about half the chunks: the child evicts while it fills.
CAPACITY_BYTES = 8 << 20


def chunk_name(index: int) -> str:
    return f"0/crash/E1.O{index}.chunk"


def chunk_bytes(index: int) -> bytes:
    rng = random.Random(f"chunk-{index}")
    return rng.randbytes(rng.randint(1, CHUNK_BYTES_MAX))


def main(folder: str, seed: int) -> None:
    from slts.bindings.base import ChunkHandle

    from tests.support.chunk_cache import RemoteMemoryChunkStorage, cached

    inner = RemoteMemoryChunkStorage("memory://crash-cache")
    for index in range(CHUNKS):
        inner.create(chunk_name(index), chunk_bytes(index))
    storage = cached(
        inner, folder, capacity_bytes=CAPACITY_BYTES, block_bytes=BLOCK_BYTES, fill_bytes_max=4 << 20
    )
    rng = random.Random(seed)
    print("READY", flush=True)
    for step in range(10_000_000):  # bounded; the parent kills it long before
        index = rng.randrange(CHUNKS)
        data = chunk_bytes(index)
        offset = rng.randrange(len(data))
        length = rng.randint(1, len(data) - offset)
        got = storage.read(ChunkHandle(chunk_name(index), readonly=True), offset, length)
        assert got == data[offset : offset + length], (index, offset, length)
        print(f"READ {step}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[3] if len(sys.argv) > 3 else ".")
    main(sys.argv[1], int(sys.argv[2]))
