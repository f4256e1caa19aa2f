"""The native paths against a real bucket: ``SLTS_GCS_URL=gs://BUCKET/prefix`` (credentials: ADC).

What the emulator cannot show is checked here: the service itself refuses a second
``ifGenerationMatch=0`` create (so the probe keeps ``server`` mode and exclusivity holds
across processes), and a compose tree runs natively. The conformance suite's ``gcs-real``
entry runs the whole contract there too. Without the variable every test skips, saying why.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from slts.bindings import ConcatSource

from slts.errors import ChunkExists
from tests.conformance import conftest as conformance
from tests.support.gcs import real_binding, real_bucket_configured, real_bucket_url


@pytest.fixture
def storage() -> Iterator[Any]:
    real_bucket_url()  # skips with the reason when SLTS_GCS_URL is not set
    binding = real_binding(f"specific-{uuid.uuid4().hex}")
    yield binding
    for name in list(binding.list()):
        binding.delete(binding.open_read(name))
    binding.close()


def test_the_real_bucket_entry_runs_when_configured() -> None:
    url = real_bucket_url()
    assert real_bucket_configured() and url
    assert "gcs-real" in conformance.BINDINGS


def test_the_service_enforces_if_generation_match(storage) -> None:
    storage.create("a", b"first")
    assert storage.preconditions == "server"  # the probe saw a 412 (or Google's endpoint needs none)
    with pytest.raises(ChunkExists):
        storage.create("a", b"second")
    assert storage.read(storage.open_read("a"), 0, 10) == b"first"


def test_a_compose_tree_runs_natively(storage) -> None:
    sources = []
    for i in range(40):
        storage.create(f"p{i:02}", bytes([i]) * 3)
        sources.append(ConcatSource(f"p{i:02}", 0, 3))
    before = storage.statistics()
    storage.concat("t", sources)
    after = storage.statistics()
    assert after.bytes_uploaded == before.bytes_uploaded
    assert after.compose_requests - before.compose_requests == 3
    assert storage.read(storage.open_read("t"), 0, 120) == b"".join(bytes([i]) * 3 for i in range(40))
