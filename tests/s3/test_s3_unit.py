"""The S3 binding without a server: key mapping, concat planning, URL parsing, and the
error choke point (retries, translation, ambiguous conditional writes) against a fake
client that implements the binding's narrow ``S3Client`` protocol in memory.

The behaviour against a real server is in ``test_s3_specific.py`` and the conformance suite.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'slts[s3]')")

import botocore.exceptions
from slts.bindings import ChunkHandle, ConcatSource, from_url
from slts.bindings.base import CHUNK_NAME_BYTES_MAX
from slts.bindings.s3 import (
    LEAF_BYTES_MAX,
    META_WRITE,
    PART_BYTES_MIN,
    RETRY_DELAY_S_BASE,
    CopyPart,
    S3ChunkStorage,
    UploadPart,
    bytes_through_client,
    object_leaf,
    plan_parts,
)

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNotFound,
    ChunkStorageError,
    InvalidConfig,
    SltsError,
    StorageUnavailable,
)

MiB = 1 << 20


# -- key mapping (invariants 1 and 2 of bindings/s3.py) ------------------------------------------

NAMES = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=300
)


@settings(max_examples=300)
@given(name=NAMES)
def test_a_leaf_is_one_short_path_component(name: str) -> None:
    if len(name.encode()) > CHUNK_NAME_BYTES_MAX:
        return
    leaf = object_leaf(name)
    assert 0 < len(leaf.encode()) <= LEAF_BYTES_MAX
    assert "/" not in leaf and "\\" not in leaf and leaf not in (".", "..") and not leaf.startswith(".")


@settings(max_examples=300)
@given(a=NAMES, b=NAMES)
def test_distinct_names_get_distinct_leaves(a: str, b: str) -> None:
    if a != b:
        assert object_leaf(a) != object_leaf(b)


@settings(max_examples=300)
@given(name=NAMES, cut=st.integers(min_value=0, max_value=300))
def test_a_name_prefix_encodes_to_a_key_prefix(name: str, cut: int) -> None:
    from slts.bindings.s3 import _list_head

    prefix = name[:cut]
    assert object_leaf(name).startswith(_list_head(prefix))


def test_leaf_examples() -> None:
    assert object_leaf("0/seg/E1.O0.ab") == "0%2Fseg%2FE1.O0.ab"
    assert object_leaf("..") == "%2E."
    assert object_leaf("a~b%c\\d") == "a%7Eb%25c%5Cd"
    assert object_leaf("ünï cödé") == "ünï cödé"
    long = object_leaf("x" * 1024)
    assert long == "x" * 190 + "~" + hashlib.sha256(b"x" * 1024).hexdigest()


# -- concat planning (invariant 3) ----------------------------------------------------------------

LENGTHS = st.lists(
    st.one_of(st.integers(0, 3 * MiB), st.integers(5 * MiB - 2, 5 * MiB + 2), st.integers(5 * MiB, 23 * MiB)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=500)
@given(lengths=LENGTHS)
def test_planned_parts_are_valid_and_cover_the_ranges_in_order(lengths: list[int]) -> None:
    sources = [ConcatSource(f"s{i}", 7, length) for i, length in enumerate(lengths)]
    parts = plan_parts(sources)
    for part in parts[:-1]:
        assert part.length >= PART_BYTES_MIN
    pieces = []
    for part in parts:
        pieces.extend(
            [(part.source, part.offset, part.length)]
            if isinstance(part, CopyPart)
            else [(p.name, p.offset, p.length) for p in part.pieces]
        )
    merged: list[list[Any]] = []
    for name, offset, length in pieces:  # adjacent pieces of one source join up again
        if merged and merged[-1][0] == name and merged[-1][1] + merged[-1][2] == offset:
            merged[-1][2] += length
        else:
            merged.append([name, offset, length])
    assert merged == [[s.name, s.offset, s.length] for s in sources if s.length]
    through = bytes_through_client(sources)
    assert 0 <= through <= sum(lengths)
    if all(length >= PART_BYTES_MIN for length in lengths):
        assert through == 0  # every range is a server-side copy


def test_plan_examples() -> None:
    five = 5 * MiB
    assert plan_parts([ConcatSource("a", 0, five)] * 3) == [CopyPart("a", 0, five)] * 3
    # Small ranges gather into one upload part; a big range after them lends what they lack.
    small = [ConcatSource("s", 0, MiB)] * 2
    parts = plan_parts([*small, ConcatSource("b", 0, 12 * MiB)])
    assert parts == [UploadPart((*small, ConcatSource("b", 0, 3 * MiB))), CopyPart("b", 3 * MiB, 9 * MiB)]
    # ... or joins it whole when what would stay is too small for a part.
    parts = plan_parts([*small, ConcatSource("b", 0, 6 * MiB), ConcatSource("c", 0, five)])
    assert parts == [UploadPart((*small, ConcatSource("b", 0, 6 * MiB))), CopyPart("c", 0, five)]
    assert bytes_through_client([ConcatSource("x", 0, 10)]) == 10  # one PutObject
    assert bytes_through_client([ConcatSource("x", 0, five), ConcatSource("y", 0, 10)]) == 10


# -- URLs ---------------------------------------------------------------------------------------


def test_from_url_reads_bucket_prefix_and_options() -> None:
    url = "s3://my-bucket/some/prefix/?endpoint_url=http://127.0.0.1:9&region=eu-west-1&max_attempts=3"
    storage = from_url(url)
    assert isinstance(storage, S3ChunkStorage)
    assert (storage.bucket, storage.prefix, storage.url) == ("my-bucket", "some/prefix", url)
    assert storage.object_key("a/b") == "some/prefix/a%2Fb"
    assert storage.supports_concat and not storage.supports_append
    assert not storage.supports_truncate and not storage.supports_readonly
    bare = S3ChunkStorage.from_url("s3://bucket-1")
    assert (bare.prefix, bare.object_key("x")) == ("", "x")


@pytest.mark.parametrize(
    "url",
    [
        "s3://",
        "s3:///prefix",
        "s3://Bad_Bucket/p",
        "s3://ab/p",
        "s3://bucket-1/p?nope=1",
        "s3://bucket-1/p?region=a&region=b",
        "s3://bucket-1/p?region=",
        "s3://bucket-1/p?max_attempts=0",
        "s3://bucket-1/p?max_attempts=lots",
        "s3://bucket-1/p?read_timeout_s=-1",
        "s3://bucket-1/p?endpoint_url=ftp://host",
        "s3://bucket-1/p?addressing_style=sideways",
        "s3://bucket-1/a/../b",
        "s3://bucket-1/a//b",
        "s3://bucket-1/p#frag",
        "s3://bucket-1/" + "x" * 600,
        "s3://bucket-1/p?profile=no-such-profile-slts-test",
    ],
)
def test_bad_urls_raise_invalid_config(url: str) -> None:
    with pytest.raises(InvalidConfig):
        from_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAEXAMPLE:topsecretvalue@bucket-1/p",
        "s3://bucket-1/p?aws_secret_access_key=topsecretvalue",
        "s3://bucket-1/p?aws_access_key_id=AKIAEXAMPLE&secret=topsecretvalue",
        "s3://bucket-1/p?session_token=topsecretvalue",
    ],
)
def test_credentials_in_a_url_are_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        from_url(url)
    assert "topsecretvalue" not in str(caught.value) and "topsecretvalue" not in repr(caught.value)


# -- the choke point, against a fake client --------------------------------------------------------


def client_error(code: str, status: int, operation: str = "PutObject") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": f"fake {code}"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self) -> bytes:
        return self._data


class FakeS3:
    """Objects in a dict, S3's conditional semantics, and a queue of failures per call."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.failures: dict[str, list[Callable[[], Exception] | tuple[str, Callable[[], Exception]]]] = {}
        self.calls: list[str] = []

    def fail(self, method: str, *errors: Callable[[], Exception], after_applying: bool = False) -> None:
        """The next calls of ``method`` raise ``errors`` in turn (after doing the work if asked)."""
        self.failures.setdefault(method, []).extend(("applied", e) if after_applying else e for e in errors)

    def _enter(self, method: str) -> Callable[[], Exception] | None:
        self.calls.append(method)
        queue = self.failures.get(method)
        if not queue:
            return None
        failure = queue.pop(0)
        if isinstance(failure, tuple):
            return failure[1]  # raise after the work
        raise failure()

    @staticmethod
    def _etag(data: bytes) -> str:
        return f'"{hashlib.md5(data).hexdigest()}"'

    def put_object(
        self,
        *,
        Bucket: str,
        Key: str,
        Body: bytes,
        Metadata: Mapping[str, str] | None = None,
        IfNoneMatch: str | None = None,
        IfMatch: str | None = None,
    ) -> Mapping[str, Any]:
        after = self._enter("put_object")
        if IfNoneMatch == "*" and Key in self.objects:
            raise client_error("PreconditionFailed", 412)
        if IfMatch is not None and (Key not in self.objects or self._etag(self.objects[Key][0]) != IfMatch):
            raise client_error("PreconditionFailed", 412)
        self.objects[Key] = (bytes(Body), dict(Metadata or {}))
        if after is not None:
            raise after()
        return {"ETag": self._etag(Body)}

    def head_object(self, *, Bucket: str, Key: str) -> Mapping[str, Any]:
        self._enter("head_object")
        if Key not in self.objects:
            raise client_error("404", 404, "HeadObject")
        data, metadata = self.objects[Key]
        return {"ContentLength": len(data), "ETag": self._etag(data), "Metadata": metadata}

    def get_object(self, *, Bucket: str, Key: str, Range: str) -> Mapping[str, Any]:
        self._enter("get_object")
        if Key not in self.objects:
            raise client_error("NoSuchKey", 404, "GetObject")
        data = self.objects[Key][0]
        first, last = (int(x) for x in Range.removeprefix("bytes=").split("-"))
        if first >= len(data):
            raise client_error("InvalidRange", 416, "GetObject")
        last = min(last, len(data) - 1)
        return {"Body": _Body(data[first : last + 1]), "ContentRange": f"bytes {first}-{last}/{len(data)}"}

    def delete_object(self, *, Bucket: str, Key: str) -> Mapping[str, Any]:
        self._enter("delete_object")
        self.objects.pop(Key, None)
        return {}

    #: Keys per ``ListObjectsV2`` page (S3's is 1000).
    page_keys = 1000

    def list_objects_v2(self, **kwargs: Any) -> Mapping[str, Any]:
        self._enter("list_objects_v2")
        keys = sorted(k for k in self.objects if k.startswith(kwargs.get("Prefix", "")))
        start = int(kwargs.get("ContinuationToken", "0"))
        page = keys[start : start + self.page_keys]
        more = start + self.page_keys < len(keys)
        return {
            "Contents": [{"Key": k} for k in page],
            "IsTruncated": more,
            **({"NextContinuationToken": str(start + self.page_keys)} if more else {}),
        }

    def __getattr__(self, name: str) -> Any:  # the multipart calls: not used by these tests
        raise AttributeError(name)


