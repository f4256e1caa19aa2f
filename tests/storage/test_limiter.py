"""The priority rate limiter (``slts.limiter``): per-class limits within 10% over 10 s,
priority within a shared total with no class starving, unused share passed down, bursts,
bad arguments; a discrete-event simulation on a fake clock, and threads in real time."""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass

import pytest
from slts.tools.simulation.seam import FakeClock

from slts.errors import InvalidArgument
from slts.limiter import Limit, PriorityLimiter, TrafficClass, current_traffic_class, traffic_class

MB = 1_000_000
T, R, OFF, D, G, S = (
    TrafficClass.TAIL_WRITE,
    TrafficClass.READ,
    TrafficClass.OFFLOAD,
    TrafficClass.DEFRAG,
    TrafficClass.GC,
    TrafficClass.SCRUB,
)


@dataclass(frozen=True)
class Client:
    """A caller that, once let through, spends ``busy_s`` on its request and asks again."""

    kind: TrafficClass
    nbytes: int
    busy_s: float = 0.0


def simulate(
    limiter: PriorityLimiter, clock: FakeClock, clients: list[Client], seconds: float = 10.0
) -> dict:
    """Run ``clients`` side by side for ``seconds`` of fake time; bytes and requests let
    through per class (counted when they go ahead, inside the window)."""
    start = clock.now
    events = [(start, i) for i in range(len(clients))]
    heapq.heapify(events)
    granted: dict[TrafficClass, list[int]] = {kind: [0, 0] for kind in TrafficClass}
    while events:
        at, i = heapq.heappop(events)
        if at >= start + seconds:
            continue
        clock.now = at
        client = clients[i]
        wait = limiter.reserve(client.kind, client.nbytes)
        if at + wait < start + seconds:
            granted[client.kind][0] += client.nbytes
            granted[client.kind][1] += 1
        heapq.heappush(events, (at + wait + max(client.busy_s, 1e-6), i))
    return {kind: (b / seconds, r / seconds) for kind, (b, r) in granted.items()}


def limiter(**kwargs: object) -> tuple[PriorityLimiter, FakeClock]:
    clock = FakeClock(0.0)
    return PriorityLimiter(clock=clock, sleep=clock.advance, **kwargs), clock  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", [1 * MB, 20 * MB, 300 * MB])
def test_a_class_limit_holds_within_ten_percent_over_ten_seconds(rate: int) -> None:
    lim, clock = limiter(limits={D: Limit(bytes_per_s=rate)})
    result = simulate(lim, clock, [Client(D, 64 << 10), Client(D, 1 << 20), Client(D, 4096)])
    assert 0.9 * rate <= result[D][0] <= 1.1 * rate, result[D]


def test_a_request_limit_holds_and_classes_without_limits_pass() -> None:
    lim, clock = limiter(limits={G: Limit(requests_per_s=50)})
    result = simulate(lim, clock, [Client(G, 100), Client(G, 100), Client(T, 100, busy_s=0.01)])
    assert 45 <= result[G][1] <= 55, result[G]
    assert result[T][1] == pytest.approx(100, rel=0.01), "the tail writes are not limited"


def test_no_limit_means_no_wait() -> None:
    lim, _ = limiter()
    assert lim.unlimited
    assert all(lim.reserve(kind, 1 << 30) == 0.0 for kind in TrafficClass for _ in range(10))
    assert lim.stats()[T].requests_throttled == 0 and lim.stats()[T].bytes == 10 << 30


def test_priority_within_the_total_and_no_class_starves() -> None:
    total = 100 * MB
    lim, clock = limiter(total=Limit(bytes_per_s=total), min_share=0.05)
    clients = [Client(T, 64 << 10)] * 4 + [Client(D, 1 << 20)] * 2 + [Client(G, 256 << 10)] * 2
    result = simulate(lim, clock, clients)
    let_through = sum(b for b, _ in result.values())
    assert 0.9 * total <= let_through <= 1.1 * total, result
    assert result[T][0] >= 0.85 * total, "the tail writes get all but the others' minimum shares"
    for kind in (D, G):
        assert 0.04 * total <= result[kind][0] <= 0.08 * total, (kind, result[kind])


