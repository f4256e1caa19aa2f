"""The GCS binding against the real emulator (``gcp-storage-emulator``, ``tests/support/gcsserver.py``).

* conditional creates: the emulator ignores ``ifGenerationMatch`` (checked here, so a
  release that starts enforcing it shows up); the binding still sends it, its probe
  takes the checked mode there, and the checked mode refuses a create over an object
  another writer stored; a 412 (injected through the binding's request seam, as the
  emulator never answers one) maps to ``ChunkExists``, or settles by the write id;
* concat: whole objects composed on the server (no byte through this process), partial
  ranges through temporary objects, a tree beyond 32 sources, nothing left behind on
  failure, old debris swept; the engine's defrag reports the bytes;
* retries and typed errors; credentials from the environment (ADC, STORAGE_EMULATOR_HOST).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "google.cloud.storage", reason="google-cloud-storage is not installed (pip install 'slts[gcs]')"
)

import google.api_core.exceptions as gexc
from slts.bindings import ConcatSource, from_url, gcs_keys
from slts.bindings.gcs import GcsChunkStorage, GcsStatistics

from slts.config import StorageConfig
from slts.errors import ChunkExists, ChunkNotFound, ChunkStorageError, StorageUnavailable
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.gcsserver import GcsEmulator


def pattern(length: int, seed: int = 0) -> bytes:
    block = bytes((seed + i) % 251 for i in range(251))
    return (block * (length // 251 + 1))[:length]


def delta(after: GcsStatistics, before: GcsStatistics, field: str) -> int:
    return int(getattr(after, field)) - int(getattr(before, field))


class Faults:
    """The binding's request seam: raise ``error`` at the ``nth`` attempt of ``operation``."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, int, BaseException]] = []
        self.seen: dict[str, int] = {}
        self.actions: list[tuple[str, int, Any]] = []

    def fail(self, operation: str, nth: int, error: BaseException) -> None:
        self.rules.append((operation, nth, error))

    def before(self, operation: str, nth: int, action: Any) -> None:
        self.actions.append((operation, nth, action))

    def __call__(self, operation: str) -> None:
        self.seen[operation] = self.seen.get(operation, 0) + 1
        for op, nth, action in self.actions:
            if op == operation and nth == self.seen[operation]:
                action()
        for op, nth, error in self.rules:
            if op == operation and nth == self.seen[operation]:
                raise error


def binding_on(
    emulator: GcsEmulator, bucket: str, faults: Faults | None = None, **options: Any
) -> GcsChunkStorage:
    return GcsChunkStorage(
        bucket,
        "chunks",
        client=emulator.client(fresh=True),
        before_request=faults,
        sleep=lambda _s: None,
        **emulator.binding_kwargs(),
        **options,
    )


def object_names(emulator: GcsEmulator, bucket: str) -> list[str]:
    return sorted(blob.name for blob in emulator.client().list_blobs(bucket))


def raw_put(emulator: GcsEmulator, bucket: str, object_name: str, data: bytes) -> None:
    emulator.client().bucket(bucket).blob(object_name).upload_from_string(data, retry=None)


def raw_get(emulator: GcsEmulator, bucket: str, object_name: str) -> bytes:
    return bytes(emulator.client().bucket(bucket).blob(object_name).download_as_bytes(retry=None))


# -- conditional creates ---------------------------------------------------------------------------


def test_the_emulator_ignores_if_generation_match(gcs_emulator, bucket) -> None:
    """The gap the checked mode exists for: a second create with ifGenerationMatch=0 succeeds."""
    blob = gcs_emulator.client().bucket(bucket).blob("raw")
    blob.upload_from_string(b"first", if_generation_match=0, retry=None)
    blob.upload_from_string(b"second", if_generation_match=0, retry=None)  # GCS: 412
    assert raw_get(gcs_emulator, bucket, "raw") == b"second"


def test_the_probe_takes_the_checked_mode_on_the_emulator_and_leaves_nothing(gcs_emulator, bucket) -> None:
    storage = binding_on(gcs_emulator, bucket)
    assert storage.preconditions == "auto"
    storage.create("a", b"x")
    assert storage.preconditions == "checked"
    assert object_names(gcs_emulator, bucket) == [storage.object_name("a")]  # no probe object stays


def test_the_checked_mode_refuses_a_create_over_another_writers_object(gcs_emulator, bucket) -> None:
    storage = binding_on(gcs_emulator, bucket, preconditions="checked")
    raw_put(gcs_emulator, bucket, storage.object_name("taken"), b"theirs")
    with pytest.raises(ChunkExists):
        storage.create("taken", b"ours")
    with pytest.raises(ChunkExists):
        storage.concat("taken", [ConcatSource("taken", 0, 6)])
    assert raw_get(gcs_emulator, bucket, storage.object_name("taken")) == b"theirs"


