"""Memory-binding specifics: capability flags can be turned off (an S3-like memory binding);
``memory://`` URLs share one store per name until it is discarded."""

from __future__ import annotations

import uuid

import pytest
from slts.bindings import discard_memory, from_url, memory_urls
from slts.bindings.memory import MemoryChunkStorage

from slts.errors import InvalidArgument


def test_memory_capabilities_follow_the_constructor_then_the_class():
    class NoAppend(MemoryChunkStorage):
        supports_append = False

    assert NoAppend().supports_append is False
    assert NoAppend(supports_append=True).supports_append is True
    assert MemoryChunkStorage(supports_truncate=False).supports_truncate is False
    assert MemoryChunkStorage().supports_truncate is True


def test_memory_urls_share_one_instance_per_name():
    url = f"memory://conformance-{uuid.uuid4().hex}"
    first = from_url(url)
    first.create("c", b"x")
    assert from_url(url) is first
    assert not from_url(url + "-other").exists("c")


def test_a_discarded_memory_url_starts_empty_and_its_old_binding_keeps_its_chunks():
    url = f"memory://conformance-{uuid.uuid4().hex}"
    first = from_url(url)
    first.create("c", b"x")
    assert url in memory_urls()
    discard_memory(url)
    assert url not in memory_urls()
    second = from_url(url)
    assert second is not first and not second.exists("c")
    assert first.read(first.open_read("c"), 0, 1) == b"x"
    discard_memory(url)
    discard_memory(url)  # nothing left to forget: no error


@pytest.mark.parametrize("url", ["file:///tmp/x", "memory", "", None, 7])
def test_discarding_anything_but_a_memory_url_is_refused_and_changes_nothing(url):
    kept = f"memory://conformance-{uuid.uuid4().hex}"
    from_url(kept)
    before = memory_urls()
    with pytest.raises(InvalidArgument, match="memory://"):
        discard_memory(url)
    assert memory_urls() == before
