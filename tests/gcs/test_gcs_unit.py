"""The GCS binding without a server: object names, the compose plan and tree, URLs, the
error mapping (real SDK exception objects through ``translate``) and the missing extra."""

from __future__ import annotations

import itertools
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from slts.bindings import from_url
from slts.bindings.base import CHUNK_NAME_BYTES_MAX, ConcatSource

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNotFound,
    ChunkStorageError,
    InvalidConfig,
    StorageUnavailable,
)

pytest.importorskip(
    "google.cloud.storage", reason="google-cloud-storage is not installed (pip install 'slts[gcs]')"
)

import google.api_core.exceptions as gexc
import google.auth.exceptions
import requests.exceptions
from slts.bindings import gcs_keys
from slts.bindings.gcs import (
    COMPOSE_SOURCES_MAX,
    CopiedRanges,
    GcsChunkStorage,
    WholeObject,
    bytes_through_client,
    compose_tree,
    parse_url,
    plan_compose,
)

names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=300
).filter(lambda n: len(n.encode("utf-8")) <= CHUNK_NAME_BYTES_MAX)


# -- object names (gcs_keys invariants) ----------------------------------------------------------------


@given(names)
def test_a_leaf_is_one_short_component_that_decodes_back_to_its_name(name: str) -> None:
    leaf = gcs_keys.object_leaf(name)
    assert "/" not in leaf and 0 < len(leaf.encode("utf-8")) <= gcs_keys.LEAF_BYTES_MAX
    assert not gcs_keys.is_reserved(leaf), "a chunk's leaf never meets a temporary object's"
    if gcs_keys.is_hashed(leaf):
        assert gcs_keys.decode_hashed_leaf(leaf, gcs_keys.name_metadata(name)) == name
    else:
        assert gcs_keys.decode_plain_leaf(leaf) == name


@given(names, names)
def test_distinct_names_get_distinct_leaves(a: str, b: str) -> None:
    if a != b:
        assert gcs_keys.object_leaf(a) != gcs_keys.object_leaf(b)


@given(names, st.integers(min_value=0, max_value=300))
def test_a_name_prefix_encodes_to_a_leaf_prefix(name: str, cut: int) -> None:
    assert gcs_keys.object_leaf(name).startswith(gcs_keys.list_head(name[:cut]))


def test_leaf_examples() -> None:
    assert gcs_keys.object_leaf("0/seg/E1.O0") == "0%2Fseg%2FE1.O0"
    assert gcs_keys.object_leaf("..") == "%2E."
    assert gcs_keys.object_leaf(".tmp~1~a~0") == "%2Etmp%7E1%7Ea%7E0"
    assert gcs_keys.decode_plain_leaf(".tmp~1~a~0") is None
    assert gcs_keys.tmp_leaf_time_ms(gcs_keys.tmp_leaf(1234, "abc", 7)) == 1234
    assert gcs_keys.tmp_leaf_time_ms("a~b") is None


# -- the compose plan and tree --------------------------------------------------------------------------

ranges = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(0, 50), st.booleans()),
    min_size=1,
    max_size=40,
)


@given(ranges)
def test_the_plan_covers_the_ranges_in_order_and_composes_only_whole_objects(spec: list) -> None:
    sources, sizes = [], {}
    for number, (chunk, offset, length, whole) in enumerate(spec):
        name = f"c{chunk}-{number}"
        sizes[name] = length if whole else offset + length + 1
        sources.append(ConcatSource(name, 0 if whole else offset, length))
    pieces = plan_compose(sources, sizes)
    flat: list[ConcatSource] = []
    for piece in pieces:
        if isinstance(piece, WholeObject):
            assert piece.length == sizes[piece.name] > 0
            flat.append(ConcatSource(piece.name, 0, piece.length))
        else:
            assert piece.ranges and all(r.length > 0 for r in piece.ranges)
            flat.extend(piece.ranges)
    assert flat == [s for s in sources if s.length > 0]
    for left, right in itertools.pairwise(pieces):
        assert not (isinstance(left, CopiedRanges) and isinstance(right, CopiedRanges)), (
            "adjacent ranges merge"
        )
    copied = sum(s.length for s in sources if s.length and not (s.offset == 0 and s.length == sizes[s.name]))
    assert bytes_through_client(sources, sizes) == copied


@given(st.integers(1, 5000))
def test_the_compose_tree_never_exceeds_32_sources_and_ends_in_one_object(count: int) -> None:
    rounds = compose_tree(count)
    inputs = count
    for groups in rounds:
        assert groups[0][0] == 0 and groups[-1][1] == inputs
        assert all(1 <= end - first <= COMPOSE_SOURCES_MAX for first, end in groups)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(groups))
        inputs = len(groups)
    assert len(rounds[-1]) == 1


def test_compose_tree_examples() -> None:
    assert compose_tree(1) == [[(0, 1)]]
    assert compose_tree(32) == [[(0, 32)]]
    assert compose_tree(33) == [[(0, 32), (32, 33)], [(0, 2)]]
    assert len(compose_tree(32 * 32 + 1)) == 3


# -- URLs ----------------------------------------------------------------------------------------------


def test_parse_url_reads_bucket_prefix_and_options() -> None:
    bucket, prefix, settings = parse_url(
        "gs://my-bucket/slts/chunks?endpoint=http://127.0.0.1:9023&anonymous=1&max_attempts=3"
        "&timeout_s=7.5&project=p1&preconditions=checked"
    )
    assert (bucket, prefix) == ("my-bucket", "/slts/chunks")
    assert settings == {
        "endpoint": "http://127.0.0.1:9023",
        "anonymous": True,
        "max_attempts": 3,
        "timeout_s": 7.5,
        "project": "p1",
        "preconditions": "checked",
    }