def test_every_conditional_write_sends_its_precondition(gcs_emulator, bucket) -> None:
    """The real service enforces what the emulator ignores: the binding must send it."""
    client = gcs_emulator.client(fresh=True)
    sent: list[str] = []
    client._http.hooks["response"].append(lambda response, **_: sent.append(response.request.url))
    storage = GcsChunkStorage(
        bucket, "chunks", client=client, preconditions="server", **gcs_emulator.binding_kwargs()
    )
    storage.create("a", b"abc")
    storage.create("e")
    empty_generation = storage._bucket.get_blob(storage.object_name("e")).generation
    storage.write(storage.open_write("e"), 0, b"xyz")
    storage.create("b", b"def")
    storage.concat("t", [ConcatSource("a", 0, 3), ConcatSource("b", 0, 3)])
    uploads = [url for url in sent if "/upload/" in url]
    composes = [url for url in sent if url.split("?")[0].endswith("/compose")]
    assert len(uploads) == 4 and len(composes) == 1
    assert sum("ifGenerationMatch=0" in url for url in uploads) == 3  # the creates
    assert any(
        f"ifGenerationMatch={empty_generation}" in url for url in uploads
    )  # the write: the empty object's
    assert "ifGenerationMatch=0" in composes[0]


def test_a_failed_precondition_is_chunk_exists_on_create_and_invalid_offset_on_write(
    gcs_emulator, bucket
) -> None:
    faults = Faults()
    storage = binding_on(gcs_emulator, bucket, faults, preconditions="server")
    faults.fail("UPLOAD", 1, gexc.PreconditionFailed("conditionNotMet"))
    with pytest.raises(ChunkExists):
        storage.create("a", b"x")
    assert not storage.exists("a")
    storage.create("e")
    faults.fail("UPLOAD", faults.seen["UPLOAD"] + 1, gexc.PreconditionFailed("conditionNotMet"))
    from slts.errors import ChunkInvalidOffset

    with pytest.raises(ChunkInvalidOffset):
        storage.write(storage.open_write("e"), 0, b"late")
    assert storage.get_info("e").length == 0


@pytest.mark.parametrize("ours", [True, False], ids=["landed-before-its-answer-was-lost", "someone-elses"])
def test_a_create_retried_after_a_lost_answer_is_settled_by_its_write_id(gcs_emulator, bucket, ours) -> None:
    """Attempt 1 lands but its answer is lost; attempt 2 fails the precondition (GCS's 412).
    The write id in the object's metadata tells success from another writer's object."""
    client = gcs_emulator.client(fresh=True)
    faults = Faults()
    storage = GcsChunkStorage(
        bucket,
        "chunks",
        client=client,
        before_request=faults,
        sleep=lambda _s: None,
        preconditions="server",
        **gcs_emulator.binding_kwargs(),
    )
    lost = [True]

    def lose_the_answer(response: Any, **_: Any) -> None:
        if "/upload/" in response.request.url and lost[0]:
            lost[0] = False
            import requests

            raise requests.exceptions.ConnectionError("connection reset after the upload")

    client._http.hooks["response"].append(lose_the_answer)
    if not ours:
        faults.before("UPLOAD", 2, lambda: raw_put(gcs_emulator, bucket, storage.object_name("a"), b"theirs"))
    faults.fail("UPLOAD", 2, gexc.PreconditionFailed("conditionNotMet"))
    if ours:
        storage.create("a", b"ours")
        assert raw_get(gcs_emulator, bucket, storage.object_name("a")) == b"ours"
    else:
        with pytest.raises(ChunkExists):
            storage.create("a", b"ours")
        assert raw_get(gcs_emulator, bucket, storage.object_name("a")) == b"theirs"
    assert storage.statistics().retries == 1


# -- concat --------------------------------------------------------------------------------------------


def test_a_concat_of_whole_objects_is_composed_on_the_server(gcs_emulator, bucket) -> None:
    storage = binding_on(gcs_emulator, bucket)
    parts = [pattern(1000 + i, seed=i) for i in range(3)]
    for i, data in enumerate(parts):
        storage.create(f"s{i}", data)
    sources = [ConcatSource(f"s{i}", 0, len(data)) for i, data in enumerate(parts)]
    assert storage.concat_bytes_through_client(sources) == 0
    before = storage.statistics()
    info = storage.concat("t", sources)
    after = storage.statistics()
    assert info.length == sum(map(len, parts))
    assert delta(after, before, "bytes_uploaded") == delta(after, before, "bytes_downloaded") == 0
    assert delta(after, before, "compose_requests") == 1
    assert delta(after, before, "bytes_composed_server_side") == info.length
    assert storage.read(storage.open_read("t"), 0, info.length) == b"".join(parts)


