"""Azure Blob Storage chunk storage (azure-storage-blob): one blob per chunk below ``container/prefix``.

Capabilities: append (append blobs), native concat where the service has Put Block From
URL (feature-detected; else the bytes go through this process), no truncate, no
read-only. ``high_latency_reads``: the engine reads ahead for sequential readers.

How the contract maps onto Blob Storage (the conformance suite checks each line):

* ``create(name, data)``: ``Put Blob`` of an empty *append blob* with ``If-None-Match: *``
  (of two creators exactly one wins; 409 ``BlobAlreadyExists`` -> ``ChunkExists``), then
  ``data`` in ``Append Block`` requests (``appendpos`` condition). A chunk created with
  data carries ``slts_length`` (the create's length) in its metadata: it is *visible*
  (``exists``, ``open_*``, ``get_info``, ``read``, ``list``) only once the blob holds at
  least that many bytes, so readers never see a partial chunk, and a create that died
  half-way leaves an invisible blob that still takes its name (``ChunkExists``) and that
  ``delete`` removes (the engine's GC intent for the chunk does).
* ``write(handle, offset, data)``: ``Append Block`` with ``appendpos=offset``: the service
  appends only if the blob is exactly ``offset`` long, so of two writers exactly one wins
  (412 ``AppendPositionConditionNotMet`` -> ``ChunkInvalidOffset``), in one request. A
  write larger than ``append_block_bytes`` is several blocks, each at its position (not
  atomic: a failure between them leaves a tail, which the engine never adopts). A concat
  target is a block blob (below): writes to it ``Put Block`` and re-commit the block list
  with ``If-Match`` on the ETag read before.
* **Full chunks.** An append blob holds at most ``BLOCKS_MAX`` (50,000) blocks. An append
  that would pass ``blocks_max`` is refused with ``ChunkInvalidOffset`` and writes nothing
  (the service's own 409 ``BlockCountExceedsLimit`` too): the engine's write fails once,
  marks the chunk, and its retry rolls to a new chunk (docs/bindings.md, "The Azure binding").
* ``read``: one ranged ``Get Blob``; 416 is settled with ``Get Blob Properties``: ``b""``
  at the end, ``ChunkInvalidOffset`` past it.
* ``exists``/``get_info``/``open_*``: ``Get Blob Properties``. ``delete``: ``Delete Blob``
  (404 -> ``ChunkNotFound``). ``list``: ``List Blobs`` with metadata, page by page.
* ``concat``: a new *block blob*: each source range becomes blocks staged by ``Put Block
  From URL`` (copied inside the service) or, where the service lacks it (Azurite answers
  501; ``native_concat=auto`` remembers that), read and staged by ``Put Block``; then
  ``Put Block List`` with ``If-None-Match: *`` publishes it at once (uncommitted blocks
  are invisible and the service drops them after a week).

Blob names (``blob_name``): ``<prefix>/<leaf>``, the leaf being the chunk name with ``%``,
``/``, ``\\``, ``~``, control characters and a leading or trailing ``.`` percent-encoded
(so a leaf is one path segment, never ``.``/``..``, and a name prefix is a blob-name
prefix). A leaf longer than ``LEAF_CHARS_MAX`` becomes ``<head>~<sha256 of the name>``
with the name in the blob's metadata (``slts_name``, base64url): ``list`` reads it from
the listing itself.

Retries: every request goes through ``_call``, the one place where azure-core errors
become typed errors (``raise ... from exc``); the SDK's own retries are off. Throttling
(429, 503 ``ServerBusy``), 5xx and connection errors are retried ``max_attempts`` times
with the shared ``RetryPolicy``; then ``StorageUnavailable``. A conditional request
retried after a lost answer that then fails its condition is settled: a create by the
write id in ``slts_write``, an append by reading its range back.

Credentials come from the environment as Azure users give them (``credentials_from_environment``),
never from the URL (refused): a connection string, an account key, a SAS token, or
``DefaultAzureCredential`` with the ``azure-identity`` extra. They appear in no message,
repr or log of this module.

Invariants (asserted or checked by tests):

1. ``blob_leaf(name)`` is injective and decodes back only to its own name.
2. A chunk is visible only when its blob holds at least its ``slts_length``.
3. Every request is counted once per attempt, by kind (``statistics``, ``observe_requests``).
4. No azure-core exception leaves a public method (only ``slts.errors`` types).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobBlock, BlobServiceClient, BlobType, ContainerClient

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNameInvalid,
    ChunkNotFound,
    ChunkReadOnly,
    ChunkStorageError,
    InvalidConfig,
    StorageUnavailable,
)

from .base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource, check_name
from .retry import MAX_ATTEMPTS_DEFAULT, RetryPolicy
from .store_urls import StoreUrl

_log = logging.getLogger(__name__)

MiB = 1 << 20
#: Most blocks of one append or block blob (the service's limit).
BLOCKS_MAX = 50_000
#: Largest Append Block since API version 2022-11-02 (4 MiB before it).
APPEND_BLOCK_BYTES_MAX = 100 * MiB
APPEND_BLOCK_BYTES_DEFAULT = APPEND_BLOCK_BYTES_MAX
#: Blocks staged through this process by a concat without Put Block From URL.
STAGE_BLOCK_BYTES = 8 * MiB
#: Largest range one Put Block From URL copies (the service allows 4,000 MiB).
COPY_BLOCK_BYTES_MAX = 4000 * MiB
#: Longest leaf; with a prefix of at most ``PREFIX_CHARS_MAX`` a name fits Azure's 1,024.
LEAF_CHARS_MAX = 700
PREFIX_CHARS_MAX = 300
_HASH_CHARS = 64
_HASHED_HEAD_CHARS_MAX = LEAF_CHARS_MAX - 1 - _HASH_CHARS
MAX_ATTEMPTS_LIMIT = 20
RETRY_DELAY_S_BASE = 0.05
RETRY_DELAY_S_MAX = 2.0
CONNECT_TIMEOUT_S_DEFAULT = 5.0
READ_TIMEOUT_S_DEFAULT = 60.0
#: How long the read SAS of a native concat's source is valid.
SOURCE_SAS_S = 3600
_READ_ROUNDS_MAX = 3
_BLOCK_COUNT_CACHE_MAX = 4096
_LIST_PAGES_MAX = 10_000_000

#: Blob metadata (C# identifiers): the chunk name of a hashed leaf, the id of the write
#: that made the blob, the length a create gives it (the chunk is visible from there on).
META_NAME = "slts_name"
META_WRITE = "slts_write"
META_LENGTH = "slts_length"

_ESCAPED = frozenset("%/\\~") | frozenset(chr(c) for c in range(0x20)) | {"\x7f"}
_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_RETRYABLE_CODES = frozenset({"ServerBusy", "OperationTimedOut", "InternalError", "IngressOverAccountLimit"})
_CONDITION_CODES = frozenset(
    {
        "ConditionNotMet",
        "AppendPositionConditionNotMet",
        "MaxBlobSizeConditionNotMet",
        "TargetConditionNotMet",
        "BlobAlreadyExists",
    }
)
_FULL_CODES = frozenset({"BlockCountExceedsLimit", "BlockListTooLong"})
_READ_ONLY_CODES = frozenset({"BlobImmutableDueToPolicy", "BlobImmutableDueToLegalHold", "BlobIsSealed"})
_UNSUPPORTED_STATUS = frozenset({501})
_URL_OPTIONS = (
    "account",
    "endpoint",
    "max_attempts",
    "connect_timeout_s",
    "read_timeout_s",
    "native_concat",
    "append_block_bytes",
    "blocks_max",
)
#: The URL's rules (``store_urls``): its options, and the query keys taken for credentials.
_URL = StoreUrl(
    scheme="azure",
    service="Azure",
    a_service="an Azure",
    container="container",
    options=_URL_OPTIONS,
    secret_words=("secret", "password", "token", "key", "sig", "sas", "credential", "connection"),
    credentials_hint=(
        "AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN or an identity"
    ),
)
_CONTAINER = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")
_SAS_SIGNATURE = re.compile(r"(sig=)[^&\s'\"]+", re.IGNORECASE)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AzureStatistics:
    """Requests sent (every attempt counts: each is billed) and bytes moved, since start."""

    put_requests: int = 0  # Put Blob, Append Block, Put Block, Put Block List
    copy_requests: int = 0  # Put Block From URL
    get_requests: int = 0  # Get Blob
    head_requests: int = 0  # Get Blob Properties, Get Block List
    list_requests: int = 0  # List Blobs pages
    delete_requests: int = 0  # Delete Blob
    retries: int = 0
    bytes_uploaded: int = 0  # request bodies sent through this process
    bytes_downloaded: int = 0  # response bodies received by this process
    bytes_copied_server_side: int = 0  # copied by Put Block From URL

    @property
    def requests(self) -> int:
        return (
            self.put_requests
            + self.copy_requests
            + self.get_requests
            + self.head_requests
            + self.list_requests
            + self.delete_requests
        )


_COUNTER_BY_KIND = {
    "PUT": "put_requests",
    "COPY": "copy_requests",
    "GET": "get_requests",
    "HEAD": "head_requests",
    "LIST": "list_requests",
    "DELETE": "delete_requests",
}


# -- blob names ----------------------------------------------------------------------------------


def _escape_char(ch: str) -> str:
    return "".join(f"%{byte:02X}" for byte in ch.encode("utf-8"))


def _encoded_units(name: str) -> list[str]:
    last = len(name) - 1
    return [
        _escape_char(ch) if ch in _ESCAPED or (ch == "." and i in (0, last)) else ch
        for i, ch in enumerate(name)
    ]


def _cut(units: Sequence[str], chars_max: int) -> str:
    out, size = [], 0
    for unit in units:
        size += len(unit)
        if size > chars_max:
            break
        out.append(unit)
    return "".join(out)


def blob_leaf(name: str) -> str:
    """The last path segment of chunk ``name``'s blob name (invariant 1)."""
    units = _encoded_units(check_name(name))
    leaf = "".join(units)
    if len(leaf) > LEAF_CHARS_MAX:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
        leaf = f"{_cut(units, _HASHED_HEAD_CHARS_MAX)}~{digest}"
    assert 0 < len(leaf) <= LEAF_CHARS_MAX and "/" not in leaf and not leaf.endswith("."), leaf
    return leaf


