"""Memory-binding specifics: capability flags can be turned off (an S3-like memory binding)."""

from __future__ import annotations

import uuid

from slts.bindings import from_url
from slts.bindings.memory import MemoryChunkStorage


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