def test_partial_ranges_go_through_the_client_and_their_temporaries_are_removed(gcs_emulator, bucket) -> None:
    storage = binding_on(gcs_emulator, bucket)
    a, b, c = pattern(500, 1), pattern(700, 2), pattern(300, 3)
    for name, data in (("a", a), ("b", b), ("c", c)):
        storage.create(name, data)
    sources = [
        ConcatSource("a", 0, 500),
        ConcatSource("b", 100, 200),
        ConcatSource("c", 10, 5),
        ConcatSource("a", 0, 500),
    ]
    before = storage.statistics()
    info = storage.concat("t", sources)
    after = storage.statistics()
    assert delta(after, before, "bytes_uploaded") == 205  # the two partial ranges, as one temporary
    assert delta(after, before, "compose_requests") == 1
    assert storage.read(storage.open_read("t"), 0, info.length) == a + b[100:300] + c[10:15] + a
    assert not [n for n in object_names(gcs_emulator, bucket) if ".tmp~" in n]


def test_more_than_32_sources_compose_in_a_tree_without_leaving_intermediates(gcs_emulator, bucket) -> None:
    storage = binding_on(gcs_emulator, bucket)
    sources = []
    for i in range(70):
        storage.create(f"p{i:02}", pattern(10, seed=i))
        sources.append(ConcatSource(f"p{i:02}", 0, 10))
    before = storage.statistics()
    storage.concat("t", sources)
    after = storage.statistics()
    assert delta(after, before, "compose_requests") == 4  # 32 + 32 + 6, then the three into the target
    assert delta(after, before, "bytes_uploaded") == 0
    assert storage.read(storage.open_read("t"), 0, 700) == b"".join(pattern(10, seed=i) for i in range(70))
    assert not [n for n in object_names(gcs_emulator, bucket) if ".tmp~" in n]


def test_a_failed_concat_leaves_no_target_and_no_temporary(gcs_emulator, bucket) -> None:
    faults = Faults()
    storage = binding_on(gcs_emulator, bucket, faults)
    sources = []
    for i in range(40):
        storage.create(f"p{i:02}", b"x" * 5)
        sources.append(ConcatSource(f"p{i:02}", 1 if i == 0 else 0, 4 if i == 0 else 5))
    faults.fail("COMPOSE", 3, gexc.Forbidden("denied"))  # the last compose, into the target
    with pytest.raises(ChunkStorageError):
        storage.concat("t", sources)
    assert not storage.exists("t")
    assert not [n for n in object_names(gcs_emulator, bucket) if ".tmp~" in n]


def test_the_sweep_removes_old_temporaries_only_and_lists_never_show_them(gcs_emulator, bucket) -> None:
    storage = binding_on(gcs_emulator, bucket)
    now_ms = int(time.time() * 1000)
    old = "chunks/" + gcs_keys.tmp_leaf(now_ms - 2 * 3600 * 1000, "dead", 0)
    young = "chunks/" + gcs_keys.tmp_leaf(now_ms, "live", 0)
    for name in (old, young):
        raw_put(gcs_emulator, bucket, name, b"debris")
    storage.create("c", b"chunk")
    assert list(storage.list()) == ["c"]
    assert storage.sweep_temporaries() == 1
    assert object_names(gcs_emulator, bucket) == sorted([young, storage.object_name("c")])


def test_defrag_reports_bytes_composed_and_bytes_through_the_client(gcs_emulator, bucket, tmp_path) -> None:
    storage = binding_on(gcs_emulator, bucket)
    store = LmdbMetadataStore(str(tmp_path / "md"), TABLES)
    config = StorageConfig(gc_interval_s=0.0, metadata_log_flush_interval_s=0.0, concat_merge_seam=False)
    with ChunkedSegmentStorage(0, 1, storage, store, config, owns_resources=True) as engine:
        engine.create("seg")
        expected = b""
        for index in range(3):
            part, data = f"seg.part{index}", pattern(4096, seed=index)
            engine.create(part)
            engine.write(engine.open_write(part), 0, data)
            engine.seal(engine.open_write(part))
            engine.concat(engine.open_write("seg"), len(expected), part)
            expected += data
        engine.seal(engine.open_write("seg"))
        before = storage.statistics()
        result = engine.defrag("seg")
        after = storage.statistics()
        assert (result.chunks_before, result.chunks_after) == (3, 1)
        assert (result.bytes_native, result.bytes_copied) == (3 * 4096, 0)
        assert delta(after, before, "bytes_uploaded") == 0
        assert engine.read(engine.open_read("seg"), 0, len(expected)) == expected


# -- retries and errors ------------------------------------------------------------------------------