def _is_hashed(leaf: str) -> bool:
    return "~" in leaf


def _decode_plain_leaf(leaf: str) -> str | None:
    try:
        name = unquote(leaf, encoding="utf-8", errors="strict")
        return name if name and blob_leaf(name) == leaf else None
    except (UnicodeError, ChunkNameInvalid):
        return None


def _list_head(prefix: str) -> str:
    """A leaf prefix shared by the leaves of every name starting with ``prefix`` (a
    trailing ``.`` of the prefix may be encoded in the name, so it is left out)."""
    units = [
        _escape_char(ch) if ch in _ESCAPED or (ch == "." and i == 0) else ch for i, ch in enumerate(prefix)
    ]
    while units and units[-1] == ".":
        units.pop()
    return _cut(units, _HASHED_HEAD_CHARS_MAX)


def _name_metadata(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode("utf-8")).decode("ascii")


# -- configuration ---------------------------------------------------------------------------------


def _check_container(container: str) -> str:
    """Azure container names: 3-63 of ``[a-z0-9-]``, no leading, trailing or double ``-``."""
    if not isinstance(container, str) or not _CONTAINER.match(container):
        raise InvalidConfig(f"not an Azure container name (3-63 of a-z, 0-9, single '-'): {container!r}")
    return container


def _check_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    if not prefix:
        return ""
    if len(prefix) > PREFIX_CHARS_MAX:
        raise InvalidConfig(f"Azure blob prefix is longer than {PREFIX_CHARS_MAX} characters")
    for part in prefix.split("/"):
        if (
            part in ("", ".", "..")
            or part.endswith(".")
            or any(ch in _ESCAPED and ch not in "%~" for ch in part)
        ):
            raise InvalidConfig(
                f"Azure blob prefix has an empty, '.'/'..', dot-ended or control-character part: {prefix!r}"
            )
    return prefix