@pytest.fixture
def fake() -> FakeS3:
    return FakeS3()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def storage(fake: FakeS3, sleeps: list[float]) -> S3ChunkStorage:
    return S3ChunkStorage("bucket-1", "p", client=fake, sleep=sleeps.append, max_attempts=4)


def connection_closed() -> Exception:
    return botocore.exceptions.ConnectionClosedError(endpoint_url="http://127.0.0.1:1")


@pytest.mark.parametrize(
    "error",
    [
        lambda: client_error("SlowDown", 503),
        lambda: client_error("ServiceUnavailable", 503),
        lambda: client_error("InternalError", 500),
        lambda: client_error("Throttling", 400),
        lambda: client_error("TooManyRequests", 429),
        connection_closed,
        lambda: botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        lambda: botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    ],
)
def test_throttling_and_transient_errors_are_retried_with_growing_delays(
    fake, storage, sleeps, error
) -> None:
    fake.fail("put_object", error, error)
    storage.create("c", b"data")
    assert fake.objects["p/c"][0] == b"data"
    assert fake.calls == ["put_object"] * 3
    # base * 2**(attempt-1), times a jitter in [0.5, 1)
    assert (
        len(sleeps) == 2
        and RETRY_DELAY_S_BASE / 2 <= sleeps[0] < RETRY_DELAY_S_BASE <= sleeps[1] < 2 * RETRY_DELAY_S_BASE
    )
    stats = storage.statistics()
    assert (stats.put_requests, stats.retries) == (3, 2)


