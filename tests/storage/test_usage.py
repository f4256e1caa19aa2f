"""Usage metering (``slts.usage``) in the gate every chunk storage call passes: requests by
kind in the caller's traffic class (on S3 exactly the requests the binding sent), bytes,
latency and errors; usage added to the metadata store by concurrent flushers without loss,
and priced by ``slts.cost``. On the filesystem binding and on S3."""

from __future__ import annotations

import threading

import pytest
from slts.bindings.base import REQUEST_KINDS, ChunkAppend
from slts.bindings.memory import MemoryChunkStorage
from slts.bindings.s3 import S3ChunkStorage
from slts.journal.restore import restore

from slts.config import StorageConfig
from slts.cost import GiB, Prices, cost_report
from slts.errors import ChunkInvalidOffset, ChunkNotFound, Fenced, InvalidArgument, InvalidConfig
from slts.limiter import TrafficClass
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.gate import GatedChunkStorage
from slts.usage import EMPTY_USAGE, UsageMeter, UsageRecord, read_usage
from tests.support.engine import Env, env_fixture

env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])
s3_env = env_fixture([("s3", "lmdb")])
CONFIG = StorageConfig(
    gc_delay_s=0.0,
    gc_interval_s=0.0,
    metadata_log_flush_interval_s=0.0,
    usage_flush_interval_s=0.0,
    journal=False,
)


def start(env: Env) -> ChunkedSegmentStorage:
    storage = ChunkedSegmentStorage(0, None, env.binding, env.store, CONFIG)
    env.instances.append(storage)
    return storage


def recorded(env: Env) -> dict[TrafficClass, UsageRecord]:
    with env.store.snapshot() as view:
        return read_usage(view, 0)


def test_work_is_counted_in_its_class_with_its_bytes(env: Env) -> None:
    storage = start(env)
    storage.create("s")
    handle = storage.open_write("s")
    for i in range(3):
        storage.write(handle, i * 1000, bytes([i]) * 1000)
    assert storage.read(storage.open_read("s"), 0, 3000) == b"\x00" * 1000 + b"\x01" * 1000 + b"\x02" * 1000
    storage.delete(storage.open_write("s"))
    deleted = storage.gc.run_once().chunks_deleted  # GC declares its own class
    assert deleted >= 1
    usage = storage.meter.usage()
    assert usage[TrafficClass.TAIL_WRITE].bytes_sent >= 3000
    assert usage[TrafficClass.TAIL_WRITE].requests.get("PUT", 0) >= 1
    assert usage[TrafficClass.READ].bytes_received >= 3000
    assert usage[TrafficClass.READ].requests.get("GET", 0) >= 1
    assert usage[TrafficClass.GC].requests.get("DELETE", 0) == deleted
    assert usage[TrafficClass.DEFRAG] == EMPTY_USAGE
    for record in usage.values():
        assert set(record.requests) <= set(REQUEST_KINDS)


def test_s3_requests_are_the_ones_the_binding_sent(s3_env: Env) -> None:
    env = s3_env
    assert isinstance(env.binding, S3ChunkStorage)
    before = env.binding.statistics()
    storage = start(env)
    storage.create("s")
    for i in range(4):
        storage.write(storage.open_write("s"), i * 10, b"x" * 10)
    storage.read(storage.open_read("s"), 0, 40)
    storage.concat(storage.open_write("s"), 40, _one_chunk_segment(storage, "t"))
    storage.delete(storage.open_write("s"))
    storage.gc.run_once()
    after = env.binding.statistics()
    total = UsageRecord({}, 0, 0, 0)
    for record in storage.meter.usage().values():
        total = total.plus(record)
    sent = {
        "PUT": after.put_requests - before.put_requests,
        "GET": after.get_requests - before.get_requests,
        "HEAD": after.head_requests - before.head_requests,
        "LIST": after.list_requests - before.list_requests,
        "DELETE": after.delete_requests - before.delete_requests,
        "MULTIPART": after.multipart_requests - before.multipart_requests,
        "COPY": after.copy_part_requests - before.copy_part_requests,
    }
    assert {kind: count for kind, count in total.requests.items() if count} == {
        kind: count for kind, count in sent.items() if count
    }
    assert total.requests.get("DELETE", 0) >= 1


