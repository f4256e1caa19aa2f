"""The S3 binding against a real S3 server (SeaweedFS, ``tests/support/s3server.py``).

* server-side concat: defrag of >= 5 MiB chunks moves no chunk byte through this process
  (the binding's byte counters prove it); small and mixed chunks go through it, exactly
  as much as ``plan_parts`` says;
* a fault test: the server is SIGKILLed while a writer runs and restarted on the same
  data and ports: typed errors meanwhile, nothing acknowledged lost, writes continue;
* credentials appear in no repr, message or log record;
* the server's conditional writes, which exclusivity rests on, are checked directly;
* ``slts.open`` and the CLI with an ``s3://`` URL.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'slts[s3]')")

import botocore.exceptions
from slts.bindings import ChunkHandle, ConcatSource, from_url
from slts.bindings.s3 import PART_BYTES_MIN, S3ChunkStorage, S3Statistics, bytes_through_client
from slts.tools import cli, command_line

import slts
from slts.config import StorageConfig
from slts.errors import ChunkExists, ChunkNotFound, ChunkStorageError, InvalidConfig, StorageUnavailable
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.s3 import run_quick_bench
from tests.support.s3server import SeaweedServer, SeaweedUnavailable, find_weed

FIVE_MIB = PART_BYTES_MIN
SMALL = 64 << 10


def pattern(length: int, seed: int = 0) -> bytes:
    block = bytes((seed + i) % 251 for i in range(251))
    return (block * (length // 251 + 1))[:length]


def binding_on(server: SeaweedServer, **options: object) -> S3ChunkStorage:
    return S3ChunkStorage(server.new_bucket("specific"), "chunks", **server.binding_kwargs(), **options)


def engine(binding: S3ChunkStorage, folder: Path, **config: object) -> ChunkedSegmentStorage:
    store = LmdbMetadataStore(str(folder), TABLES)
    # No background threads: a metadata-log flush to the bucket would count in the
    # statistics these tests compare (it did, on a loaded machine).
    defaults = {"gc_interval_s": 0.0, "metadata_log_flush_interval_s": 0.0}
    settings = StorageConfig(**{**defaults, **config})  # type: ignore[arg-type]
    return ChunkedSegmentStorage(0, None, binding, store, settings, owns_resources=True)


def segment_of_chunks(storage: ChunkedSegmentStorage, name: str, sizes: list[int]) -> bytes:
    """A sealed segment whose chunks have exactly ``sizes`` (sealed segments concatenated
    without merging at the seams); returns its bytes."""
    storage.create(name)
    expected = b""
    for index, size in enumerate(sizes):
        part = f"{name}.part{index}"
        data = pattern(size, seed=index)
        storage.create(part)
        handle = storage.open_write(part)
        storage.write(handle, 0, data)
        storage.seal(handle)
        storage.concat(storage.open_write(name), len(expected), part)
        expected += data
    storage.seal(storage.open_write(name))
    assert [chunk.length for _, chunk in storage.chunks(name)] == sizes
    return expected


def everything(storage: ChunkedSegmentStorage, name: str) -> bytes:
    info = storage.info(name)
    return storage.read(storage.open_read(name), info.start_offset, info.length - info.start_offset)


def delta(after: S3Statistics, before: S3Statistics, field: str) -> int:
    return getattr(after, field) - getattr(before, field)


# -- (a) server-side concat ---------------------------------------------------------------------


def test_defrag_of_large_chunks_moves_no_chunk_byte_through_the_client(s3_server, tmp_path) -> None:
    binding = binding_on(s3_server)
    with engine(binding, tmp_path / "md", concat_merge_seam=False) as storage:
        expected = segment_of_chunks(storage, "seg", [FIVE_MIB] * 3)
        before = binding.statistics()
        result = storage.defrag("seg")
        after = binding.statistics()
        assert (result.chunks_before, result.chunks_after, result.runs_committed) == (3, 1, 1)
        assert delta(after, before, "bytes_uploaded") == 0
        assert delta(after, before, "bytes_downloaded") == 0
        assert delta(after, before, "copy_part_requests") == 3
        assert delta(after, before, "bytes_copied_server_side") == 3 * FIVE_MIB
        assert (result.bytes_native, result.bytes_copied) == (3 * FIVE_MIB, 0)
        assert everything(storage, "seg") == expected


@pytest.mark.parametrize(
    "sizes",
    [[SMALL] * 3, [FIVE_MIB, SMALL, FIVE_MIB], [SMALL, FIVE_MIB + SMALL, FIVE_MIB]],
    ids=["small", "large-small-large", "small-large-large"],
)
def test_defrag_of_small_chunks_sends_exactly_the_planned_bytes_through_the_client(
    s3_server, tmp_path, sizes
) -> None:
    binding = binding_on(s3_server)
    with engine(binding, tmp_path / "md", concat_merge_seam=False) as storage:
        expected = segment_of_chunks(storage, "seg", sizes)
        sources = [ConcatSource(chunk.name, 0, chunk.length) for _, chunk in storage.chunks("seg")]
        through = binding.concat_bytes_through_client(sources)
        assert through == bytes_through_client(sources) > 0
        before = binding.statistics()
        result = storage.defrag("seg")
        after = binding.statistics()
        assert result.chunks_after == 1
        assert delta(after, before, "bytes_uploaded") == through
        assert delta(after, before, "bytes_downloaded") == through
        assert delta(after, before, "bytes_copied_server_side") == sum(sizes) - through
        assert everything(storage, "seg") == expected


def test_defrag_result_tells_bytes_sent_through_the_client(s3_server, tmp_path) -> None:
    binding = binding_on(s3_server)
    with engine(binding, tmp_path / "md", concat_merge_seam=False) as storage:
        segment_of_chunks(storage, "seg", [SMALL] * 3)
        result = storage.defrag("seg")
        assert (result.bytes_native, result.bytes_copied) == (0, 3 * SMALL)


def test_a_failed_concat_aborts_its_upload_and_leaves_no_target(s3_server) -> None:
    binding = binding_on(s3_server)
    binding.create("big", pattern(FIVE_MIB))
    binding.create("gone", pattern(FIVE_MIB, seed=1))
    sources = [ConcatSource("big", 0, FIVE_MIB), ConcatSource("gone", 0, FIVE_MIB)]
    real_head = binding._head
    # The second source disappears after the checks, before its part is copied.
    checked: list[str] = []

    def head_then_delete(name: str):
        response = real_head(name)
        checked.append(name)
        if name == "gone":
            binding._client.delete_object(Bucket=binding.bucket, Key=binding.object_key("gone"))
        return response

    binding._head = head_then_delete  # type: ignore[method-assign]
    with pytest.raises(ChunkNotFound):
        binding.concat("target", sources)
    binding._head = real_head  # type: ignore[method-assign]
    assert "gone" in checked
    assert not binding.exists("target")
    uploads = s3_server.client().list_multipart_uploads(Bucket=binding.bucket).get("Uploads", [])
    assert uploads == []  # aborted


def test_list_reads_every_page_of_a_large_listing(s3_server) -> None:
    from concurrent.futures import ThreadPoolExecutor

    binding = binding_on(s3_server)
    client = s3_server.client()
    names = [f"0/seg/E1.O{i}" for i in range(1005)]  # one more page than S3's 1000 keys
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda name: client.put_object(Bucket=binding.bucket, Key=binding.object_key(name), Body=b""),
                names,
            )
        )
    before = binding.statistics().list_requests
    assert list(binding.list("0/")) == sorted(names)
    assert binding.statistics().list_requests - before == 2


# -- the server's conditional writes (exclusivity rests on them) -----------------------------------


def test_the_server_honours_conditional_writes(s3_server) -> None:
    client = s3_server.client()
    bucket = s3_server.new_bucket("conditional")

    def status(call) -> int:
        try:
            call()
        except botocore.exceptions.ClientError as exc:
            return exc.response["ResponseMetadata"]["HTTPStatusCode"]
        return 200

    assert status(lambda: client.put_object(Bucket=bucket, Key="k", Body=b"1", IfNoneMatch="*")) == 200
    assert status(lambda: client.put_object(Bucket=bucket, Key="k", Body=b"2", IfNoneMatch="*")) == 412
    assert status(lambda: client.put_object(Bucket=bucket, Key="k", Body=b"3", IfMatch='"0000"')) == 412
    upload = client.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    part = client.upload_part(Bucket=bucket, Key="k", UploadId=upload, PartNumber=1, Body=b"4")
    complete = lambda: client.complete_multipart_upload(
        Bucket=bucket,
        Key="k",
        UploadId=upload,
        IfNoneMatch="*",
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    assert status(complete) == 412
    client.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=upload)
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"1"


def test_create_on_a_missing_bucket_is_a_storage_error_not_a_new_bucket(s3_server) -> None:
    binding = S3ChunkStorage("no-such-bucket-slts", "p", **s3_server.binding_kwargs())
    with pytest.raises(ChunkStorageError) as caught:
        binding.create("c", b"x")
    assert not caught.value.retryable and not isinstance(caught.value, ChunkExists)
    assert "does not exist" in str(caught.value)


# -- (b) the server dies mid-write ------------------------------------------------------------------


@pytest.mark.timeout(300)  # starts, kills and restarts its own SeaweedFS server (12 s measured)
def test_a_server_killed_mid_write_loses_no_acknowledged_data(tmp_path) -> None:
    try:
        find_weed()
    except SeaweedUnavailable as exc:
        pytest.skip(str(exc))
    server = SeaweedServer(tmp_path / "weed")
    server.start()
    try:
        binding = binding_on(server, max_attempts=6, connect_timeout_s=2.0, read_timeout_s=20.0)
        storage = engine(binding, tmp_path / "md")
        storage.create("seg")
        handle = storage.open_write("seg")
        acknowledged = bytearray()
        running = threading.Event()
        outcome: dict[str, BaseException | None] = {}

        def writer() -> None:
            try:
                for index in range(100_000):  # bounded; ends at the first error
                    piece = pattern(SMALL, seed=index)
                    storage.write(handle, len(acknowledged), piece)
                    acknowledged.extend(piece)
                    if index == 20:
                        running.set()
                outcome["error"] = None
            except BaseException as exc:
                outcome["error"] = exc
            finally:
                running.set()

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        assert running.wait(120)
        server.kill()  # SIGKILL while the writer writes
        thread.join(300)
        assert not thread.is_alive()
        error = outcome["error"]
        assert isinstance(error, ChunkStorageError), repr(error)  # typed: StorageUnavailable or kin
        assert isinstance(error, StorageUnavailable) and error.retryable, repr(error)
        assert len(acknowledged) >= 21 * SMALL
        with pytest.raises(StorageUnavailable):  # while it is down, reads fail typed too
            storage.read(storage.open_read("seg"), 0, 10)

        server.restart()  # same data folder, same ports
        assert storage.info("seg").length == len(acknowledged)
        assert everything(storage, "seg") == acknowledged  # nothing acknowledged is lost
        storage.write(handle, len(acknowledged), b"after the restart")  # writes continue
        acknowledged.extend(b"after the restart")
        assert everything(storage, "seg") == acknowledged
        storage.close()

        reopened = engine(binding_on_bucket(server, binding.bucket), tmp_path / "md")
        assert everything(reopened, "seg") == acknowledged
        reopened.close()
    finally:
        server.stop()
    assert not server.running()


def binding_on_bucket(server: SeaweedServer, bucket: str) -> S3ChunkStorage:
    return S3ChunkStorage(bucket, "chunks", **server.binding_kwargs())


# -- (c) credentials stay secret ------------------------------------------------------------------


def test_credentials_appear_in_no_repr_message_or_log(s3_server, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    wrong_secret = "WRONG-" + os.urandom(8).hex()
    secrets = (s3_server.secret_key, wrong_secret)
    key = s3_server.access_key
    good = binding_on(s3_server, max_attempts=2)
    good.create("c", b"x")
    texts = [repr(good), str(good), good.url, repr(good.statistics())]
    errors: list[BaseException] = []

    def failing(call) -> None:
        with pytest.raises(ChunkStorageError) as caught:
            call()
        errors.append(caught.value)

    failing(lambda: good.get_info("missing"))
    failing(lambda: good.create("c", b"again"))
    failing(
        lambda: S3ChunkStorage("no-such-bucket-slts", "p", **s3_server.binding_kwargs()).create("c", b"x")
    )
    bad = S3ChunkStorage(
        good.bucket,
        "chunks",
        endpoint_url=s3_server.endpoint_url,
        region="us-east-1",
        access_key_id=key,
        secret_access_key=wrong_secret,
    )
    texts.append(repr(bad))
    failing(lambda: bad.create("d", b"x"))
    failing(lambda: bad.read(ChunkHandle("c", readonly=True), 0, 1))
    closed_port = S3ChunkStorage(
        good.bucket,
        "p",
        endpoint_url="http://127.0.0.1:9",
        region="us-east-1",
        access_key_id=key,
        secret_access_key=s3_server.secret_key,
        max_attempts=2,
    )
    failing(lambda: closed_port.create("c", b"x"))
    assert isinstance(errors[-1], StorageUnavailable)
    with pytest.raises(InvalidConfig) as caught:
        from_url(f"s3://{key}:{s3_server.secret_key}@{good.bucket}/p")
    errors.append(caught.value)
    for error in errors:
        texts += [str(error), repr(error), repr(error.context), str(error.__cause__), repr(error.__cause__)]
    for text in texts:
        for secret in secrets:
            assert secret not in text, text
        assert key not in text, text
    for record in caplog.records:
        message = record.getMessage()
        for secret in secrets:
            assert secret not in message, (record.name, message)
        if record.name.startswith("slts"):
            assert key not in message, (record.name, message)


# -- (d) URLs against the server ---------------------------------------------------------------------


def test_a_binding_from_an_s3_url_with_environment_credentials(s3_server, monkeypatch) -> None:
    for variable, value in s3_server.credentials().items():
        monkeypatch.setenv(variable, value)
    bucket = s3_server.new_bucket("url")
    storage = from_url(f"s3://{bucket}/deep/prefix?endpoint_url={s3_server.endpoint_url}&max_attempts=2")
    storage.create("x/y", b"through the URL")
    assert list(storage.list()) == ["x/y"]
    raw = s3_server.client().get_object(Bucket=bucket, Key="deep/prefix/x%2Fy")["Body"].read()
    assert raw == b"through the URL"


# -- slts.open and the CLI -----------------------------------------------------------------------------


def test_slts_open_on_an_s3_url(s3_server, monkeypatch, tmp_path) -> None:
    for variable, value in s3_server.credentials().items():
        monkeypatch.setenv(variable, value)
    url = f"s3://{s3_server.new_bucket('open')}/slts?endpoint_url={s3_server.endpoint_url}"
    storage = slts.open(url, metadata=str(tmp_path / "md"))
    storage.create("scope/stream/0")
    handle = storage.open_write("scope/stream/0")
    storage.write(handle, 0, b"hello")
    storage.write(handle, 5, b" world")  # no append on S3: a second chunk
    assert storage.info("scope/stream/0").chunk_count == 2
    storage.close()
    again = slts.open(url, metadata=str(tmp_path / "md"))
    assert again.read(again.open_read("scope/stream/0"), 0, 11) == b"hello world"
    again.close()


def test_the_cli_takes_an_s3_url(s3_server, monkeypatch, tmp_path, capsys) -> None:
    for variable, value in s3_server.credentials().items():
        monkeypatch.setenv(variable, value)
    url = f"s3://{s3_server.new_bucket('cli')}/slts?endpoint_url={s3_server.endpoint_url}"
    common = ["--store", url, "--metadata", str(tmp_path / "md")]
    source = tmp_path / "input"
    source.write_bytes(b"from a file" * 1000)
    assert cli.main(["put", "logs/a", str(source), "--write-bytes", "4096", *common]) == command_line.EXIT_OK
    assert cli.main(["seal", "logs/a", *common]) == command_line.EXIT_OK
    capsys.readouterr()
    assert cli.main(["ls", *common]) == command_line.EXIT_OK
    assert capsys.readouterr().out.split() == ["logs/a"]
    assert cli.main(["info", "logs/a", "--json", *common]) == command_line.EXIT_OK
    assert '"length": 11000' in capsys.readouterr().out
    # A fresh process finds the credentials in the environment, as an operator's shell would.
    result = subprocess.run(
        [sys.executable, "-m", "slts.tools.cli", "cat", "logs/a", *common],
        capture_output=True,
        timeout=120,
        env={**os.environ},
        check=False,
    )
    assert result.returncode == command_line.EXIT_OK, result.stderr
    assert result.stdout == b"from a file" * 1000
    assert cli.main(["cat", "nope", *common]) == command_line.EXIT_NOT_FOUND


# -- slts bench --store s3://... ------------------------------------------------------------------------


def test_bench_runs_the_s3_benchmarks_against_the_store(s3_server, monkeypatch, tmp_path, capsys) -> None:
    only = ["s3_write_64k", "s3_concat", "s3_cache_reread_after_scan"]
    bucket, figures = run_quick_bench(s3_server, monkeypatch, tmp_path, capsys, only)
    for figure in figures:
        assert figure["unit"] == "MB/s" and figure["repetitions"] == 3 and figure["ratio"] > 0
        assert figure["subject_min"] <= figure["subject_median"] <= figure["subject_max"]
    assert list(tmp_path.iterdir()) == []  # scratch folders removed
    assert s3_server.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # scratch objects too
    # Without an s3:// store the S3 benchmarks do not exist.
    assert (
        cli.main(["bench", "--quick", "--only", "s3_write_64k", "--dir", str(tmp_path)])
        == command_line.EXIT_INVALID
    )


@pytest.mark.parametrize("ours", [True, False], ids=["completed-by-us", "someone-elses"])
def test_a_concat_whose_completion_answer_was_lost_is_settled_by_its_write_id(s3_server, ours: bool) -> None:
    """The answer to CompleteMultipartUpload is lost after the server completed it; the
    retry gets NoSuchUpload. That is the concat's success if the target is its own (the
    write-id check), and a non-transient failure otherwise; never retried as transient."""
    binding = binding_on(s3_server)
    binding.create("a", pattern(FIVE_MIB))
    binding.create("b", pattern(FIVE_MIB, seed=1))
    sources = [ConcatSource("a", 0, FIVE_MIB), ConcatSource("b", 0, FIVE_MIB)]
    lost: list[str] = []

    def lose_the_answer(**kwargs: object) -> None:
        if not lost:  # the server completed the upload; its answer never arrives
            lost.append("CompleteMultipartUpload")
            if not ours:  # someone else's object now stands where the upload completed
                binding._client.put_object(
                    Bucket=binding.bucket, Key=binding.object_key("target"), Body=b"other"
                )
            raise botocore.exceptions.ConnectionClosedError(endpoint_url="http://lost")
        # The retry: AWS answers NoSuchUpload for an upload already completed (SeaweedFS
        # answers otherwise), so that answer is the one this client sees.
        lost.append("retry")
        raise botocore.exceptions.ClientError(
            {
                "Error": {"Code": "NoSuchUpload", "Message": "The specified upload does not exist."},
                "ResponseMetadata": {"HTTPStatusCode": 404},
            },
            "CompleteMultipartUpload",
        )

    binding._client.meta.events.register("after-call.s3.CompleteMultipartUpload", lose_the_answer)
    try:
        if ours:
            assert binding.concat("target", sources).length == 2 * FIVE_MIB
            assert binding.read(binding.open_read("target"), FIVE_MIB, 3) == pattern(FIVE_MIB, seed=1)[:3]
        else:
            with pytest.raises(ChunkStorageError) as failed:
                binding.concat("target", sources)
            assert not isinstance(failed.value, StorageUnavailable)
    finally:
        binding._client.meta.events.unregister("after-call.s3.CompleteMultipartUpload", lose_the_answer)
    assert lost == ["CompleteMultipartUpload", "retry"], lost
