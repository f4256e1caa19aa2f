"""An owner whose faults a test injects, through the seeded fault wrappers only.

``faulty_owner(env)`` starts the next epoch on ``env``'s binding and store, each seen
through its fault wrapper (``FaultyChunkStorage``, ``FaultyMetadataStore``): the process
in which the test makes calls fail, pauses a call (``before``) or dies (``kill`` both).
``env.open()`` or ``env.reopen()`` afterwards is another process on the same data.
"""

from __future__ import annotations

from slts.bindings.faulty import FaultyChunkStorage

from slts.config import StorageConfig
from slts.metadata.faulty_store import FaultyMetadataStore
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env


def faulty_owner(
    env: Env, seed: int = 0, **config: object
) -> tuple[ChunkedSegmentStorage, FaultyChunkStorage, FaultyMetadataStore]:
    """A new owner on ``env`` through seeded fault wrappers (no rule set yet), with
    ``env.open``'s defaults (no background threads); closed with ``env``."""
    binding = FaultyChunkStorage(env.binding, seed)
    store = FaultyMetadataStore(env.store, seed)
    defaults = {"gc_delay_s": 10.0, "gc_interval_s": 0.0, "metadata_log_flush_interval_s": 0.0}
    settings = StorageConfig(**{**defaults, **config})  # type: ignore[arg-type]
    storage = ChunkedSegmentStorage(0, None, binding, store, settings, clock=env.clock)
    env.instances.append(storage)
    return storage, binding, store


def die(binding: FaultyChunkStorage, store: FaultyMetadataStore) -> None:
    """The process of ``faulty_owner`` dies: every later call of its binding and store fails."""
    binding.kill()
    store.kill()
