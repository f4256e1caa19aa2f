"""The SIGKILL crash matrix: every kill point of every operation kind (issue 12).

For each operation of ``matrix_child.OPERATIONS`` (write, concat, truncate, in-process
defrag, batch defrag driver, GC, metadata snapshot, metadata-log flush, restore), on the
filesystem binding + LMDB: a reference run learns how many kill points the operation has
(a tick before and after each chunk storage change and each metadata commit) and the
state it leaves; then, from the same starting store, the child is SIGKILLed at kill point
1, 2, ... in turn. After each kill, a new owner (a new epoch) must find:

* every segment exactly as before the operation or exactly as after it (atomic; zero
  acknowledged bytes lost, nothing half-done visible);
* ``verify`` clean and the leak check at zero (no index entry or chunk record nothing
  reaches);
* after the orphan reconciler and GC past the delay, exactly the referenced chunks on
  the chunk storage (nothing leaked, nothing referenced deleted);
* for ``restore``: the store untouched, no half-restored store at the target (the
  restore builds in a staging folder and renames it into place), and a new restore
  byte-identical.

CI runs a slice (a spread of kill points per operation); ``SLTS_CRASH_MATRIX=full`` runs
every kill point (over 200 kills) and prints the count per operation.

The whole matrix runs twice: on a plain store, and with compression and encryption on
(``transformed``: the child's ``SLTS_CRASH_TRANSFORMS``, the store's key ring in its
folder), where every chunk is frames under data keys and the tier-2 records are sealed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slts.journal.restore import restore_to_folder

import slts
from slts.admin.orphans import reconcile
from slts.transforms.keys import FolderKeyRing
from tests.support.engine import segment_chunks

from . import matrix_child
from .test_kill9_layout import describe, observed

FULL = os.environ.get("SLTS_CRASH_MATRIX") == "full"
LEASE_PAST_S = 2 * 3600.0  # past defrag_batch_lease_s (600 s) + gc_delay_s
SLICE_POINTS = 4  # kill points per operation in the CI slice (first, last and a spread)

Observed = dict[str, tuple[int, bool, bytes]]


def build_store(folder: Path) -> None:
    """The starting store every run copies: small chunks, a chain of concat targets, a
    sealed transaction, dropped chunks and a deleted chain awaiting GC."""
    if matrix_child.transformed():
        ring = FolderKeyRing.create(str(folder / "key-ring"))
        ring.activate(ring.add())
    # GC waits: garbage stays queued; seams stay: small chunks stay for defrag.
    storage = matrix_child.open_owner(str(folder), gc_delay_s=3600.0, concat_merge_seam=False)

    def filled(name: str, sizes: list[int], *, rolling: int = 64, sealed: bool = False) -> None:
        storage.create(name, max_rolling_length=rolling)
        handle = storage.open_write(name)
        for size in sizes:
            storage.write(handle, storage.info(name).length, os.urandom(size))
        if sealed:
            storage.seal(handle)

    def concat(target: str, source: str) -> None:
        storage.concat(storage.open_write(target), storage.info(target).length, source)

    filled("main", [40] * 16)
    storage.truncate(storage.open_write("main"), 70)  # one dropped chunk in the GC queue
    filled("chain", [], rolling=1000)
    filled("inner", [])
    filled("t1", [20, 20], rolling=16, sealed=True)
    concat("inner", "t1")
    storage.seal(storage.open_write("inner"))
    concat("chain", "inner")  # chain -> inner -> t1: an intermediate namespace of links only
    filled("t2", [30], rolling=32, sealed=True)
    concat("chain", "t2")
    storage.seal(storage.open_write("chain"))
    filled("txn", [25, 25], rolling=32, sealed=True)
    filled("frag", [], rolling=1000)
    for number in range(10):  # ten small chunks, one per concatenated part
        filled(f"part{number}", [20], rolling=1000, sealed=True)
        concat("frag", f"part{number}")
    storage.seal(storage.open_write("frag"))
    for outer in ("doomed", "doomed-inner"):
        filled(outer, [])
    filled("doomed-leaf", [10, 10], rolling=8, sealed=True)
    concat("doomed-inner", "doomed-leaf")
    storage.seal(storage.open_write("doomed-inner"))
    concat("doomed", "doomed-inner")
    storage.delete(storage.open_write("doomed"))  # a tombstone over a chain of namespaces
    filled("doomed-flat", [30] * 4, rolling=16)
    storage.delete(storage.open_write("doomed-flat"))  # a tombstone of several batches
    storage.close()


def run_child(folder: Path, operation: str, kill_at: int | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # the environment's SLTS_CRASH_TRANSFORMS passes on (``transformed``)
        [
            sys.executable,
            matrix_child.__file__,
            str(folder),
            operation,
            "none" if kill_at is None else str(kill_at),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def reader(folder: Path) -> slts.ChunkedSegmentStorage:
    """The store in ``folder``, read-only (with its key ring where transforms are on)."""
    return slts.open(
        f"file://{folder}/chunks",
        metadata=f"{folder}/metadata",
        read_only=True,
        key_ring=matrix_child.key_ring(str(folder)),
    )


def contents(folder: Path) -> Observed:
    with reader(folder) as storage:
        return observed(storage)


def check_after_kill(folder: Path, operation: str, before: Observed, after: Observed) -> None:
    if operation == "restore":
        check_partial_restore(folder)
    # The next owner (a new epoch), its clock past every lease: a batch defrag's intents are
    # queued a lease ahead, so "GC past its delay" means past the lease too.
    storage = matrix_child.open_owner(str(folder), clock=lambda: time.time() + LEASE_PAST_S)
    try:
        assert_consistent(storage, before, after)
    finally:
        storage.close()


def assert_consistent(storage: slts.ChunkedSegmentStorage, before: Observed, after: Observed) -> None:
    """The checks after a kill, on the next owner ``storage`` (its clock past every lease
    and gc_delay_s): segments as before or after, verify and the leak check clean, and
    after the orphan reconciler and GC exactly the referenced chunks on the storage."""
    actual = observed(storage)
    assert actual in (before, after), "neither the state before nor after:\n" + describe(actual, after)
    report = slts.admin.verify.verify_container(storage)
    assert report.problems == [], report.problems
    assert report.leaks is not None and report.leaks.index_entries == report.leaks.chunk_records == 0
    reconcile(storage)
    for _ in range(1000):
        if not storage.gc.run_once().progressed:
            break
    referenced = {chunk.name for name in storage.list() for _, chunk in storage.chunks(name)}
    assert set(segment_chunks(storage.chunk_storage)) == referenced, "orphans left, or referenced chunks gone"
    leaks = storage.check_leaks()
    assert leaks.total == 0, leaks.problems()
    assert observed(storage) == actual, "collecting changed what the segments hold"


def check_partial_restore(folder: Path) -> None:
    """A restore killed midway left no store at its target (it builds in a staging
    folder and renames it into place when complete), or a complete one; and a new
    restore from tier-2 reads back the store's segments."""
    partial = folder / "restored"
    ring = matrix_child.key_ring(str(folder))
    if partial.exists():
        with slts.open(
            f"file://{folder}/chunks", metadata=str(partial), read_only=True, key_ring=ring
        ) as storage:
            assert observed(storage) == contents(folder), "a restore that looked complete is not"
    again = folder / "restored-again"
    with slts.bindings.from_url(f"file://{folder}/chunks") as binding:
        restore_to_folder(binding, 0, str(again), matrix_child.record_seal(str(folder)))
    with slts.open(f"file://{folder}/chunks", metadata=str(again), read_only=True, key_ring=ring) as storage:
        restored = observed(storage)
    assert restored == contents(folder), "tier-2 no longer restores the store"