def test_retries_are_bounded_then_storage_unavailable(fake, storage, sleeps) -> None:
    fake.fail("get_object", *[lambda: client_error("SlowDown", 503)] * 10)
    fake.objects["p/c"] = (b"data", {})
    with pytest.raises(StorageUnavailable) as caught:
        storage.read(ChunkHandle("c", readonly=True), 0, 4)
    assert caught.value.retryable and caught.value.chunk == "c"
    assert "4 attempts" in str(caught.value)
    assert fake.calls.count("get_object") == 4 and len(sleeps) == 3
    assert isinstance(caught.value.__cause__, botocore.exceptions.ClientError)  # the cause is kept


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (lambda: client_error("AccessDenied", 403), ChunkStorageError),
        (lambda: client_error("NoSuchBucket", 404), ChunkStorageError),
        (lambda: client_error("InvalidArgument", 400), ChunkStorageError),
        (lambda: botocore.exceptions.NoCredentialsError(), ChunkStorageError),
    ],
)
def test_other_errors_are_not_retried_and_are_typed(fake, storage, sleeps, error, expected) -> None:
    fake.fail("put_object", error)
    with pytest.raises(expected) as caught:
        storage.create("c", b"x")
    assert not isinstance(caught.value, (StorageUnavailable, ChunkNotFound, ChunkExists))
    assert not caught.value.retryable and sleeps == [] and fake.calls == ["put_object"]