def test_transient_errors_are_retried_then_storage_unavailable(gcs_emulator, bucket) -> None:
    faults = Faults()
    sleeps: list[float] = []
    storage = GcsChunkStorage(
        bucket,
        "chunks",
        client=gcs_emulator.client(fresh=True),
        before_request=faults,
        sleep=sleeps.append,
        max_attempts=3,
        **gcs_emulator.binding_kwargs(),
    )
    storage.create("a", b"data")
    faults.fail("GET", 1, gexc.ServiceUnavailable("busy"))
    faults.fail("GET", 2, gexc.TooManyRequests("slow down"))
    assert storage.read(storage.open_read("a"), 0, 4) == b"data"
    assert storage.statistics().retries == 2 and len(sleeps) == 2
    for nth in (4, 5, 6):
        faults.fail("GET", nth, gexc.InternalServerError("down"))
    with pytest.raises(StorageUnavailable, match="gave up after 3 attempts") as caught:
        storage.read(storage.open_read("a"), 0, 4)
    assert caught.value.retryable and isinstance(caught.value.__cause__, gexc.InternalServerError)


def test_not_found_and_a_dead_endpoint_are_typed(gcs_emulator, bucket) -> None:
    storage = binding_on(gcs_emulator, bucket)
    with pytest.raises(ChunkNotFound):
        storage.get_info("missing")
    from slts.bindings import ChunkHandle

    with pytest.raises(ChunkNotFound):
        storage.read(ChunkHandle("missing", readonly=True), 0, 10)
    with pytest.raises(ChunkNotFound):
        storage.delete(ChunkHandle("missing", readonly=False))
    dead = GcsChunkStorage(
        bucket, "x", endpoint="http://127.0.0.1:9", anonymous=True, max_attempts=2, sleep=lambda _s: None
    )
    with pytest.raises(StorageUnavailable):
        dead.exists("a")


# -- credentials from the environment --------------------------------------------------------------------


def _service_account_file(path: Path) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    email = "slts-test@adc-project.iam.gserviceaccount.com"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "adc-project",
                "private_key_id": "0" * 40,
                "private_key": pem,
                "client_email": email,
                "client_id": "1",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    return email


def test_application_default_credentials_come_from_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    email = _service_account_file(tmp_path / "sa.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "sa.json"))
    storage = from_url("gs://some-bucket/chunks")
    assert isinstance(storage, GcsChunkStorage)
    assert storage._client._credentials.service_account_email == email  # ADC's, not anonymous
    assert storage._client.project == "adc-project"
    assert storage.endpoint == "https://storage.googleapis.com"
    assert storage.preconditions == "server"  # Google enforces ifGenerationMatch: no probe
    assert "BEGIN PRIVATE KEY" not in repr(storage) + storage.url


def test_storage_emulator_host_points_a_plain_url_at_the_emulator(gcs_emulator, bucket, monkeypatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    storage = from_url(f"gs://{bucket}/env")
    handle = storage.create("a", b"via the environment")
    assert storage.read(handle, 0, 100) == b"via the environment"
    assert raw_get(gcs_emulator, bucket, "env/a") == b"via the environment"


@pytest.mark.timeout(120)
def test_an_emulator_killed_inside_a_compose_tree_leaves_only_sweepable_debris(tmp_path: Path) -> None:
    """The emulator is SIGKILLed between the composes of a tree (temporaries and an
    intermediate exist, the target does not) and restarted: no target, the debris is
    under reserved names no listing shows, the sweep removes it, and the concat retried
    succeeds."""
    emulator = GcsEmulator(tmp_path / "own")  # its own: it gets killed
    emulator.start()
    try:
        bucket = emulator.new_bucket("killed")
        faults = Faults()
        storage = binding_on(emulator, bucket, faults, max_attempts=1)
        sources = []
        for i in range(40):
            storage.create(f"p{i:02}", pattern(8, seed=i))
            sources.append(ConcatSource(f"p{i:02}", 1 if i % 10 == 0 else 0, 7 if i % 10 == 0 else 8))
        faults.before("COMPOSE", 2, emulator.kill)  # after the first intermediate compose
        with pytest.raises(StorageUnavailable):
            storage.concat("t", sources)
        emulator.restart()
        after = binding_on(emulator, bucket)
        assert not after.exists("t")
        debris = [n for n in object_names(emulator, bucket) if ".tmp~" in n]
        assert len(debris) >= 2  # copied ranges and the first intermediate
        assert sorted(after.list()) == [f"p{i:02}" for i in range(40)]  # no listing shows them
        assert after.sweep_temporaries() == 0  # younger than the age guard: maybe a live concat
        assert after.sweep_temporaries(age_s_min=0.0) == len(debris)
        assert not [n for n in object_names(emulator, bucket) if ".tmp~" in n]
        info = after.concat("t", sources)
        expected = b"".join(pattern(8, seed=int(s.name[1:]))[s.offset :] for s in sources)
        assert after.read(after.open_read("t"), 0, info.length) == expected
    finally:
        emulator.stop()
