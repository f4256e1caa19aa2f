"""S3 chunk storage (boto3): one object per chunk below ``bucket/prefix``.

Capabilities: no append (an object cannot grow), native concat (multipart upload with
``UploadPartCopy``), no truncate, no read-only. The engine therefore starts a new chunk
for every write (``supports_append`` is off) and defrag merges them on the server.

How the contract maps onto S3 (the conformance suite checks each line):

* ``create``: ``PutObject`` with ``If-None-Match: *``, a conditional create: of two
  writers of one name exactly one wins, the other gets 412 -> ``ChunkExists``. S3
  objects are atomic (readers never see a partial object) and durable on the 200.
* ``write``: without append only an empty chunk is written, at offset 0: ``HeadObject``
  (length must be 0 and equal to the offset), then ``PutObject`` with ``If-Match:
  <etag of the empty object>``: of two writers exactly one wins, the other gets 412 ->
  ``ChunkInvalidOffset``.
* ``read``: one ranged ``GetObject`` (``Range: bytes=a-b``), clipped by the server at the
  end; a 416 (range starts at or past the end) is settled with ``HeadObject``: ``b""`` at
  the end, ``ChunkInvalidOffset`` past it. The body length is checked against the
  ``Content-Range`` the server sent; a short body is retried. A missing object
  (``NoSuchKey``) is ``ChunkNotFound`` from the GET itself: the engine reads through
  handles it builds, without ``open_read`` and its ``HeadObject`` (``high_latency_reads``
  also tells it to read ahead for sequential readers).
* ``get_info``/``exists``/``open_*``: ``HeadObject``. ``delete``: ``HeadObject`` (so a
  missing chunk raises ``ChunkNotFound``; S3's ``DeleteObject`` succeeds on missing
  keys) then ``DeleteObject``. ``list``: ``ListObjectsV2`` page by page, decoded, sorted.
* ``concat``: see ``plan_parts``: ranges of at least ``PART_BYTES_MIN`` (5 MiB, S3's
  minimum for every part but the last) become ``UploadPartCopy`` parts (copied inside
  the server: no chunk byte passes through this process); smaller ranges are read with
  ranged GETs and uploaded together with their neighbours as ordinary ``UploadPart``
  parts of at least 5 MiB (the last part may be smaller). A concat of less than 5 MiB in
  all is one conditional ``PutObject``. The upload is completed with ``If-None-Match:
  *`` (exclusive like ``create``) and aborted on any failure.

Object keys (``object_key``): ``<prefix>/<leaf>``, one path component per chunk. The leaf
is the chunk name with ``%``, ``/``, ``\\``, ``~``, control characters and a leading ``.``
percent-encoded (UTF-8, uppercase hex), everything else kept (non-ASCII included). So
the leaf is never ``.``/``..``, never holds ``/`` (chunks ``a`` and ``a/b`` are two
sibling objects even on servers that map ``/`` to folders, as SeaweedFS does), and a name
prefix encodes to a key prefix (``list`` asks the server for exactly that prefix). A
leaf longer than ``LEAF_BYTES_MAX`` (255: SeaweedFS's limit for one path component;
AWS's limit for the whole key is 1024) becomes ``<first <=190 bytes of the leaf>~<sha256
of the name>``, with the name itself in the object's metadata (``x-amz-meta-slts-name``,
base64url): ``list`` reads it back with one ``HeadObject`` per such key. ``~`` is always
encoded in plain leaves, so the two forms never collide.

Retries: every request goes through ``_call``, the one place where botocore errors
become typed errors (``raise ... from exc``). Throttling (``SlowDown``, 429, 503...), 5xx
and connection errors are retried ``max_attempts`` times in all with exponential backoff
and jitter (the ``RetryPolicy`` of ``retry``); then ``StorageUnavailable`` (``retryable``).
A conditional request retried after an ambiguous failure (the first attempt may have
been applied) that then fails its condition is checked (the policy's ``settle`` hook)
against the write id this binding put in the object's metadata
(``x-amz-meta-slts-write``): if the object is its own, the request succeeded. The same
check settles a ``CompleteMultipartUpload`` retried after a lost answer that then gets
``NoSuchUpload`` (the first attempt completed the upload, which is gone): never retried
as transient, it is the concat's success if the target is its own, else a failed concat.

Credentials come from boto3's usual chain (``AWS_*`` environment variables, shared
config and credential files, profiles via ``?profile=``, instance roles) or from the
constructor; never from the URL (refused). They appear in no message, repr or log of
this module: error messages are built from the operation, the chunk, the S3 error code
and the server's message with any credential string removed.

Invariants (asserted or checked by tests):

1. ``object_key(name)`` is injective, and a key decodes back only to its own name.
2. Every leaf is one path component of at most ``LEAF_BYTES_MAX`` bytes, not ``.``/``..``.
3. ``plan_parts``: every part but the last is at least ``PART_BYTES_MIN``; the parts
   cover the ranges exactly, in order; copy parts are at most ``COPY_PART_BYTES_MAX``.
4. No botocore exception leaves a public method (only ``slts.errors`` types).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, unquote, urlencode, urlparse

import boto3
import botocore.config
import botocore.exceptions

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNameInvalid,
    ChunkNotFound,
    ChunkStorageError,
    InvalidConfig,
    StorageUnavailable,
)

from .base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource, check_name
from .retry import MAX_ATTEMPTS_DEFAULT, RetryPolicy
from .store_urls import StoreUrl

_log = logging.getLogger(__name__)

MiB = 1 << 20
#: S3's smallest part of a multipart upload (every part but the last).
PART_BYTES_MIN = 5 * MiB
#: S3's largest part copied by one ``UploadPartCopy``.
COPY_PART_BYTES_MAX = 5 * 1024 * MiB
#: S3's most parts in one multipart upload.
PARTS_MAX = 10_000
#: Longest leaf (one path component): SeaweedFS refuses longer ones (AWS takes 1024).
LEAF_BYTES_MAX = 255
_HASH_CHARS = 64  # sha256 in hex
#: Longest head of a hashed leaf: head + "~" + hash fits ``LEAF_BYTES_MAX``.
_HASHED_HEAD_BYTES_MAX = LEAF_BYTES_MAX - 1 - _HASH_CHARS
#: Longest key prefix (``prefix/``): leaves up to ``LEAF_BYTES_MAX`` keep keys <= 1024.
PREFIX_BYTES_MAX = 512
KEY_BYTES_MAX = 1024
#: Bounds on every loop over server answers.
_LIST_PAGES_MAX = 10_000_000
_READ_ROUNDS_MAX = 3

#: The most attempts of one S3 request (each is billed).
MAX_ATTEMPTS_LIMIT = 20
RETRY_DELAY_S_BASE = 0.05
RETRY_DELAY_S_MAX = 2.0
CONNECT_TIMEOUT_S_DEFAULT = 5.0
READ_TIMEOUT_S_DEFAULT = 60.0
POOL_CONNECTIONS_DEFAULT = 32

#: Object metadata: the chunk name of a hashed key, the id of the write that made it.
META_NAME = "slts-name"
META_WRITE = "slts-write"

_ESCAPED = frozenset("%/\\~") | frozenset(chr(c) for c in range(0x20)) | {"\x7f"}
_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
        "BandwidthLimitExceeded",
        "PriorRequestNotComplete",
    }
)
_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_CONFLICT_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
    }
)
#: Transport failures worth a retry: the request may or may not have reached the server.
_RETRYABLE_TRANSPORT = (
    botocore.exceptions.ConnectionError,  # endpoint refused, connect timeout, proxy
    botocore.exceptions.HTTPClientError,  # connection closed, read timeout, broken stream
    botocore.exceptions.IncompleteReadError,
)
_URL_OPTIONS = (
    "endpoint_url",
    "region",
    "profile",
    "max_attempts",
    "connect_timeout_s",
    "read_timeout_s",
    "addressing_style",
)
#: The URL's rules (``store_urls``): its options, and the query keys taken for credentials.
_URL = StoreUrl(
    scheme="s3",
    service="S3",
    a_service="an S3",
    container="bucket",
    options=_URL_OPTIONS,
    secret_words=("secret", "password", "token", "access_key", "accesskey", "credential", "signature"),
    credentials_hint="the AWS_* environment variables, a shared credentials file or ?profile=",
)

T = TypeVar("T")


class S3Client(Protocol):
    """The part of boto3's S3 client this binding uses (keyword arguments as boto3's)."""

    def put_object(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def get_object(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def head_object(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def delete_object(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def list_objects_v2(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def create_multipart_upload(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def upload_part(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def upload_part_copy(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def complete_multipart_upload(self, **kwargs: Any) -> Mapping[str, Any]: ...
    def abort_multipart_upload(self, **kwargs: Any) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class S3Statistics:
    """Requests sent (every attempt counts: each is billed) and bytes moved, since start."""

    put_requests: int = 0  # PutObject
    get_requests: int = 0  # GetObject
    head_requests: int = 0  # HeadObject
    list_requests: int = 0  # ListObjectsV2 pages
    delete_requests: int = 0  # DeleteObject
    multipart_requests: int = 0  # Create/Complete/AbortMultipartUpload, UploadPart
    copy_part_requests: int = 0  # UploadPartCopy
    retries: int = 0  # attempts after a retryable failure
    bytes_uploaded: int = 0  # request bodies sent through this process (PutObject, UploadPart)
    bytes_downloaded: int = 0  # response bodies received by this process (GetObject)
    bytes_copied_server_side: int = 0  # copied by UploadPartCopy inside the server

    @property
    def requests(self) -> int:
        return (
            self.put_requests
            + self.get_requests
            + self.head_requests
            + self.list_requests
            + self.delete_requests
            + self.multipart_requests
            + self.copy_part_requests
        )


_COUNTER_BY_OPERATION = {
    "PUT": "put_requests",
    "GET": "get_requests",
    "HEAD": "head_requests",
    "LIST": "list_requests",
    "DELETE": "delete_requests",
    "MULTIPART": "multipart_requests",
    "COPY_PART": "copy_part_requests",
}
#: The billed kind (``REQUEST_KINDS``) of each operation.
_KIND_BY_OPERATION = {operation: operation for operation in _COUNTER_BY_OPERATION} | {"COPY_PART": "COPY"}


# -- object keys -------------------------------------------------------------------------------


def _escape_char(ch: str) -> str:
    return "".join(f"%{byte:02X}" for byte in ch.encode("utf-8"))


def _encoded_units(name: str) -> list[str]:
    """The leaf encoding of ``name``, one unit per character (see module doc)."""
    return [_escape_char(ch) if ch in _ESCAPED or (i == 0 and ch == ".") else ch for i, ch in enumerate(name)]


def _cut(units: Sequence[str], bytes_max: int) -> str:
    """The longest run of whole leading units of at most ``bytes_max`` UTF-8 bytes."""
    out, size = [], 0
    for unit in units:
        size += len(unit.encode("utf-8"))
        if size > bytes_max:
            break
        out.append(unit)
    return "".join(out)


def object_leaf(name: str) -> str:
    """The last path component of chunk ``name``'s key (invariants 1 and 2)."""
    units = _encoded_units(check_name(name))
    leaf = "".join(units)
    if len(leaf.encode("utf-8")) > LEAF_BYTES_MAX:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
        leaf = f"{_cut(units, _HASHED_HEAD_BYTES_MAX)}~{digest}"
    assert 0 < len(leaf.encode("utf-8")) <= LEAF_BYTES_MAX and leaf not in (".", "..") and "/" not in leaf
    return leaf


