"""What the Azure binding brings to the conformance suite (``tests/conformance/conftest.py``).

``azure_binding``: the binding against the session's Azurite (``tests/support/azurite.py``),
a fresh blob prefix per binding in one session container, all sharing one container
client. The raw hook reads and writes the blobs with the SDK directly, by the binding's
name mapping.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Any

from tests.support.azurite import AzuriteServer, shared_server_or_skip
from tests.support.conformance import BindingUnderTest

_prefixes = itertools.count()
_containers: dict[int, str] = {}
_containers_lock = threading.Lock()

#: A real account for the native paths Azurite lacks (tests/azure/test_real_account.py).
REAL_URL_VARIABLE = "SLTS_AZURE_URL"


class AzureRaw:
    """Reaches the chunks' blobs with plain SDK calls, bypassing the binding."""

    def __init__(self, container_client: Any, storage: Any) -> None:
        self._client = container_client
        self._storage = storage  # only for its name mapping (blob_name, blob_metadata)

    def read(self, name: str) -> bytes:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self._client.download_blob(self._storage.blob_name(name)).readall()
        except ResourceNotFoundError:
            raise KeyError(name) from None

    def write(self, name: str, data: bytes) -> None:
        from azure.storage.blob import BlobType

        self._client.upload_blob(
            self._storage.blob_name(name),
            bytes(data),
            blob_type=BlobType.APPENDBLOB,
            overwrite=True,
            metadata=self._storage.blob_metadata(name),
        )

    def exists(self, name: str) -> bool:
        return bool(self._client.get_blob_client(self._storage.blob_name(name)).exists())


def session_container(server: AzuriteServer) -> str:
    """One container per emulator for all conformance bindings (each has its own prefix)."""
    with _containers_lock:
        if id(server) not in _containers:
            _containers[id(server)] = server.new_container("conformance")
        return _containers[id(server)]


def azure_binding(workdir: Path) -> BindingUnderTest:
    from slts.bindings.azure import AzureChunkStorage

    server = shared_server_or_skip()
    container = session_container(server)
    prefix = f"c/{next(_prefixes)}-{workdir.name}"
    client = server.service().get_container_client(container)

    def make() -> AzureChunkStorage:
        return AzureChunkStorage(container, prefix, container_client=client)

    storage = make()
    return BindingUnderTest("azure", storage, AzureRaw(client, storage), reopen=make, model_examples=30)


def azure_storage_binding(tmp: Path) -> Any:
    """A binding on a new container of the session's Azurite, with its own client, for the
    engine tests (``tests/support/engine.py``): one container per test."""
    from slts.bindings.azure import AzureChunkStorage, credentials_from_environment

    server = shared_server_or_skip()
    credentials = credentials_from_environment(environ=server.credentials())
    return AzureChunkStorage(server.new_container("storage"), "chunks", credentials=credentials)


def real_account_configured() -> bool:
    return bool(os.environ.get(REAL_URL_VARIABLE))


def real_account_url() -> str:
    """``$SLTS_AZURE_URL`` (``azure://CONTAINER/prefix``, credentials in the environment as
    for any azure:// URL), or skip the calling test saying why."""
    import pytest

    url = os.environ.get(REAL_URL_VARIABLE, "")
    if not url:
        pytest.skip(
            f"no real Azure account: set {REAL_URL_VARIABLE}=azure://CONTAINER/prefix and "
            "AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT with a key, SAS or identity)"
        )
    return url


def azure_real_binding(workdir: Path) -> BindingUnderTest:
    """The conformance entry ``azure-real``: a fresh prefix below ``$SLTS_AZURE_URL`` per
    binding, removed afterwards; the raw hook is the SDK on the binding's own client."""
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    from slts.bindings.azure import AzureChunkStorage

    parts = urlsplit(real_account_url())
    path = parts.path.rstrip("/") + f"/conformance-{uuid.uuid4().hex[:12]}"
    url = urlunsplit(parts._replace(path=path))
    storage = AzureChunkStorage.from_url(url)
    client = storage._client

    def cleanup() -> None:
        for blob in client.list_blobs(name_starts_with=storage.prefix + "/"):
            client.delete_blob(blob.name)

    return BindingUnderTest(
        "azure-real",
        storage,
        AzureRaw(client, storage),
        reopen=lambda: AzureChunkStorage.from_url(url),
        cleanup=cleanup,
        model_examples=20,
    )
