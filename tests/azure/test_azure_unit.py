"""The Azure binding without a service: blob names, URLs, credentials from the
environment, the missing extras, and the translation of every SDK error (``_translate``,
the binding's one choke point). Connection failures are real: a port nothing listens on."""

from __future__ import annotations

import socket
import sys

import pytest

pytest.importorskip(
    "azure.storage.blob", reason="azure-storage-blob is not installed (pip install 'slts[azure]')"
)

from azure.core.credentials import AzureSasCredential
from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError
from hypothesis import given
from hypothesis import strategies as st
from slts.bindings import from_url
from slts.bindings.azure import (
    LEAF_CHARS_MAX,
    AzureChunkStorage,
    AzureCredentials,
    blob_leaf,
    credentials_from_environment,
)

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNotFound,
    ChunkReadOnly,
    ChunkStorageError,
    InvalidConfig,
    StorageUnavailable,
)

KEY = "dGhpcyBpcyBub3QgYSByZWFsIGFjY291bnQga2V5IQ=="
CONNECTION = (
    f"DefaultEndpointsProtocol=http;AccountName=acct1;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:9/acct1;"
)
names = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), min_size=1, max_size=300)


def offline(**options: object) -> AzureChunkStorage:
    """A binding on a port nothing listens on (connection refused, at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    credentials = credentials_from_environment(
        "acct1", f"http://127.0.0.1:{port}/acct1", environ={"AZURE_STORAGE_KEY": KEY}
    )
    return AzureChunkStorage("c1c", "p", credentials=credentials, sleep=lambda _: None, **options)  # type: ignore[arg-type]


# -- blob names ----------------------------------------------------------------------------------


@given(names)
def test_a_leaf_is_one_short_segment_that_decodes_back(name: str) -> None:
    leaf = blob_leaf(name)
    assert 0 < len(leaf) <= LEAF_CHARS_MAX and "/" not in leaf and leaf not in (".", "..")
    assert not leaf.endswith(".") and not leaf.startswith(".")


@given(names, names)
def test_distinct_names_get_distinct_leaves(a: str, b: str) -> None:
    if a != b:
        assert blob_leaf(a) != blob_leaf(b)


def test_leaf_examples() -> None:
    assert blob_leaf("0/seg/E1.O0.ab") == "0%2Fseg%2FE1.O0.ab"
    assert blob_leaf("..") == "%2E%2E"
    assert blob_leaf("a.") == "a%2E"
    assert blob_leaf("100%") == "100%25"
    long = blob_leaf("y" * 1000)
    assert long.startswith("y" * 100) and "~" in long and len(long) <= LEAF_CHARS_MAX


# -- URLs ----------------------------------------------------------------------------------------


def test_from_url_reads_container_prefix_and_options(monkeypatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", CONNECTION)
    url = "azure://my-container/some/prefix/?max_attempts=3&native_concat=off&append_block_bytes=4194304"
    storage = from_url(url)
    assert isinstance(storage, AzureChunkStorage)
    assert (storage.container, storage.prefix, storage.url) == ("my-container", "some/prefix", url)
    assert storage.blob_name("a/b") == "some/prefix/a%2Fb"
    assert (storage.retry.max_attempts, storage.native_concat, storage.append_block_bytes) == (
        3,
        False,
        4 << 20,
    )
    assert storage.supports_append and storage.supports_concat
    assert not storage.supports_truncate and not storage.supports_readonly
    bare = AzureChunkStorage.from_url("azure://abc")
    assert (bare.prefix, bare.blob_name("x")) == ("", "x")


@pytest.mark.parametrize(
    "url",
    [
        "azure://",
        "azure:///prefix",
        "azure://Bad_Container/p",
        "azure://ab/p",
        "azure://a--b/p",
        "azure://-abc/p",
        "azure://abc/p?nope=1",
        "azure://abc/p?max_attempts=2&max_attempts=3",
        "azure://abc/p?max_attempts=",
        "azure://abc/p?max_attempts=0",
        "azure://abc/p?max_attempts=lots",
        "azure://abc/p?read_timeout_s=-1",
        "azure://abc/p?native_concat=maybe",
        "azure://abc/p?append_block_bytes=0",
        "azure://abc/p?append_block_bytes=104857601",
        "azure://abc/p?blocks_max=50001",
        "azure://abc/a/../b",
        "azure://abc/a//b",
        "azure://abc/a./b",
        "azure://abc/p#frag",
        "azure://abc/" + "x" * 400,
        "azure://abc/p?endpoint=ftp://host",
    ],
)
def test_bad_urls_raise_invalid_config(url: str, monkeypatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", CONNECTION)
    with pytest.raises(InvalidConfig):
        from_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "azure://acct1:topsecretvalue@abc/p",
        "azure://abc/p?account_key=topsecretvalue",
        "azure://abc/p?sig=topsecretvalue&sv=2020-01-01",
        "azure://abc/p?sas=topsecretvalue",
        "azure://abc/p?connection_string=topsecretvalue",
    ],
)
def test_credentials_in_a_url_are_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        from_url(url)
    assert "topsecretvalue" not in str(caught.value) and "topsecretvalue" not in repr(caught.value)


# -- credentials from the environment ---------------------------------------------------------------


def test_a_connection_string_comes_first() -> None:
    found = credentials_from_environment(
        environ={"AZURE_STORAGE_CONNECTION_STRING": CONNECTION, "AZURE_STORAGE_ACCOUNT": "other"}
    )
    assert found.connection_string == CONNECTION and found.source == "AZURE_STORAGE_CONNECTION_STRING"
    assert KEY not in repr(found)
    with pytest.raises(InvalidConfig, match="both name the endpoint"):
        credentials_from_environment(
            None, "http://h/acct1", environ={"AZURE_STORAGE_CONNECTION_STRING": CONNECTION}
        )


def test_an_account_key_or_a_sas_token_with_the_account() -> None:
    keyed = credentials_from_environment(environ={"AZURE_STORAGE_ACCOUNT": "acct1", "AZURE_STORAGE_KEY": KEY})
    assert keyed.account_url == "https://acct1.blob.core.windows.net"
    assert keyed.credential == {"account_name": "acct1", "account_key": KEY}
    sas = credentials_from_environment(
        "acct2", "http://127.0.0.1:9/acct2", environ={"AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=abc"}
    )
    assert sas.account_url == "http://127.0.0.1:9/acct2"
    assert isinstance(sas.credential, AzureSasCredential) and sas.credential.signature == "sv=1&sig=abc"
    with pytest.raises(InvalidConfig, match="account name"):
        credentials_from_environment("Bad_Name", environ={"AZURE_STORAGE_KEY": KEY})


def test_no_account_at_all_names_what_to_set() -> None:
    with pytest.raises(InvalidConfig, match="AZURE_STORAGE_CONNECTION_STRING"):
        credentials_from_environment(environ={})


def test_without_key_or_sas_the_identity_extra_is_named(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)  # not installed
    with pytest.raises(InvalidConfig, match=r"pip install 'slts\[azure-identity\]'"):
        credentials_from_environment(environ={"AZURE_STORAGE_ACCOUNT": "acct1"})


def test_a_missing_sdk_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "azure.storage.blob", None)  # not installed
    monkeypatch.delitem(sys.modules, "slts.bindings.azure")
    with pytest.raises(InvalidConfig, match=r"pip install 'slts\[azure\]'"):
        from_url("azure://abc/p")


def test_credentials_repr_shows_no_secret() -> None:
    found = AzureCredentials(
        "http://h/a", {"account_name": "a", "account_key": KEY}, None, "AZURE_STORAGE_KEY"
    )
    assert KEY not in repr(found) and KEY not in str(found)


# -- the choke point ------------------------------------------------------------------------------


def http_error(status: int, code: str) -> HttpResponseError:
    error = HttpResponseError(message=f"{code} (test)")
    error.status_code = status
    error.error_code = code  # type: ignore[attr-defined]
    return error


@pytest.mark.parametrize(
    ("status", "code", "conflict", "expected"),
    [
        (404, "BlobNotFound", ChunkExists, ChunkNotFound),
        (409, "BlobAlreadyExists", ChunkExists, ChunkExists),
        (412, "ConditionNotMet", ChunkExists, ChunkExists),
        (412, "AppendPositionConditionNotMet", ChunkInvalidOffset, ChunkInvalidOffset),
        (412, "MaxBlobSizeConditionNotMet", ChunkInvalidOffset, ChunkInvalidOffset),
        (409, "BlockCountExceedsLimit", ChunkExists, ChunkInvalidOffset),
        (416, "InvalidRange", ChunkExists, ChunkInvalidOffset),
        (409, "BlobImmutableDueToPolicy", ChunkExists, ChunkReadOnly),
        (409, "BlobIsSealed", ChunkInvalidOffset, ChunkReadOnly),
        (503, "ServerBusy", ChunkExists, StorageUnavailable),
        (500, "OperationTimedOut", ChunkExists, StorageUnavailable),
        (500, "InternalError", ChunkExists, StorageUnavailable),
        (429, "", ChunkExists, StorageUnavailable),
        (403, "AuthenticationFailed", ChunkExists, ChunkStorageError),
        (403, "AuthorizationPermissionMismatch", ChunkExists, ChunkStorageError),
        (404, "ContainerNotFound", ChunkExists, ChunkStorageError),
        (400, "InvalidHeaderValue", ChunkExists, ChunkStorageError),
    ],
)
def test_every_service_answer_becomes_a_typed_error(status, code, conflict, expected) -> None:
    storage = offline()
    error = storage._translate(http_error(status, code), "Put Blob", "c", conflict)
    assert type(error) is expected or (expected is ChunkStorageError and type(error) is ChunkStorageError)
    assert error.retryable == (expected is StorageUnavailable)
    assert error.context["chunk"] == "c"


@pytest.mark.parametrize("error", [ServiceRequestError("refused"), ServiceResponseError("reset")])
def test_transport_failures_are_retryable(error) -> None:
    assert isinstance(offline()._translate(error, "Get Blob", "c", ChunkExists), StorageUnavailable)


def test_a_refused_connection_is_retried_then_storage_unavailable() -> None:
    sleeps: list[float] = []
    storage = offline(max_attempts=3)
    storage._sleep = sleeps.append
    with pytest.raises(StorageUnavailable, match="gave up after 3 attempts") as caught:
        storage.create("c", b"x")
    assert isinstance(caught.value.__cause__, ServiceRequestError)
    assert len(sleeps) == 2 and storage.statistics().retries == 2
    assert storage.statistics().put_requests == 3  # every attempt counted
    assert KEY not in str(caught.value)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.exists("c"),
        lambda s: s.get_info("c"),
        lambda s: list(s.list()),
        lambda s: s.read(s.open_read("c"), 0, 1),
    ],
)
def test_no_sdk_exception_leaves_the_binding(call) -> None:
    with pytest.raises(StorageUnavailable):
        call(offline(max_attempts=1))


def test_without_key_or_sas_default_azure_credential_is_used(monkeypatch) -> None:
    import types

    class DefaultAzureCredential:  # stands in for azure-identity's (not installed here)
        def get_token(self, *scopes: str) -> object:
            raise AssertionError("no token is needed to build the binding")

    module = types.ModuleType("azure.identity")
    module.DefaultAzureCredential = DefaultAzureCredential  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "azure.identity", module)
    found = credentials_from_environment(environ={"AZURE_STORAGE_ACCOUNT": "acct1"})
    assert found.source == "DefaultAzureCredential"
    assert isinstance(found.credential, DefaultAzureCredential)
    assert found.account_url == "https://acct1.blob.core.windows.net"
    storage = AzureChunkStorage("abc", credentials=found)
    assert storage._client.credential is found.credential