def _one_chunk_segment(storage: ChunkedSegmentStorage, name: str) -> str:
    storage.create(name)
    storage.write(storage.open_write(name), 0, b"y" * 10)
    storage.seal(storage.open_write(name))
    return name


def test_latency_and_errors_per_call(env: Env) -> None:
    storage = start(env)
    storage.create("s")
    storage.write(storage.open_write("s"), 0, b"abc")
    with pytest.raises(ChunkNotFound):
        storage.chunk_storage.get_info("no-such-chunk")
    timings = storage.meter.timings()
    assert timings["get_info"].errors == {"ChunkNotFound": 1}
    assert timings["get_info"].count >= 1
    assert timings["create"].count >= 1  # the first write of a segment creates its chunk
    for timing in timings.values():
        assert timing.sum_s >= 0 and sum(timing.buckets) == timing.count


def test_usage_is_added_to_the_store_across_instances(env: Env) -> None:
    first = start(env)
    first.create("a")
    first.write(first.open_write("a"), 0, b"a" * 100)
    first_usage = first.meter.usage()
    first.close()
    assert recorded(env)[TrafficClass.TAIL_WRITE] == first_usage[TrafficClass.TAIL_WRITE]
    second = start(env)
    second.read(second.open_read("a"), 0, 100)
    second_usage = second.meter.usage()
    assert second.flush_usage() > 0
    assert second.flush_usage() == 0  # nothing new
    stored = recorded(env)
    for kind in (TrafficClass.TAIL_WRITE, TrafficClass.READ):
        assert stored[kind] == first_usage[kind].plus(second_usage[kind])


def test_concurrent_flushes_lose_nothing() -> None:
    store = MemoryMetadataStore(TABLES)
    meters = [UsageMeter() for _ in range(4)]
    rounds = 50

    def work(meter: UsageMeter) -> None:
        for _ in range(rounds):
            meter.request("PUT")
            meter.call(TrafficClass.TAIL_WRITE, "write", 0.001, sent=10)
            meter.flush(store, 7)

    threads = [threading.Thread(target=work, args=(meter,)) for meter in meters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with store.snapshot() as view:
        usage = read_usage(view, 7)
        assert read_usage(view, 0) == {}
    assert usage == {TrafficClass.TAIL_WRITE: UsageRecord({"PUT": 4 * rounds}, 4 * rounds * 10, 0, 0)}


def test_a_failed_flush_keeps_the_counts_for_the_next() -> None:
    store = MemoryMetadataStore(TABLES)
    meter = UsageMeter()
    meter.request("GET")
    store.close()
    with pytest.raises(Exception):  # noqa: B017 - whatever a closed store raises
        meter.flush(store, 0)
    fresh = MemoryMetadataStore(TABLES)
    assert meter.flush(fresh, 0) == 1
    with fresh.snapshot() as view:
        assert read_usage(view, 0)[TrafficClass.READ].requests == {"GET": 1}


def test_cost_report_prices_requests_transfers_and_storage(env: Env) -> None:
    storage = start(env)
    storage.create("s")
    storage.write(storage.open_write("s"), 0, b"z" * 5000)
    storage.flush_usage()
    prices = Prices(storage_gb_month=2.0, put_per_1000=1.0, get_per_1000=0.5, upload_gb=3.0)
    report = cost_report(storage, prices)
    assert report.stored.segments == 1 and report.stored.chunks == 1 and report.stored.bytes == 5000
    assert report.stored.logical_bytes == 5000  # no transforms: what is stored is what was written
    assert report.storage_per_month == pytest.approx(5000 / GiB * 2.0)
    total = report.total
    expected = (
        sum(
            count
            * (0.001 if kind in ("PUT", "COPY", "MULTIPART", "LIST") else 0.0 if kind == "DELETE" else 0.0005)
            for kind, count in total.requests.items()
        )
        + total.bytes_sent / GiB * 3.0
    )
    assert report.cost() == pytest.approx(expected)
    assert report.cost() > 0
    document = report.as_json()
    assert document["stored"]["bytes"] == 5000
    assert document["classes"]["tail_write"]["requests"] == dict(
        report.usage[TrafficClass.TAIL_WRITE].requests
    )
    assert document["total"]["requests"] == dict(total.requests)
    assert "tail_write" in report.as_text()


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "1", True])
def test_bad_prices_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="put_per_1000"):
        Prices(put_per_1000=bad)  # type: ignore[arg-type]


