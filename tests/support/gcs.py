"""What the GCS binding brings to the conformance suite (``tests/conformance/conftest.py``).

``gcs_binding``: the binding against the session's emulator (``tests/support/gcsserver.py``),
a fresh object prefix per binding in one session bucket, all sharing one SDK client. The
raw hook reads and writes the objects with the SDK directly, by the binding's name mapping.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

from tests.support.conformance import BindingUnderTest
from tests.support.gcsserver import GcsEmulator, shared_emulator_or_skip

_prefixes = itertools.count()
_buckets: dict[int, str] = {}
_buckets_lock = threading.Lock()


class GcsRaw:
    """Reaches the chunks' objects with plain SDK calls, bypassing the binding."""

    def __init__(self, client: Any, storage: Any) -> None:
        self._bucket = client.bucket(storage.bucket)
        self._storage = storage  # only for its name mapping (object_name, object_metadata)

    def read(self, name: str) -> bytes:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self._bucket.blob(self._storage.object_name(name)).download_as_bytes(retry=None))
        except NotFound:
            raise KeyError(name) from None

    def write(self, name: str, data: bytes) -> None:
        blob = self._bucket.blob(self._storage.object_name(name))
        blob.metadata = self._storage.object_metadata(name) or None
        blob.upload_from_string(bytes(data), content_type="application/octet-stream", retry=None)

    def exists(self, name: str) -> bool:
        return bool(self._bucket.blob(self._storage.object_name(name)).exists(retry=None))


def session_bucket(emulator: GcsEmulator) -> str:
    """One bucket per emulator for all conformance bindings (each has its own prefix)."""
    with _buckets_lock:
        if id(emulator) not in _buckets:
            _buckets[id(emulator)] = emulator.new_bucket("conformance")
        return _buckets[id(emulator)]


def gcs_binding(workdir: Path) -> BindingUnderTest:
    from slts.bindings.gcs import GcsChunkStorage

    emulator = shared_emulator_or_skip()
    bucket = session_bucket(emulator)
    prefix = f"c/{next(_prefixes)}-{workdir.name}"
    client = emulator.client()

    def make() -> GcsChunkStorage:
        return GcsChunkStorage(bucket, prefix, client=client, **emulator.binding_kwargs())

    storage = make()
    # The emulator serves one request at a time: fewer model programs, as for S3.
    return BindingUnderTest("gcs", storage, GcsRaw(client, storage), reopen=make, model_examples=30)


def gcs_storage_binding(tmp: Path) -> Any:
    """A binding on a new bucket of the session's emulator, with its own client, for the
    engine tests: one bucket per test."""
    from slts.bindings.gcs import GcsChunkStorage

    emulator = shared_emulator_or_skip()
    return GcsChunkStorage(emulator.new_bucket("storage"), "chunks", **emulator.binding_kwargs())
