"""A fetch with the leader-epoch cache never returns another leader's batches: after an
unclean election truncated the log inside a remote segment, the segment's batches past
the truncation were written by the old leader (found by ``slts simulate``'s remote room)."""

from __future__ import annotations

from pathlib import Path

import pytest
from slts.tools.kafka_logs import decode_records

from slts.errors import RemoteOffsetOutOfRange
from slts.remote.lineage import LeaderEpochCache
from slts.remote.manager import RemoteLogManager
from tests.remote.test_remote_log import TP, make_partition
from tests.support.engine import Env, env_fixture

env = env_fixture([("filesystem", "lmdb")])


def test_a_fetch_stops_where_an_unclean_election_cut_the_lineage(env: Env, tmp_path: Path) -> None:
    """One remote segment: epoch 0 at offsets 0..14, epoch 1 at 15..29. A new leader
    (epoch 2) took over with its log truncated at 15: in its lineage, 15..29 are other
    bytes. A fetch from 0 with its cache and any budget returns the batches up to 14 and
    says to continue at 15; a fetch at 15..29 finds nothing of the lineage."""
    partition = make_partition(tmp_path / "payments-7", [10], epochs_every=5)
    manager = RemoteLogManager(env.open())
    manager.copy_rolled_segments(TP, partition.local())
    assert manager.rlmm.highest_offset(TP) == 29
    lineage = LeaderEpochCache.of([(0, 0), (2, 15)])

    for start in (0, 7, 12):
        result = manager.fetch(TP, start, 1 << 20, leader_epochs=lineage)
        records = decode_records(result.records)
        assert result.next_offset == 15 and records[-1][0] == 14, "batches of epoch 1 were returned"
        assert records == [r for r in partition.records() if r[0] < 15 and r[0] >= records[0][0]]
    for offset in (15, 20, 29):
        with pytest.raises(RemoteOffsetOutOfRange):
            manager.fetch(TP, offset, 1 << 20, leader_epochs=lineage)
    # The old leader's own lineage (and a fetch without a cache) still reads everything.
    old = LeaderEpochCache.of([(0, 0), (1, 15)])
    assert manager.fetch(TP, 0, 1 << 20, leader_epochs=old).next_offset == 30
    assert manager.fetch(TP, 0, 1 << 20).next_offset == 30