def test_price_settings_name_their_source(tmp_path) -> None:
    from slts.config_sources import resolve_config

    file = tmp_path / "slts.toml"
    file.write_text("[prices]\nput_per_1000 = 0.01\n")
    resolved = resolve_config(
        str(file), {"SLTS_PRICES_GET_PER_1000": "0.002"}, ["prices.storage_gb_month=0.01"]
    )
    assert resolved.price_list() == Prices(put_per_1000=0.01, get_per_1000=0.002, storage_gb_month=0.01)
    assert resolved.sources["prices.get_per_1000"] == "$SLTS_PRICES_GET_PER_1000"
    file.write_text("[prices]\nput_per_1000 = -1\n")
    with pytest.raises(InvalidConfig, match=r"prices\.put_per_1000"):
        resolve_config(str(file), {}, [])
    file.write_text("[prices]\nput_per_month = 1\n")
    with pytest.raises(InvalidConfig, match=r"prices\.put_per_month: unknown key"):
        resolve_config(str(file), {}, [])


def test_recorded_usage_survives_the_loss_of_the_machine(env: Env) -> None:
    storage = env.open()  # with the metadata's copy on tier-2
    storage.create("s")
    storage.write(storage.open_write("s"), 0, b"u" * 100)
    storage.close()  # adds its usage, then the metadata copy's last flush takes it to tier-2
    with env.store.snapshot() as view:
        local = read_usage(view, 0)
    assert local[TrafficClass.TAIL_WRITE].requests["PUT"] >= 1
    restored = MemoryMetadataStore(TABLES)
    restore(env.binding, 0, restored)  # from tier-2 alone, as after the loss of the machine
    with restored.snapshot() as view:
        assert read_usage(view, 0) == local


def test_the_periodic_flush_stops_once_fenced() -> None:
    """A flush that raises ``Fenced`` ends the flusher thread (a fenced instance never
    writes again; it used to read and fail at every interval until close); any other
    failure is tried again at the next interval."""
    meter = UsageMeter()
    calls: list[str] = []
    outcomes = iter([InvalidArgument("a passing failure"), Fenced("a newer epoch owns the container")])

    def flush() -> None:
        outcome = next(outcomes)
        calls.append(type(outcome).__name__)
        raise outcome

    meter.start(flush, 0.001)
    flusher = meter._flusher  # white box: the thread to wait for
    assert flusher is not None
    flusher.join(timeout=60)
    assert not flusher.is_alive() and calls == ["InvalidArgument", "Fenced"]
    meter.stop()


def test_a_read_call_counts_as_the_general_call_of_a_read() -> None:
    """``read_call`` (the gate's hot path) leaves the meter as ``call(..., "read", ...)`` does."""
    from slts.limiter import TrafficClass
    from slts.usage import UsageMeter

    general, hot = UsageMeter(), UsageMeter()
    for seconds, received, request in ((0.0001, 4096, "GET"), (0.02, 10, None), (3.0, 0, "GET")):
        general.call(TrafficClass.READ, "read", seconds, request=request, received=received)
        hot.read_call(TrafficClass.READ, seconds, received, request)
    assert hot.usage() == general.usage()
    assert hot.timings() == general.timings()


def test_appends_written_together_are_metered_one_write_each() -> None:
    """``write_together`` through the gate: one ``write`` per append in the timings, the
    failed one's error counted by type, and only the bytes of the appends that landed
    sent; the limiter is paid for all of them at once."""
    meter = UsageMeter()
    gate = GatedChunkStorage(MemoryChunkStorage(), meter)
    good, shifted = gate.create("good"), gate.create("shifted", b"x")
    results = gate.write_together([ChunkAppend(good, 0, b"abcd"), ChunkAppend(shifted, 0, b"ef")])
    assert results[0] == 4 and isinstance(results[1], ChunkInvalidOffset)
    timings = meter.timings()["write"]
    assert timings.count == 2
    assert timings.errors == {"ChunkInvalidOffset": 1}
    assert meter.usage()[TrafficClass.TAIL_WRITE].bytes_sent == 1 + 4  # the create's byte, the append's four
