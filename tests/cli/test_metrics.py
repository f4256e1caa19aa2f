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
        storage.delete(storage.open_write("b"))
        storage.check_leaks()
        registry = CollectorRegistry()
        registry.register(SltsCollector(storage, limiter=limiter))
        parsed = samples(generate_latest(registry).decode())
        assert value(parsed, "slts_writes_total") == 5
        assert value(parsed, "slts_written_bytes_total") == 15_000
        assert value(parsed, "slts_read_bytes_total") == 15_000
        assert value(parsed, "slts_segments") == 1 and value(parsed, "slts_chunks") == 4
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
    finally:
        storage.close()


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