def test_a_create_retried_after_it_was_applied_succeeds(fake, storage) -> None:
    # The first attempt stores the object but its answer is lost: the retry gets 412, and
    # the object's write id shows it is this create's own.
    fake.fail("put_object", connection_closed, after_applying=True)
    storage.create("c", b"mine")
    assert fake.objects["p/c"][0] == b"mine"
    assert fake.calls == ["put_object", "put_object", "head_object"]


def test_a_create_retried_that_finds_another_writers_object_raises_exists(fake, storage) -> None:
    def someone_else_wins() -> Exception:
        fake.objects["p/c"] = (b"theirs", {META_WRITE: "another-writer"})
        return connection_closed()

    fake.fail("put_object", someone_else_wins)
    with pytest.raises(ChunkExists):
        storage.create("c", b"mine")
    assert fake.objects["p/c"][0] == b"theirs"


def test_a_write_retried_after_it_was_applied_succeeds(fake, storage) -> None:
    handle = storage.create("c")
    fake.fail("put_object", connection_closed, after_applying=True)
    assert storage.write(handle, 0, b"data") == 4
    assert fake.objects["p/c"][0] == b"data"
    with pytest.raises(ChunkInvalidOffset):
        storage.write(handle, 0, b"more")


def test_a_short_body_is_retried(fake, storage) -> None:
    fake.objects["p/c"] = (b"0123456789", {})
    real = fake.get_object
    answers = iter([{"Body": _Body(b"012"), "ContentRange": "bytes 0-9/10"}])

    def flaky(**kwargs: Any) -> Mapping[str, Any]:
        return next(answers, None) or real(**kwargs)

    fake.get_object = flaky  # type: ignore[method-assign]
    assert storage.read(ChunkHandle("c", readonly=True), 0, 100) == b"0123456789"
    assert storage.statistics().get_requests == 2


def test_list_reads_every_page_and_skips_foreign_keys(fake, storage) -> None:
    fake.page_keys = 3
    names = [f"n{i:02}" for i in range(10)] + ["a/b", ".dot", "é" * 200]
    for name in names:
        storage.create(name)
    fake.objects["p/sub/folder"] = (b"", {})  # not a leaf of this binding
    fake.objects["p/%2f"] = (b"", {})  # lower-case escape: no name encodes to it
    fake.objects["p/x~" + "0" * 64] = (b"", {})  # a hashed leaf without its name
    fake.objects["other/n00"] = (b"", {})  # outside the prefix
    before = storage.statistics().list_requests
    assert list(storage.list()) == sorted(names)
    assert storage.statistics().list_requests - before == 6  # 16 keys below p/, 3 a page
    assert list(storage.list("n0")) == [f"n0{i}" for i in range(10)]


METHODS: dict[str, Callable[[S3ChunkStorage], object]] = {
    "exists": lambda s: s.exists("c"),
    "create": lambda s: s.create("c", b"x"),
    "get_info": lambda s: s.get_info("c"),
    "open_read": lambda s: s.open_read("c"),
    "read": lambda s: s.read(ChunkHandle("c", readonly=True), 0, 1),
    "write": lambda s: s.write(ChunkHandle("c", readonly=False), 0, b"x"),
    "delete": lambda s: s.delete(ChunkHandle("c", readonly=False)),
    "list": lambda s: list(s.list("")),
}


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize(
    "error",
    [
        lambda: client_error("SlowDown", 503),
        lambda: client_error("Weird", 400),
        connection_closed,
        lambda: botocore.exceptions.NoCredentialsError(),
    ],
)
def test_no_botocore_exception_leaves_the_binding(fake, storage, method, error) -> None:
    for name in ("put_object", "head_object", "get_object", "delete_object", "list_objects_v2"):
        fake.fail(name, *[error] * 10)
    with pytest.raises(SltsError) as caught:
        METHODS[method](storage)
    assert isinstance(caught.value, ChunkStorageError)
    assert not isinstance(caught.value, botocore.exceptions.BotoCoreError | botocore.exceptions.ClientError)
