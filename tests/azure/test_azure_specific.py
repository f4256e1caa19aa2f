"""The Azure binding against Azurite (``tests/support/azurite.py``), beyond the conformance suite.

* conditional creates and appends: the binding sends the conditions (seen on the wire),
  and the emulator honours them (checked directly, as the exclusivity rests on them);
* half-created chunks (a create whose appends did not all land) are invisible and keep
  their name; full chunks refuse appends without writing anything;
* concat: Put Block From URL is feature-detected (Azurite answers 501), the fallback
  copies through this process and says so; ``native_concat=on`` fails without a target;
* credentials from the environment, and never in a repr, message or log record;
* lost answers: a create or append applied by the service whose answer never came back
  is settled by the retry, not turned into ``ChunkExists``/``ChunkInvalidOffset``;
* ``slts.open`` and ``from_url`` on an ``azure://`` URL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip(
    "azure.storage.blob", reason="azure-storage-blob is not installed (pip install 'slts[azure]')"
)

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobServiceClient, BlobType
from slts.bindings import ChunkHandle, ConcatSource, from_url
from slts.bindings.azure import META_LENGTH, AzureChunkStorage, credentials_from_environment

import slts
from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNotFound,
    ChunkStorageError,
    StorageUnavailable,
)
from tests.support.azurite import AzuriteServer


def pattern(length: int, seed: int = 0) -> bytes:
    block = bytes((seed + i) % 251 for i in range(251))
    return (block * (length // 251 + 1))[:length]


class Wire:
    """Every request's method, path and headers, and a way to lose the next answers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.lose: list[str] = []  # lose the answer of the next request whose query has this
        #: Called with every response (after ``lose``), every request before it is sent:
        #: a test's own doing at that moment.
        self.respond: Callable[[Any], None] | None = None
        self.before: Callable[[Any], None] | None = None

    def on_request(self, request: Any) -> None:
        http = request.http_request
        self.requests.append((http.method, http.url, dict(http.headers)))
        if self.before is not None:
            self.before(request)

    def on_response(self, response: Any) -> None:
        url = response.http_request.url
        for marker in list(self.lose):
            if marker in url:
                self.lose.remove(marker)
                raise ServiceResponseError("the answer was lost on the way back (test)")
        if self.respond is not None:
            self.respond(response)


def binding_on(azurite: AzuriteServer, wire: Wire | None = None, **options: Any) -> AzureChunkStorage:
    hooks = (
        {} if wire is None else {"raw_request_hook": wire.on_request, "raw_response_hook": wire.on_response}
    )
    service = BlobServiceClient.from_connection_string(azurite.connection_string, retry_total=0, **hooks)
    client = service.get_container_client(azurite.new_container("specific"))
    return AzureChunkStorage(
        client.container_name, "chunks", container_client=client, sleep=lambda _: None, **options
    )


def raw_container(azurite: AzuriteServer, storage: AzureChunkStorage) -> Any:
    return azurite.service().get_container_client(storage.container)


# -- conditions ------------------------------------------------------------------------------------


def test_create_and_append_send_their_conditions(azurite) -> None:
    wire = Wire()
    storage = binding_on(azurite, wire)
    handle = storage.create("c", b"first")
    storage.write(handle, 5, b"second")
    puts = [(url, headers) for method, url, headers in wire.requests if method == "PUT"]
    create, first_block, second_block = puts
    assert create[1]["If-None-Match"] == "*" and create[1]["x-ms-blob-type"] == "AppendBlob"
    assert "comp=appendblock" in first_block[0] and first_block[1]["x-ms-blob-condition-appendpos"] == "0"
    assert second_block[1]["x-ms-blob-condition-appendpos"] == "5"


def test_the_emulator_honours_the_conditions(azurite) -> None:
    storage = binding_on(azurite)
    blob = raw_container(azurite, storage).get_blob_client("raw")
    blob.create_append_blob(match_condition=MatchConditions.IfMissing)
    with pytest.raises(ResourceExistsError):
        blob.create_append_blob(match_condition=MatchConditions.IfMissing)
    blob.append_block(b"abc", appendpos_condition=0)
    with pytest.raises(HttpResponseError) as refused:
        blob.append_block(b"xyz", appendpos_condition=0)
    assert (refused.value.status_code, refused.value.error_code) == (412, "AppendPositionConditionNotMet")
    assert blob.download_blob().readall() == b"abc"


