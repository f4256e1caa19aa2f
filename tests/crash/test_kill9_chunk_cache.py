"""Kill -9 a process while it fills its chunk cache: after the restart the cache serves
only whole, verified bytes (docs/chunk_cache.md; ``slts.bindings.chunk_cache.files``
invariants 1-3, the cache's invariant 2).

The child (``cache_filler.py``) reads random ranges of deterministic chunks through a
cache much smaller than them, so that background fills, evictions and merges are always
under way; it is killed after a random number of reads. Then, in this process, the
cache is opened on the folder again: no temporary file is left, the files on disk hold
at most the capacity, every file the index holds is verified whole against the chunk's
true bytes, and reads through the reopened cache equal the chunks.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from slts.bindings.base import ChunkHandle
from slts.bindings.chunk_cache import files

from tests.support.chunk_cache import RemoteMemoryChunkStorage, cached

from . import cache_filler

ROUNDS = 6
ROOT = str(Path(__file__).resolve().parents[2])


def run_until_killed(folder: str, seed: int, reads: int) -> None:
    child = subprocess.Popen(
        [sys.executable, cache_filler.__file__, folder, str(seed), ROOT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("READY"), (line, child.stderr.read() if child.stderr else "")
        for _ in range(reads):
            line = child.stdout.readline()
            assert line.startswith("READ"), (line, child.stderr.read() if child.stderr else "")
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL


def check(folder: str) -> int:
    """Open the cache on ``folder`` as a restarted process would; check it; return how
    many files it held."""
    inner = RemoteMemoryChunkStorage("memory://crash-cache")  # the child's URL: its keys
    names = {}
    for index in range(cache_filler.CHUNKS):
        inner.create(cache_filler.chunk_name(index), cache_filler.chunk_bytes(index))
    storage = cached(
        inner,
        folder,
        capacity_bytes=cache_filler.CAPACITY_BYTES,
        block_bytes=cache_filler.BLOCK_BYTES,
    )
    try:
        cache = storage.cache
        for index in range(cache_filler.CHUNKS):
            names[cache.key_of(storage.url, cache_filler.chunk_name(index))] = index
        assert os.listdir(os.path.join(folder, files.TMP_FOLDER)) == []
        on_disk = [
            entry.stat().st_size
            for sub in os.scandir(os.path.join(folder, files.BLOCKS_FOLDER))
            for entry in os.scandir(sub.path)
        ]
        assert sum(on_disk) == cache.index.committed <= cache_filler.CAPACITY_BYTES
        held = cache.index.files()
        assert len(on_disk) == len(held)
        for file in held:  # whole and verified: every byte the file holds is the chunk's
            data = cache_filler.chunk_bytes(names[file.key])
            assert files.read_checked(file, file.start, file.length) == data[file.start : file.end]
        reads_before = cache.statistics().misses
        for file in held:  # and served as such
            index = names[file.key]
            handle = ChunkHandle(cache_filler.chunk_name(index), readonly=True)
            data = cache_filler.chunk_bytes(index)
            assert storage.read(handle, file.start, file.length) == data[file.start : file.end]
        assert cache.statistics().misses == reads_before
        return len(held)
    finally:
        storage.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_cache_killed_while_filling_serves_only_whole_verified_bytes(tmp_path, seed: int) -> None:
    folder = str(tmp_path / "cache")
    rng = random.Random(seed)
    held = []
    for round_ in range(ROUNDS):
        run_until_killed(folder, seed * 100 + round_, rng.randint(1, 40))
        held.append(check(folder))
    assert any(held), "no round left a file: the test did not exercise a restart with data"
