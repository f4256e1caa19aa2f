"""The orphan reconciler finds what nothing accounts for, and only that."""

from __future__ import annotations

from slts.admin.orphans import reconcile
from slts.admin.verify import verify_container
from slts.storage.segment_names import chunk_epoch, chunk_name
from tests.support.engine import Env


def test_chunk_epoch_parses_engine_names_only() -> None:
    assert chunk_epoch(chunk_name(3, "a/b", 17, 99)) == 17
    assert chunk_epoch("3/a/b/not-ours") is None


def test_orphans_of_older_epochs_are_queued_and_collected(env: Env) -> None:
    old = env.open()
    old.create("s")
    handle = old.open_write("s")
    old.write(handle, 0, b"kept")
    leaked = chunk_name(0, "s", old.epoch, 4)
    env.binding.create(leaked, b"leaked by a crash between claim and delete")
    foreign = "0/s/handmade-file"
    env.binding.create(foreign, b"not ours")
    new = env.open()
    current = chunk_name(0, "s", new.epoch, 8)
    env.binding.create(current, b"a write of this epoch in flight")
    assert any("leak" in problem for problem in verify_container(new).problems)

    report = reconcile(new, dry_run=True)
    assert report.orphans == [leaked] and report.foreign == [foreign] and report.queued == 0
    assert env.binding.exists(leaked)

    report = reconcile(new)
    assert report.queued == 1
    env.clock.advance(100)
    while new.gc.run_once().progressed:
        pass
    assert not env.binding.exists(leaked)
    assert env.binding.exists(foreign) and env.binding.exists(current)
    assert new.read(new.open_read("s"), 0, 4) == b"kept"
    assert reconcile(new, dry_run=True).orphans == []
