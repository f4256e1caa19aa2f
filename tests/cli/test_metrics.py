"""Prometheus metrics: the collector in a user's registry (values parsed back with the client
library's parser), and ``slts metrics --serve`` scraped over real HTTP."""

from __future__ import annotations

import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import slts
from slts.errors import InvalidArgument
from slts.limiter import PriorityLimiter
from slts.metrics import SltsCollector
from tests.support.cli import child_env, run_slts, slts_command


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(parsed: dict, name: str, **labels: str) -> float:
    return parsed[(name, tuple(sorted({"container": "0", **labels}.items())))]


def test_the_collector_in_a_users_registry(tmp_path: Path) -> None:
    limiter = PriorityLimiter()
    storage = slts.open(
        f"file://{tmp_path / 'chunks'}",
        metadata=str(tmp_path / "md"),
        limiter=limiter,
        gc_interval_s=0.0,
        gc_delay_s=0.0,
        rolling_length_bytes_default=4096,
    )
    try:
        storage.create("a")
        handle = storage.open_write("a")
        for i in range(5):
            storage.write(handle, i * 3000, b"x" * 3000)
        storage.read(storage.open_read("a"), 0, 15_000)
        storage.create("b")
        storage.write(storage.open_write("b"), 0, b"y" * 3000)  # one chunk for GC to delete
        storage.delete(storage.open_write("b"))
        storage.check_leaks()
        registry = CollectorRegistry()
        registry.register(SltsCollector(storage, limiter=limiter))
        parsed = samples(generate_latest(registry).decode())
        assert value(parsed, "slts_writes_total") == 6
        assert value(parsed, "slts_written_bytes_total") == 18_000
        assert value(parsed, "slts_read_bytes_total") == 15_000
        assert value(parsed, "slts_segments") == 1 and value(parsed, "slts_chunks") == 5  # b's awaits GC
        assert value(parsed, "slts_gc_deleted_segments") == 1
        assert value(parsed, "slts_leaked_items", kind="index_entries") == 0
        assert value(parsed, "slts_metadata_log_lag_records") >= 0
        assert value(parsed, "slts_limiter_bytes_total", **{"class": "tail_write"}) >= 15_000
        assert value(parsed, "slts_limiter_throttled_seconds_total", **{"class": "gc"}) == 0

        while storage.gc.run_once().progressed:
            pass
        parsed = samples(generate_latest(registry).decode())
        assert value(parsed, "slts_gc_deleted_segments") == 0
        assert value(parsed, "slts_limiter_requests_total", **{"class": "gc"}) > 0
        # The chunk storage as the gate saw it: requests by kind and class, bytes, latency.
        deletes = value(parsed, "slts_chunk_storage_requests_total", **{"class": "gc", "kind": "DELETE"})
        assert deletes == storage.gc.statistics().chunks_deleted == 1
        assert value(parsed, "slts_chunk_storage_sent_bytes_total", **{"class": "tail_write"}) >= 15_000
        assert value(parsed, "slts_chunk_storage_received_bytes_total", **{"class": "read"}) >= 15_000
        calls = storage.meter.timings()
        assert value(parsed, "slts_chunk_storage_call_seconds_count", call="delete") == calls["delete"].count
        assert value(parsed, "slts_chunk_storage_call_seconds_bucket", call="delete", le="+Inf") == 1
    finally:
        storage.close()


def test_counts_cover_stores_larger_than_one_read_page() -> None:
    with slts.open("memory://many", gc_interval_s=0.0, journal=False) as storage:
        for i in range(1_100):  # the store reads 1,000 entries per page
            storage.create(f"s{i:04d}")
        registry = CollectorRegistry()
        registry.register(SltsCollector(storage))
        assert value(samples(generate_latest(registry).decode()), "slts_segments") == 1_100


def test_a_scrape_reads_no_table_in_full() -> None:
    """What a scrape reads from the metadata store does not grow with the store: the same
    reads (one snapshot: the tables' counts and the GC queue's first key) at 10 segments
    and at thousands of segments, chunks, tombstones and GC entries (several read pages
    each), with right gauges at both sizes."""
    with slts.open(
        "memory://scrape", gc_interval_s=0.0, usage_flush_interval_s=0.0, journal=False
    ) as storage:
        registry = CollectorRegistry()
        registry.register(SltsCollector(storage))
        store = storage.context.store

        def scrape() -> tuple[int, dict]:
            before = store.statistics().reads
            parsed = samples(generate_latest(registry).decode())
            return store.statistics().reads - before, parsed

        def populate(first: int, last: int) -> None:
            for i in range(first, last):
                storage.create(f"s{i:05d}")
                storage.write(storage.open_write(f"s{i:05d}"), 0, b"x")

        populate(0, 10)
        small_reads, parsed = scrape()
        assert value(parsed, "slts_segments") == value(parsed, "slts_chunks") == 10

        populate(10, 2_500)
        for i in range(1_100):  # tombstones, their chunks awaiting GC
            storage.delete(storage.open_write(f"s{i:05d}"))
        storage.create("rolled", max_rolling_length=1)  # a byte per chunk
        rolled = storage.open_write("rolled")
        storage.write(rolled, 0, bytes(1_500))
        storage.truncate(rolled, 1_500)  # its 1,500 chunks queued for GC
        large_reads, parsed = scrape()
        assert value(parsed, "slts_segments") == 2_500 - 1_100 + 1
        assert value(parsed, "slts_chunks") == 2_500  # the queued ones are unlinked
        assert value(parsed, "slts_gc_deleted_segments") == 1_100
        assert (
            value(parsed, "slts_gc_queue_entries") == 2
        )  # two truncate commits (gc_batch_max 1,000), a run each
        assert large_reads == small_reads, (small_reads, large_reads)


def test_chunk_storage_errors_are_counted_by_type(tmp_path: Path) -> None:
    with slts.open(
        f"file://{tmp_path / 'chunks'}", metadata=str(tmp_path / "md"), gc_interval_s=0.0
    ) as storage:
        with pytest.raises(Exception, match="chunk"):
            storage.chunk_storage.get_info("missing-chunk")
        registry = CollectorRegistry()
        registry.register(SltsCollector(storage))
        parsed = samples(generate_latest(registry).decode())
        errors = value(parsed, "slts_chunk_storage_call_errors_total", call="get_info", error="ChunkNotFound")
        assert errors == 1


def test_bad_arguments_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        SltsCollector("not a storage")  # type: ignore[arg-type]
    storage = slts.open("memory://m", gc_interval_s=0.0)
    try:
        with pytest.raises(InvalidArgument):
            SltsCollector(storage, limiter="fast")  # type: ignore[arg-type]
    finally:
        storage.close()


def test_slts_metrics_serves_over_http(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (tmp_path / "data").write_bytes(b"y" * 10_000)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return run_slts(*argv, "--store", str(store))

    for name in ("a", "b", "c"):
        assert run("put", name, str(tmp_path / "data")).returncode == 0
    once = run("metrics")
    assert once.returncode == 0 and value(samples(once.stdout), "slts_segments") == 3

    server = subprocess.Popen(
        slts_command("metrics", "--serve", "0", "--store", str(store)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline().strip()  # printed once the server listens
        assert first.startswith("serving http://127.0.0.1:"), first
        url = first.removeprefix("serving ")
        assert run("rm", "c").returncode == 0  # the live view follows the store
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
            parsed = samples(response.read().decode())
        assert value(parsed, "slts_segments") == 2 and value(parsed, "slts_gc_deleted_segments") == 1
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, server.stderr.read() if server.stderr else ""
