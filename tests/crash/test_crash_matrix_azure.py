"""The crash matrix on Azure Blob Storage: the service (Azurite) is SIGKILLed in the
middle of an operation, at its 1st, a middle and its last request, and restarted.

As ``test_crash_matrix_s3``: the operation fails with a typed error or completes; after
the restart the next owner (a new epoch, on the same LMDB metadata) must find every
segment as before or after the operation, ``verify`` and the leak check clean, and after
the orphan reconciler and GC exactly the referenced chunks in the container. Each
operation runs on a plain store and on one with compression and encryption on.

**The emulator's own loss.** Blob Storage acknowledges only durable writes; Azurite saves
its metadata every 5 s, so a SIGKILL loses what it acknowledged since its last save
(``tests/support/azurite.py``). A store made inconsistent by that would be the emulator's
loss, not SLTS's. So before each kill the test waits for Azurite's save of everything it
acknowledged (``AzuriteServer.persisted``, only when a request changed something since the
last save): the kill then models the real service, which loses nothing it acknowledged,
and the requests in flight at the kill are lost as they would be.
``test_a_kill_after_the_save_loses_nothing_acknowledged`` checks that wait itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "azure.storage.blob", reason="azure-storage-blob is not installed (pip install 'slts[azure]')"
)

from azure.storage.blob import BlobServiceClient
from slts.bindings.azure import AzureChunkStorage

from slts.config import StorageConfig
from slts.errors import SltsError
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import FolderKeyRing
from tests.support.azurite import AzuriteServer, AzuriteUnavailable, find_azurite

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


class Requests:
    """Counts the operation's requests, kills the emulator before the ``kill_at``-th, and
    knows whether something was acknowledged since Azurite's last save."""

    def __init__(self, server: AzuriteServer) -> None:
        self.server = server
        self.kill_at: int | None = None
        self.sent = 0
        self.armed = False
        self.changed = False  # a change acknowledged since the last save
        self.bytes_written = False  # ... with bytes (the extent database too)

    def on_request(self, request: Any) -> None:
        if not self.armed:
            return
        self.sent += 1
        if self.sent == self.kill_at:
            self.saved()
            self.server.kill()

    def on_response(self, response: Any) -> None:
        http = response.http_request
        if http.method in ("PUT", "DELETE") and 200 <= response.http_response.status_code < 300:
            self.changed = True
            body = int(http.headers.get("Content-Length", "0") or 0) > 0
            self.bytes_written |= body or "x-ms-copy-source" in http.headers

    def saved(self) -> None:
        """Wait for Azurite's save of what it acknowledged (see the module doc)."""
        if self.changed:
            self.server.persisted(extents=self.bytes_written)
        self.changed = self.bytes_written = False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    try:
        find_azurite()
    except AzuriteUnavailable as exc:
        pytest.skip(str(exc))
    own = AzuriteServer(tmp_path_factory.mktemp("azurite-matrix"))  # its own: it gets killed
    own.start()
    yield own
    own.stop()
    assert not own.running()


def binding(server: AzuriteServer, container: str, requests: Requests) -> AzureChunkStorage:
    service = BlobServiceClient.from_connection_string(
        server.connection_string,
        retry_total=0,
        connection_timeout=1,
        read_timeout=10,
        raw_request_hook=requests.on_request,
        raw_response_hook=requests.on_response,
    )
    client = service.get_container_client(container)
    return AzureChunkStorage(
        container, "chunks", container_client=client, max_attempts=2, sleep=lambda _: None
    )


def owner(
    server: AzuriteServer,
    container: str,
    metadata: Path,
    ring: FolderKeyRing | None,
    requests: Requests,
    **overrides: Any,
) -> ChunkedSegmentStorage:
    """The next owner of the store (transforms on with a ``ring``)."""
    store = LmdbMetadataStore(str(metadata), TABLES)
    config = StorageConfig(**{**CONFIG, **(TRANSFORMS if ring is not None else {}), **overrides})
    return ChunkedSegmentStorage(
        0,
        None,
        binding(server, container, requests),
        store,
        config,
        owns_resources=True,
        clock=lambda: time.time() + LEASE_PAST_S,
        key_ring=ring,
    )


def build(server: AzuriteServer, metadata: Path, ring: FolderKeyRing | None, requests: Requests) -> str:
    """A new container with the matrix's store (as ``test_crash_matrix_s3.build``)."""
    container = server.new_container("matrix")
    requests.changed = True  # the container itself
    storage = owner(server, container, metadata, ring, requests, gc_delay_s=3600.0, concat_merge_seam=False)
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
    return container


def run(
    server: AzuriteServer,
    container: str,
    metadata: Path,
    ring: FolderKeyRing | None,
    requests: Requests,
    operation: str,
    kill_at: int | None,
) -> int:
    """Run ``operation`` on a new owner; SIGKILL the emulator right before its
    ``kill_at``-th request. Returns the number of requests the operation sent."""
    storage = owner(server, container, metadata, ring, requests)
    requests.sent, requests.kill_at, requests.armed = 0, kill_at, True
    try:
        OPERATIONS[operation](storage)
    except SltsError:
        assert kill_at is not None, "the operation failed without a kill"
    finally:
        requests.armed = False
        if not server.running():
            server.restart()
        storage.close()
    return requests.sent


@pytest.mark.slow
# Every operation plain; with transforms only the write, whose frames meet this binding's
# requests: transforms are the same on every binding, and the S3 matrix runs them with every
# operation (CI time: each case here waits for kills and restarts of the server).
@pytest.mark.parametrize(
    ("operation", "transforms"),
    [*((operation, "plain") for operation in OPERATIONS), ("write", "transformed")],
)
def test_a_service_killed_inside_an_operation_leaves_a_consistent_store(
    server: AzuriteServer, tmp_path: Path, operation: str, transforms: str
) -> None:
    ring = None
    if transforms == "transformed":
        ring = FolderKeyRing.create(str(tmp_path / "key-ring"))
        ring.activate(ring.add())
    requests = Requests(server)
    reference_metadata = tmp_path / "reference"
    container = build(server, reference_metadata, ring, requests)
    with owner(server, container, reference_metadata, ring, requests) as storage:
        before = observed(storage)
        chunks = [chunk for name in storage.list() for _, chunk in storage.chunks(name)]
        assert chunks and all(bool(chunk.data_keys) == (ring is not None) for chunk in chunks)
    total = run(server, container, reference_metadata, ring, requests, operation, None)
    assert total >= 1, f"{operation} sent no request"
    with owner(server, container, reference_metadata, ring, requests) as storage:
        after = observed(storage)
    for kill_at in sorted({1, (total + 1) // 2, total}):
        metadata = tmp_path / f"kill-{kill_at}"
        container = build(server, metadata, ring, requests)
        run(server, container, metadata, ring, requests, operation, kill_at)
        with owner(server, container, metadata, ring, requests) as storage:
            assert_consistent(storage, before, after)


@pytest.mark.slow
def test_a_kill_after_the_save_loses_nothing_acknowledged(server: AzuriteServer) -> None:
    requests = Requests(server)
    container = server.new_container("saved")
    storage = binding(server, container, requests)
    names = [f"c{i}" for i in range(5)]
    for name in names:
        handle = storage.create(name, name.encode() * 100)
        storage.write(handle, 200, b"tail")
    requests.changed = True
    requests.saved()
    server.kill()
    server.restart()
    again = binding(server, container, requests)
    assert list(again.list()) == names
    for name in names:
        assert again.read(again.open_read(name), 0, 1000) == name.encode() * 100 + b"tail"