@dataclass(frozen=True, slots=True)
class AzureCredentials:
    """Where and how to connect, as found in the environment (``credentials_from_environment``).

    ``connection_string`` alone, or ``account_url`` with ``credential`` (an account-key
    dict, an ``AzureSasCredential`` or a token credential). Never printed."""

    account_url: str | None
    credential: Any
    connection_string: str | None = None
    source: str = ""

    def __repr__(self) -> str:
        return f"AzureCredentials(account_url={self.account_url!r}, source={self.source!r})"


def credentials_from_environment(
    account: str | None = None, endpoint: str | None = None, environ: Mapping[str, str] | None = None
) -> AzureCredentials:
    """Credentials the way Azure users give them, first found wins:

    1. ``AZURE_STORAGE_CONNECTION_STRING`` (account key or SAS, and the endpoint);
    2. ``AZURE_STORAGE_ACCOUNT`` (or the URL's ``account``) with ``AZURE_STORAGE_KEY``;
    3. the same account with ``AZURE_STORAGE_SAS_TOKEN``;
    4. the same account with ``DefaultAzureCredential`` (extra ``azure-identity``).

    The endpoint is the URL's ``endpoint`` or ``https://<account>.blob.core.windows.net``.
    ``InvalidConfig`` when none applies (naming what to set or install)."""
    env = os.environ if environ is None else environ
    connection_string = env.get("AZURE_STORAGE_CONNECTION_STRING")
    if connection_string:
        if endpoint is not None:
            raise InvalidConfig(
                "the URL's endpoint= and AZURE_STORAGE_CONNECTION_STRING both name the endpoint; keep one"
            )
        return AzureCredentials(None, None, connection_string, "AZURE_STORAGE_CONNECTION_STRING")
    account = account or env.get("AZURE_STORAGE_ACCOUNT")
    if not account:
        raise InvalidConfig(
            "no Azure storage account: set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT "
            "(or ?account= in the URL) with AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN or an identity"
        )
    if not re.fullmatch(r"[a-z0-9]{3,24}", account):
        raise InvalidConfig(f"not an Azure storage account name (3-24 of a-z, 0-9): {account!r}")
    account_url = endpoint or f"https://{account}.blob.core.windows.net"
    if env.get("AZURE_STORAGE_KEY"):
        credential = {"account_name": account, "account_key": env["AZURE_STORAGE_KEY"]}
        return AzureCredentials(account_url, credential, None, "AZURE_STORAGE_KEY")
    if env.get("AZURE_STORAGE_SAS_TOKEN"):
        from azure.core.credentials import AzureSasCredential

        return AzureCredentials(
            account_url, AzureSasCredential(env["AZURE_STORAGE_SAS_TOKEN"].lstrip("?")), None, "SAS"
        )
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:
        raise InvalidConfig(
            "no Azure credentials in the environment (AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY "
            "or AZURE_STORAGE_SAS_TOKEN), and DefaultAzureCredential needs the azure-identity extra "
            "(pip install 'slts[azure-identity]')"
        ) from exc
    return AzureCredentials(account_url, DefaultAzureCredential(), None, "DefaultAzureCredential")


# -- internal signals ------------------------------------------------------------------------------


class _WrongBlobType(ChunkStorageError):
    """Append Block on a block blob (a concat target): the write takes the block-list path."""


class _NotImplemented(ChunkStorageError):
    """The service lacks the call (501): Azurite for Put Block From URL."""


class _Uncommittable(ChunkStorageError):
    """``InvalidBlockList``: the staged blocks are gone (another commit discarded them)."""


@dataclass(frozen=True, slots=True)
class _Properties:
    size: int
    metadata: Mapping[str, str]
    etag: str
    block_blob: bool
    committed_blocks: int | None


# -- the binding -----------------------------------------------------------------------------------


