"""Against a real Azure Storage account: ``SLTS_AZURE_URL=azure://CONTAINER/prefix`` with
credentials in the environment (``AZURE_STORAGE_CONNECTION_STRING``, or
``AZURE_STORAGE_ACCOUNT`` with ``AZURE_STORAGE_KEY``/``AZURE_STORAGE_SAS_TOKEN``/an identity).

The conformance suite's ``azure-real`` entry runs then; this module checks what only the
real service decides: Put Block From URL authorized the way the credentials allow (a read
SAS from the account key, the SAS itself, or an OAuth bearer), the 100 MiB Append Block of
current API versions, and the block-count limit's error. Without the variable it skips
once, saying why."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conformance import conftest as conformance
from tests.support.azure import real_account_configured, real_account_url

MiB = 1 << 20


@pytest.fixture
def storage():
    from slts.bindings.azure import AzureChunkStorage

    parts = urlsplit(real_account_url())  # skips, saying why, without SLTS_AZURE_URL
    url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + f"/real-{uuid.uuid4().hex[:12]}"))
    binding = AzureChunkStorage.from_url(url)
    yield binding
    for name in list(binding.list()):
        binding.delete(binding.open_write(name))
    binding.close()


def test_the_real_account_entry_runs_when_configured() -> None:
    assert real_account_url() and real_account_configured()
    assert "azure-real" in conformance.BINDINGS


def test_native_concat_copies_inside_the_service(storage) -> None:
    from slts.bindings import ConcatSource

    data = bytes(range(256)) * (4 * MiB // 256)
    storage.create("a", data)
    storage.create("b", data[:1000])
    storage.concat("t", [ConcatSource("a", 0, len(data)), ConcatSource("b", 10, 990)])
    statistics = storage.statistics()
    assert storage.native_concat is True
    assert statistics.bytes_copied_server_side == len(data) + 990
    assert storage.read(storage.open_read("t"), 0, 10 * MiB) == data + data[10:1000]


def test_a_write_of_eight_mib_is_one_append_block(storage) -> None:
    handle = storage.create("c", b"h")
    before = storage.statistics().put_requests
    storage.write(handle, 1, b"x" * (8 * MiB))
    assert storage.statistics().put_requests - before == 1
    assert storage.get_info("c").length == 1 + 8 * MiB
