"""Kill -9 a writer at random points: every acknowledged write survives, nothing else shows.

DESIGN.md §5 invariants 2 and 6. The writer (``writer.py``) acknowledges a write only
after ``write`` returned. After each kill the container is reopened (a new epoch), every
segment is checked against the deterministic stream the writer produces, and at the end
the garbage collector must leave exactly the referenced chunks on storage.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys

import pytest
from slts.tools.simulation.checks import NonceLedger

from . import writer

ROUNDS = 10
SEGMENTS = 3


def run_until_killed(folder: str, rng: random.Random, acked: dict[str, int], threads: bool = False) -> None:
    child = subprocess.Popen(
        [sys.executable, writer.__file__, folder, str(SEGMENTS), *(["threads"] if threads else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        kill_after = rng.randint(0, 40)
        line = child.stdout.readline()
        assert line.startswith("READY"), (line, child.stderr.read() if child.stderr else "")
        for _ in range(kill_after):
            line = child.stdout.readline()
            assert line.startswith("ACK"), (line, child.stderr.read() if child.stderr else "")
            _, name, end = line.split()
            acked[name] = max(acked.get(name, 0), int(end))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL


def check(folder: str, acked: dict[str, int], nonces: NonceLedger) -> None:
    """Every acknowledged write reads back; and no frame stored since the run began shares
    its data key and ordinal with another (``nonces``: kept across the kills and takeovers)."""
    storage = writer.open_storage(folder)
    try:
        nonces.check(storage.context.store, storage.chunk_storage)
        for i in range(SEGMENTS):
            name = f"crash/{i}"
            if not storage.exists(name):
                assert name not in acked
                continue
            length = storage.info(name).length
            assert length >= acked.get(name, 0), f"{name}: acknowledged data lost"
            expected = writer.expected_prefix(name, length)
            assert expected is not None, f"{name}: length {length} is not a write boundary (torn write)"
            assert storage.read(storage.open_read(name), 0, length) == expected
            acked[name] = length  # a write committed right before the kill is durable too
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("seed", "encrypted", "threads"),
    [
        (1, False, False),
        (2, False, False),
        (3, False, False),
        (4, True, False),
        (5, False, True),
        (6, True, True),
    ],
)
def test_acknowledged_writes_survive_sigkill(
    tmp_path, monkeypatch, seed: int, encrypted: bool, threads: bool
) -> None:
    """``encrypted``: the store compressed and encrypted (frames, sealed journal), the
    writer and every check with the key ring. ``threads``: a writer thread per segment,
    so acknowledged writes come out of shared, pipelined group commits."""
    folder = str(tmp_path / "store")
    if encrypted:
        from slts.transforms.keys import FolderKeyRing

        ring = FolderKeyRing.create(str(tmp_path / "ring"))
        ring.activate(ring.add())
        monkeypatch.setenv(writer.KEY_RING_VARIABLE, ring.folder)  # the child inherits it
    rng = random.Random(seed)
    acked: dict[str, int] = {}
    nonces = NonceLedger()
    for _ in range(ROUNDS):
        run_until_killed(folder, rng, acked, threads)
        check(folder, acked, nonces)
    assert sum(acked.values()) > 0

    from slts.admin.verify import verify_container
    from tests.support.engine import segment_chunks

    storage = writer.open_storage(folder, gc_delay_s=0.0)
    try:
        while storage.gc.run_once().progressed:
            pass
        chunks = [chunk for name in storage.list() for _, chunk in storage.chunks(name)]
        assert all(bool(chunk.data_keys) == encrypted for chunk in chunks)
        referenced = {chunk.name for chunk in chunks}
        assert set(segment_chunks(storage.chunk_storage)) == referenced, (
            "orphans of killed writes were not collected"
        )
        assert verify_container(storage).problems == []  # includes the tier-2 copy: it restores
    finally:
        storage.close()
