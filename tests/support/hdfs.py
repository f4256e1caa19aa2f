"""What the HDFS bindings bring to the conformance suite (``tests/conformance/conftest.py``).

* ``hdfs_binding``: the binding against this process's WebHDFS test server
  (``tests/support/webhdfs_server.py``), a fresh root folder per test; the raw hook reads and
  writes the server's in-memory files directly.
* ``hdfs_real_binding``: the same against a real cluster when ``SLTS_HDFS_URL`` is set
  (e.g. ``hdfs://namenode:9870/tmp/slts?user=hdfs``); each test gets a fresh folder below
  that URL's path, removed afterwards; the raw hook talks to WebHDFS with ``pyhdfs``
  itself. Without the variable the entry is left out of ``BINDINGS`` and
  ``tests/hdfs/test_real_cluster.py`` skips once, giving the reason (one line instead of
  one skip per conformance test).

``pyhdfs`` is imported lazily: without it the factories skip rather than break the suite.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import pytest

from tests.support.conformance import BindingUnderTest
from tests.support.webhdfs_server import WebHdfsTestServer, shared_server

#: The HDFS user the binding runs as on the test server (not its superuser, so
#: permissions are checked as on a real cluster).
TEST_USER = "slts"
#: Test URLs retry without sleeping: the server's failures are injected, not timed.
TEST_OPTIONS = {"user": TEST_USER, "backoff_s": 0, "max_attempts": 4, "timeout_s": 30}
REAL_URL_VARIABLE = "SLTS_HDFS_URL"


def require_pyhdfs() -> None:
    pytest.importorskip("pyhdfs", reason="pyhdfs is not installed (pip install 'slts[hdfs]')")


class ServerRaw:
    """Reads and writes the test server's files without HTTP, by the binding's name mapping."""

    def __init__(self, server: WebHdfsTestServer, root: str) -> None:
        self._server = server
        self._root = root

    def path(self, name: str) -> str:
        from slts.bindings.hdfs import chunk_relpath

        return f"{self._root}/{chunk_relpath(name)}"

    def read(self, name: str) -> bytes:
        return self._server.raw_read(self.path(name))  # KeyError if absent

    def write(self, name: str, data: bytes) -> None:
        self._server.raw_write(self.path(name), data, owner=TEST_USER)

    def exists(self, name: str) -> bool:
        return self._server.raw_exists(self.path(name))


class PyhdfsRaw:
    """Reads and writes a real cluster's files with ``pyhdfs`` (not through the binding)."""

    def __init__(self, client, root: str) -> None:
        self._client = client
        self._root = root

    def path(self, name: str) -> str:
        from slts.bindings.hdfs import chunk_relpath

        return f"{self._root}/{chunk_relpath(name)}"

    def read(self, name: str) -> bytes:
        import pyhdfs

        try:
            with self._client.open(self.path(name)) as stream:
                return stream.read()
        except pyhdfs.HdfsFileNotFoundException:
            raise KeyError(name) from None

    def write(self, name: str, data: bytes) -> None:
        self._client.create(self.path(name), data, overwrite="true")

    def exists(self, name: str) -> bool:
        import pyhdfs

        try:
            return self._client.get_file_status(self.path(name)).type == "FILE"
        except pyhdfs.HdfsFileNotFoundException:
            return False


def hdfs_binding(workdir: Path) -> BindingUnderTest:
    require_pyhdfs()
    from slts.bindings.hdfs import HdfsChunkStorage

    server = shared_server()
    root = f"/conformance/{uuid.uuid4().hex}"
    url = server.url(root, **TEST_OPTIONS)
    storage = HdfsChunkStorage.from_url(url)
    return BindingUnderTest(
        "hdfs",
        storage,
        ServerRaw(server, root),
        reopen=lambda: HdfsChunkStorage.from_url(url),
        cleanup=lambda: server.raw_delete(root),
        # Every model step is a few dozen HTTP requests (about 0.5 ms each, client and
        # server sharing one GIL): 50 programs keep the run near 30 s.
        model_examples=50,
    )


def real_cluster_configured() -> bool:
    """Whether ``SLTS_HDFS_URL`` names a real cluster for the ``hdfs-real`` entry."""
    return bool(os.environ.get(REAL_URL_VARIABLE, ""))


def real_cluster_url() -> str:
    url = os.environ.get(REAL_URL_VARIABLE, "")
    if not url:
        pytest.skip(
            f"{REAL_URL_VARIABLE} is not set: no real HDFS cluster to test against "
            "(set it to hdfs://NAMENODE:HTTP_PORT/writable/folder?user=NAME)"
        )
    return url


def hdfs_real_binding(workdir: Path) -> BindingUnderTest:
    url = real_cluster_url()
    require_pyhdfs()
    import pyhdfs
    from slts.bindings.hdfs import HdfsChunkStorage

    parts = urlsplit(url)
    root = unquote(parts.path).rstrip("/") + f"/conformance-{uuid.uuid4().hex}"
    test_url = urlunsplit(parts._replace(path=root))
    storage = HdfsChunkStorage.from_url(test_url)
    options = dict(parse_qsl(parts.query))
    client = pyhdfs.HdfsClient(
        hosts=parts.netloc,
        user_name=storage.user,
        randomize_hosts=False,
        scheme="https" if options.get("https", "0").lower() in ("1", "true", "yes") else "http",
    )
    return BindingUnderTest(
        "hdfs-real",
        storage,
        PyhdfsRaw(client, root),
        reopen=lambda: HdfsChunkStorage.from_url(test_url),
        cleanup=lambda: client.delete(root, recursive="true"),
        model_examples=20,  # a real cluster: milliseconds per request, each step dozens
    )
