"""The cache never changes what a read returns: random programs of creates, appends,
truncates, deletes, reads, corruptions of cached files and restarts of the cache, each
read through the cache compared with the same read of the uncached binding (the
reference), errors included. A small cache, so evictions happen all the time."""

from __future__ import annotations

import os
import random
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st
from slts.bindings.base import ChunkHandle
from slts.bindings.chunk_cache import CachedChunkStorage, files

from slts.errors import SltsError
from tests.support.chunk_cache import RemoteMemoryChunkStorage, cached

BLOCK = 4096
CAPACITY = 6 * (BLOCK + files.trailer_bytes(BLOCK))
NAMES = ("a", "b", "c")

step = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(0, 5 * BLOCK)),
    st.tuples(st.just("append"), st.sampled_from(NAMES), st.integers(1, 2 * BLOCK)),
    st.tuples(st.just("truncate"), st.sampled_from(NAMES), st.floats(0, 1)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("read"), st.sampled_from(NAMES), st.floats(0, 1.1), st.integers(0, 3 * BLOCK)),
    st.tuples(st.just("corrupt"), st.integers(0, 1000)),
    st.tuples(st.just("drain")),
    st.tuples(st.just("restart")),
)


def outcome(call):
    try:
        return ("ok", bytes(call()))
    except SltsError as exc:
        return ("error", type(exc).__name__)


@settings(max_examples=100, deadline=None)
@given(st.lists(step, max_size=50), st.integers(0, 2**32))
def test_reads_through_the_cache_equal_reads_of_the_binding(program, seed) -> None:
    rng = random.Random(seed)
    reference = RemoteMemoryChunkStorage("memory://cache-model")
    with tempfile.TemporaryDirectory() as folder:
        storage: CachedChunkStorage = cached(reference, folder, capacity_bytes=CAPACITY, block_bytes=BLOCK)
        try:
            for action in program:
                kind = action[0]
                if kind == "create":
                    _, name, length = action
                    if not reference.exists(name):
                        storage.create(name, rng.randbytes(length))
                elif kind == "append":
                    _, name, length = action
                    if reference.exists(name):
                        handle = storage.open_write(name)
                        storage.write(handle, reference.get_info(name).length, rng.randbytes(length))
                elif kind == "truncate":
                    _, name, fraction = action
                    if reference.exists(name):
                        length = int(reference.get_info(name).length * fraction)
                        storage.truncate(storage.open_write(name), length)
                elif kind == "delete":
                    if reference.exists(action[1]):
                        storage.delete(storage.open_write(action[1]))
                elif kind == "read":
                    _, name, fraction, length = action
                    size = reference.get_info(name).length if reference.exists(name) else BLOCK
                    offset = int(size * fraction)
                    for read in (storage.read, storage.read_view):
                        # A handle built, not opened, as the engine reads: a missing chunk too.
                        handle = ChunkHandle(name, readonly=True)
                        got = outcome(lambda: read(handle, offset, length))  # noqa: B023
                        want = outcome(lambda: reference.read(handle, offset, length))  # noqa: B023
                        assert got == want, (name, offset, length)
                elif kind == "corrupt":
                    held = storage.cache.index.files()
                    if held:
                        victim = held[action[1] % len(held)]
                        with open(victim.path, "r+b") as file:
                            at = action[1] % victim.length
                            file.seek(at)
                            byte = file.read(1)
                            file.seek(at)
                            file.write(bytes([byte[0] ^ 0xFF]))
                elif kind == "drain":
                    storage.cache.drain()
                else:  # a restart of the process's cache: rebuilt from the folder
                    storage.close()
                    storage = cached(reference, folder, capacity_bytes=CAPACITY, block_bytes=BLOCK)
                statistics = storage.chunk_cache_statistics()
                assert statistics.bytes <= CAPACITY
            assert (
                sum(
                    entry.stat().st_size
                    for sub in os.scandir(os.path.join(folder, files.BLOCKS_FOLDER))
                    for entry in os.scandir(sub.path)
                )
                <= CAPACITY
            )
        finally:
            storage.close()