def _is_hashed(leaf: str) -> bool:
    return "~" in leaf


def _decode_plain_leaf(leaf: str) -> str | None:
    """The chunk name of a plain (not hashed) leaf, or None if no name has this leaf."""
    try:
        name = unquote(leaf, encoding="utf-8", errors="strict")
        return name if name and object_leaf(name) == leaf else None
    except (UnicodeError, ChunkNameInvalid):
        return None


def _list_head(prefix: str) -> str:
    """A key prefix (after ``prefix/``) shared by the keys of every name starting with ``prefix``."""
    return _cut(_encoded_units(prefix), _HASHED_HEAD_BYTES_MAX)


def _name_metadata(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode("utf-8")).decode("ascii")


# -- concat planning -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CopyPart:
    """A part copied inside the server from one source range (``UploadPartCopy``)."""

    source: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class UploadPart:
    """A part whose bytes are read from the sources and sent by this process (``UploadPart``)."""

    pieces: tuple[ConcatSource, ...]

    @property
    def length(self) -> int:
        return sum(piece.length for piece in self.pieces)


def plan_parts(
    sources: Sequence[ConcatSource],
    part_bytes_min: int = PART_BYTES_MIN,
    copy_part_bytes_max: int = COPY_PART_BYTES_MAX,
) -> list[CopyPart | UploadPart]:
    """The parts of a multipart concat of ``sources`` (invariant 3).

    A range of at least ``part_bytes_min`` bytes is copied by the server. Smaller ranges
    collect in a pending upload part, sent once it reaches ``part_bytes_min``; a large
    range that follows a pending part lends it the bytes it lacks (read through this
    process) if what stays is still a valid copy part (or the last part), else it joins
    the upload part whole. Depends only on the range lengths.
    """
    ranges = [source for source in sources if source.length > 0]
    parts: list[CopyPart | UploadPart] = []
    pending: list[ConcatSource] = []
    pending_bytes = 0
    for index, source in enumerate(ranges):
        last = index == len(ranges) - 1
        offset, length = source.offset, source.length
        if length < part_bytes_min:
            pending.append(source)
            pending_bytes += length
            if pending_bytes >= part_bytes_min:
                parts.append(UploadPart(tuple(pending)))
                pending, pending_bytes = [], 0
            continue
        if pending:
            need = part_bytes_min - pending_bytes
            assert 0 < need < part_bytes_min
            if length - need >= part_bytes_min or last:
                pending.append(ConcatSource(source.name, offset, need))
                offset, length = offset + need, length - need
            else:
                pending.append(source)
                offset, length = offset + length, 0
            parts.append(UploadPart(tuple(pending)))
            pending, pending_bytes = [], 0
        if length:
            count = -(-length // copy_part_bytes_max)
            step = -(-length // count)
            for start in range(offset, offset + length, step):
                parts.append(CopyPart(source.name, start, min(step, offset + length - start)))
    if pending:
        parts.append(UploadPart(tuple(pending)))
    for part in parts[:-1]:
        assert part.length >= part_bytes_min, part
    assert sum(part.length for part in parts) == sum(source.length for source in ranges)
    return parts


def bytes_through_client(sources: Sequence[ConcatSource]) -> int:
    """How many bytes a ``concat`` of ``sources`` reads and sends through this process."""
    parts = plan_parts(sources)
    if not parts or (len(parts) == 1 and isinstance(parts[0], UploadPart)):
        return sum(source.length for source in sources)  # one PutObject of everything
    return sum(part.length for part in parts if isinstance(part, UploadPart))


# -- configuration ------------------------------------------------------------------------------


def _check_bucket(bucket: str) -> str:
    """DNS-style bucket names only (3-63 of ``[a-z0-9.-]``, letters or digits at both ends)."""
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789.-")
    if (
        not isinstance(bucket, str)
        or not 3 <= len(bucket) <= 63
        or not set(bucket) <= allowed
        or not bucket[0].isalnum()
        or not bucket[-1].isalnum()
        or ".." in bucket
    ):
        raise InvalidConfig(f"not a DNS-style S3 bucket name: {bucket!r}")
    return bucket


def _check_prefix(prefix: str) -> str:
    """The key prefix without surrounding ``/``; each component a valid path component."""
    prefix = prefix.strip("/")
    if not prefix:
        return ""
    if len(prefix.encode("utf-8", "surrogatepass")) > PREFIX_BYTES_MAX:
        raise InvalidConfig(f"S3 key prefix is longer than {PREFIX_BYTES_MAX} bytes")
    for part in prefix.split("/"):
        if part in ("", ".", "..") or len(part.encode("utf-8", "surrogatepass")) > LEAF_BYTES_MAX:
            raise InvalidConfig(f"S3 key prefix has an empty, '.', '..' or too long part: {prefix!r}")
        if any(ch in _ESCAPED and ch not in "%~" for ch in part):
            raise InvalidConfig(f"S3 key prefix has a control character or backslash: {prefix!r}")
        try:
            part.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidConfig(f"S3 key prefix is not valid Unicode text: {prefix!r}") from exc
    return prefix


# -- the binding ---------------------------------------------------------------------------------


class _UploadVanished(ChunkStorageError):
    """``NoSuchUpload``: the multipart upload is gone (completed by an attempt whose answer
    was lost, or aborted). Not retried: ``_call`` settles it like a failed condition."""

    retryable = True  # the whole concat may be tried again


class _ShortBody(Exception):
    """A response body shorter than its headers announced (a broken connection): retried."""


class S3ChunkStorage(ChunkStorage):
    """Chunks as objects below ``bucket/prefix``. No append, truncate or read-only; native concat."""

    supports_append = False
    supports_concat = True
    supports_truncate = False
    supports_readonly = False
    counts_own_requests = True
    high_latency_reads = True  # the engine reads ahead for sequential readers

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        max_attempts: int = MAX_ATTEMPTS_DEFAULT,
        connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT,
        read_timeout_s: float = READ_TIMEOUT_S_DEFAULT,
        addressing_style: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        client: S3Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        url: str | None = None,
    ) -> None:
        """Credentials, if given here, go only into the boto3 session; ``client``
        replaces the boto3 client (tests inject a fake one); ``sleep`` waits between
        attempts (tests inject a fake)."""
        self.bucket = _check_bucket(bucket)
        self.prefix = _check_prefix(prefix)
        self._base = f"{self.prefix}/" if self.prefix else ""
        if not isinstance(max_attempts, int) or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise InvalidConfig(
                f"max_attempts must be an integer in [1, {MAX_ATTEMPTS_LIMIT}], got {max_attempts!r}"
            )
        if addressing_style not in (None, "path", "virtual", "auto"):
            raise InvalidConfig(f"addressing_style must be path, virtual or auto, got {addressing_style!r}")
        if endpoint_url is not None and urlparse(endpoint_url).scheme not in ("http", "https"):
            raise InvalidConfig(f"endpoint_url must be an http(s) URL, got {_URL.redacted(endpoint_url)!r}")
        #: How failed requests are retried.
        self.retry = RetryPolicy(max_attempts, delay_s_base=RETRY_DELAY_S_BASE, delay_s_max=RETRY_DELAY_S_MAX)
        self._sleep = sleep
        #: Where and how to connect (no secret among them): tools build raw clients from these.
        self.endpoint_url, self.region, self.profile = endpoint_url, region, profile
        options = {
            "endpoint_url": endpoint_url,
            "region": region,
            "profile": profile,
            "max_attempts": None if max_attempts == MAX_ATTEMPTS_DEFAULT else max_attempts,
        }
        query = urlencode({k: v for k, v in options.items() if v is not None}, safe=":/")
        self.url = url or f"s3://{self.bucket}/{quote(self.prefix)}" + (f"?{query}" if query else "")
        self._lock = threading.Lock()
        self._counts = dict.fromkeys((f.name for f in fields(S3Statistics)), 0)
        self._session: Any = None
        self._owns_client = client is None
        if client is None:
            try:
                self._session = boto3.session.Session(
                    aws_access_key_id=access_key_id,
                    aws_secret_access_key=secret_access_key,
                    aws_session_token=session_token,
                    profile_name=profile,
                    region_name=region,
                )
                config = botocore.config.Config(
                    retries={"max_attempts": 1, "mode": "standard"},  # retried here, in _call
                    connect_timeout=connect_timeout_s,
                    read_timeout=read_timeout_s,
                    max_pool_connections=POOL_CONNECTIONS_DEFAULT,
                    s3={"addressing_style": addressing_style or ("path" if endpoint_url else "auto")},
                )
                client = self._session.client("s3", endpoint_url=endpoint_url, config=config)
            except botocore.exceptions.BotoCoreError as exc:  # e.g. ProfileNotFound
                raise InvalidConfig(
                    f"cannot configure the S3 client for {self.url}: {type(exc).__name__}"
                ) from exc
        self._client: S3Client = client

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3ChunkStorage:
        """``s3://bucket/prefix?endpoint_url=http://host:port&region=R&profile=P&max_attempts=N
        &connect_timeout_s=S&read_timeout_s=S&addressing_style=path|virtual|auto``.

        Credentials in the URL are refused (``InvalidConfig``, the URL shown redacted).
        """
        bucket, prefix, options, _ = _URL.parse(url)
        settings: dict[str, Any] = {
            k: options[k] for k in ("endpoint_url", "region", "profile", "addressing_style") if k in options
        }
        if "max_attempts" in options:
            settings["max_attempts"] = _URL.number(
                "max_attempts", options["max_attempts"], int, 1, MAX_ATTEMPTS_LIMIT
            )
        for key in ("connect_timeout_s", "read_timeout_s"):
            if key in options:
                settings[key] = _URL.number(key, options[key], float, 0.001, 3600.0)
        return cls(bucket, prefix, url=url, **settings, **kwargs)

    # -- keys, counters ---------------------------------------------------------------------

    def object_key(self, name: str) -> str:
        """The key of chunk ``name`` in the bucket (see module doc)."""
        key = self._base + object_leaf(name)
        assert len(key.encode("utf-8")) <= KEY_BYTES_MAX, key
        return key

    def object_metadata(self, name: str, write_id: str | None = None) -> dict[str, str]:
        """The user metadata this binding stores with chunk ``name``'s object."""
        metadata = {META_NAME: _name_metadata(name)} if _is_hashed(object_leaf(name)) else {}
        if write_id is not None:
            metadata[META_WRITE] = write_id
        return metadata

    def statistics(self) -> S3Statistics:
        """Requests and bytes since this binding was made (a frozen snapshot)."""
        with self._lock:
            return S3Statistics(**self._counts)

    def _add(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._counts[key] += delta

    # -- the one choke point ------------------------------------------------------------------

    def _call(
        self,
        operation: str,
        name: str,
        request: Callable[[], T],
        *,
        conflict: type[ChunkStorageError] = ChunkExists,
        recovered: Callable[[], bool] | None = None,
    ) -> T | None:
        """Run ``request`` (one S3 call) with retries; translate what it raises.

        ``conflict`` is the error for a failed condition (412). ``recovered``, for a
        conditional write, says whether the object now is this request's own: asked when
        a retry fails its condition after an attempt that may have been applied; if so
        the call returns None (success).
        """
        counter = _COUNTER_BY_OPERATION[operation]
        kind = _KIND_BY_OPERATION[operation]
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
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, _ShortBody) as exc:
                error = self._translate(exc, operation, name, conflict)
                if isinstance(error, StorageUnavailable) and attempts == self.retry.max_attempts:
                    error = StorageUnavailable(
                        f"{error.message} (gave up after {attempts} attempts)", **error.context
                    )
                raise error from exc

        def log_retry(error: Exception, failed: int, delay_s: float) -> None:
            _log.debug(
                "S3 %s of %r: %s; attempt %d of %d in %.3f s",
                operation,
                name,
                error,
                failed + 1,
                self.retry.max_attempts,
                delay_s,
            )
            self._add(retries=1)

        def settles(error: Exception) -> bool:
            return isinstance(error, (conflict, _UploadVanished)) and recovered is not None and recovered()

        return self.retry.run(attempt, sleep=self._sleep, on_retry=log_retry, settle=settles)

    def _translate(
        self, exc: Exception, operation: str, name: str, conflict: type[ChunkStorageError]
    ) -> ChunkStorageError:
        """The typed error for one failed S3 request (never raises itself)."""
        context = {"chunk": name, "binding": self.url}
        if isinstance(exc, _ShortBody):
            return StorageUnavailable(f"S3 {operation} of chunk {name!r}: {exc}", **context)
        if isinstance(exc, _RETRYABLE_TRANSPORT):
            return StorageUnavailable(
                f"S3 {operation} of chunk {name!r}: {type(exc).__name__}: {self._scrubbed(str(exc))}",
                **context,
            )
        if not isinstance(exc, botocore.exceptions.ClientError):
            # NoCredentialsError, ParamValidationError...: not retryable.
            return ChunkStorageError(
                f"S3 {operation} of chunk {name!r}: {type(exc).__name__}: {self._scrubbed(str(exc))}",
                **context,
            )
        error = exc.response.get("Error", {}) or {}
        code = str(error.get("Code", ""))
        status = int((exc.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode", 0) or 0)
        detail = self._scrubbed(str(error.get("Message", "")))
        message = f"S3 {operation} of chunk {name!r}: {code or 'error'} (HTTP {status})" + (
            f": {detail}" if detail else ""
        )
        if code in _THROTTLING_CODES or status in _RETRYABLE_STATUS:
            return StorageUnavailable(message, **context)
        if code in _CONFLICT_CODES or status == 412:
            return conflict(message, **context)
        if code == "NoSuchBucket":
            return ChunkStorageError(f"S3 bucket {self.bucket!r} does not exist ({message})", **context)
        if code == "NoSuchUpload":
            return _UploadVanished(
                f"{message}: the multipart upload is gone; the concat did not take effect", **context
            )
        if code in _NOT_FOUND_CODES or status == 404:
            return ChunkNotFound(f"chunk {name!r} not found ({message})", **context)
        if code == "InvalidRange" or status == 416:
            return ChunkInvalidOffset(message, **context)
        if code == "KeyTooLongError":
            return ChunkNameInvalid(message, **context)
        if code in _DENIED_CODES or status == 403:
            return ChunkStorageError(f"S3 access denied: {message}", **context)
        return ChunkStorageError(message, **context)

    def _scrubbed(self, text: str) -> str:
        """``text`` without any credential string of this binding's session."""
        if self._session is None or not text:
            return text
        try:
            credentials = self._session.get_credentials()
            frozen = credentials.get_frozen_credentials() if credentials is not None else None
        except Exception:  # noqa: BLE001 - formatting an error must not fail
            return "(message withheld)"
        if frozen is not None:
            for secret in (frozen.secret_key, frozen.token, frozen.access_key):
                if secret:
                    text = text.replace(secret, "***")
        return text

    # -- requests ------------------------------------------------------------------------------

    def _head(self, name: str) -> Mapping[str, Any]:
        key = self.object_key(name)
        response = self._call("HEAD", name, lambda: self._client.head_object(Bucket=self.bucket, Key=key))
        assert response is not None
        return response

    def _written_by(self, name: str, write_id: str) -> bool:
        """True if chunk ``name``'s object is the one written with ``write_id``."""
        try:
            metadata = self._head(name).get("Metadata", {}) or {}
        except ChunkNotFound:
            return False
        return metadata.get(META_WRITE) == write_id

    def _put(self, name: str, data: bytes, *, conflict: type[ChunkStorageError], **condition: str) -> None:
        """One conditional ``PutObject`` of ``data`` as chunk ``name``."""
        key = self.object_key(name)
        write_id = uuid.uuid4().hex
        metadata = self.object_metadata(name, write_id)

        def request() -> Mapping[str, Any]:
            self._add(bytes_uploaded=len(data))
            return self._client.put_object(
                Bucket=self.bucket, Key=key, Body=data, Metadata=metadata, **condition
            )

        self._call(
            "PUT", name, request, conflict=conflict, recovered=lambda: self._written_by(name, write_id)
        )

    def _get_range(self, name: str, offset: int, length: int) -> tuple[bytes, int]:
        """(bytes ``[offset, offset+length)`` clipped at the end, object size); ``length > 0``.

        Raises ``ChunkInvalidOffset`` (416) when ``offset`` is at or past the end.
        """
        assert length > 0
        key = self.object_key(name)

        def request() -> tuple[bytes, int]:
            response = self._client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}"
            )
            body = response["Body"].read()
            self._add(bytes_downloaded=len(body))
            content_range = response.get("ContentRange")
            if content_range:  # "bytes a-b/size": the server honoured the range
                size = int(content_range.rpartition("/")[2])
                data = body
            else:  # the whole object (a server that ignores Range)
                size = int(response.get("ContentLength", len(body)))
                data = body[offset : offset + length]
                if len(body) != size:
                    raise _ShortBody(f"body of {len(body)} bytes, announced {size}")
            if offset > size:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: read at {offset} past its end {size}", chunk=name, offset=offset
                )
            expected = min(length, size - offset)
            if len(data) != expected:
                raise _ShortBody(f"body of {len(data)} bytes, expected {expected}")
            return data, size

        result = self._call("GET", name, request)
        assert result is not None
        return result

    def _read_exact(self, name: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (a concat source range already checked)."""
        if length == 0:
            return b""
        data, _ = self._get_range(name, offset, length)
        if len(data) != length:
            raise ChunkInvalidOffset(
                f"concat source {name!r} shrank while being read", chunk=name, offset=offset
            )
        return data

    # -- hooks (arguments checked by ChunkStorage) -------------------------------------------

    def _do_exists(self, name: str) -> bool:
        try:
            self._head(name)
        except ChunkNotFound:
            return False
        return True

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        self._put(name, data, conflict=ChunkExists, IfNoneMatch="*")
        return ChunkHandle(name, readonly=False)

    def _do_delete(self, handle: ChunkHandle) -> None:
        name = handle.name
        self._head(name)  # S3 deletes missing keys without complaint; the contract does not
        key = self.object_key(name)
        self._call("DELETE", name, lambda: self._client.delete_object(Bucket=self.bucket, Key=key))

    def _do_open_read(self, name: str) -> ChunkHandle:
        self._head(name)
        return ChunkHandle(name, readonly=True)

    def _do_open_write(self, name: str) -> ChunkHandle:
        self._head(name)
        return ChunkHandle(name, readonly=False)

    def _do_get_info(self, name: str) -> ChunkInfo:
        return ChunkInfo(name, int(self._head(name)["ContentLength"]))

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        name = handle.name
        for _ in range(_READ_ROUNDS_MAX):
            if length > 0:
                try:
                    return self._get_range(name, offset, length)[0]
                except ChunkInvalidOffset:
                    pass  # at or past the end: the length decides which
            size = int(self._head(name)["ContentLength"])
            if offset > size:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: read at {offset} past its end {size}",
                    chunk=name,
                    offset=offset,
                    binding=self.url,
                )
            if offset == size or length == 0:
                return b""
            # The object grew between the GET and the HEAD (an empty chunk was written): again.
        raise StorageUnavailable(
            f"chunk {name!r} kept changing while being read", chunk=name, binding=self.url
        )

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        name = handle.name
        head = self._head(name)
        size = int(head["ContentLength"])
        if offset != size:
            raise ChunkInvalidOffset(
                f"chunk {name!r}: write at {offset}, but its length is {size}",
                chunk=name,
                offset=offset,
                binding=self.url,
            )
        if size:
            raise ChunkInvalidOffset(
                f"chunk {name!r}: S3 has no append (only an empty chunk at 0)",
                chunk=name,
                offset=offset,
                binding=self.url,
            )
        if data:
            # Replaces the empty object only if it is still the one we saw: one writer wins.
            self._put(name, data, conflict=ChunkInvalidOffset, IfMatch=str(head["ETag"]))
        return len(data)

    def _do_list(self, prefix: str) -> Iterator[str]:
        key_prefix = self._base + _list_head(prefix)
        names: list[str] = []
        token: str | None = None
        for _ in range(_LIST_PAGES_MAX):
            arguments = {"Bucket": self.bucket, "Prefix": key_prefix}
            if token is not None:
                arguments["ContinuationToken"] = token
            page = self._call("LIST", prefix, functools.partial(self._client.list_objects_v2, **arguments))
            assert page is not None
            for entry in page.get("Contents", []) or []:
                name = self._name_of(str(entry["Key"]))
                if name is not None and name.startswith(prefix):
                    names.append(name)
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
            if not token:
                raise ChunkStorageError(
                    f"S3 listing of {key_prefix!r} is truncated without a continuation token",
                    binding=self.url,
                )
        return iter(sorted(names))

    def _name_of(self, key: str) -> str | None:
        """The chunk name whose key is ``key``, or None for a foreign object."""
        if not key.startswith(self._base):
            return None
        leaf = key[len(self._base) :]
        if not leaf or "/" in leaf:
            return None
        if not _is_hashed(leaf):
            return _decode_plain_leaf(leaf)
        try:
            response = self._call("HEAD", leaf, lambda: self._client.head_object(Bucket=self.bucket, Key=key))
        except ChunkNotFound:
            return None  # deleted since the listing
        assert response is not None
        encoded = (response.get("Metadata", {}) or {}).get(META_NAME)
        try:
            name = base64.urlsafe_b64decode(encoded.encode("ascii")).decode("utf-8") if encoded else None
            return name if name is not None and object_leaf(name) == leaf else None
        except (ValueError, UnicodeError, ChunkNameInvalid):
            return None

    # -- concat ------------------------------------------------------------------------------

    def concat_bytes_through_client(self, sources: Sequence[ConcatSource]) -> int:
        """How many of a ``concat``'s bytes this binding reads and sends itself (the rest
        the server copies): ``bytes_through_client``. Needs no request."""
        return bytes_through_client(sources)

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        if self.exists(target):
            raise ChunkExists(f"chunk {target!r} exists", chunk=target, binding=self.url)
        sizes: dict[str, int] = {}
        for source in sources:
            if source.name not in sizes:
                sizes[source.name] = int(self._head(source.name)["ContentLength"])
            if source.offset + source.length > sizes[source.name]:
                raise ChunkInvalidOffset(
                    f"concat source {source.name!r}: range {source.offset}+{source.length} "
                    f"past its end {sizes[source.name]}",
                    chunk=source.name,
                    offset=source.offset,
                    binding=self.url,
                )
        total = sum(source.length for source in sources)
        parts = plan_parts(sources)
        if len(parts) > PARTS_MAX:
            raise ChunkStorageError(
                f"concat into {target!r} needs {len(parts)} parts, more than S3's {PARTS_MAX}",
                chunk=target,
                binding=self.url,
            )
        if not parts or (len(parts) == 1 and isinstance(parts[0], UploadPart)):
            data = b"".join(self._read_exact(s.name, s.offset, s.length) for s in sources)
            self._put(target, data, conflict=ChunkExists, IfNoneMatch="*")
        else:
            self._multipart(target, parts)
        return ChunkInfo(target, total)

    def _multipart(self, target: str, parts: Sequence[CopyPart | UploadPart]) -> None:
        """Build ``target`` from ``parts`` in one multipart upload; abort it on any failure."""
        key = self.object_key(target)
        write_id = uuid.uuid4().hex
        metadata = self.object_metadata(target, write_id)
        created = self._call(
            "MULTIPART",
            target,
            lambda: self._client.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata=metadata),
        )
        assert created is not None
        upload_id = str(created["UploadId"])
        try:
            done = [
                {"PartNumber": number, "ETag": self._send_part(target, key, upload_id, number, part)}
                for number, part in enumerate(parts, start=1)
            ]
            self._call(
                "MULTIPART",
                target,
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                    IfNoneMatch="*",
                ),
                conflict=ChunkExists,
                recovered=lambda: self._written_by(target, write_id),
            )
        except BaseException:
            try:
                self._call(
                    "MULTIPART",
                    target,
                    lambda: self._client.abort_multipart_upload(
                        Bucket=self.bucket, Key=key, UploadId=upload_id
                    ),
                )
            except ChunkStorageError as abort_error:
                _log.warning(
                    "S3 concat into %r: could not abort upload %s: %s", target, upload_id, abort_error.message
                )
            raise

    def _send_part(
        self, target: str, key: str, upload_id: str, number: int, part: CopyPart | UploadPart
    ) -> str:
        """Upload or copy one part of chunk ``target`` (object ``key``); its ETag."""
        if isinstance(part, CopyPart):
            source = {"Bucket": self.bucket, "Key": self.object_key(part.source)}
            byte_range = f"bytes={part.offset}-{part.offset + part.length - 1}"

            def copy() -> Mapping[str, Any]:
                response = self._client.upload_part_copy(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    CopySource=source,
                    CopySourceRange=byte_range,
                )
                self._add(bytes_copied_server_side=part.length)
                return response

            copied = self._call("COPY_PART", part.source, copy, conflict=ChunkStorageError)
            assert copied is not None
            return str(copied["CopyPartResult"]["ETag"])
        data = b"".join(self._read_exact(piece.name, piece.offset, piece.length) for piece in part.pieces)

        def upload() -> Mapping[str, Any]:
            self._add(bytes_uploaded=len(data))
            return self._client.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data
            )

        uploaded = self._call("MULTIPART", target, upload, conflict=ChunkStorageError)
        assert uploaded is not None
        return str(uploaded["ETag"])

    def close(self) -> None:
        if self._owns_client:
            close = getattr(self._client, "close", None)
            if close is not None:
                close()
