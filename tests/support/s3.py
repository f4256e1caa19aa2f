"""What the S3 binding brings to the conformance suite (``tests/conformance/conftest.py``).

``s3_binding``: the binding against the session's SeaweedFS server (``tests/support/s3server.py``),
a fresh key prefix per binding in one session bucket, all sharing one boto3 client (a
client per binding would cost ~0.1 s each, and the property tests make hundreds). The raw
hook reads and writes the objects with boto3 directly, by the binding's key mapping.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

from tests.support.conformance import BindingUnderTest
from tests.support.s3server import SeaweedServer, shared_server_or_skip

_prefixes = itertools.count()
_buckets: dict[int, str] = {}
_buckets_lock = threading.Lock()


class S3Raw:
    """Reaches the chunks' objects with plain boto3 calls, bypassing the binding."""

    def __init__(self, client: Any, storage: Any) -> None:
        self._client = client
        self._storage = storage  # only for its key mapping (object_key, object_metadata)

    def read(self, name: str) -> bytes:
        try:
            response = self._client.get_object(
                Bucket=self._storage.bucket, Key=self._storage.object_key(name)
            )
        except self._client.exceptions.NoSuchKey:
            raise KeyError(name) from None
        return response["Body"].read()

    def write(self, name: str, data: bytes) -> None:
        self._client.put_object(
            Bucket=self._storage.bucket,
            Key=self._storage.object_key(name),
            Body=bytes(data),
            Metadata=self._storage.object_metadata(name),
        )

    def exists(self, name: str) -> bool:
        import botocore.exceptions

        try:
            self._client.head_object(Bucket=self._storage.bucket, Key=self._storage.object_key(name))
        except botocore.exceptions.ClientError as exc:
            if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
                return False
            raise
        return True


def session_bucket(server: SeaweedServer) -> str:
    """One bucket per server for all conformance bindings (each has its own prefix)."""
    with _buckets_lock:
        if id(server) not in _buckets:
            _buckets[id(server)] = server.new_bucket("conformance")
        return _buckets[id(server)]


def s3_binding(workdir: Path) -> BindingUnderTest:
    from slts.bindings.s3 import S3ChunkStorage

    server = shared_server_or_skip()
    bucket = session_bucket(server)
    prefix = f"c/{next(_prefixes)}-{workdir.name}"
    client = server.client()

    def make() -> S3ChunkStorage:
        return S3ChunkStorage(bucket, prefix, endpoint_url=server.endpoint_url, client=client)

    storage = make()
    # ~25 requests per model step at ~1 ms each: 30 programs of 40 steps take ~30 s.
    return BindingUnderTest("s3", storage, S3Raw(client, storage), reopen=make, model_examples=30)


def s3_storage_binding(tmp: Path) -> Any:
    """A binding on a new bucket of the session's server, with its own boto3 client, for
    the engine tests (``tests/storage/conftest.py``): one bucket per test."""
    from slts.bindings.s3 import S3ChunkStorage

    server = shared_server_or_skip()
    return S3ChunkStorage(server.new_bucket("storage"), "chunks", **server.binding_kwargs())


def run_quick_bench(
    server: SeaweedServer, monkeypatch: Any, tmp_path: Path, capsys: Any, only: list[str]
) -> tuple[str, list[dict[str, Any]]]:
    """``slts bench --quick --json`` of the S3 benchmarks ``only`` against a new bucket of
    ``server`` (its credentials in the environment, scratch folders in ``tmp_path``),
    asserted to succeed; the bucket and the figures printed."""
    import json

    from slts.tools import cli, command_line

    for variable, value in server.credentials().items():
        monkeypatch.setenv(variable, value)
    bucket = server.new_bucket("bench")
    url = f"s3://{bucket}/b?endpoint_url={server.endpoint_url}"
    code = cli.main(["bench", "--quick", "--store", url, "--only", *only, "--dir", str(tmp_path), "--json"])
    assert code == command_line.EXIT_OK
    figures: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["figures"]
    assert [figure["name"] for figure in figures] == only
    return bucket, figures
