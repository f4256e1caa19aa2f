"""Google Cloud Storage chunk storage (google-cloud-storage): one object per chunk below ``bucket/prefix``.

Capabilities: no append (an object cannot grow), native concat (``compose``), no
truncate, no read-only; ``high_latency_reads``. The engine starts a new chunk for every
write and defrag merges them on the server.

How the contract maps onto GCS (the conformance suite checks each line):

* ``create``: an upload with ``ifGenerationMatch=0``: GCS creates the object only if no
  live generation exists, so of two writers of one name exactly one wins; the other gets
  412 -> ``ChunkExists``. Uploads of more than 8 MiB go through a resumable session (the
  SDK's rule), smaller ones are one request. Objects are atomic and durable on the 200.
* ``write``: only an empty chunk, at offset 0: a metadata GET (length 0, its generation
  ``g``), then an upload with ``ifGenerationMatch=g``: one writer wins, the other gets 412
  -> ``ChunkInvalidOffset``.
* ``read``: one ranged media GET. A body shorter than asked (the chunk's end), a 416
  (GCS: range at or past the end) or an empty 206 (the emulator's answer past the end)
  is settled with a metadata GET: ``b""`` at the end, ``ChunkInvalidOffset`` past it.
* ``exists``/``get_info``/``open_*``: metadata GET. ``delete``: DELETE (404 ->
  ``ChunkNotFound``). ``list``: objects.list page by page, decoded, sorted.
* ``concat``: see ``plan_compose``: sources that are whole objects are composed by the
  server as they are; a range that is not a whole object is read through this process
  and uploaded as a temporary object (adjacent ranges together), which is then composed
  like the others. ``compose`` takes at most ``COMPOSE_SOURCES_MAX`` (32) sources: more
  are composed in a tree of temporary intermediate objects. The last compose writes the
  target with ``ifGenerationMatch=0`` (exclusive like ``create``) and the sources'
  generations as ``ifSourceGenerationMatch``. Temporary objects are deleted when the
  concat ends, failed or not; a crash leaves them under reserved names (``gcs_keys``)
  that ``sweep_temporaries`` removes once they are older than ``TMP_AGE_S_MAX`` (run by
  the first concat of every binding instance).

Preconditions (``preconditions`` option): GCS enforces ``ifGenerationMatch``; the
``gcp-storage-emulator`` accepts and ignores it. The binding always sends it, and in
``checked`` mode it also enforces it itself: a metadata GET under a process-wide lock per
object before every conditional write, so writers *in this process* see exactly one
winner even on a server that ignores preconditions (across processes only the server can
decide). ``server`` trusts the server; ``auto`` (the default) is ``server`` against
Google and, against a custom endpoint or ``STORAGE_EMULATOR_HOST``, asks a one-time probe
(two ``ifGenerationMatch=0`` creates of one probe object: a second success means the
server ignores the condition) and takes ``checked`` if the server fails it.

Credentials: Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's
ADC file, the metadata server), or ``credentials=`` in code; never the URL. Anonymous
access only with ``?anonymous=1`` (an emulator) or under ``STORAGE_EMULATOR_HOST`` (the
SDK's rule).

Retries: every request goes through ``_call``, the one place where SDK, google-auth and
HTTP errors become ``slts.errors`` types (``raise ... from exc``); the SDK's own retries
are off. 408, 429, 5xx, connection errors and broken bodies are retried ``max_attempts``
times in all (``RetryPolicy``), then ``StorageUnavailable``. A conditional write whose
retry fails its condition after an attempt that may have landed is settled against the
write id in the object's custom metadata (``slts-write``): its own object is success.

Invariants (asserted or checked by tests):

1. No SDK, google-auth or requests exception leaves a public method.
2. ``plan_compose``: the pieces cover the source ranges exactly, in order; every object
   piece is a whole source object; no compose call gets more than ``COMPOSE_SOURCES_MAX``
   sources (``compose_tree``).
3. A concat leaves no object but its target behind, except after a crash (then only
   reserved ``.tmp~`` names, which the sweep removes).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlparse

import google.api_core.exceptions as gexc
import google.auth
import google.auth.credentials
import google.auth.exceptions
import google.cloud.storage as gcs
import requests.exceptions
from google.api_core.client_options import ClientOptions

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNotFound,
    ChunkStorageError,
    InvalidArgument,
    InvalidConfig,
    StorageUnavailable,
)

from . import gcs_keys
from .base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource
from .retry import MAX_ATTEMPTS_DEFAULT, RetryPolicy
from .store_urls import StoreUrl

_log = logging.getLogger(__name__)

MiB = 1 << 20
#: Sources of one ``compose`` request (GCS's limit).
COMPOSE_SOURCES_MAX = 32
#: Above this the SDK uploads through a resumable session (initiate + upload: 2 requests).
RESUMABLE_BYTES_MIN = 8 * MiB
#: A temporary object older than this is crash debris (a live concat takes far less).
TMP_AGE_S_MAX = 3600.0
MAX_ATTEMPTS_LIMIT = 20
#: The most requests one binding may have in flight (``requests_max``; default: unbounded).
REQUESTS_MAX_LIMIT = 1024
RETRY_DELAY_S_BASE = 0.05
RETRY_DELAY_S_MAX = 2.0
CONNECT_TIMEOUT_S_DEFAULT = 5.0
READ_TIMEOUT_S_DEFAULT = 60.0
_LIST_PAGES_MAX = 10_000_000
_READ_ROUNDS_MAX = 3
_LOCK_STRIPES = 256
#: Custom metadata: the chunk name of a hashed leaf, the id of the write that made the object.
META_NAME = "slts-name"
META_WRITE = "slts-write"
PRECONDITION_MODES = ("auto", "server", "checked")
_URL_OPTIONS = (
    "endpoint",
    "project",
    "anonymous",
    "max_attempts",
    "timeout_s",
    "preconditions",
    "requests_max",
)
#: The URL's rules (``store_urls``): its options, and the query keys taken for credentials.
_URL = StoreUrl(
    scheme="gs",
    service="GCS",
    a_service="a GCS",
    container="bucket",
    options=_URL_OPTIONS,
    secret_words=("secret", "password", "token", "key", "credential", "signature"),
    credentials_hint=(
        "Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth"
        " application-default login)"
    ),
)
_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_RETRYABLE_TRANSPORT = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
    google.auth.exceptions.TransportError,
)
GOOGLE_ENDPOINT = "https://storage.googleapis.com"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GcsStatistics:
    """Requests sent (every attempt counts: each is billed) and bytes moved, since start."""

    upload_requests: int = 0  # objects.insert (simple or multipart upload)
    resumable_requests: int = 0  # a resumable session's initiation and its upload
    get_requests: int = 0  # media GET (reads)
    metadata_requests: int = 0  # objects.get (metadata)
    list_requests: int = 0  # objects.list pages
    delete_requests: int = 0  # objects.delete
    compose_requests: int = 0  # objects.compose
    retries: int = 0  # attempts after a retryable failure
    bytes_uploaded: int = 0  # bodies sent by this process
    bytes_downloaded: int = 0  # bodies received by this process
    bytes_composed_server_side: int = 0  # source bytes of composes (copied inside GCS)

    @property
    def requests(self) -> int:
        return (
            self.upload_requests
            + self.resumable_requests
            + self.get_requests
            + self.metadata_requests
            + self.list_requests
            + self.delete_requests
            + self.compose_requests
        )


#: operation -> (counter, billed kind of ``REQUEST_KINDS``)
_OPERATIONS = {
    "UPLOAD": ("upload_requests", "PUT"),
    "RESUMABLE": ("resumable_requests", "PUT"),
    "GET": ("get_requests", "GET"),
    "METADATA": ("metadata_requests", "HEAD"),
    "LIST": ("list_requests", "LIST"),
    "DELETE": ("delete_requests", "DELETE"),
    "COMPOSE": ("compose_requests", "COPY"),
}


# -- concat planning ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WholeObject:
    """A compose source used as it is: the whole chunk ``name`` (``length`` bytes)."""

    name: str
    length: int


@dataclass(frozen=True, slots=True)
class CopiedRanges:
    """Source ranges read through this process and uploaded as one temporary object."""

    ranges: tuple[ConcatSource, ...]

    @property
    def length(self) -> int:
        return sum(piece.length for piece in self.ranges)


def plan_compose(sources: Sequence[ConcatSource], sizes: dict[str, int]) -> list[WholeObject | CopiedRanges]:
    """The compose pieces of a concat of ``sources`` whose chunks have ``sizes`` (invariant 2).

    A range covering its whole chunk is composed by the server; other ranges (and empty
    ones are dropped) are copied through this process, adjacent ones into one piece.
    Depends only on the ranges and sizes.
    """
    pieces: list[WholeObject | CopiedRanges] = []
    pending: list[ConcatSource] = []
    for source in sources:
        if source.length == 0:
            continue
        if source.offset == 0 and source.length == sizes[source.name]:
            if pending:
                pieces.append(CopiedRanges(tuple(pending)))
                pending = []
            pieces.append(WholeObject(source.name, source.length))
        else:
            pending.append(source)
    if pending:
        pieces.append(CopiedRanges(tuple(pending)))
    assert sum(piece.length for piece in pieces) == sum(source.length for source in sources)
    return pieces


def bytes_through_client(sources: Sequence[ConcatSource], sizes: dict[str, int]) -> int:
    """How many bytes a ``concat`` of ``sources`` reads and sends through this process."""
    return sum(piece.length for piece in plan_compose(sources, sizes) if isinstance(piece, CopiedRanges))


def compose_tree(count: int, fan_in: int = COMPOSE_SOURCES_MAX) -> list[list[tuple[int, int]]]:
    """The rounds of composes that merge ``count`` components into one (invariant 2).

    Each round is a list of ``(first, end)`` index ranges over the previous round's
    components (round 0: the pieces); each range becomes one object. The last round has
    exactly one range of at most ``fan_in`` components: the target.
    """
    assert count >= 1 and fan_in >= 2, (count, fan_in)
    rounds: list[list[tuple[int, int]]] = []
    while True:
        groups = [(first, min(first + fan_in, count)) for first in range(0, count, fan_in)]
        rounds.append(groups)
        if len(groups) == 1:
            return rounds
        count = len(groups)


# -- configuration ----------------------------------------------------------------------------------


def check_bucket(bucket: str) -> str:
    """GCS bucket naming rules: 3-63 of ``[a-z0-9_.-]`` (up to 222 with dots, each dotted
    part at most 63), a letter or digit at both ends, not starting with ``goog``."""
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789_.-")
    dotted = isinstance(bucket, str) and "." in bucket
    if (
        not isinstance(bucket, str)
        or not 3 <= len(bucket) <= (222 if dotted else 63)
        or not set(bucket) <= allowed
        or not bucket[0].isalnum()
        or not bucket[-1].isalnum()
        or ".." in bucket
        or bucket.startswith("goog")
        or any(not 1 <= len(part) <= 63 for part in bucket.split("."))
    ):
        raise InvalidConfig(f"not a valid GCS bucket name: {bucket!r}")
    return bucket


def check_prefix(prefix: str) -> str:
    """The object name prefix without surrounding ``/``; no empty, ``.`` or ``..`` part."""
    prefix = prefix.strip("/")
    if not prefix:
        return ""
    try:
        size = len(prefix.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidConfig(f"GCS prefix is not valid Unicode text: {prefix!r}") from exc
    if size > gcs_keys.PREFIX_BYTES_MAX:
        raise InvalidConfig(f"GCS prefix is longer than {gcs_keys.PREFIX_BYTES_MAX} bytes")
    for part in prefix.split("/"):
        if part in ("", ".", "..") or len(part.encode("utf-8")) > gcs_keys.LEAF_BYTES_MAX:
            raise InvalidConfig(f"GCS prefix has an empty, '.', '..' or too long part: {prefix!r}")
        if any(ord(ch) < 0x20 or ch in "\x7f\\#[]*?" for ch in part):
            raise InvalidConfig(f"GCS prefix has a control or wildcard character: {prefix!r}")
    return prefix


def parse_url(url: str) -> tuple[str, str, dict[str, Any]]:
    """``gs://BUCKET[/PREFIX][?OPTIONS]`` -> (bucket, prefix, constructor options).

    Options: ``endpoint`` (http(s) URL of the service or an emulator), ``project``,
    ``anonymous`` (``1``/``0``), ``max_attempts`` (1-20), ``timeout_s`` (per request read
    timeout), ``preconditions`` (``auto``/``server``/``checked``), ``requests_max`` (requests
    in flight at once, 1-1024; unbounded by default). Anything else, a
    repeated or empty option, user info, a fragment, or a secret-looking key is
    ``InvalidConfig`` (the URL shown redacted).
    """
    netloc, path, options, shown = _URL.parse(url)
    settings: dict[str, Any] = {
        k: options[k] for k in ("endpoint", "project", "preconditions") if k in options
    }
    if "anonymous" in options:
        if options["anonymous"] not in ("0", "1"):
            raise InvalidConfig(f"GCS URL option anonymous must be 0 or 1 in {shown}")
        settings["anonymous"] = options["anonymous"] == "1"
    if "max_attempts" in options:
        settings["max_attempts"] = _URL.number(
            "max_attempts", options["max_attempts"], int, 1, MAX_ATTEMPTS_LIMIT
        )
    if "requests_max" in options:
        settings["requests_max"] = _URL.number(
            "requests_max", options["requests_max"], int, 1, REQUESTS_MAX_LIMIT
        )
    if "timeout_s" in options:
        settings["timeout_s"] = _URL.number("timeout_s", options["timeout_s"], float, 0.001, 3600.0)
    return check_bucket(netloc), path, settings


# -- process-wide state of the checked mode -------------------------------------------------------

_stripes = [threading.Lock() for _ in range(_LOCK_STRIPES)]
_probed: dict[tuple[str, str], bool] = {}  # (endpoint, bucket) -> the server enforces preconditions
_probed_lock = threading.Lock()


def _object_lock(endpoint: str, bucket: str, object_name: str) -> threading.Lock:
    return _stripes[hash((endpoint, bucket, object_name)) % _LOCK_STRIPES]


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_LOCK = _NoLock()


class _ShortBody(Exception):
    """A ranged GET answered with fewer bytes than its Content-Range: retried."""


# -- the binding -------------------------------------------------------------------------------------


class GcsChunkStorage(ChunkStorage):
    """Chunks as objects below ``bucket/prefix``. No append, truncate or read-only; native concat."""

    supports_append = False
    supports_concat = True
    supports_truncate = False
    supports_readonly = False
    counts_own_requests = True
    high_latency_reads = True

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        project: str | None = None,
        anonymous: bool = False,
        credentials: google.auth.credentials.Credentials | None = None,
        max_attempts: int = MAX_ATTEMPTS_DEFAULT,
        timeout_s: float = READ_TIMEOUT_S_DEFAULT,
        preconditions: str = "auto",
        requests_max: int | None = None,
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        before_request: Callable[[str], None] | None = None,
        url: str | None = None,
    ) -> None:
        """``client`` replaces the SDK client (a shared one, for tests making many
        bindings); ``sleep`` waits between attempts; ``before_request(operation)`` runs
        before every request attempt, and what it raises counts as that attempt's failure
        (tests kill the server or raise an SDK error there)."""
        self.bucket = check_bucket(bucket)
        self.prefix = check_prefix(prefix)
        self._base = f"{self.prefix}/" if self.prefix else ""
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
            raise InvalidConfig(f"max_attempts must be an integer, got {max_attempts!r}")
        if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise InvalidConfig(f"max_attempts must be in [1, {MAX_ATTEMPTS_LIMIT}], got {max_attempts}")
        if preconditions not in PRECONDITION_MODES:
            raise InvalidConfig(
                f"preconditions must be one of {', '.join(PRECONDITION_MODES)}, got {preconditions!r}"
            )
        if endpoint is not None and urlparse(endpoint).scheme not in ("http", "https"):
            raise InvalidConfig(f"endpoint must be an http(s) URL, got {_URL.redacted(endpoint)!r}")
        if requests_max is not None and (
            isinstance(requests_max, bool)
            or not isinstance(requests_max, int)
            or not 1 <= requests_max <= REQUESTS_MAX_LIMIT
        ):
            raise InvalidConfig(
                f"requests_max must be an integer in [1, {REQUESTS_MAX_LIMIT}], got {requests_max!r}"
            )
        self._in_flight = threading.BoundedSemaphore(requests_max) if requests_max else None
        self.retry = RetryPolicy(max_attempts, delay_s_base=RETRY_DELAY_S_BASE, delay_s_max=RETRY_DELAY_S_MAX)
        self._sleep = sleep
        self._before_request = before_request
        self._timeout = (CONNECT_TIMEOUT_S_DEFAULT, float(timeout_s))
        emulator_host = os.environ.get("STORAGE_EMULATOR_HOST")
        #: The service this binding talks to (no secret in it).
        self.endpoint = endpoint or emulator_host or GOOGLE_ENDPOINT
        self.anonymous = anonymous
        self.project = project
        options = {
            "endpoint": endpoint,
            "project": project,
            "anonymous": "1" if anonymous else None,
            "max_attempts": None if max_attempts == MAX_ATTEMPTS_DEFAULT else max_attempts,
            "preconditions": None if preconditions == "auto" else preconditions,
            "requests_max": requests_max,
        }
        query = urlencode({k: v for k, v in options.items() if v is not None}, safe=":/")
        self.url = url or f"gs://{self.bucket}/{quote(self.prefix)}" + (f"?{query}" if query else "")
        if preconditions == "auto" and self.endpoint == GOOGLE_ENDPOINT:
            preconditions = "server"
        self._preconditions = preconditions
        self._lock = threading.Lock()
        self._counts = dict.fromkeys((f.name for f in fields(GcsStatistics)), 0)
        self._swept = False
        self._owns_client = client is None
        self._client = client if client is not None else self._make_client(credentials)
        self._bucket = self._client.bucket(self.bucket)

    def _make_client(self, credentials: google.auth.credentials.Credentials | None) -> Any:
        """The SDK client: ADC unless ``anonymous`` (or the SDK's emulator variable)."""
        from google.auth.credentials import AnonymousCredentials

        project = self.project
        try:
            if credentials is None and (self.anonymous or os.environ.get("STORAGE_EMULATOR_HOST")):
                credentials = AnonymousCredentials()
            elif credentials is None:
                credentials, adc_project = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/devstorage.read_write"]
                )
                project = project or adc_project
            endpoint = None if self.endpoint == GOOGLE_ENDPOINT else self.endpoint
            return gcs.Client(
                # Object requests name no project; a placeholder keeps the SDK from looking for one.
                project=project or "slts-no-project",
                credentials=credentials,
                client_options=ClientOptions(api_endpoint=endpoint) if endpoint else None,
            )
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise InvalidConfig(
                f"no Google credentials for {self.url}: set GOOGLE_APPLICATION_CREDENTIALS or run "
                f"`gcloud auth application-default login` ({type(exc).__name__})"
            ) from exc
        except (ValueError, google.auth.exceptions.GoogleAuthError) as exc:
            raise InvalidConfig(
                f"cannot configure the GCS client for {self.url}: {type(exc).__name__}"
            ) from exc

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> GcsChunkStorage:
        """The binding for ``gs://BUCKET/PREFIX?OPTIONS`` (``parse_url``)."""
        bucket, prefix, settings = parse_url(url)
        return cls(bucket, prefix, url=url, **settings, **kwargs)

    # -- names, counters -----------------------------------------------------------------------

    def object_name(self, name: str) -> str:
        """The object of chunk ``name`` in the bucket."""
        object_name = self._base + gcs_keys.object_leaf(name)
        assert len(object_name.encode("utf-8")) <= gcs_keys.OBJECT_NAME_BYTES_MAX, object_name
        return object_name

    def object_metadata(self, name: str, write_id: str | None = None) -> dict[str, str]:
        """The custom metadata this binding stores with chunk ``name``'s object."""
        leaf = gcs_keys.object_leaf(name)
        metadata = {META_NAME: gcs_keys.name_metadata(name)} if gcs_keys.is_hashed(leaf) else {}
        if write_id is not None:
            metadata[META_WRITE] = write_id
        return metadata

    @property
    def client(self) -> Any:
        """The SDK client this binding sends its requests with (tools use it for raw baselines)."""
        return self._client

    @property
    def preconditions(self) -> str:
        """``server`` or ``checked`` once decided; ``auto`` until the probe ran."""
        return self._preconditions

    def statistics(self) -> GcsStatistics:
        """Requests and bytes since this binding was made (a frozen snapshot)."""
        with self._lock:
            return GcsStatistics(**self._counts)

    def _add(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._counts[key] += delta

    # -- the one choke point ---------------------------------------------------------------------

    def _call(
        self,
        operation: str,
        name: str,
        request: Callable[[], T],
        *,
        conflict: type[ChunkStorageError] = ChunkExists,
        recovered: Callable[[], bool] | None = None,
        requests_per_attempt: int = 1,
    ) -> T | None:
        """Run ``request`` (one SDK call) with retries; translate what it raises.

        ``conflict`` is the error of a failed precondition (412). ``recovered`` settles a
        conditional write whose retry failed its condition (see module doc).
        """
        counter, kind = _OPERATIONS[operation]
        attempts = 0

        def attempt() -> T:
            nonlocal attempts
            attempts += 1
            self._add(**{counter: requests_per_attempt})
            observer = self._request_observer
            for _ in range(requests_per_attempt):
                if observer is not None:
                    observer(kind)
            try:
                if self._before_request is not None:
                    self._before_request(operation)  # a test's fault or kill, translated as the request's own
                if self._in_flight is None:
                    return request()
                with self._in_flight:
                    return request()
            except ChunkStorageError:
                raise
            except Exception as exc:
                error = self.translate(exc, operation, name, conflict)
                if isinstance(error, StorageUnavailable) and attempts == self.retry.max_attempts:
                    error = StorageUnavailable(
                        f"{error.message} (gave up after {attempts} attempts)", **error.context
                    )
                raise error from exc

        def on_retry(error: Exception, failed: int, delay_s: float) -> None:
            _log.debug("GCS %s of %r: %s; attempt %d in %.3f s", operation, name, error, failed + 1, delay_s)
            self._add(retries=1)

        def settles(error: Exception) -> bool:
            return isinstance(error, conflict) and recovered is not None and recovered()

        return self.retry.run(attempt, sleep=self._sleep, on_retry=on_retry, settle=settles)

    def translate(
        self, exc: BaseException, operation: str, name: str, conflict: type[ChunkStorageError] = ChunkExists
    ) -> ChunkStorageError:
        """The typed error for one failed request (never raises itself); see docs/bindings.md."""
        context = {"chunk": name, "binding": self.url}
        what = f"GCS {operation} of chunk {name!r}"
        if isinstance(exc, _ShortBody):
            return StorageUnavailable(f"{what}: {exc}", **context)
        if isinstance(exc, _RETRYABLE_TRANSPORT):
            return StorageUnavailable(f"{what}: {type(exc).__name__}: {exc}", **context)
        if isinstance(exc, google.auth.exceptions.GoogleAuthError):
            return ChunkStorageError(f"{what}: credentials failed: {type(exc).__name__}: {exc}", **context)
        if isinstance(exc, gexc.GoogleAPICallError):
            status = int(exc.code or 0)
            message = f"{what}: HTTP {status}: {exc.message}"
            if status in _RETRYABLE_STATUS:
                return StorageUnavailable(message, **context)
            if status in (409, 412):
                return conflict(message, **context)
            if status == 404:
                if "bucket" in str(exc.message).lower():
                    return ChunkStorageError(
                        f"GCS bucket {self.bucket!r} does not exist ({message})", **context
                    )
                return ChunkNotFound(f"chunk {name!r} not found ({message})", **context)
            if status == 416:
                return ChunkInvalidOffset(message, **context)
            if status in (401, 403):
                return ChunkStorageError(f"GCS access denied: {message}", **context)
            return ChunkStorageError(message, **context)
        if isinstance(exc, requests.exceptions.RequestException):
            return ChunkStorageError(f"{what}: {type(exc).__name__}: {exc}", **context)
        http_status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(http_status, int) and http_status in _RETRYABLE_STATUS:  # resumable-media's
            return StorageUnavailable(f"{what}: HTTP {http_status}: {exc}", **context)
        if type(exc).__name__ == "DataCorruption":  # a checksum mismatch in transit: try again
            return StorageUnavailable(f"{what}: {exc}", **context)
        return ChunkStorageError(f"{what}: {type(exc).__name__}: {exc}", **context)

    # -- preconditions --------------------------------------------------------------------------

    def _checked(self) -> bool:
        """Whether this binding enforces preconditions itself (see module doc)."""
        if self._preconditions == "auto":
            key = (self.endpoint, self.bucket)
            with _probed_lock:
                enforced = _probed.get(key)
            if enforced is None:
                enforced = self._probe()
                with _probed_lock:
                    _probed[key] = enforced
            self._preconditions = "server" if enforced else "checked"
            if not enforced:
                _log.warning(
                    "GCS server %s ignores ifGenerationMatch: exclusive creates are enforced by this "
                    "process only (preconditions=checked)",
                    self.endpoint,
                )
        return self._preconditions == "checked"

    def _probe(self) -> bool:
        """True if the server refuses a second ``ifGenerationMatch=0`` create of one object."""
        blob = self._bucket.blob(f"{self._base}{gcs_keys.PROBE_LEAF_PREFIX}{uuid.uuid4().hex}")

        def upload() -> None:
            blob.upload_from_string(b"", if_generation_match=0, retry=None, timeout=self._timeout)

        self._call("UPLOAD", blob.name, upload)
        try:
            self._call("UPLOAD", blob.name, upload)
            return False
        except ChunkExists:
            return True
        finally:
            try:
                self._delete_object(blob.name, blob.name)
            except ChunkStorageError as error:
                _log.warning("GCS precondition probe %r not removed: %s", blob.name, error.message)

    def _guard(self, object_name: str) -> threading.Lock | _NoLock:
        """The lock a conditional change of ``object_name`` holds in checked mode."""
        return _object_lock(self.endpoint, self.bucket, object_name) if self._checked() else _NO_LOCK

    # -- requests --------------------------------------------------------------------------------

    def _metadata(self, name: str, object_name: str | None = None) -> Any:
        """The object's metadata (size, generation, custom metadata); ``ChunkNotFound``."""
        blob = self._bucket.blob(object_name or self.object_name(name))
        self._call("METADATA", name, lambda: blob.reload(retry=None, timeout=self._timeout))
        return blob

    def _size(self, name: str) -> int:
        return int(self._metadata(name).size or 0)

    def _written_by(self, name: str, object_name: str, write_id: str) -> bool:
        try:
            blob = self._metadata(name, object_name)
        except ChunkNotFound:
            return False
        return (blob.metadata or {}).get(META_WRITE) == write_id

    def _upload(
        self,
        name: str,
        object_name: str,
        data: bytes,
        metadata: dict[str, str],
        *,
        generation: int,
        conflict: type[ChunkStorageError],
    ) -> None:
        """One upload of ``data`` as ``object_name`` if its generation is ``generation`` (0: absent)."""
        write_id = uuid.uuid4().hex
        resumable = len(data) > RESUMABLE_BYTES_MIN

        def request() -> None:
            blob = self._bucket.blob(object_name)
            blob.metadata = {**metadata, META_WRITE: write_id}
            self._add(bytes_uploaded=len(data))
            blob.upload_from_string(
                data,
                content_type="application/octet-stream",
                if_generation_match=generation,
                checksum="crc32c",
                retry=None,
                timeout=self._timeout,
            )

        self._call(
            "RESUMABLE" if resumable else "UPLOAD",
            name,
            request,
            conflict=conflict,
            recovered=lambda: self._written_by(name, object_name, write_id),
            requests_per_attempt=2 if resumable else 1,
        )

    def _get_range(self, name: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)``, fewer at the end, ``b""`` past it; ``length > 0``.

        The caller settles a short answer with the object's size (a 416 comes back as
        ``ChunkInvalidOffset``)."""
        assert length > 0
        blob = self._bucket.blob(self.object_name(name))

        def request() -> bytes:
            data = blob.download_as_bytes(
                start=offset,
                end=offset + length - 1,
                raw_download=True,
                checksum=None,
                retry=None,
                timeout=self._timeout,
            )
            self._add(bytes_downloaded=len(data))
            if len(data) > length:
                raise _ShortBody(f"{len(data)} bytes for a range of {length}")
            return bytes(data)

        result = self._call("GET", name, request)
        assert result is not None
        return result

    def _read_exact(self, name: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (a concat source range already checked)."""
        data = self._get_range(name, offset, length) if length else b""
        if len(data) != length:
            raise ChunkInvalidOffset(
                f"concat source {name!r} changed while being read", chunk=name, offset=offset
            )
        return data

    # -- hooks (arguments checked by ChunkStorage) -------------------------------------------------

    def _do_exists(self, name: str) -> bool:
        try:
            self._metadata(name)
        except ChunkNotFound:
            return False
        return True

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        object_name = self.object_name(name)
        with self._guard(object_name):
            if self._preconditions == "checked" and self._do_exists(name):
                raise ChunkExists(f"chunk {name!r} exists", chunk=name, binding=self.url)
            self._upload(
                name, object_name, data, self.object_metadata(name), generation=0, conflict=ChunkExists
            )
        return ChunkHandle(name, readonly=False)

    def _delete_object(self, label: str, object_name: str) -> None:
        """One DELETE of ``object_name`` (``ChunkNotFound`` if it is missing)."""
        blob = self._bucket.blob(object_name)
        self._call("DELETE", label, functools.partial(blob.delete, retry=None, timeout=self._timeout))

    def _do_delete(self, handle: ChunkHandle) -> None:
        object_name = self.object_name(handle.name)
        with self._guard(object_name):
            self._delete_object(handle.name, object_name)

    def _do_open_read(self, name: str) -> ChunkHandle:
        self._metadata(name)
        return ChunkHandle(name, readonly=True)

    def _do_open_write(self, name: str) -> ChunkHandle:
        self._metadata(name)
        return ChunkHandle(name, readonly=False)

    def _do_get_info(self, name: str) -> ChunkInfo:
        return ChunkInfo(name, self._size(name))

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        name = handle.name
        for _ in range(_READ_ROUNDS_MAX):
            data = b""
            if length > 0:
                try:
                    data = self._get_range(name, offset, length)
                except ChunkInvalidOffset:
                    data = b""  # 416: at or past the end; the size decides which
                if len(data) == length:
                    return data
            size = self._size(name)
            if offset > size:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: read at {offset} past its end {size}",
                    chunk=name,
                    offset=offset,
                    binding=self.url,
                )
            if len(data) == min(length, size - offset):
                return data
            # The object changed between the GET and the metadata GET (an empty chunk was written): again.
        raise StorageUnavailable(
            f"chunk {name!r} kept changing while being read", chunk=name, binding=self.url
        )

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        name = handle.name
        object_name = self.object_name(name)
        with self._guard(object_name):
            blob = self._metadata(name, object_name)
            size = int(blob.size or 0)
            if offset != size:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: write at {offset}, but its length is {size}",
                    chunk=name,
                    offset=offset,
                    binding=self.url,
                )
            if size:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: GCS has no append (only an empty chunk at 0)",
                    chunk=name,
                    offset=offset,
                    binding=self.url,
                )
            if data:
                # Replaces the empty object only if it is still the one we saw: one writer wins.
                self._upload(
                    name,
                    object_name,
                    data,
                    self.object_metadata(name),
                    generation=int(blob.generation),
                    conflict=ChunkInvalidOffset,
                )
        return len(data)

    def _list_objects(self, name_prefix: str, label: str) -> list[Any]:
        """Every object whose name starts with ``name_prefix`` (all pages)."""

        def request() -> list[Any]:
            found: list[Any] = []
            iterator = self._client.list_blobs(
                self._bucket, prefix=name_prefix, retry=None, timeout=self._timeout
            )
            for number, page in enumerate(iterator.pages):
                assert number < _LIST_PAGES_MAX
                if number:
                    self._add(list_requests=1)  # the first page is counted by _call
                found.extend(page)
            return found

        result = self._call("LIST", label, request)
        assert result is not None
        return result

    def _do_list(self, prefix: str) -> Iterator[str]:
        names: list[str] = []
        for blob in self._list_objects(self._base + gcs_keys.list_head(prefix), prefix):
            name = self._name_of(str(blob.name), blob.metadata or {})
            if name is not None and name.startswith(prefix):
                names.append(name)
        return iter(sorted(names))

    def _name_of(self, object_name: str, metadata: dict[str, str]) -> str | None:
        """The chunk name of ``object_name``, or None for a foreign or reserved object."""
        if not object_name.startswith(self._base):
            return None
        leaf = object_name[len(self._base) :]
        if not leaf or "/" in leaf or gcs_keys.is_reserved(leaf):
            return None
        if gcs_keys.is_hashed(leaf):
            return gcs_keys.decode_hashed_leaf(leaf, metadata.get(META_NAME))
        return gcs_keys.decode_plain_leaf(leaf)

    # -- concat ----------------------------------------------------------------------------------

    def concat_bytes_through_client(self, sources: Sequence[ConcatSource]) -> int:
        """Bytes of ranges that are not whole objects (read and uploaded by this process).
        Without a request, a range from offset 0 is assumed to be its whole chunk."""
        sizes: dict[str, int] = {}
        for source in sources:
            if source.offset == 0:
                sizes[source.name] = max(sizes.get(source.name, 0), source.length)
            else:
                sizes.setdefault(source.name, -1)
        return bytes_through_client(sources, sizes)

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        if not self._swept:
            self._swept = True
            try:
                self.sweep_temporaries()
            except ChunkStorageError as error:
                _log.warning("GCS sweep of temporary objects failed: %s", error.message)
        if self.exists(target):
            raise ChunkExists(f"chunk {target!r} exists", chunk=target, binding=self.url)
        sizes: dict[str, int] = {}
        generations: dict[str, int] = {}
        for source in sources:
            if source.name not in sizes:
                blob = self._metadata(source.name)
                sizes[source.name], generations[source.name] = int(blob.size or 0), int(blob.generation)
            if source.offset + source.length > sizes[source.name]:
                raise ChunkInvalidOffset(
                    f"concat source {source.name!r}: range {source.offset}+{source.length} "
                    f"past its end {sizes[source.name]}",
                    chunk=source.name,
                    offset=source.offset,
                    binding=self.url,
                )
        total = sum(source.length for source in sources)
        pieces = plan_compose(sources, sizes)
        target_object = self.object_name(target)
        if all(isinstance(piece, CopiedRanges) for piece in pieces):
            data = b"".join(self._read_exact(s.name, s.offset, s.length) for s in sources)
            with self._guard(target_object):
                if self._preconditions == "checked" and self._do_exists(target):
                    raise ChunkExists(f"chunk {target!r} exists", chunk=target, binding=self.url)
                self._upload(
                    target,
                    target_object,
                    data,
                    self.object_metadata(target),
                    generation=0,
                    conflict=ChunkExists,
                )
            return ChunkInfo(target, total)
        self._compose_pieces(target, target_object, pieces, generations)
        return ChunkInfo(target, total)

    def _compose_pieces(
        self,
        target: str,
        target_object: str,
        pieces: Sequence[WholeObject | CopiedRanges],
        generations: dict[str, int],
    ) -> None:
        """Upload the copied pieces, compose everything into ``target`` (a tree beyond 32
        components), then delete every temporary object, whatever happened."""
        token = uuid.uuid4().hex
        now_ms = int(time.time() * 1000)
        temporaries: list[str] = []

        def temporary() -> str:
            object_name = self._base + gcs_keys.tmp_leaf(now_ms, token, len(temporaries))
            temporaries.append(object_name)
            return object_name

        try:
            # (object name, generation or None for our own temporaries, length)
            components: list[tuple[str, int | None, int]] = []
            for piece in pieces:
                if isinstance(piece, WholeObject):
                    components.append((self.object_name(piece.name), generations[piece.name], piece.length))
                    continue
                data = b"".join(self._read_exact(r.name, r.offset, r.length) for r in piece.ranges)
                object_name = temporary()
                self._upload(target, object_name, data, {}, generation=0, conflict=ChunkStorageError)
                components.append((object_name, None, piece.length))
            rounds = compose_tree(len(components))
            for depth, groups in enumerate(rounds):
                last = depth == len(rounds) - 1
                merged: list[tuple[str, int | None, int]] = []
                for first, end in groups:
                    group = components[first:end]
                    if last:
                        with self._guard(target_object):
                            if self._preconditions == "checked" and self._do_exists(target):
                                raise ChunkExists(f"chunk {target!r} exists", chunk=target, binding=self.url)
                            self._compose(target, target_object, group, self.object_metadata(target))
                    elif len(group) == 1:
                        merged.append(group[0])
                    else:
                        object_name = temporary()
                        self._compose(target, object_name, group, {})
                        merged.append((object_name, None, sum(length for _, _, length in group)))
                components = merged
        finally:
            for object_name in temporaries:
                try:
                    self._delete_object(target, object_name)
                except ChunkNotFound:
                    pass  # never made (the failure came first)
                except ChunkStorageError as error:
                    _log.warning(
                        "GCS concat into %r: temporary %r stays: %s", target, object_name, error.message
                    )

    def _compose(
        self,
        target: str,
        object_name: str,
        group: Sequence[tuple[str, int | None, int]],
        metadata: dict[str, str],
    ) -> None:
        """One ``compose`` of ``group`` (at most 32 components) into a new ``object_name``."""
        assert 1 <= len(group) <= COMPOSE_SOURCES_MAX, len(group)
        write_id = uuid.uuid4().hex
        sources = [self._bucket.blob(source) for source, _, _ in group]
        if_source = [generation for _, generation, _ in group]

        def request() -> None:
            blob = self._bucket.blob(object_name)
            blob.metadata = {**metadata, META_WRITE: write_id}
            blob.content_type = "application/octet-stream"
            blob.compose(
                sources,
                if_generation_match=0,
                if_source_generation_match=if_source,
                retry=None,
                timeout=self._timeout,
            )
            self._add(bytes_composed_server_side=sum(length for _, _, length in group))

        self._call(
            "COMPOSE",
            target,
            request,
            conflict=ChunkExists,
            recovered=lambda: self._written_by(target, object_name, write_id),
        )

    def sweep_temporaries(self, age_s_min: float = TMP_AGE_S_MAX, now_s: float | None = None) -> int:
        """Delete temporary concat objects below the prefix named more than ``age_s_min``
        seconds ago (crash debris: a live concat is much younger); returns how many.
        ``InvalidArgument`` for an age or a time that is not a finite number >= 0."""
        for label, value in (("age_s_min", age_s_min), ("now_s", 0.0 if now_s is None else now_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise InvalidArgument(
                    f"sweep_temporaries: {label} must be a finite number >= 0, got {value!r}"
                )
        now_ms = int((time.time() if now_s is None else now_s) * 1000)
        removed = 0
        for blob in self._list_objects(self._base + gcs_keys.TMP_LEAF_PREFIX, gcs_keys.TMP_LEAF_PREFIX):
            stamp = gcs_keys.tmp_leaf_time_ms(str(blob.name)[len(self._base) :])
            if stamp is None or now_ms - stamp < age_s_min * 1000:
                continue
            try:
                self._delete_object(str(blob.name), str(blob.name))
                removed += 1
            except ChunkNotFound:
                pass  # removed by another process meanwhile
        return removed

    def close(self) -> None:
        if self._owns_client:
            close = getattr(self._client, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"GcsChunkStorage({self.url!r})"


#: The names a test or tool may need without reaching into the module's privates.
__all__ = [
    "COMPOSE_SOURCES_MAX",
    "CopiedRanges",
    "GcsChunkStorage",
    "GcsStatistics",
    "WholeObject",
    "bytes_through_client",
    "compose_tree",
    "parse_url",
    "plan_compose",
]