def kill_points(total: int) -> list[int]:
    if FULL or total <= SLICE_POINTS:
        return list(range(1, total + 1))
    step = (total - 1) / (SLICE_POINTS - 1)
    return sorted({1 + round(i * step) for i in range(SLICE_POINTS)})


KILLS: dict[str, int] = {}


@pytest.fixture(scope="module", params=["plain", "transformed"])
def pristine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The starting store, plain or with transforms on (and the children told so)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "transformed":
            patch.setenv("SLTS_CRASH_TRANSFORMS", "1")
        else:
            patch.delenv("SLTS_CRASH_TRANSFORMS", raising=False)
        folder = tmp_path_factory.mktemp(f"pristine-{request.param}")
        build_store(folder)
        yield folder


@pytest.mark.parametrize("operation", list(matrix_child.OPERATIONS))
def test_every_kill_point_of_the_operation_leaves_a_consistent_store(
    pristine: Path, tmp_path: Path, operation: str
) -> None:
    before = contents(pristine)
    reference = tmp_path / "reference"
    shutil.copytree(pristine, reference)
    done = run_child(reference, operation, None)
    assert done.returncode == 0 and done.stdout.startswith("DONE"), done.stderr[-3000:]
    total = int(done.stdout.split()[1])
    assert total >= 2, f"{operation} changed nothing: the matrix would test nothing"
    after = contents(reference)
    if matrix_child.transformed():  # the matrix runs what it says: frames under data keys
        with reader(reference) as storage:
            chunks = [chunk for name in storage.list() for _, chunk in storage.chunks(name)]
        assert chunks and all(chunk.transformed and chunk.data_keys for chunk in chunks)
    if operation in ("write", "concat", "truncate", "truncate_all", "delete_and_gc"):
        assert after != before, "the operation had no visible effect"
    else:
        assert after == before, "only writes, concats, truncates and deletes change what segments hold"
    for kill_at in kill_points(total):
        run = tmp_path / f"kill-{kill_at}"
        shutil.copytree(pristine, run)
        child = run_child(run, operation, kill_at)
        assert child.returncode == -signal.SIGKILL, (kill_at, child.returncode, child.stderr[-3000:])
        check_after_kill(run, operation, before, after)
        shutil.rmtree(run)
        KILLS[operation] = KILLS.get(operation, 0) + 1
    if FULL:
        print(
            f"\ncrash matrix: {operation}: {KILLS[operation]} kills of {total} points; "
            f"{sum(KILLS.values())} kills so far"
        )
