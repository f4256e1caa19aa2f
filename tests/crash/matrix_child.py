"""Child of the SIGKILL crash matrix (``test_crash_matrix.py``): one operation, killed at
one point.

Run as ``python matrix_child.py FOLDER OPERATION KILL_AT|none``. It starts the container
in FOLDER (filesystem binding + LMDB, a new epoch), arms a kill switch and runs
OPERATION; the switch SIGKILLs the process at its ``KILL_AT``-th tick, and it ticks
right before and right after every chunk storage change (create, write, delete, concat)
and every metadata commit or replicate, counted from the start of the operation only.
So ``KILL_AT = 1, 2, ...`` walks every step inside the operation. Unkilled, it prints
``DONE <ticks>`` (the number of kill points the operation has) and exits.

Operations (``OPERATIONS``): ``write`` (crosses the rolling size: several chunks),
``concat`` (a sealed transaction into ``main``, merging the seam), ``truncate`` and
``truncate_all`` (batched: ``gc_batch_max`` is 3), ``defrag`` (in process, over a chain
of concat targets) and ``defrag_many`` (ten chunks into one), ``batch_defrag`` (the
non-owner driver with its leased GC intents), ``gc`` (a deleted segment's tombstone,
dropped chunks, a chain of namespaces) and ``delete_and_gc``, ``snapshot`` (a metadata
snapshot on tier-2), ``flush`` (the metadata log to tier-2) and ``restore`` (tier-2 into
a new folder).

With ``SLTS_CRASH_TRANSFORMS=1`` in its environment the container runs with compression
and encryption on (its key ring in ``FOLDER/key-ring``, made by the test's starting
store): every operation then moves frames under data keys, and the journal and metadata
copies on tier-2 are sealed.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

CONFIG: dict[str, Any] = {
    "gc_delay_s": 0.0,  # GC deletes at once: kills land inside real deletions too
    "gc_interval_s": 0.0,  # no background threads: every step happens in the operation
    "metadata_log_flush_interval_s": 0.0,
    "gc_batch_max": 3,  # truncates and GC runs take several commits
    "rolling_length_bytes_default": 64,
    "defrag_small_chunk_bytes": 400,
    "concat_merge_seam": True,
}


#: The config the container gets with ``SLTS_CRASH_TRANSFORMS=1`` on top of ``CONFIG``
#: (frames smaller than the writes, so a write is several frames).
TRANSFORMS: dict[str, Any] = {"compression_level": 3, "encryption": True, "frame_bytes": 16}


def transformed() -> bool:
    """Whether this run's container has transforms on (module doc)."""
    return os.environ.get("SLTS_CRASH_TRANSFORMS") == "1"


def key_ring(folder: str) -> Any:
    """The key ring of the store in ``folder``, or None without transforms."""
    from slts.transforms.keys import FolderKeyRing

    return FolderKeyRing(f"{folder}/key-ring") if transformed() else None


def record_seal(folder: str) -> Any:
    """What opens the sealed tier-2 records of the store in ``folder`` (restore), or None."""
    from slts.transforms.sealed import RecordSeal

    ring = key_ring(folder)
    return RecordSeal(ring, sealing=False) if ring is not None else None


class KillSwitch:
    """SIGKILLs this process at the ``kill_at``-th tick once armed (never if None)."""

    def __init__(self, kill_at: int | None) -> None:
        self.kill_at = kill_at
        self.armed = False
        self.ticks = 0

    def tick(self) -> None:
        if not self.armed:
            return
        self.ticks += 1
        if self.kill_at is not None and self.ticks >= self.kill_at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


def install(switch: KillSwitch) -> None:
    """Tick around every change of the filesystem binding and the LMDB store (all instances)."""
    from slts.bindings.filesystem import FileSystemChunkStorage

    from slts.metadata.lmdb_store import LmdbMetadataStore

    def ticking(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            switch.tick()
            result = method(*args, **kwargs)
            switch.tick()
            return result

        return call

    for name in ("create", "write", "delete", "concat"):
        setattr(FileSystemChunkStorage, name, ticking(getattr(FileSystemChunkStorage, name)))
    for name in ("commit", "replicate"):
        setattr(LmdbMetadataStore, name, ticking(getattr(LmdbMetadataStore, name)))


def open_owner(folder: str, **overrides: Any) -> Any:
    import slts

    config = {**CONFIG, **(TRANSFORMS if transformed() else {}), **overrides}
    return slts.open(
        f"file://{folder}/chunks", metadata=f"{folder}/metadata", key_ring=key_ring(folder), **config
    )


def _batch_defrag(folder: str, storage: Any) -> None:
    from slts.config import StorageConfig
    from slts.storage.batch_defrag import BatchDefrag, execute_locally, run_batch

    config = StorageConfig(**{**CONFIG, **(TRANSFORMS if transformed() else {})})
    driver = BatchDefrag(storage.chunk_storage, storage._metadata_store, 0, config)
    run_batch(driver, execute_locally(storage.chunk_storage, 1))


def _gc(folder: str, storage: Any) -> None:
    for _ in range(1000):
        if not storage.gc.run_once().progressed:
            return
    raise AssertionError("GC did not converge")


def _delete_and_gc(folder: str, storage: Any) -> None:
    storage.delete(storage.open_write("main"))
    _gc(folder, storage)


def _restore(folder: str, storage: Any) -> None:
    from slts.journal.restore import restore_to_folder

    restore_to_folder(storage.chunk_storage, 0, f"{folder}/restored", record_seal(folder))


OPERATIONS: dict[str, Callable[[str, Any], object]] = {
    "write": lambda folder, s: s.write(s.open_write("main"), s.info("main").length, b"w" * 600),
    "concat": lambda folder, s: s.concat(s.open_write("main"), s.info("main").length, "txn"),
    "truncate": lambda folder, s: s.truncate(s.open_write("main"), s.info("main").length - 100),
    "truncate_all": lambda folder, s: s.truncate(s.open_write("main"), s.info("main").length),
    "defrag": lambda folder, s: s.defrag("chain"),
    "defrag_many": lambda folder, s: s.defrag("frag"),
    "batch_defrag": _batch_defrag,
    "gc": _gc,
    "delete_and_gc": _delete_and_gc,
    "snapshot": lambda folder, s: s.durable.snapshot(),
    "flush": lambda folder, s: s.durable.flush(),
    "restore": _restore,
}


def main(argv: Sequence[str]) -> None:
    folder, operation, kill_at = argv[1], argv[2], None if argv[3] == "none" else int(argv[3])
    switch = KillSwitch(kill_at)
    install(switch)
    storage = open_owner(folder)
    if operation == "flush":  # changes for the flush to ship, none of them visible in a segment
        storage.create("scratch")
        storage.write(storage.open_write("scratch"), 0, b"s" * 100)
        storage.delete(storage.open_write("scratch"))
    switch.armed = True
    OPERATIONS[operation](folder, storage)
    switch.armed = False
    print("DONE", switch.ticks, flush=True)
    os._exit(0)  # as abrupt as a kill after the operation: nothing more is flushed or closed


if __name__ == "__main__":
    main(sys.argv)