def test_a_half_created_chunk_is_invisible_but_keeps_its_name(azurite) -> None:
    storage = binding_on(azurite)
    container = raw_container(azurite, storage)
    # What a create leaves when it dies between Put Blob and its Append Block.
    container.get_blob_client(storage.blob_name("half")).create_append_blob(metadata={META_LENGTH: "10"})
    assert not storage.exists("half")
    assert list(storage.list()) == []
    with pytest.raises(ChunkNotFound):
        storage.get_info("half")
    with pytest.raises(ChunkNotFound):
        storage.read(ChunkHandle("half", readonly=True), 0, 1)
    with pytest.raises(ChunkNotFound):
        storage.write(ChunkHandle("half", readonly=False), 0, b"0123456789")
    with pytest.raises(ChunkExists):
        storage.create("half", b"again")
    storage.delete(ChunkHandle("half", readonly=False))  # GC removes it by name
    storage.create("half", b"now whole")
    assert storage.read(storage.open_read("half"), 0, 100) == b"now whole"


def test_a_full_chunk_refuses_appends_and_writes_nothing(azurite) -> None:
    storage = binding_on(azurite, blocks_max=3)
    handle = storage.create("c", b"a")  # block 1
    storage.write(handle, 1, b"b")  # block 2
    storage.write(handle, 2, b"c")  # block 3
    with pytest.raises(ChunkInvalidOffset, match="full"):
        storage.write(handle, 3, b"d")
    assert storage.read(handle, 0, 10) == b"abc"
    # A fresh binding (no remembered count) asks the service first.
    with pytest.raises(ChunkInvalidOffset, match="full"):
        binding_on_same(storage).write(handle, 3, b"d")


def binding_on_same(storage: AzureChunkStorage) -> AzureChunkStorage:
    return AzureChunkStorage(
        storage.container, storage.prefix, container_client=storage._client, blocks_max=storage.blocks_max
    )


def test_writes_larger_than_a_block_are_split_at_their_positions(azurite) -> None:
    wire = Wire()
    storage = binding_on(azurite, wire, append_block_bytes=1000)
    data = pattern(2500)
    handle = storage.create("c", data[:1])
    storage.write(handle, 1, data[1:])
    positions = [h.get("x-ms-blob-condition-appendpos") for m, u, h in wire.requests if "appendblock" in u]
    assert positions == ["0", "1", "1001", "2001"]
    assert storage.read(handle, 0, 3000) == data


# -- lost answers ----------------------------------------------------------------------------------


def test_a_create_whose_answer_was_lost_is_settled_by_its_write_id(azurite) -> None:
    wire = Wire()
    storage = binding_on(azurite, wire)
    wire.lose.append("chunks/c")  # the Put Blob's answer; the retry then meets its own blob
    storage.create("c", b"mine")
    assert storage.statistics().retries >= 1
    assert storage.read(storage.open_read("c"), 0, 10) == b"mine"


def test_an_append_whose_answer_was_lost_is_settled_by_reading_it_back(azurite) -> None:
    wire = Wire()
    storage = binding_on(azurite, wire)
    handle = storage.create("c", b"head")
    wire.lose.append("comp=appendblock")
    storage.write(handle, 4, b"tail")
    assert storage.statistics().retries == 1
    assert storage.read(handle, 0, 100) == b"headtail"  # once, not twice


def test_another_writers_append_is_not_taken_for_ours(azurite) -> None:
    wire = Wire()
    storage = binding_on(azurite, wire)
    handle = storage.create("c", b"head")
    raw = raw_container(azurite, storage).get_blob_client(storage.blob_name("c"))
    done: list[int] = []

    def rival(request: Any) -> None:  # ours never leaves; a rival appends at our offset
        if "comp=appendblock" in request.http_request.url and not done:
            done.append(1)
            raw.append_block(b"RIVL", appendpos_condition=4)
            raise ServiceRequestError("connection reset before sending (test)")

    wire.before = rival
    # The retry meets 412; the bytes there are not ours, so the write lost the race.
    with pytest.raises(ChunkInvalidOffset):
        storage.write(handle, 4, b"ours")
    assert storage.statistics().retries == 1
    assert storage.read(handle, 0, 100) == b"headRIVL"


# -- concat ------------------------------------------------------------------------------------------


