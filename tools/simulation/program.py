"""Programs: lists of steps generated from the seed.

A ``Step`` is a kind and a salt. The kind says what to do; the salt seeds the step's own
``random.Random``, from which it draws its choices (which segment, how many bytes,
which faults) against the state it meets when it runs. So dropping steps from a program
leaves a valid program whose other steps still do much the same, which is what lets
the runner shrink a failing program.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: Step kinds and their weights in generated programs.
WEIGHTS: dict[str, int] = {
    "create": 6,
    "write": 20,
    "read": 8,
    "observe": 8,  # a read-only observer reads, walks, verifies or scrubs beside a change
    "seal": 3,
    "unseal": 1,
    "transaction": 6,  # create, write, seal, concat into a live segment
    "chain": 5,  # seal a former concat target and concat it into another segment
    "concat": 3,
    "truncate": 6,
    "delete": 4,
    "defrag": 4,
    "batch_defrag": 4,
    "gc": 4,
    "gc_full": 3,
    "snapshot": 2,
    "flush": 2,
    "restore": 1,
    "crash": 3,
    "zombie": 2,
    # the remote room (``remote_room``): a tiered Kafka log of one or two partitions
    "remote_produce": 6,
    "remote_copy": 3,
    "remote_fetch": 3,
    "remote_retention": 2,
    "remote_delete_partition": 1,  # mostly a cleanup run; now and then a deletion
    # the offload room (``offload_room``): Pulsar's ledger (PIP-17) and streaming (PIP-76) offload
    "offload_ledger": 2,
    "offload_stream_offer": 6,
    "offload_stream_flush": 2,
    "offload_stream_close": 2,
    "offload_read": 2,
    "offload_delete": 2,
    "offload_cleanup": 2,
}
KINDS = tuple(WEIGHTS)


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a program."""

    kind: str
    salt: int

    def __post_init__(self) -> None:
        assert self.kind in WEIGHTS, self.kind


def generate(rng: random.Random, ops: int) -> list[Step]:
    """A program of ``ops`` steps drawn from ``rng``."""
    assert ops >= 0, ops
    kinds = rng.choices(KINDS, weights=[WEIGHTS[k] for k in KINDS], k=ops)
    return [Step(kind, rng.getrandbits(48)) for kind in kinds]
