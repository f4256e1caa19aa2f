"""Fixtures for the HDFS binding's own tests: the WebHDFS test server and bindings on it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.support.hdfs import TEST_OPTIONS, require_pyhdfs
from tests.support.webhdfs_server import WebHdfsTestServer, shared_server, stop_shared_server


@pytest.fixture(scope="session")
def webhdfs_server() -> Iterator[WebHdfsTestServer]:
    """The session's test server (shared with the conformance suite's ``hdfs`` entry)."""
    server = shared_server()
    yield server
    errors = list(server.internal_errors)
    stop_shared_server()
    assert errors == [], errors


@pytest.fixture
def server(webhdfs_server: WebHdfsTestServer) -> Iterator[WebHdfsTestServer]:
    """The session's server with no injected faults, modes or pauses left by a test."""
    yield webhdfs_server
    webhdfs_server.clear_injections()
    webhdfs_server.safe_mode = False
    webhdfs_server.standby = False
    webhdfs_server.finish_recoveries()


@pytest.fixture
def own_server() -> Iterator[WebHdfsTestServer]:
    """A private server, for tests that change its settings or stop it."""
    with WebHdfsTestServer() as private:
        yield private
        assert private.internal_errors == []


@pytest.fixture
def root(server: WebHdfsTestServer) -> Iterator[str]:
    folder = f"/hdfs-tests/{uuid.uuid4().hex}"
    yield folder
    server.raw_delete(folder)


@pytest.fixture
def make_storage(server: WebHdfsTestServer, root: str) -> Iterator[Callable[..., object]]:
    """Builds ``HdfsChunkStorage`` instances on ``root`` (keyword arguments: URL options)."""
    require_pyhdfs()
    from slts.bindings.hdfs import HdfsChunkStorage

    made: list[HdfsChunkStorage] = []

    def make(**options: object) -> HdfsChunkStorage:
        storage = HdfsChunkStorage.from_url(server.url(root, **{**TEST_OPTIONS, **options}))
        made.append(storage)
        return storage

    yield make
    for storage in made:
        storage.close()


@pytest.fixture
def storage(make_storage):
    return make_storage()
