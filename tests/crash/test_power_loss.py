"""A modelled power loss in the middle of concurrent durable writes (docs/architecture.md,
"Why an acknowledged write survives a power loss").

The chunk storage side: ``FaultyChunkStorage.lose_power()`` keeps only what the calls that
returned wrote, plus torn prefixes of the calls still running (the page cache of files
whose ``fdatasync`` had not returned, dropped). The metadata side: the commits up to the
newest one whose ``commit`` had returned (durability is a prefix: a sync makes every
earlier commit durable), rebuilt from the captured change log. A new owner starts on
what is left: every write acknowledged before the power went must read back exactly,
each segment must hold a prefix of its writer's writes (nothing torn, nothing foreign),
and the container must verify clean. A store that committed a layout before its data
was durable, or acknowledged a commit before it was, fails this test.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

import pytest
from slts.bindings.faulty import FaultyChunkStorage
from slts.bindings.memory import MemoryChunkStorage

from slts.admin.verify import verify_container
from slts.config import StorageConfig
from slts.errors import SltsError
from slts.metadata.delegating import DelegatingStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.metadata.store import Expect, Operation
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import NoAppendMemoryChunkStorage

WRITERS = 4
SEGMENTS_PER_WRITER = 3
WAIT_S = 60.0


class AcknowledgedCommits(DelegatingStore):
    """Records the newest sequence whose ``commit`` returned, until the power goes."""

    def __init__(self, inner: MemoryMetadataStore) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.newest = 0
        self.powered = True

    def commit(self, ops: Sequence[Operation], expect: Sequence[Expect] = ()) -> int:
        if not self.powered:
            raise SltsError("no power")
        sequence = self.inner.commit(ops, expect)
        with self._lock:
            if not self.powered:
                raise SltsError("no power")  # it never returned: not known durable
            self.newest = max(self.newest, sequence)
        return sequence

    def lose_power(self) -> MemoryMetadataStore:
        """What survives: the commits through the newest acknowledged one."""
        with self._lock:
            self.powered = False
            through = self.newest
        survivor = MemoryMetadataStore(TABLES)
        for change in self.inner.changes(0, limit=1_000_000):
            if change.sequence <= through:
                survivor.replicate(change.sequence, change.ops)
        return survivor


def _image_binding(image: dict[str, bytes], kind: type[MemoryChunkStorage]) -> MemoryChunkStorage:
    binding = kind("memory://after-power-loss")
    for name, data in image.items():
        binding.create(name, data)
    return binding


@pytest.mark.parametrize(
    "kind", [MemoryChunkStorage, NoAppendMemoryChunkStorage], ids=["append", "object-store"]
)
@pytest.mark.parametrize("seed", range(6))
def test_acknowledged_writes_survive_a_power_loss(seed: int, kind: type[MemoryChunkStorage]) -> None:
    """On an object store every write creates a chunk under an intent registered by the
    previous write's commit (``slts.storage.ahead_intents``)."""
    rng = random.Random(seed)
    chunks = FaultyChunkStorage(kind("memory://power"), seed=seed)
    inner = MemoryMetadataStore(TABLES)
    inner.enable_change_capture()  # the model rebuilds the durable prefix from it
    store = AcknowledgedCommits(inner)
    config = StorageConfig(
        journal=False,  # its metadata copy would discard the changes the model replays
        gc_interval_s=0.0,
        usage_flush_interval_s=0.0,
        metadata_log_flush_interval_s=0.0,
        rolling_length_bytes_default=rng.choice([300, 4096]),  # appends and new chunks both
    )
    storage = ChunkedSegmentStorage(0, None, chunks, store, config)
    names = [f"w{w}/s{s}" for w in range(WRITERS) for s in range(SEGMENTS_PER_WRITER)]
    for name in names:
        storage.create(name)
    planned = {name: [rng.randbytes(rng.randrange(1, 700)) for _ in range(40)] for name in names}
    acknowledged = {name: 0 for name in names}  # writes returned, per segment
    enough = threading.Event()
    writes_before_loss = rng.randrange(20, 120)
    done = 0
    counting = threading.Lock()

    def writer(w: int) -> None:
        nonlocal done
        mine = [name for name in names if name.startswith(f"w{w}/")]
        handles = {name: storage.open_write(name) for name in mine}
        offsets = dict.fromkeys(mine, 0)
        for step in range(40):
            for name in mine:
                data = planned[name][step]
                try:
                    storage.write(handles[name], offsets[name], data)
                except SltsError:
                    return  # the power went
                offsets[name] += len(data)
                acknowledged[name] = step + 1
                with counting:
                    done += 1
                    if done >= writes_before_loss:
                        enough.set()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    assert enough.wait(WAIT_S)
    image = chunks.lose_power()  # the chunk storage first: a store ahead of its data is the fault sought
    survivor = store.lose_power()
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive()
    seen = dict(acknowledged)  # every write acknowledged before the power went

    after = ChunkedSegmentStorage(0, None, _image_binding(image, kind), survivor, config)
    try:
        for name in names:
            info = after.info(name)
            content = after.read(after.open_read(name), 0, info.length) if info.length else b""
            writes = planned[name]
            prefix = b"".join(writes[: seen[name]])
            assert content.startswith(prefix), f"{name}: an acknowledged write was lost or damaged"
            boundaries = {len(b"".join(writes[:n])) for n in range(len(writes) + 1)}
            assert len(content) in boundaries, f"{name}: holds part of a write"
            assert content == b"".join(writes)[: len(content)], f"{name}: holds bytes never written"
        assert verify_container(after).problems == []
    finally:
        after.close()
