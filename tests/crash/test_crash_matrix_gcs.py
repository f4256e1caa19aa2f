"""The crash matrix on GCS: the emulator is SIGKILLed in the middle of an operation, at its
1st, a middle and its last request, and restarted on the same data folder and port (issue 30,
after ``test_crash_matrix_s3.py``).

The operation fails with a typed error or completes; after the restart the next owner (a
new epoch, on the same LMDB metadata) must find what ``test_crash_matrix`` asks for: every
segment as before or after the operation, ``verify`` and the leak check clean, and after
the orphan reconciler and GC exactly the referenced chunks in the bucket. A concat killed
between its composes may leave temporary objects (reserved ``.tmp~`` names, which no
listing of chunks shows): the sweep finds and removes them, after which the bucket holds
exactly the referenced chunks' objects. Each operation runs on a plain store and with
compression and encryption on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "google.cloud.storage", reason="google-cloud-storage is not installed (pip install 'slts[gcs]')"
)

from slts.bindings.gcs import GcsChunkStorage

from slts.config import StorageConfig
from slts.errors import SltsError
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import FolderKeyRing
from tests.support.gcsserver import EmulatorUnavailable, GcsEmulator, check_installed

from .matrix_child import CONFIG, TRANSFORMS
from .test_crash_matrix import LEASE_PAST_S, assert_consistent
from .test_crash_matrix_s3 import OPERATIONS
from .test_kill9_layout import observed

Hook = Callable[[str], None]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Any:
    try:
        check_installed()
    except EmulatorUnavailable as exc:
        pytest.skip(str(exc))
    own = GcsEmulator(tmp_path_factory.mktemp("gcs-matrix"))  # its own: it gets killed
    own.start()
    yield own
    own.stop()
    assert not own.running()


def binding(emulator: GcsEmulator, bucket: str, hook: Hook | None = None) -> GcsChunkStorage:
    return GcsChunkStorage(
        bucket, "chunks", max_attempts=2, timeout_s=10.0, before_request=hook, **emulator.binding_kwargs()
    )


def owner(
    emulator: GcsEmulator,
    bucket: str,
    metadata: Path,
    ring: FolderKeyRing | None,
    hook: Hook | None = None,
    **overrides: Any,
) -> ChunkedSegmentStorage:
    """The next owner of the store (transforms on with a ``ring``)."""
    store = LmdbMetadataStore(str(metadata), TABLES)
    config = StorageConfig(**{**CONFIG, **(TRANSFORMS if ring is not None else {}), **overrides})
    return ChunkedSegmentStorage(
        0,
        None,
        binding(emulator, bucket, hook),
        store,
        config,
        owns_resources=True,
        clock=lambda: time.time() + LEASE_PAST_S,
        key_ring=ring,
    )


def build(emulator: GcsEmulator, metadata: Path, ring: FolderKeyRing | None) -> str:
    """The store of ``test_crash_matrix_s3.build`` in a new bucket."""
    bucket = emulator.new_bucket("matrix")
    storage = owner(emulator, bucket, metadata, ring, gc_delay_s=3600.0, concat_merge_seam=False)
    with storage:
        for name, sizes, rolling, sealed in (
            ("main", [40] * 6, 64, False),
            ("txn", [25, 25], 32, True),
            ("tail", [10], 1000, False),
            ("doomed", [30] * 3, 16, False),
        ):
            storage.create(name, max_rolling_length=rolling)
            for size in sizes:
                storage.write(storage.open_write(name), storage.info(name).length, bytes([len(name)]) * size)
            if sealed:
                storage.seal(storage.open_write(name))
        storage.create("frag", max_rolling_length=1000)
        for number in range(5):
            storage.create(f"p{number}", max_rolling_length=1000)
            storage.write(storage.open_write(f"p{number}"), 0, bytes([number]) * 20)
            storage.seal(storage.open_write(f"p{number}"))
            storage.concat(storage.open_write("frag"), storage.info("frag").length, f"p{number}")
        storage.seal(storage.open_write("frag"))
        storage.truncate(storage.open_write("main"), 70)
        storage.delete(storage.open_write("doomed"))
    return bucket


def run(
    emulator: GcsEmulator,
    bucket: str,
    metadata: Path,
    ring: FolderKeyRing | None,
    operation: str,
    kill_at: int | None,
) -> int:
    """Run ``operation`` on a new owner; SIGKILL the emulator right before its ``kill_at``-th
    request. Returns the number of requests the operation sent."""
    sent = [0]
    armed = [False]

    def before_request(_operation: str) -> None:
        if armed[0]:
            sent[0] += 1
            if sent[0] == kill_at:
                emulator.kill()

    storage = owner(emulator, bucket, metadata, ring, before_request)
    armed[0] = True
    try:
        OPERATIONS[operation](storage)
    except SltsError:
        assert kill_at is not None, "the operation failed without a kill"
    finally:
        armed[0] = False
        if not emulator.running():
            emulator.restart()
        storage.close()
    return sent[0]


def assert_no_debris(emulator: GcsEmulator, bucket: str, storage: ChunkedSegmentStorage) -> None:
    """After the sweep, the bucket holds exactly the referenced chunks' objects."""
    with binding(emulator, bucket) as fresh:
        fresh.sweep_temporaries(age_s_min=0.0)
        expected = {
            fresh.object_name(chunk.name) for name in storage.list() for _, chunk in storage.chunks(name)
        }
        stored = {blob.name for blob in emulator.client().list_blobs(bucket, prefix="chunks/")}
        # Other objects below the prefix are the engine's own (its metadata log, snapshots).
        segment_objects = {name for name in stored if name in expected or ".tmp~" in name}
        assert segment_objects == expected


@pytest.mark.slow
# Every operation plain; with transforms only the write, whose frames meet this binding's
# requests: transforms are the same on every binding, and the S3 matrix runs them with every
# operation (CI time: each case here waits for kills and restarts of the server).
@pytest.mark.parametrize(
    ("operation", "transforms"),
    [*((operation, "plain") for operation in OPERATIONS), ("write", "transformed")],
)
def test_an_emulator_killed_inside_an_operation_leaves_a_consistent_store(
    emulator: GcsEmulator, tmp_path: Path, operation: str, transforms: str
) -> None:
    ring = None
    if transforms == "transformed":
        ring = FolderKeyRing.create(str(tmp_path / "key-ring"))
        ring.activate(ring.add())
    reference_metadata = tmp_path / "reference"
    bucket = build(emulator, reference_metadata, ring)
    with owner(emulator, bucket, reference_metadata, ring) as storage:
        before = observed(storage)
        chunks = [chunk for name in storage.list() for _, chunk in storage.chunks(name)]
        assert chunks and all(bool(chunk.data_keys) == (ring is not None) for chunk in chunks)
    total = run(emulator, bucket, reference_metadata, ring, operation, None)
    assert total >= 1, f"{operation} sent no request"
    with owner(emulator, bucket, reference_metadata, ring) as storage:
        after = observed(storage)
    for kill_at in sorted({1, (total + 1) // 2, total}):
        metadata = tmp_path / f"kill-{kill_at}"
        bucket = build(emulator, metadata, ring)
        run(emulator, bucket, metadata, ring, operation, kill_at)
        with owner(emulator, bucket, metadata, ring) as storage:
            assert_consistent(storage, before, after)
            assert_no_debris(emulator, bucket, storage)