def test_concat_copies_inside_the_emulator_with_put_block_from_url(azurite) -> None:
    storage = binding_on(azurite)
    assert storage.native_concat is None  # not known before the first concat
    storage.create("a", pattern(3000, 1))
    storage.create("b", pattern(5000, 2))
    sources = [ConcatSource("a", 10, 2000), ConcatSource("b", 0, 5000)]
    before = storage.statistics()
    storage.concat("t", sources)
    after = storage.statistics()
    assert storage.native_concat is True  # Azurite 3.37 has Put Block From URL
    assert after.copy_requests - before.copy_requests == 2
    assert after.bytes_copied_server_side - before.bytes_copied_server_side == 7000
    assert after.bytes_uploaded == before.bytes_uploaded
    assert after.bytes_downloaded == before.bytes_downloaded
    assert storage.concat_bytes_through_client(sources) == 0
    assert storage.read(storage.open_read("t"), 0, 10_000) == pattern(3000, 1)[10:2010] + pattern(5000, 2)


def refuse_copies(wire: Wire) -> None:
    """Answer every Put Block From URL with 501, as a service without it does (Azurite
    3.37 has it; its Put Blob From URL and Append Block From URL answer 501)."""

    def on_response(response: Any) -> None:
        if "x-ms-copy-source" in response.http_request.headers:
            response.http_response.status_code = 501

    wire.respond = on_response


def test_concat_falls_back_for_good_when_the_service_answers_501(azurite) -> None:
    wire = Wire()
    refuse_copies(wire)
    storage = binding_on(azurite, wire)
    storage.create("a", pattern(3000, 1))
    storage.create("b", pattern(5000, 2))
    sources = [ConcatSource("a", 10, 2000), ConcatSource("b", 0, 5000)]
    assert storage.concat_bytes_through_client(sources) == 0  # taken to be native until found not
    storage.concat("t", sources)
    first = storage.statistics()
    assert storage.native_concat is False
    assert first.copy_requests == 1 and first.bytes_copied_server_side == 0
    assert storage.concat_bytes_through_client(sources) == 7000
    assert storage.read(storage.open_read("t"), 0, 10_000) == pattern(3000, 1)[10:2010] + pattern(5000, 2)
    storage.concat("t2", sources)  # decided once: no second Put Block From URL
    assert storage.statistics().copy_requests == 1
    assert storage.statistics().bytes_uploaded - first.bytes_uploaded == 7000


def test_native_concat_on_fails_where_the_service_lacks_it_and_leaves_no_target(azurite) -> None:
    wire = Wire()
    refuse_copies(wire)
    storage = binding_on(azurite, wire, native_concat="on")
    storage.create("a", b"abc")
    with pytest.raises(ChunkStorageError, match=r"Put Block From URL.*501"):
        storage.concat("t", [ConcatSource("a", 0, 3)])
    assert not storage.exists("t")
    assert list(storage.list()) == ["a"]


def test_native_concat_off_sends_no_copy_request(azurite) -> None:
    storage = binding_on(azurite, native_concat="off")
    storage.create("a", b"abc")
    storage.concat("t", [ConcatSource("a", 1, 2)])
    assert storage.statistics().copy_requests == 0
    assert storage.read(storage.open_read("t"), 0, 5) == b"bc"


def test_a_concat_target_is_a_block_blob_that_appends_by_block_list(azurite) -> None:
    wire = Wire()
    storage = binding_on(azurite, wire, native_concat="off")
    storage.create("a", b"abc")
    storage.concat("t", [ConcatSource("a", 0, 3)])
    properties = raw_container(azurite, storage).get_blob_client(storage.blob_name("t")).get_blob_properties()
    assert properties.blob_type == BlobType.BLOCKBLOB
    handle = storage.open_write("t")
    storage.write(handle, 3, b"def")
    commits = [h for m, u, h in wire.requests if "comp=blocklist" in u and m == "PUT"]
    assert commits[0]["If-None-Match"] == "*"  # the concat: exclusive
    assert commits[-1]["If-Match"]  # the append: only onto the blob as read
    with pytest.raises(ChunkInvalidOffset):
        storage.write(handle, 3, b"late")
    assert storage.read(handle, 0, 10) == b"abcdef"


# -- credentials and URLs ------------------------------------------------------------------------------


