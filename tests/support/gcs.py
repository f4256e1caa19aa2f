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


# -- a real bucket (SLTS_GCS_URL) -------------------------------------------------------------------

#: ``gs://BUCKET/prefix`` of a real bucket the tests may write below (credentials: ADC).
REAL_URL_VARIABLE = "SLTS_GCS_URL"


def real_bucket_configured() -> bool:
    """Whether ``SLTS_GCS_URL`` names a real bucket for the ``gcs-real`` entry."""
    import os

    return bool(os.environ.get(REAL_URL_VARIABLE, ""))


def real_bucket_url() -> str:
    """``SLTS_GCS_URL``, or skip the calling test saying why."""
    import os

    import pytest

    url = os.environ.get(REAL_URL_VARIABLE, "")
    if not url:
        pytest.skip(
            f"{REAL_URL_VARIABLE} is not set: no real GCS bucket to test the native paths against "
            "(set it to gs://BUCKET/writable/prefix; credentials from Application Default Credentials)"
        )
    return url


def real_binding(suffix: str) -> Any:
    """A binding below a fresh prefix ``<SLTS_GCS_URL's prefix>/<suffix>`` of the real bucket."""
    from urllib.parse import urlsplit, urlunsplit

    from slts.bindings.gcs import GcsChunkStorage

    parts = urlsplit(real_bucket_url())
    path = parts.path.rstrip("/") + f"/{suffix}"
    return GcsChunkStorage.from_url(urlunsplit(parts._replace(path=path)))


def gcs_real_binding(workdir: Path) -> BindingUnderTest:
    """The conformance entry ``gcs-real``: the real service, a fresh prefix per binding."""
    import uuid

    suffix = f"conformance-{uuid.uuid4().hex}"
    storage = real_binding(suffix)

    def cleanup() -> None:  # runs after storage.close(): a new binding on the same prefix
        with real_binding(suffix) as leftover:
            for name in list(leftover.list()):
                leftover.delete(leftover.open_read(name))

    return BindingUnderTest(
        "gcs-real",
        storage,
        GcsRaw(storage._client, storage),
        reopen=lambda: real_binding(suffix),
        cleanup=cleanup,
        model_examples=20,
    )