@pytest.mark.parametrize(
    "url",
    [
        "gs://",  # no bucket
        "gs://ab/x",  # bucket too short
        "gs://Upper/x",  # not lower case
        "gs://-bucket/x",  # must start with a letter or digit
        "gs://goog-bucket/x",  # reserved
        "gs://bucket/x?unknown=1",
        "gs://bucket/x?max_attempts=0",
        "gs://bucket/x?max_attempts=many",
        "gs://bucket/x?max_attempts=2&max_attempts=3",
        "gs://bucket/x?timeout_s=",
        "gs://bucket/x?anonymous=yes",
        "gs://bucket/x?preconditions=maybe",
        "gs://bucket/x?requests_max=0",
        "gs://bucket/x?requests_max=2000",
        "gs://bucket/x?endpoint=ftp://host",
        "gs://bucket/a/../b",
        "gs://bucket/a//b",
        "gs://bucket/x#fragment",
        "s3://bucket/x",
    ],
)
def test_bad_urls_raise_invalid_config(url: str) -> None:
    with pytest.raises(InvalidConfig):
        GcsChunkStorage.from_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "gs://user:hunter2@bucket/x",
        "gs://bucket/x?access_token=hunter2",
        "gs://bucket/x?private_key=hunter2",
        "gs://bucket/x?credentials=hunter2",
    ],
)
def test_credentials_in_a_url_are_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(InvalidConfig) as caught:
        from_url(url)
    assert "hunter2" not in str(caught.value)
    assert "Application Default Credentials" in str(caught.value)


def test_no_application_default_credentials_is_invalid_config(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(InvalidConfig, match="GOOGLE_APPLICATION_CREDENTIALS"):
        from_url("gs://some-bucket/x")


# -- the missing extra -----------------------------------------------------------------------------


def test_a_missing_sdk_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "google.cloud.storage", None)  # import fails as if not installed
    monkeypatch.delitem(sys.modules, "slts.bindings.gcs", raising=False)
    with pytest.raises(InvalidConfig) as caught:
        from_url("gs://some-bucket/x")
    assert "pip install 'slts[gcs]'" in str(caught.value)


# -- the error mapping (the one choke point) -------------------------------------------------------------


@pytest.fixture
def offline() -> GcsChunkStorage:
    """A binding with anonymous credentials on an endpoint nothing listens on (no request is sent)."""
    return GcsChunkStorage("some-bucket", "p", endpoint="http://127.0.0.1:9", anonymous=True)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (gexc.NotFound("No such object: b/p/x"), ChunkNotFound),
        (gexc.NotFound("The specified bucket does not exist."), ChunkStorageError),
        (gexc.PreconditionFailed("conditionNotMet"), ChunkExists),
        (gexc.Conflict("conflicting mutation"), ChunkExists),
        (gexc.RequestRangeNotSatisfiable("bad range"), ChunkInvalidOffset),
        (gexc.TooManyRequests("slow down"), StorageUnavailable),
        (gexc.InternalServerError("oops"), StorageUnavailable),
        (gexc.BadGateway("oops"), StorageUnavailable),
        (gexc.ServiceUnavailable("oops"), StorageUnavailable),
        (gexc.GatewayTimeout("oops"), StorageUnavailable),
        (gexc.from_http_status(408, "request timeout"), StorageUnavailable),
        (gexc.Forbidden("denied"), ChunkStorageError),
        (gexc.Unauthorized("who"), ChunkStorageError),
        (gexc.BadRequest("invalid"), ChunkStorageError),
        (requests.exceptions.ConnectionError("refused"), StorageUnavailable),
        (requests.exceptions.ReadTimeout("slow"), StorageUnavailable),
        (requests.exceptions.ChunkedEncodingError("cut"), StorageUnavailable),
        (google.auth.exceptions.TransportError("dns"), StorageUnavailable),
        (google.auth.exceptions.RefreshError("expired"), ChunkStorageError),
        (ValueError("anything else"), ChunkStorageError),
    ],
)
def test_every_sdk_error_maps_to_one_typed_error(offline, error, expected) -> None:
    translated = offline.translate(error, "GET", "x")
    assert type(translated) is expected
    assert translated.context["chunk"] == "x" and translated.context["binding"] == offline.url
    assert isinstance(translated, StorageUnavailable) == bool(getattr(translated, "retryable", False))


def test_a_failed_precondition_on_a_write_is_an_invalid_offset(offline) -> None:
    translated = offline.translate(
        gexc.PreconditionFailed("conditionNotMet"), "UPLOAD", "x", ChunkInvalidOffset
    )
    assert type(translated) is ChunkInvalidOffset


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", True, None])
def test_the_sweep_refuses_a_bad_age_before_any_request(offline, bad) -> None:
    from slts.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="age_s_min"):
        offline.sweep_temporaries(bad)
    assert offline.statistics().requests == 0


def test_the_binding_repr_and_url_hold_no_credentials(offline) -> None:
    assert repr(offline) == "GcsChunkStorage('gs://some-bucket/p?endpoint=http://127.0.0.1:9&anonymous=1')"
    assert offline.preconditions == "auto"  # decided by the probe on the first conditional write