def test_what_a_class_above_leaves_unused_goes_below() -> None:
    total = 100 * MB
    lim, clock = limiter(total=Limit(bytes_per_s=total))
    # tail writes want about 20 MB/s (64 KiB every 3.3 ms); defrag would take everything
    result = simulate(
        lim, clock, [Client(T, 64 << 10, busy_s=0.00328), Client(D, 1 << 20), Client(D, 1 << 20)]
    )
    assert result[T][0] == pytest.approx(20 * MB, rel=0.1), "the tail writes get what they ask"
    assert result[D][0] >= 0.7 * total, "defrag gets the rest"
    assert result[T][0] + result[D][0] <= 1.1 * total


def test_a_class_alone_gets_nearly_all_of_the_total() -> None:
    lim, clock = limiter(total=Limit(bytes_per_s=50 * MB))
    result = simulate(lim, clock, [Client(S, 1 << 20), Client(S, 1 << 20)])
    assert 0.9 * 50 * MB <= result[S][0] <= 1.1 * 50 * MB


def test_a_request_larger_than_the_burst_waits_and_is_never_refused() -> None:
    lim, clock = limiter(limits={OFF: Limit(bytes_per_s=1000)}, burst_s=1.0)
    assert lim.reserve(OFF, 5000) == pytest.approx(5.0)
    clock.advance(2.0)
    assert lim.reserve(OFF, 0) == pytest.approx(3.0), "the debt is paid before the next goes ahead"
    assert lim.acquire(OFF, 0) == pytest.approx(3.0) and clock.now == pytest.approx(5.0)
    assert lim.stats()[OFF].requests_throttled == 3


def test_after_idleness_at_most_one_burst_passes_at_once() -> None:
    lim, clock = limiter(limits={R: Limit(bytes_per_s=1000)}, burst_s=0.5)
    clock.advance(100.0)
    assert lim.reserve(R, 500) == 0.0
    assert lim.reserve(R, 100) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limits": {"gc": Limit()}},
        {"limits": {G: 5}},
        {"total": 10},
        {"min_share": 0.5},
        {"min_share": 0},
        {"burst_s": 0},
        {"burst_s": True},
    ],
)
def test_bad_arguments_are_typed_errors(kwargs: dict) -> None:
    with pytest.raises(InvalidArgument):
        PriorityLimiter(**kwargs)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "5", True])
def test_a_bad_limit_is_a_typed_error(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        Limit(bytes_per_s=bad)  # type: ignore[arg-type]


def test_the_traffic_class_is_per_thread_and_nests() -> None:
    assert current_traffic_class(R) == R
    seen = []
    with traffic_class(G):
        with traffic_class(S):
            assert current_traffic_class(T) == S
        assert current_traffic_class(T) == G
        thread = threading.Thread(target=lambda: seen.append(current_traffic_class(T)))
        thread.start()
        thread.join()
    assert seen == [T], "a new thread starts outside any class"
    assert current_traffic_class(R) == R
    with pytest.raises(InvalidArgument), traffic_class(3):  # type: ignore[arg-type]
        pass


def test_threads_in_real_time_are_held_to_the_rate() -> None:
    """Four threads take 300 KB at 200 KB/s: it cannot take less than 1.5 s less the
    burst (a lower bound only: sleeping never ends early)."""
    lim = PriorityLimiter({D: Limit(bytes_per_s=200_000)}, burst_s=0.25)
    started = time.monotonic()

    def take() -> None:
        for _ in range(15):
            lim.acquire(D, 5_000)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - started >= 300_000 / 200_000 - 0.25 - 0.025
    assert lim.stats()[D].bytes == 300_000 and lim.stats()[D].requests == 60
