"""Fixtures for the journal tests: every binding kind the journal must work on.

``binding``: memory (append), filesystem (append, real files), memory without append
(object-per-record, like S3) and S3 on the session's SeaweedFS server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slts.bindings.base import ChunkStorage

from tests.support.engine import BINDINGS, FakeClock, env  # noqa: F401 - the engine fixture, reused

KINDS = ["memory", "filesystem", "no-append", "s3"]


@pytest.fixture(params=KINDS)
def binding(request: pytest.FixtureRequest, tmp_path) -> Iterator[ChunkStorage]:
    made = BINDINGS[request.param](tmp_path)
    yield made
    made.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
