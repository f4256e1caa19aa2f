"""A Spark defrag batch beside the container's live owner, a writer in another process.

The driver fences nobody: the writer keeps its epoch and keeps appending to the very
segments the batch merges (and creating new ones) for the whole run, and until its GC
has deleted some of the chunks the batch replaced (``GC_DELETED``); its cache learns the
new layout through its conflict handling and the stale-cache retry on reads. Every acknowledged write is then
readable byte-identical, to the writer itself and to the next owner, and nothing leaks.

The batches are of ``BATCH_RUNS`` runs so that each commits well within the writer's
``gc_delay_s`` (5 s): a run committed later than that is dropped, and its chunk leaks
(``test_findings.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from slts.admin.verify import verify_container
from slts.storage.batch_defrag import Executor

from .conftest import collect_garbage, defrag_with, file_locations, fragment, mismatched, open_owner

SEGMENTS, PIECES = 600, 4
BATCH_RUNS = 100
#: Chunks the writer's GC deletes before it stops. Not all of them: under a steady writer
#: every GC claim waits for a whole metadata-log flush (see the report), 5-10 a second.
GC_DELETED = 60
READY_S_MAX, STOP_S_MAX, GC_S_MAX = 60.0, 120.0, 60.0
#: Run as a script (it imports ``pieces`` from its own folder).
WRITER = str(Path(__file__).with_name("live_writer.py"))


class Child:
    """The writer process, its stdout lines collected by a thread as they come."""

    def __init__(self, *argv: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, WRITER, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith(("READY", "FENCED", "ERROR")):
                self.ready.set()
        self.ready.set()

    def acks(self) -> int:
        return sum(line.startswith("ACK ") for line in list(self.lines))

    def gc_deleted(self) -> int:
        return max([int(line.split()[1]) for line in list(self.lines) if line.startswith("GC ")], default=0)

    def finish(self, timeout: float) -> tuple[int, str]:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        finally:
            self._reader.join(10)
        assert self.process.stderr is not None
        return code, self.process.stderr.read()


def test_the_live_writer_keeps_writing_and_loses_nothing(tmp_path, spark: Executor) -> None:
    url, metadata = file_locations(tmp_path)
    names = [f"live/{i:04d}" for i in range(SEGMENTS)]
    written = fragment(url, metadata, names, PIECES)
    stop = tmp_path / "stop"
    child = Child(str(tmp_path), str(stop))
    try:
        assert child.ready.wait(READY_S_MAX) and child.lines[0].startswith("READY"), child.lines[:3]
        epoch = int(child.lines[0].split()[1])
        deadline = time.monotonic() + READY_S_MAX
        while child.acks() < 10 and child.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the writer is at work before the batch starts
        assert child.acks() >= 10, child.lines[-5:]
        acks_before = child.acks()
        report = defrag_with(spark, url, metadata, batch_runs=BATCH_RUNS)
        acks_during = child.acks() - acks_before
        replaced = report.chunks_before - report.chunks_after + report.runs_committed
        deadline = time.monotonic() + GC_S_MAX  # the writer goes on until its GC deleted them
        while (
            child.gc_deleted() < GC_DELETED and time.monotonic() < deadline and child.process.poll() is None
        ):
            time.sleep(0.1)
    finally:
        stop.touch()
    code, stderr = child.finish(STOP_S_MAX)
    assert code == 0, (code, child.lines[-5:], stderr[-3000:])

    # The batch: every run committed (the writer appends after the runs: no conflict drops one).
    assert report.runs_failed == report.runs_dropped == 0 and report.errors == [], report
    assert (
        report.runs_committed == report.runs_planned == SEGMENTS and report.batches == SEGMENTS // BATCH_RUNS
    )
    assert report.chunks_after < report.chunks_before
    assert acks_during >= 50, f"the writer wrote only {acks_during} times during the batch"

    # The writer: never fenced, same epoch, its own reads right during and after the batch.
    assert not any(line.startswith(("FENCED", "ERROR", "BADREAD")) for line in child.lines), child.lines[-5:]
    done = json.loads(child.lines[-1].removeprefix("DONE "))
    assert done["epoch"] == done["epoch_end"] == epoch and done["fenced"] is False and done["bad"] == []
    assert done["writes"] == sum(line.startswith("ACK write") for line in child.lines)
    assert done["gc_deleted"] >= GC_DELETED, "the writer's GC deleted replaced chunks while it ran"

    # Every acknowledged write, to the next owner: the lengths and bytes acknowledged.
    acked = dict(written.lengths)
    for line in child.lines:
        if line.startswith("ACK create "):
            acked[line.split()[2]] = 0
        elif line.startswith("ACK write "):
            _, _, name, end = line.split()
            acked[name] = int(end)
    assert len(acked) == SEGMENTS + done["creates"] and done["creates"] > 0
    with open_owner(url, metadata) as owner:
        assert owner.epoch == epoch + 1, "nobody but the writer and this owner started the container"
        assert sorted(owner.list()) == sorted(acked)
        assert mismatched(owner, acked) == []
        # The rest of the replaced chunks (the writer's last GC pass may end after its DONE line).
        assert done["gc_deleted"] + collect_garbage(owner) <= replaced
        assert verify_container(owner, checksums=True).problems == []
        assert mismatched(owner, acked) == []