def test_a_binding_from_an_azure_url_with_a_connection_string(azurite, monkeypatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    container = azurite.new_container("url")
    storage = from_url(f"azure://{container}/deep/prefix?max_attempts=2")
    storage.create("x/y", b"through the URL")
    assert list(storage.list()) == ["x/y"]
    blob = azurite.service().get_container_client(container).get_blob_client("deep/prefix/x%2Fy")
    assert blob.download_blob().readall() == b"through the URL"
    storage.close()


def test_a_binding_from_an_account_and_key(azurite, monkeypatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", azurite.account)
    monkeypatch.setenv("AZURE_STORAGE_KEY", azurite.account_key)
    container = azurite.new_container("key")
    storage = from_url(f"azure://{container}/p?endpoint={azurite.endpoint_url}")
    storage.create("k", b"by key")
    assert storage.read(storage.open_read("k"), 0, 10) == b"by key"
    storage.close()


def test_a_wrong_key_is_a_typed_access_error_that_names_no_secret(azurite, caplog) -> None:
    wrong = "V3Jvbmcga2V5IGZvciB0aGUgdGVzdCBhY2NvdW50IQ=="
    credentials = credentials_from_environment(
        azurite.account,
        azurite.endpoint_url,
        environ={"AZURE_STORAGE_ACCOUNT": azurite.account, "AZURE_STORAGE_KEY": wrong},
    )
    storage = AzureChunkStorage(azurite.new_container("denied"), credentials=credentials)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ChunkStorageError) as caught:
        storage.create("c", b"x")
    assert not isinstance(caught.value, StorageUnavailable)
    text = f"{caught.value} {caught.value!r} {storage!r} {credentials!r} {caplog.text}"
    assert wrong not in text and azurite.account_key not in text


def test_a_missing_container_is_a_storage_error(azurite) -> None:
    client = azurite.service().get_container_client("no-such-container")
    storage = AzureChunkStorage("no-such-container", container_client=client)
    with pytest.raises(ChunkStorageError, match="does not exist"):
        storage.create("c", b"x")


def test_slts_open_on_an_azure_url(azurite, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    url = f"azure://{azurite.new_container('open')}/slts"
    storage = slts.open(url, metadata=str(tmp_path / "md"))
    storage.create("scope/stream/0")
    handle = storage.open_write("scope/stream/0")
    storage.write(handle, 0, b"hello")
    storage.write(handle, 5, b" world")  # appended to the same chunk
    assert storage.info("scope/stream/0").chunk_count == 1
    storage.close()
    again = slts.open(url, metadata=str(tmp_path / "md"))
    assert again.read(again.open_read("scope/stream/0"), 0, 11) == b"hello world"
    again.close()


def test_the_engine_rolls_to_a_new_chunk_when_one_is_full(azurite, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    url = f"azure://{azurite.new_container('full')}/slts?blocks_max=2"
    storage = slts.open(url, metadata=str(tmp_path / "md"))
    storage.create("s")
    handle = storage.open_write("s")
    storage.write(handle, 0, b"one")  # a chunk: block 1
    storage.write(handle, 3, b"two")  # appended: block 2, the chunk is full
    with pytest.raises(ChunkInvalidOffset, match="full"):
        storage.write(handle, 6, b"three")  # refused, nothing written, the chunk is marked
    storage.write(handle, 6, b"three")  # the retry rolls to a new chunk
    assert storage.info("s").chunk_count == 2
    assert storage.read(storage.open_read("s"), 0, 11) == b"onetwothree"
    storage.close()


def test_a_concat_whose_commit_answer_was_lost_is_settled_by_its_write_id(azurite) -> None:
    wire = Wire()
    storage = binding_on(azurite, wire)
    storage.create("a", b"abcdef")
    wire.lose.append("comp=blocklist")  # Put Block List applied, its answer lost
    storage.concat("t", [ConcatSource("a", 1, 4)])
    assert storage.statistics().retries == 1
    assert storage.read(storage.open_read("t"), 0, 10) == b"bcde"
    with pytest.raises(ChunkExists):  # a second concat to it is still refused
        storage.concat("t", [ConcatSource("a", 0, 1)])


def test_a_write_torn_between_its_blocks_is_unavailable_not_invalid_offset(azurite) -> None:
    wire = Wire()
    storage = binding_on(azurite, wire, append_block_bytes=1000)
    handle = storage.create("c", b"h")
    raw = raw_container(azurite, storage).get_blob_client(storage.blob_name("c"))
    appended: list[int] = []

    def rival(response: Any) -> None:  # after our first block lands, another writer appends
        if "comp=appendblock" in response.http_request.url and not appended:
            appended.append(1)
            raw.append_block(b"rival", appendpos_condition=1001)

    wire.respond = rival
    with pytest.raises(StorageUnavailable, match="not this write's"):
        storage.write(handle, 1, pattern(2000))
    assert storage.get_info("c").length == 1 + 1000 + 5  # the tail is garbage to the engine
