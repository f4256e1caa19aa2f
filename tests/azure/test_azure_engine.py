"""The engine on the Azure binding (Azurite): disaster recovery from tier-2 alone, the
request counts ``slts cost`` prices and its Azure list prices, and ``slts demo --store``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "azure.storage.blob", reason="azure-storage-blob is not installed (pip install 'slts[azure]')"
)

from slts.bindings.azure import AzureChunkStorage, credentials_from_environment
from slts.tools import cli, command_line

from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.prices import AZURE_PRICES, AZURE_PRICES_SOURCE
from slts.usage import UsageRecord
from tests.support.azurite import AzuriteServer
from tests.support.engine import Env


def azure_env(azurite: AzuriteServer, tmp_path: Path) -> Env:
    credentials = credentials_from_environment(environ=azurite.credentials())
    binding = AzureChunkStorage(azurite.new_container("engine"), "chunks", credentials=credentials)
    return Env(binding, LmdbMetadataStore(str(tmp_path / "metadata"), TABLES))


def everything(storage, name: str) -> bytes:
    info = storage.info(name)
    return storage.read(storage.open_read(name), info.start_offset, info.length - info.start_offset)


def test_a_store_on_azure_restores_from_tier2_alone(azurite, tmp_path) -> None:
    env = azure_env(azurite, tmp_path)
    try:
        storage = env.open()
        expected: dict[str, bytes] = {}
        for number in range(4):
            name = f"stream-{number}"
            storage.create(name, max_rolling_length=700)
            handle = storage.open_write(name)
            data = b""
            for write in range(6):
                piece = bytes([number * 10 + write]) * (150 + write)
                storage.write(handle, len(data), piece)
                data += piece
            expected[name] = data
        storage.create("txn")
        storage.write(storage.open_write("txn"), 0, b"transaction bytes")
        storage.seal(storage.open_write("txn"))
        storage.concat(storage.open_write("stream-0"), len(expected["stream-0"]), "txn")
        expected["stream-0"] += b"transaction bytes"
        storage.truncate(storage.open_write("stream-1"), 200)
        revived = env.lose_machine_and_restore(storage)
        assert sorted(revived.list()) == sorted(expected)
        for name, data in expected.items():
            start = revived.info(name).start_offset
            assert everything(revived, name) == data[start:]
        assert revived.info("stream-1").start_offset == 200
    finally:
        for instance in env.instances:
            instance.close()
        env.store.close()
        env.binding.close()


def test_the_requests_recorded_are_the_ones_the_binding_sent(azurite, tmp_path) -> None:
    env = azure_env(azurite, tmp_path)
    binding = env.binding
    assert isinstance(binding, AzureChunkStorage)
    try:
        before = binding.statistics()
        storage = env.open()
        storage.create("s")
        for i in range(4):
            storage.write(storage.open_write("s"), i * 10, b"x" * 10)
        storage.read(storage.open_read("s"), 0, 40)
        storage.delete(storage.open_write("s"))
        storage.gc.run_once()
        after = binding.statistics()
        total = UsageRecord({}, 0, 0, 0)
        for record in storage.meter.usage().values():
            total = total.plus(record)
        sent = {
            kind: getattr(after, field) - getattr(before, field)
            for kind, field in (
                ("PUT", "put_requests"),
                ("COPY", "copy_requests"),
                ("GET", "get_requests"),
                ("HEAD", "head_requests"),
                ("LIST", "list_requests"),
                ("DELETE", "delete_requests"),
            )
        }
        assert {k: v for k, v in total.requests.items() if v} == {k: v for k, v in sent.items() if v}
        assert sent["PUT"] >= 5  # a create (Put Blob + Append Block), then three Append Blocks
    finally:
        for instance in env.instances:
            instance.close()
        env.store.close()
        binding.close()


def test_slts_cost_prices_an_azure_store_at_azure_list_prices(azurite, monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    url = f"azure://{azurite.new_container('cost')}/slts"
    common = ["--store", url, "--metadata", str(tmp_path / "md")]
    source = tmp_path / "input"
    source.write_bytes(b"priced" * 1000)
    assert cli.main(["put", "logs/a", str(source), "--write-bytes", "4096", *common]) == command_line.EXIT_OK
    capsys.readouterr()
    assert cli.main(["cost", "--json", *common]) == command_line.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["prices_source"] == AZURE_PRICES_SOURCE and "2025" in report["prices_source"]
    assert report["prices"]["put_per_1000"] == AZURE_PRICES.put_per_1000
    assert report["prices"]["storage_gb_month"] == AZURE_PRICES.storage_gb_month
    assert report["exact_requests"] is True
    puts = report["total"]["requests"]["PUT"]
    assert puts >= 2 and report["total"]["cost"] >= puts * AZURE_PRICES.put_per_1000 / 1000
    assert cli.main(["cost", *common]) == command_line.EXIT_OK
    assert "Azure Blob Storage list prices" in capsys.readouterr().out


def test_the_demo_runs_on_an_azure_store(azurite, tmp_path) -> None:
    from slts.tools.spark_defrag import spark_unavailable

    if (missing := spark_unavailable()) is not None:
        pytest.skip(f"the demo's defrag step runs on Spark: {missing}")
    container = azurite.new_container("demo")
    url = f"azure://{container}/demo"
    folder = tmp_path / "demo"
    script = os.path.join(os.path.dirname(sys.executable), "slts")
    result = subprocess.run(
        [script, "demo", "--dir", str(folder), "--segments", "3", "--writes", "8", "--json", "--store", url],
        capture_output=True,
        text=True,
        env={**os.environ, **azurite.credentials()},
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["verified"] is True and report["mismatched"] == [] and report["problems"] == []
    assert report["chunks_after_defrag"] < report["chunks_before_defrag"]
    assert report["defrag_bytes_native"] > 0 and report["defrag_bytes_copied"] == 0  # Put Block From URL
    assert report["restore_sequence"] >= report["snapshot_sequence"]
    assert report["cost_before_defrag"]["requests"] > 0
    # The store is left empty (no --keep), the folder removed.
    assert list(azurite.service().get_container_client(container).list_blobs()) == []
    assert not folder.exists()
