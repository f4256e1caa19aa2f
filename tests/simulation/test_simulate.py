"""``slts simulate``: the CI slice on fixed seeds, exact replay, and that it catches bugs.

The slice runs ``SEEDS`` x ``OPS`` (about 20 s on the 2-core machine). Violation kinds
the engine is known to have (each an item of issue 12 being fixed) are counted and the
run goes on (``KNOWN``); any other kind fails the test, with the command that replays
it. Each known kind also has a pinned seed whose test is a strict xfail: once the fix
lands, that test passes unexpectedly and fails the run, the reminder to drop the kind
from ``KNOWN`` (then ``slts simulate --seeds 1000 --ops 500`` must be clean).
"""

from __future__ import annotations

import pytest
from slts.errors import InvalidArgument
from slts.storage.chunked import ChunkedSegmentStorage
from slts.tools.cli import main
from slts.tools.simulation.runner import run_seed, shrink, soak

SEEDS = range(30)
OPS = 150

#: kind -> (a seed of the slice that shows it, what it is).
KNOWN = {
    "index_leak": (6, "index clearing over chains of concat targets / GC's batched walk (the lead's fix)"),
    "zombie_noop_acknowledged": (0, "a fenced instance reports success for no-op changes (issue 12)"),
    "error_after_effect:concat": (40, "concat raises after it took effect: the seam merge's commit failed (issue 12)"),
    "error_after_effect:truncate": (15, "truncate raises after its first batch commit moved the start"),
    "verify_system_chunk_leak": (11, "a failed metadata snapshot leaves a system chunk verify reports as a leak"),
    "unexpected_error:ChunkInvalidOffset": (107, "after a torn or lost append to a metadata-log chunk, every flush "
                                                 "appends at the recorded length of that chunk again"),
    "gc_errors": (90, "the same: GC's barrier flush fails, so GC never deletes again"),
}


def test_fixed_seeds_have_no_unknown_violation() -> None:
    summary = soak(SEEDS, OPS, ignore=KNOWN)
    replay = {kind: [f"slts simulate --seed {s} --ops {OPS}" for s in seeds]
              for kind, seeds in summary.violations.items()}  # fmt: skip
    assert summary.violations == {}, f"{summary.line()}\nreplay: {replay}"
    # The slice exercises what it claims to: faults of every kind, crashes, takeovers, restores.
    assert summary.operations >= len(SEEDS) * OPS * 0.9
    for kind in ("fail", "torn", "lost-reply", "latency", "commit-fail", "commit-lost-reply", "crash"):
        assert summary.faults[kind] > 0, f"no {kind} fault injected: {summary.line()}"
    for counter in ("crashes", "takeovers", "restores"):
        assert summary.counters[counter] > 0, summary.line()


@pytest.mark.parametrize("kind", sorted(KNOWN))
def test_known_violation_is_still_there(kind: str) -> None:
    """Strict xfail by design: when this passes, the bug is fixed; drop ``kind`` from KNOWN."""
    seed, reason = KNOWN[kind]
    result = run_seed(seed, OPS, ignore=[k for k in KNOWN if k != kind])
    if result.violation is not None and result.violation.kind == kind:
        pytest.xfail(f"seed {seed}: {reason}")
    assert result.violation is None, result.violation
    pytest.fail(f"seed {seed} no longer shows {kind}: the fix landed, remove {kind!r} from KNOWN")


def test_replay_is_exactly_deterministic() -> None:
    first = run_seed(3, OPS)
    second = run_seed(3, OPS)
    assert first.violation is None, first.violation
    assert first.lines == second.lines
    assert first.digest == second.digest
    assert (first.faults, first.counters) == (second.faults, second.counters)
    assert run_seed(4, OPS, ignore=KNOWN).digest != first.digest


def test_an_engine_bug_is_caught_and_shrunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that flips its last byte: the simulator reports a content violation."""
    write = ChunkedSegmentStorage.write

    def flipping(self: ChunkedSegmentStorage, handle, offset: int, data: bytes) -> None:  # type: ignore[no-untyped-def]
        if len(data) > 20:
            data = bytes(data[:-1]) + bytes([data[-1] ^ 1])
        write(self, handle, offset, data)

    monkeypatch.setattr(ChunkedSegmentStorage, "write", flipping)
    result = run_seed(3, OPS, ignore=KNOWN)
    assert result.violation is not None and result.violation.kind == "content", result.violation
    shrunk = shrink(3, result)
    assert shrunk.violation is not None and shrunk.violation.kind == "content"
    assert len(shrunk.lines) < len(result.lines)


def test_cli_soak_and_replay(capsys: pytest.CaptureFixture[str]) -> None:
    ignore = ["--ignore", *KNOWN]
    assert main(["simulate", "--seeds", "2", "--ops", "30", *ignore]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("simulate: seeds 2, operations ") and "violations 0" in line
    assert main(["simulate", "--seed", "6", "--ops", str(OPS)]) == 1
    out = capsys.readouterr().out
    assert "shrunk program" in out and "VIOLATION index_leak" in out, out


@pytest.mark.parametrize(("call", "what"), [
    (lambda: run_seed(-1, 10), "seed"),
    (lambda: run_seed(1, -5), "ops"),
    (lambda: run_seed(True, 5), "seed"),  # type: ignore[arg-type]
    (lambda: soak([1, "2"], 5), "seed"),  # type: ignore[list-item]
    (lambda: soak([1], 5, jobs=0), "jobs"),
])  # fmt: skip
def test_bad_arguments_raise_invalid_argument(call, what: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=what):
        call()


def test_cli_rejects_bad_counts(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--seeds", "0"], ["--ops", "-1"], ["--seed", "-3"], ["--jobs", "0"]):
        with pytest.raises(SystemExit) as exited:
            main(["simulate", *argv])
        assert exited.value.code == 2
    assert "must be" in capsys.readouterr().err


def test_no_thread_runs_during_a_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread schedule is no input of a run: GC, the log flusher, the lease renewal and
    the read pool never start (a thread start would surface as a violation)."""
    import threading

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError(f"thread {self.name!r} started during a simulation")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    result = run_seed(6, OPS, ignore=KNOWN)
    assert result.violation is None, result.violation
