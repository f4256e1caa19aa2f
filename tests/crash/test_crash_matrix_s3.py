"""The crash matrix on S3: the server (SeaweedFS) is SIGKILLed in the middle of an
operation, at its 1st, a middle and its last S3 request, and restarted (issue 12).

The operation fails with a typed error or completes; after the restart the next owner
(a new epoch, on the same LMDB metadata) must find what ``test_crash_matrix`` asks for
(truncate is left out here: it sends no S3 request, only GC deletes its chunks later):
every segment as before or after the operation, ``verify`` and the leak check clean, and
after the orphan reconciler and GC exactly the referenced chunks in the bucket. Each
operation runs on a plain store and on one with compression and encryption on
(``matrix_child.TRANSFORMS``: frames under data keys, sealed tier-2 records).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'slts[s3]')")

from slts.bindings.s3 import S3ChunkStorage

from slts.config import StorageConfig
from slts.errors import SltsError
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import FolderKeyRing
from tests.support.s3server import SeaweedServer, SeaweedUnavailable, find_weed

from .matrix_child import CONFIG, TRANSFORMS
from .test_crash_matrix import LEASE_PAST_S, assert_consistent
from .test_kill9_layout import observed

Operation = Callable[[ChunkedSegmentStorage], object]

OPERATIONS: dict[str, Operation] = {
    "write": lambda s: s.write(s.open_write("main"), s.info("main").length, b"w" * 300),
    "concat": lambda s: s.concat(s.open_write("tail"), s.info("tail").length, "txn"),  # merges the seam
    "defrag": lambda s: s.defrag("frag"),
    "gc": lambda s: [s.gc.run_once() for _ in range(20)],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    try:
        find_weed()
    except SeaweedUnavailable as exc:
        pytest.skip(str(exc))
    own = SeaweedServer(tmp_path_factory.mktemp("weed-matrix"))  # its own: it gets killed
    own.start()
    yield own
    own.stop()
    assert not own.running()


def binding(server: SeaweedServer, bucket: str) -> S3ChunkStorage:
    return S3ChunkStorage(
        bucket,
        "chunks",
        max_attempts=2,
        connect_timeout_s=1.0,
        read_timeout_s=10.0,
        **server.binding_kwargs(),
    )


def owner(
    server: SeaweedServer, bucket: str, metadata: Path, ring: FolderKeyRing | None, **overrides: Any
) -> ChunkedSegmentStorage:
    """The next owner of the store (transforms on with a ``ring``)."""
    store = LmdbMetadataStore(str(metadata), TABLES)
    config = StorageConfig(**{**CONFIG, **(TRANSFORMS if ring is not None else {}), **overrides})
    return ChunkedSegmentStorage(
        0,
        None,
        binding(server, bucket),
        store,
        config,
        owns_resources=True,
        clock=lambda: time.time() + LEASE_PAST_S,
        key_ring=ring,
    )


def build(server: SeaweedServer, metadata: Path, ring: FolderKeyRing | None) -> str:
    """A new bucket with: ``main`` (small chunks), a sealed ``txn`` and a ``tail`` whose
    small last chunk merges with it at the seam, ``frag`` (five chunks to merge), dropped
    chunks and a deleted segment awaiting GC."""
    bucket = server.new_bucket("matrix")
    storage = owner(server, bucket, metadata, ring, gc_delay_s=3600.0, concat_merge_seam=False)
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
    server: SeaweedServer,
    bucket: str,
    metadata: Path,
    ring: FolderKeyRing | None,
    operation: str,
    kill_at: int | None,
) -> int:
    """Run ``operation`` on a new owner; SIGKILL the server right before its
    ``kill_at``-th S3 request. Returns the number of S3 requests the operation sent."""
    storage = owner(server, bucket, metadata, ring)
    sent = [0]
    armed = [False]

    def before_send(**kwargs: object) -> None:
        if armed[0]:
            sent[0] += 1
            if sent[0] == kill_at:
                server.kill()

    storage.chunk_storage.inner._client.meta.events.register("before-send.s3", before_send)  # inside the gate
    armed[0] = True
    try:
        OPERATIONS[operation](storage)
    except SltsError:
        assert kill_at is not None, "the operation failed without a kill"
    finally:
        armed[0] = False
        if not server.running():
            server.restart()
        storage.close()
    return sent[0]


@pytest.mark.slow
@pytest.mark.parametrize("transforms", ["plain", "transformed"])
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_server_killed_inside_an_operation_leaves_a_consistent_store(
    server: SeaweedServer, tmp_path: Path, operation: str, transforms: str
) -> None:
    ring = None
    if transforms == "transformed":
        ring = FolderKeyRing.create(str(tmp_path / "key-ring"))
        ring.activate(ring.add())
    reference_metadata = tmp_path / "reference"
    bucket = build(server, reference_metadata, ring)
    with owner(server, bucket, reference_metadata, ring) as storage:
        before = observed(storage)
        chunks = [chunk for name in storage.list() for _, chunk in storage.chunks(name)]
        assert chunks and all(bool(chunk.data_keys) == (ring is not None) for chunk in chunks)
    total = run(server, bucket, reference_metadata, ring, operation, None)
    assert total >= 1, f"{operation} sent no S3 request"
    with owner(server, bucket, reference_metadata, ring) as storage:
        after = observed(storage)
    for kill_at in sorted({1, (total + 1) // 2, total}):
        metadata = tmp_path / f"kill-{kill_at}"
        bucket = build(server, metadata, ring)
        run(server, bucket, metadata, ring, operation, kill_at)
        with owner(server, bucket, metadata, ring) as storage:
            assert_consistent(storage, before, after)