class AzureChunkStorage(ChunkStorage):
    """Chunks as blobs below ``container/prefix``: append blobs, block-blob concat targets."""

    supports_append = True
    supports_concat = True
    supports_truncate = False
    supports_readonly = False
    counts_own_requests = True
    high_latency_reads = True

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        credentials: AzureCredentials | None = None,
        container_client: ContainerClient | None = None,
        max_attempts: int = MAX_ATTEMPTS_DEFAULT,
        connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT,
        read_timeout_s: float = READ_TIMEOUT_S_DEFAULT,
        native_concat: str = "auto",
        append_block_bytes: int = APPEND_BLOCK_BYTES_DEFAULT,
        blocks_max: int = BLOCKS_MAX,
        sleep: Callable[[float], None] = time.sleep,
        url: str | None = None,
    ) -> None:
        """``credentials`` (default: ``credentials_from_environment()``) or a ready
        ``container_client`` (tests share one); ``native_concat``: ``auto`` (try Put Block
        From URL, fall back for good on 501), ``on`` (never fall back) or ``off``;
        ``sleep`` waits between attempts (tests inject a fake)."""
        self.container = _check_container(container)
        self.prefix = _check_prefix(prefix)
        self._base = f"{self.prefix}/" if self.prefix else ""
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise InvalidConfig(f"max_attempts must be an integer, got {max_attempts!r}")
        if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise InvalidConfig(f"max_attempts must be in [1, {MAX_ATTEMPTS_LIMIT}], got {max_attempts}")
        if native_concat not in ("auto", "on", "off"):
            raise InvalidConfig(f"native_concat must be auto, on or off, got {native_concat!r}")
        if not isinstance(append_block_bytes, int) or not 1 <= append_block_bytes <= APPEND_BLOCK_BYTES_MAX:
            raise InvalidConfig(f"append_block_bytes must be in [1, {APPEND_BLOCK_BYTES_MAX}]")
        if not isinstance(blocks_max, int) or not 2 <= blocks_max <= BLOCKS_MAX:
            raise InvalidConfig(f"blocks_max must be in [2, {BLOCKS_MAX}]")
        self.retry = RetryPolicy(max_attempts, delay_s_base=RETRY_DELAY_S_BASE, delay_s_max=RETRY_DELAY_S_MAX)
        self.native_concat_mode = native_concat
        #: None until the first concat tells whether Put Block From URL works here.
        self._native_concat: bool | None = {"on": True, "off": False}.get(native_concat)
        self.append_block_bytes = append_block_bytes
        self.blocks_max = blocks_max
        self._sleep = sleep
        self.url = url or f"azure://{self.container}/{self.prefix}"
        self._lock = threading.Lock()
        self._counts = dict.fromkeys((f.name for f in fields(AzureStatistics)), 0)
        self._block_counts: dict[str, int] = {}
        self._owns_client = container_client is None
        if container_client is None:
            found = credentials if credentials is not None else credentials_from_environment()
            options: dict[str, Any] = {
                "retry_total": 0,  # retried here, in _call
                "connection_timeout": connect_timeout_s,
                "read_timeout": read_timeout_s,
                "max_single_get_size": 256 * MiB,  # one GET per read
                "max_single_put_size": 256 * MiB,
            }
            try:
                if found.connection_string is not None:
                    service = BlobServiceClient.from_connection_string(found.connection_string, **options)
                else:
                    service = BlobServiceClient(
                        found.account_url or "", credential=found.credential, **options
                    )
            except (ValueError, AzureError) as exc:
                raise InvalidConfig(
                    f"cannot configure the Azure client for {self.url} from {found.source}: "
                    f"{type(exc).__name__}"
                ) from None
            container_client = service.get_container_client(self.container)
        self._client: ContainerClient = container_client

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AzureChunkStorage:
        """``azure://CONTAINER[/PREFIX][?account=NAME&endpoint=URL&max_attempts=N
        &connect_timeout_s=S&read_timeout_s=S&native_concat=auto|on|off&append_block_bytes=N
        &blocks_max=N]``; credentials from the environment (``credentials_from_environment``).
        Credentials in the URL are refused (``InvalidConfig``, the URL shown redacted)."""
        netloc, path, options, shown = _URL.parse(url)
        if "endpoint" in options and urlparse(options["endpoint"]).scheme not in ("http", "https"):
            raise InvalidConfig(f"Azure URL option endpoint must be an http(s) URL in {shown}")
        settings: dict[str, Any] = {}
        if "max_attempts" in options:
            settings["max_attempts"] = _URL.number(
                "max_attempts", options["max_attempts"], int, 1, MAX_ATTEMPTS_LIMIT
            )
        for key in ("connect_timeout_s", "read_timeout_s"):
            if key in options:
                settings[key] = _URL.number(key, options[key], float, 0.001, 3600.0)
        if "native_concat" in options:
            settings["native_concat"] = options["native_concat"]
        if "append_block_bytes" in options:
            settings["append_block_bytes"] = _URL.number(
                "append_block_bytes", options["append_block_bytes"], int, 1, APPEND_BLOCK_BYTES_MAX
            )
        if "blocks_max" in options:
            settings["blocks_max"] = _URL.number("blocks_max", options["blocks_max"], int, 2, BLOCKS_MAX)
        container = _check_container(netloc)
        prefix = _check_prefix(path)
        if "container_client" not in kwargs and "credentials" not in kwargs:
            kwargs["credentials"] = credentials_from_environment(
                options.get("account"), options.get("endpoint")
            )
        return cls(container, prefix, url=url, **settings, **kwargs)

    # -- names, counters ---------------------------------------------------------------------------

    def blob_name(self, name: str) -> str:
        """The blob name of chunk ``name`` in the container (see module doc)."""
        return self._base + blob_leaf(name)

    def blob_metadata(self, name: str, write_id: str | None = None, length: int = 0) -> dict[str, str]:
        """The metadata this binding stores with chunk ``name``'s blob."""
        metadata = {META_NAME: _name_metadata(name)} if _is_hashed(blob_leaf(name)) else {}
        if write_id is not None:
            metadata[META_WRITE] = write_id
        if length:
            metadata[META_LENGTH] = str(length)
        return metadata

    @property
    def native_concat(self) -> bool | None:
        """Whether concat copies inside the service (None: not known before the first concat)."""
        return self._native_concat

    def statistics(self) -> AzureStatistics:
        """Requests and bytes since this binding was made (a frozen snapshot)."""
        with self._lock:
            return AzureStatistics(**self._counts)

    def _add(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._counts[key] += delta

    def _blob(self, name: str) -> Any:
        return self._client.get_blob_client(self.blob_name(name))

    # -- the one choke point -----------------------------------------------------------------------

    def _call(
        self,
        kind: str,
        what: str,
        name: str,
        request: Callable[[], T],
        *,
        conflict: type[ChunkStorageError] = ChunkExists,
        recovered: Callable[[], bool] | None = None,
    ) -> T | None:
        """Run ``request`` (one Blob Storage call) with retries; translate what it raises.

        ``conflict``: the error for a failed condition. ``recovered``: for a conditional
        write, whether the blob now holds this request's effect (asked when a retry fails
        its condition after an attempt that may have been applied; then success, None)."""
        counter = _COUNTER_BY_KIND[kind]
        attempts = 0

        def attempt() -> T:
            nonlocal attempts
            attempts += 1
            self._add(**{counter: 1})
            observer = self._request_observer
            if observer is not None:
                observer(kind)
            try:
                return request()
            except AzureError as exc:
                error = self._translate(exc, what, name, conflict)
                if isinstance(error, StorageUnavailable) and attempts == self.retry.max_attempts:
                    error = StorageUnavailable(
                        f"{error.message} (gave up after {attempts} attempts)", **error.context
                    )
                raise error from exc

        def on_retry(error: Exception, failed: int, delay_s: float) -> None:
            _log.debug("Azure %s of %r: %s; attempt %d in %.3f s", what, name, error, failed + 1, delay_s)
            self._add(retries=1)

        def settles(error: Exception) -> bool:
            return isinstance(error, conflict) and recovered is not None and recovered()

        return self.retry.run(attempt, sleep=self._sleep, on_retry=on_retry, settle=settles)

    def _translate(
        self, exc: AzureError, what: str, name: str, conflict: type[ChunkStorageError]
    ) -> ChunkStorageError:
        """The typed error for one failed request (never raises itself)."""
        context = {"chunk": name, "binding": self.url}
        if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
            return StorageUnavailable(
                f"Azure {what} of chunk {name!r}: {type(exc).__name__}: {_scrubbed(str(exc))[:300]}",
                **context,
            )
        if not isinstance(exc, HttpResponseError):
            return ChunkStorageError(f"Azure {what} of chunk {name!r}: {type(exc).__name__}", **context)
        status = int(exc.status_code or 0)
        response: Any = exc.response
        headers = getattr(response, "headers", None) or {}
        code = str(getattr(exc, "error_code", None) or headers.get("x-ms-error-code", ""))
        message = f"Azure {what} of chunk {name!r}: {code or 'error'} (HTTP {status})"
        if code in _RETRYABLE_CODES or status in _RETRYABLE_STATUS:
            return StorageUnavailable(message, **context)
        if status in _UNSUPPORTED_STATUS or code in ("NotImplemented", "FeatureNotSupported"):
            return _NotImplemented(message, **context)
        if code == "InvalidBlobType":
            return _WrongBlobType(message, **context)
        if code in _FULL_CODES:
            return ChunkInvalidOffset(f"{message}: the chunk is full (roll to a new chunk)", **context)
        if code in _CONDITION_CODES or status == 412:
            return conflict(message, **context)
        if code == "InvalidBlockList":
            return _Uncommittable(message, **context)
        if code == "ContainerNotFound":
            return ChunkStorageError(
                f"Azure container {self.container!r} does not exist ({message})", **context
            )
        if code in _READ_ONLY_CODES:
            return ChunkReadOnly(message, **context)
        if code in ("BlobNotFound", "ResourceNotFound") or status == 404:
            return ChunkNotFound(f"chunk {name!r} not found ({message})", **context)
        if code == "InvalidRange" or status == 416:
            return ChunkInvalidOffset(message, **context)
        if status in (401, 403):
            return ChunkStorageError(f"Azure access denied: {message}", **context)
        if status == 409 and code == "BlobAlreadyExists":
            return conflict(message, **context)
        return ChunkStorageError(message, **context)

    # -- requests ----------------------------------------------------------------------------------

    def _properties(self, name: str, *, visible: bool = True) -> _Properties:
        """The blob's properties; ``ChunkNotFound`` for a missing (or, if ``visible``, a
        half-created) chunk."""
        blob = self._blob(name)
        props = self._call("HEAD", "Get Blob Properties", name, blob.get_blob_properties)
        assert props is not None
        result = _Properties(
            int(props.size),
            dict(props.metadata or {}),
            str(props.etag),
            props.blob_type == BlobType.BLOCKBLOB,
            props.append_blob_committed_block_count,
        )
        if visible:
            self._check_visible(name, result.size, result.metadata)
        return result

    def _check_visible(self, name: str, size: int, metadata: Mapping[str, str]) -> None:
        """Invariant 2: ``ChunkNotFound`` while a create has not yet given the blob its bytes."""
        if size < _created_length(metadata):
            raise ChunkNotFound(
                f"chunk {name!r} is still being created (or its create failed)", chunk=name, binding=self.url
            )

    def _written_by(self, name: str, write_id: str) -> bool:
        try:
            return self._properties(name, visible=False).metadata.get(META_WRITE) == write_id
        except ChunkNotFound:
            return False

    def _holds(self, name: str, offset: int, data: bytes) -> bool:
        """True if the blob holds ``data`` at ``offset`` (a retried append that had landed)."""
        try:
            stored = self._download(name, offset, len(data), visible=False)[0]
        except (ChunkNotFound, ChunkInvalidOffset):
            return False
        return stored == data

    def _download(self, name: str, offset: int, length: int, *, visible: bool = True) -> tuple[bytes, int]:
        """(bytes ``[offset, offset+length)`` clipped at the end, blob size); ``length > 0``;
        ``ChunkInvalidOffset`` (416) at or past the end."""
        assert length > 0
        blob = self._blob(name)

        def request() -> tuple[bytes, int, Mapping[str, str]]:
            downloader = blob.download_blob(offset=offset, length=length, max_concurrency=1)
            data = downloader.readall()
            self._add(bytes_downloaded=len(data))
            properties = downloader.properties
            # properties.size is the range's; "bytes a-b/total" gives the blob's size.
            size = int(str(properties.content_range).rpartition("/")[2])
            return data, size, dict(properties.metadata or {})

        result = self._call("GET", "Get Blob", name, request)
        assert result is not None
        data, size, metadata = result
        if visible:
            self._check_visible(name, size, metadata)
        if len(data) != min(length, size - offset):
            raise StorageUnavailable(
                f"Azure Get Blob of chunk {name!r}: {len(data)} bytes, expected {min(length, size - offset)}",
                chunk=name,
                binding=self.url,
            )
        return data, size

    def _append_blocks(self, name: str, offset: int, data: bytes, *, check_full: bool = True) -> int:
        """``data`` appended at ``offset`` in blocks of ``append_block_bytes``, each with its
        ``appendpos``; the committed block count after them."""
        blob = self._blob(name)
        step = self.append_block_bytes
        count = 0
        for start in range(0, len(data), step):
            piece = data[start : start + step]
            position = offset + start

            def request(piece: bytes = piece, position: int = position) -> Mapping[str, Any]:
                self._add(bytes_uploaded=len(piece))
                return blob.append_block(piece, length=len(piece), appendpos_condition=position)

            try:
                answer = self._call(
                    "PUT",
                    "Append Block",
                    name,
                    request,
                    conflict=ChunkInvalidOffset,
                    recovered=functools.partial(self._holds, name, position, piece),
                )
            except ChunkInvalidOffset as exc:
                if start == 0:
                    raise  # nothing written: the contract's answer to a lost race
                raise StorageUnavailable(
                    f"chunk {name!r}: block {start // step + 1} of a write at {offset} was refused "
                    f"({exc.message}); the chunk's tail is not this write's",
                    chunk=name,
                    offset=position,
                    binding=self.url,
                ) from exc
            if answer is not None:
                count = int(answer.get("blob_committed_block_count") or 0)
        if count:
            self._remember_blocks(name, count)
        return count

    def _remember_blocks(self, name: str, count: int) -> None:
        with self._lock:
            if len(self._block_counts) >= _BLOCK_COUNT_CACHE_MAX and name not in self._block_counts:
                self._block_counts.pop(next(iter(self._block_counts)))
            self._block_counts[name] = count

    def _known_blocks(self, name: str) -> int | None:
        with self._lock:
            return self._block_counts.get(name)

    # -- hooks (arguments checked by ChunkStorage) -------------------------------------------------

    def _do_exists(self, name: str) -> bool:
        try:
            self._properties(name)
        except ChunkNotFound:
            return False
        return True

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        blob = self._blob(name)
        write_id = uuid.uuid4().hex
        metadata = self.blob_metadata(name, write_id, len(data))

        def put() -> Mapping[str, Any]:
            return blob.create_append_blob(metadata=metadata, match_condition=MatchConditions.IfMissing)

        self._call(
            "PUT",
            "Put Blob",
            name,
            put,
            conflict=ChunkExists,
            recovered=lambda: self._written_by(name, write_id),
        )
        if data:
            try:
                self._append_blocks(name, 0, data)
            except BaseException:
                self._discard(name)
                raise
        return ChunkHandle(name, readonly=False)

    def _discard(self, name: str) -> None:
        """Best effort: remove a half-created blob (invisible anyway; GC's intent covers it)."""
        try:
            self._call("DELETE", "Delete Blob", name, self._blob(name).delete_blob)
        except ChunkStorageError as exc:
            _log.warning("Azure: could not remove the half-created chunk %r: %s", name, exc.message)

    def _do_delete(self, handle: ChunkHandle) -> None:
        self._call("DELETE", "Delete Blob", handle.name, self._blob(handle.name).delete_blob)
        with self._lock:
            self._block_counts.pop(handle.name, None)

    def _do_open_read(self, name: str) -> ChunkHandle:
        self._properties(name)
        return ChunkHandle(name, readonly=True)

    def _do_open_write(self, name: str) -> ChunkHandle:
        self._properties(name)
        return ChunkHandle(name, readonly=False)

    def _do_get_info(self, name: str) -> ChunkInfo:
        return ChunkInfo(name, self._properties(name).size)

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        name = handle.name
        for _ in range(_READ_ROUNDS_MAX):
            if length > 0:
                try:
                    return self._download(name, offset, length)[0]
                except ChunkInvalidOffset:
                    pass  # at or past the end: the size decides which
            size = self._properties(name).size
            if offset > size:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: read at {offset} past its end {size}",
                    chunk=name,
                    offset=offset,
                    binding=self.url,
                )
            if offset == size or length == 0:
                return b""
        raise StorageUnavailable(
            f"chunk {name!r} kept changing while being read", chunk=name, binding=self.url
        )

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        name = handle.name
        pieces = -(-len(data) // self.append_block_bytes)
        known = self._known_blocks(name)
        if not data or offset == 0 or pieces > 1 or (self.blocks_max < BLOCKS_MAX and known is None):
            # Checked first: an empty write, the guard of a half-created chunk (offset 0),
            # a write of several blocks (all or none must fit), a lower block limit.
            props = self._properties(name)
            if props.size != offset:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: write at {offset}, but its length is {props.size}",
                    chunk=name,
                    offset=offset,
                    binding=self.url,
                )
            if not data:
                return 0
            if props.block_blob:
                return self._append_to_block_blob(name, offset, data)
            known = props.committed_blocks
        if known is not None and known + pieces > self.blocks_max:
            raise ChunkInvalidOffset(
                f"chunk {name!r} is full: {known} blocks, {pieces} more would pass {self.blocks_max} "
                "(roll to a new chunk)",
                chunk=name,
                offset=offset,
                binding=self.url,
            )
        try:
            self._append_blocks(name, offset, data)
        except _WrongBlobType:
            return self._append_to_block_blob(name, offset, data)
        except ChunkInvalidOffset as exc:
            raise ChunkInvalidOffset(
                f"chunk {name!r}: write at {offset} refused ({exc.message})",
                chunk=name,
                offset=offset,
                binding=self.url,
            ) from exc
        return len(data)

    def _append_to_block_blob(self, name: str, offset: int, data: bytes) -> int:
        """Append to a block blob (a concat target): stage, then re-commit its block list
        with ``If-Match`` on the ETag the length was read with (one writer wins)."""
        props = self._properties(name)
        if props.size != offset:
            raise ChunkInvalidOffset(
                f"chunk {name!r}: write at {offset}, but its length is {props.size}",
                chunk=name,
                offset=offset,
                binding=self.url,
            )
        blob = self._blob(name)
        listed = self._call("HEAD", "Get Block List", name, lambda: blob.get_block_list("committed"))
        assert listed is not None
        committed = list(listed[0])
        if sum(int(block.size) for block in committed) != props.size:
            raise ChunkInvalidOffset(
                f"chunk {name!r} changed while being appended to", chunk=name, offset=offset
            )
        pieces = [data[i : i + STAGE_BLOCK_BYTES] for i in range(0, len(data), STAGE_BLOCK_BYTES)]
        if len(committed) + len(pieces) > self.blocks_max:
            raise ChunkInvalidOffset(
                f"chunk {name!r} is full (roll to a new chunk)", chunk=name, offset=offset
            )
        ids = self._stage(name, pieces)
        blocks = committed + [BlobBlock(block_id=block_id) for block_id in ids]
        metadata = dict(props.metadata)
        try:
            self._call(
                "PUT",
                "Put Block List",
                name,
                lambda: blob.commit_block_list(
                    blocks, metadata=metadata, etag=props.etag, match_condition=MatchConditions.IfNotModified
                ),
                conflict=ChunkInvalidOffset,
            )
        except _Uncommittable as exc:
            raise ChunkInvalidOffset(
                f"chunk {name!r}: another write committed first", chunk=name, offset=offset, binding=self.url
            ) from exc
        return len(data)

    def _stage(self, name: str, pieces: Sequence[bytes]) -> list[str]:
        """Stage ``pieces`` as uncommitted blocks of ``name``'s blob; their ids (one length)."""
        blob = self._blob(name)
        stem = uuid.uuid4().hex
        ids = []
        for index, piece in enumerate(pieces):
            block_id = f"{stem}{index:08d}"

            def request(block_id: str = block_id, piece: bytes = piece) -> Any:
                self._add(bytes_uploaded=len(piece))
                return blob.stage_block(block_id, piece, length=len(piece))

            self._call("PUT", "Put Block", name, request)
            ids.append(block_id)
        return ids

    def _do_list(self, prefix: str) -> Iterator[str]:
        name_prefix = self._base + _list_head(prefix)
        names: list[str] = []
        pages = self._client.list_blobs(name_starts_with=name_prefix, include=["metadata"]).by_page()

        def next_page() -> list[Any] | None:
            page = next(pages, None)  # one List Blobs request
            return None if page is None else list(page)

        for _ in range(_LIST_PAGES_MAX):
            page = self._call("LIST", "List Blobs", prefix, next_page)
            if page is None:
                break
            for entry in page:
                metadata = dict(entry.metadata or {})
                if int(entry.size) < _created_length(metadata):
                    continue  # being created: not yet a chunk (invariant 2)
                name = self._name_of(str(entry.name), metadata)
                if name is not None and name.startswith(prefix):
                    names.append(name)
        return iter(sorted(names))

    def _name_of(self, blob_name: str, metadata: Mapping[str, str]) -> str | None:
        """The chunk name whose blob is ``blob_name``, or None for a foreign blob."""
        if not blob_name.startswith(self._base):
            return None
        leaf = blob_name[len(self._base) :]
        if not leaf or "/" in leaf:
            return None
        if not _is_hashed(leaf):
            return _decode_plain_leaf(leaf)
        encoded = metadata.get(META_NAME)
        try:
            name = base64.urlsafe_b64decode(encoded.encode("ascii")).decode("utf-8") if encoded else None
            return name if name is not None and blob_leaf(name) == leaf else None
        except (ValueError, UnicodeError, ChunkNameInvalid):
            return None

    # -- concat ------------------------------------------------------------------------------------

    def concat_bytes_through_client(self, sources: Sequence[ConcatSource]) -> int:
        """0 where Put Block From URL copies the ranges inside the service, else all of them.
        Needs no request: before the first concat of ``native_concat=auto`` the service is
        taken to have Put Block From URL (Azure does; an endpoint found without it, by a
        501, counts from then on)."""
        return 0 if self._native_concat is not False else sum(source.length for source in sources)

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        if self.exists(target):
            raise ChunkExists(f"chunk {target!r} exists", chunk=target, binding=self.url)
        sizes: dict[str, int] = {}
        for source in sources:
            if source.name not in sizes:
                sizes[source.name] = self._properties(source.name).size
            if source.offset + source.length > sizes[source.name]:
                raise ChunkInvalidOffset(
                    f"concat source {source.name!r}: range {source.offset}+{source.length} "
                    f"past its end {sizes[source.name]}",
                    chunk=source.name,
                    offset=source.offset,
                    binding=self.url,
                )
        ranges = [source for source in sources if source.length > 0]
        total = sum(source.length for source in ranges)
        ids: list[str] | None = None
        if ranges and self._native_concat is not False:
            try:
                ids = self._stage_from_sources(target, ranges)
                self._native_concat = True
            except _NotImplemented:
                if self.native_concat_mode == "on":
                    raise
                _log.info(
                    "Azure %s: no Put Block From URL here; concat copies through this process", self.url
                )
                self._native_concat = False
        if ids is None:
            ids = self._stage_through_client(target, ranges)
        if len(ids) > self.blocks_max:
            raise ChunkStorageError(f"concat into {target!r} needs {len(ids)} blocks", chunk=target)
        write_id = uuid.uuid4().hex
        metadata = self.blob_metadata(target, write_id)
        blob = self._blob(target)
        try:
            self._call(
                "PUT",
                "Put Block List",
                target,
                lambda: blob.commit_block_list(
                    [BlobBlock(block_id=block_id) for block_id in ids],
                    metadata=metadata,
                    match_condition=MatchConditions.IfMissing,
                ),
                conflict=ChunkExists,
                recovered=lambda: self._written_by(target, write_id),
            )
        except _Uncommittable as exc:  # another concat's commit discarded our staged blocks
            if self._written_by(target, write_id):
                return ChunkInfo(target, total)
            raise ChunkExists(f"chunk {target!r} exists", chunk=target, binding=self.url) from exc
        return ChunkInfo(target, total)

    def _stage_through_client(self, target: str, ranges: Sequence[ConcatSource]) -> list[str]:
        """The fallback: ranges read here and staged in blocks of at most ``STAGE_BLOCK_BYTES``."""
        pending: list[bytes] = []
        pending_bytes = 0
        pieces: list[bytes] = []
        for source in ranges:
            for start in range(source.offset, source.offset + source.length, STAGE_BLOCK_BYTES):
                length = min(STAGE_BLOCK_BYTES, source.offset + source.length - start)
                data = self._download(source.name, start, length)[0]
                if len(data) != length:
                    raise ChunkInvalidOffset(f"concat source {source.name!r} shrank", chunk=source.name)
                pending.append(data)
                pending_bytes += length
                if pending_bytes >= STAGE_BLOCK_BYTES:
                    pieces.append(b"".join(pending))
                    pending, pending_bytes = [], 0
        if pending:
            pieces.append(b"".join(pending))
        return self._stage(target, pieces)

    def _stage_from_sources(self, target: str, ranges: Sequence[ConcatSource]) -> list[str]:
        """Put Block From URL for every range (split at ``COPY_BLOCK_BYTES_MAX``)."""
        blob = self._blob(target)
        stem = uuid.uuid4().hex
        ids: list[str] = []
        for source in ranges:
            source_url = self._source_url(source.name)
            for start in range(source.offset, source.offset + source.length, COPY_BLOCK_BYTES_MAX):
                length = min(COPY_BLOCK_BYTES_MAX, source.offset + source.length - start)
                block_id = f"{stem}{len(ids):08d}"

                def request(
                    block_id: str = block_id,
                    start: int = start,
                    length: int = length,
                    source_url: _SourceUrl = source_url,
                ) -> Any:
                    answer = blob.stage_block_from_url(
                        block_id,
                        source_url.url,
                        source_offset=start,
                        source_length=length,
                        **source_url.kwargs,
                    )
                    self._add(bytes_copied_server_side=length)
                    return answer

                self._call("COPY", "Put Block From URL", source.name, request)
                ids.append(block_id)
        return ids

    def _source_url(self, name: str) -> _SourceUrl:
        """How the service may read chunk ``name`` for Put Block From URL: a read SAS made
        with the account key, the SAS in use, or an OAuth bearer token."""
        blob = self._blob(name)
        credential = self._client.credential
        key = getattr(credential, "account_key", None)
        if key:
            from azure.storage.blob import BlobSasPermissions, generate_blob_sas

            sas = generate_blob_sas(
                account_name=str(credential.account_name),
                container_name=self.container,
                blob_name=self.blob_name(name),
                account_key=str(key),
                permission=BlobSasPermissions(read=True),
                expiry=datetime.now(UTC) + timedelta(seconds=SOURCE_SAS_S),
            )
            return _SourceUrl(f"{blob.url.split('?')[0]}?{sas}", {})
        signature = getattr(credential, "signature", None)
        if signature:
            return _SourceUrl(f"{blob.url.split('?')[0]}?{str(signature).lstrip('?')}", {})
        if hasattr(credential, "get_token"):
            token = credential.get_token("https://storage.azure.com/.default").token
            return _SourceUrl(blob.url, {"source_authorization": f"Bearer {token}"})
        return _SourceUrl(blob.url, {})  # a SAS in the account URL (connection string) rides along

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


@dataclass(frozen=True, slots=True)
class _SourceUrl:
    url: str
    kwargs: Mapping[str, str]

    def __repr__(self) -> str:
        return "_SourceUrl(***)"


def _created_length(metadata: Mapping[str, str]) -> int:
    """The length a create gave the blob (0 if none): visible from there on."""
    text = metadata.get(META_LENGTH)
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


def _scrubbed(text: str) -> str:
    """``text`` without SAS signatures or account keys (an error may quote a URL)."""
    text = _SAS_SIGNATURE.sub(r"\1***", text)
    return re.sub(r"(AccountKey=)[^;\s]+", r"\1***", text, flags=re.IGNORECASE)
