"""Fixtures shared by every test folder.

``s3_server``: the session's SeaweedFS S3 server (``tests/s3server.py``): endpoint, test
credentials, ``new_bucket()``. Started on first use (also by the S3 entries of the
conformance and storage suites), stopped (SIGTERM, grace, SIGKILL) when the session
ends; tests that need it skip with the reason when ``weed`` or boto3 is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.s3server import SeaweedServer, shared_server_or_skip, stop_shared_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedServer]:
    server = shared_server_or_skip()
    try:
        yield server
    finally:
        stop_shared_server()


@pytest.fixture(scope="session", autouse=True)
def _stop_s3_server_at_session_end() -> Iterator[None]:
    # Suites that start the shared server without the fixture: stopped at the end too
    # (atexit is only the fallback).
    yield
    stop_shared_server()
