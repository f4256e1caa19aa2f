"""The engine on the GCS binding (the emulator): restore from tier-2 alone, ``slts cost``
with GCS's list prices, and ``slts demo --store gs://...``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip(
    "google.cloud.storage", reason="google-cloud-storage is not installed (pip install 'slts[gcs]')"
)

from slts.bindings.gcs import GcsChunkStorage
from slts.journal.restore import restore
from slts.tools import cli, command_line

from slts.cost import cost_report
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.prices import GCS_PRICES, GCS_PRICES_SOURCE, list_prices
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.sealed import RecordSeal
from tests.support.engine import Env, key_ring
from tests.support.gcsserver import GcsEmulator


def contents(storage) -> dict[str, bytes]:
    out = {}
    for name in storage.list():
        info = storage.info(name)
        out[name] = storage.read(storage.open_read(name), info.start_offset, info.length - info.start_offset)
    return out


@pytest.mark.parametrize("transforms", ["plain", "zstd+aes"])
def test_restore_from_tier2_alone_on_gcs(
    gcs_emulator: GcsEmulator, bucket: str, tmp_path: Path, transforms
) -> None:
    binding = GcsChunkStorage(bucket, "chunks", **gcs_emulator.binding_kwargs())
    env = Env(binding, LmdbMetadataStore(str(tmp_path / "metadata"), TABLES))
    if transforms != "plain":
        env.transforms = {"compression_level": 3, "encryption": True, "frame_bytes": 4096}
        env.key_ring = key_ring(tmp_path)
    try:
        storage = env.open(concat_merge_seam=False)
        for index in range(4):
            storage.create(f"s{index}")
            for round_ in range(3):
                handle = storage.open_write(f"s{index}")
                storage.write(
                    handle, storage.info(f"s{index}").length, bytes([index + round_]) * (500 + index)
                )
        storage.create("txn")
        storage.write(storage.open_write("txn"), 0, b"t" * 300)
        storage.seal(storage.open_write("txn"))
        storage.concat(storage.open_write("s0"), storage.info("s0").length, "txn")
        storage.truncate(storage.open_write("s1"), 700)
        storage.defrag("s2")
        before = contents(storage)
        assert storage.durable is not None
        storage.durable.flush()
        storage.close()
        env.instances.remove(storage)
        # The machine is lost: LMDB forgotten, the store rebuilt from the bucket alone (with the
        # key ring where the metadata's copy is sealed).
        seal = RecordSeal(env.key_ring, sealing=False) if env.key_ring is not None else None
        restored = MemoryMetadataStore(TABLES)
        if seal is None:
            restore(binding, 0, restored)
        else:
            restore(binding, 0, restored, seal=seal)
        revived = ChunkedSegmentStorage(0, None, binding, restored, key_ring=env.key_ring)
        env.instances.append(revived)
        assert contents(revived) == before
    finally:
        for instance in env.instances:
            instance.close()
        env.store.close()
        binding.close()


def test_cost_prices_a_gcs_store_at_gcs_list_prices(
    gcs_emulator: GcsEmulator, bucket: str, tmp_path: Path, capsys
) -> None:
    url = gcs_emulator.url(bucket)
    metadata = str(tmp_path / "metadata")
    env = Env(GcsChunkStorage.from_url(url), LmdbMetadataStore(metadata, TABLES))
    with env.open() as storage:
        storage.create("s")
        for _ in range(3):
            storage.write(storage.open_write("s"), storage.info("s").length, b"c" * 1000)
        storage.seal(storage.open_write("s"))
        storage.defrag("s")  # a compose: a COPY, Class A
        storage.flush_usage()
        report = cost_report(storage, list_prices(storage.chunk_storage.url)[0])
        assert report.exact_requests and report.prices_source == GCS_PRICES_SOURCE
        assert report.prices == GCS_PRICES
        kinds = report.total.requests
        assert kinds.get("PUT", 0) >= 3 and kinds.get("COPY", 0) >= 1
        class_a = sum(kinds.get(kind, 0) for kind in ("PUT", "COPY", "LIST"))
        class_b = sum(kinds.get(kind, 0) for kind in ("GET", "HEAD"))
        assert report.cost() == pytest.approx(class_a * 0.005 / 1000 + class_b * 0.0004 / 1000)
    env.store.close()
    env.binding.close()
    code = cli.main(["cost", "--store", url, "--metadata", metadata, "--json"])
    assert code == command_line.EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["prices_source"] == GCS_PRICES_SOURCE and document["prices"]["storage_gb_month"] == 0.020


@pytest.mark.timeout(300)  # Spark starts for the demo's defrag step
def test_the_demo_runs_with_its_chunks_on_gcs(
    gcs_emulator: GcsEmulator, bucket: str, tmp_path: Path, capsys
) -> None:
    pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'slts[spark]')")
    from slts.tools.spark_defrag import spark_unavailable

    if spark_unavailable():
        pytest.skip(spark_unavailable())
    url = gcs_emulator.url(bucket, "demo")
    code = cli.main(
        ["demo", "--store", url, "--segments", "4", "--writes", "10", "--dir", str(tmp_path / "d"), "--json"]
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == command_line.EXIT_OK and report["verified"], report
    assert report["store"] == url and report["cost_after_defrag"]["prices_source"] == GCS_PRICES_SOURCE
    assert report["chunks_after_defrag"] > 0 and report["defrag_bytes_native"] > 0  # in the bucket
    with GcsChunkStorage.from_url(url) as binding:
        assert list(binding.list()) == []  # without --keep, what the demo wrote is removed
        binding.create("0/left-behind")
    assert not (tmp_path / "d").exists()  # the demo folder (metadata only) removed
    code = cli.main(
        ["demo", "--store", url, "--segments", "1", "--writes", "1", "--dir", str(tmp_path / "e")]
    )
    assert code == command_line.EXIT_INVALID  # the prefix already holds chunks


def test_bench_runs_the_gcs_benchmarks_against_the_store(
    gcs_emulator: GcsEmulator, bucket: str, tmp_path: Path, capsys
) -> None:
    only = ["gcs_write_1m", "gcs_concat"]
    code = cli.main(
        [
            "bench",
            "--quick",
            "--store",
            gcs_emulator.url(bucket, "b"),
            "--only",
            *only,
            "--dir",
            str(tmp_path),
            "--json",
        ]
    )
    assert code == command_line.EXIT_OK
    figures = json.loads(capsys.readouterr().out)["figures"]
    assert [figure["name"] for figure in figures] == only
    assert all(figure["subject_median"] > 0 and figure["baseline_median"] > 0 for figure in figures)
    assert [blob.name for blob in gcs_emulator.client().list_blobs(bucket)] == []  # scratch objects deleted
