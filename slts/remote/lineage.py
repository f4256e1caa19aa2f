"""A partition's leader-epoch lineage (Kafka's leader-epoch cache) and the rules that
decide which remote segments belong to it.

The engine that owns the local log keeps, per partition, the leader epochs it has seen
and the first offset written in each (the ``leader-epoch-checkpoint`` file). After an
unclean leader election the new leader's lineage differs from the old leader's: offsets
the old leader wrote in its epoch past the divergence point are not in the new lineage,
and remote segments holding them must be neither read nor counted, only deleted.

``LeaderEpochCache`` is an immutable view of that cache with the queries Kafka's
``LeaderEpochFileCache`` answers (same results for the same entries); the functions below
are the remote log manager's rules on top of it:

* ``filtered_epochs``: epochs that hold no record (the next epoch starts at the same
  offset) are left out of comparisons;
* ``segment_within_lineage``: whether a remote segment's epochs and offsets lie inside
  the lineage (its epochs are the lineage's, each epoch starts where the lineage says
  except the segment's first, and it ends before the next epoch and before the log end).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slts.errors import InvalidArgument
from slts.remote.records import EPOCH_MAX, OFFSET_MAX, RemoteLogSegmentMetadata

#: Kafka's "no epoch" (UNDEFINED_EPOCH) and "no offset" (UNDEFINED_EPOCH_OFFSET).
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@dataclass(frozen=True, slots=True)
class LeaderEpochCache:
    """Leader epoch -> the first offset written in it, ascending in both (Kafka's
    leader-epoch cache of one partition). Build with ``LeaderEpochCache.of(entries)``."""

    epochs: tuple[int, ...]
    starts: tuple[int, ...]

    @classmethod
    def of(cls, entries: Iterable[tuple[int, int]] | Mapping[int, int]) -> LeaderEpochCache:
        """The cache of ``entries`` ((epoch, start offset) pairs or a mapping). Raises
        ``InvalidArgument`` unless epochs and start offsets are integers in Kafka's ranges,
        epochs strictly ascending and start offsets ascending (as the checkpoint holds them)."""
        pairs = list(entries.items()) if isinstance(entries, Mapping) else list(entries)
        epochs: list[int] = []
        starts: list[int] = []
        for pair in pairs:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidArgument(f"leader epoch entry {pair!r} is not an (epoch, start offset) pair")
            epoch, start = pair
            for value, limit, what in ((epoch, EPOCH_MAX, "epoch"), (start, OFFSET_MAX, "start offset")):
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
                    raise InvalidArgument(f"leader epoch entry {pair!r}: {what} {value!r} is out of range")
            if epochs and (epoch <= epochs[-1] or start < starts[-1]):
                raise InvalidArgument(
                    f"leader epoch entries must ascend in epoch and start offset: {pairs!r}"
                )
            epochs.append(epoch)
            starts.append(start)
        return cls(tuple(epochs), tuple(starts))

    def __len__(self) -> int:
        return len(self.epochs)

    def entries(self) -> list[tuple[int, int]]:
        """Every (epoch, start offset), ascending."""
        return list(zip(self.epochs, self.starts, strict=True))

    def as_dict(self) -> dict[int, int]:
        """Epoch -> start offset (Kafka's ``epochWithOffsets``)."""
        return dict(zip(self.epochs, self.starts, strict=True))

    def earliest(self) -> tuple[int, int] | None:
        return (self.epochs[0], self.starts[0]) if self.epochs else None

    def latest(self) -> tuple[int, int] | None:
        return (self.epochs[-1], self.starts[-1]) if self.epochs else None

    def previous_entry(self, epoch: int) -> tuple[int, int] | None:
        """The entry of the greatest epoch below ``epoch``."""
        at = bisect.bisect_left(self.epochs, epoch)
        return (self.epochs[at - 1], self.starts[at - 1]) if at > 0 else None

    def next_epoch(self, epoch: int) -> int | None:
        """The smallest epoch above ``epoch``."""
        at = bisect.bisect_right(self.epochs, epoch)
        return self.epochs[at] if at < len(self.epochs) else None

    def start_of(self, epoch: int) -> int | None:
        at = bisect.bisect_left(self.epochs, epoch)
        return self.starts[at] if at < len(self.epochs) and self.epochs[at] == epoch else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch ``offset`` was written in: the last entry starting at or below it
        (None: below the first entry, or no entry). Where several epochs start at the
        same offset, the first of them (Kafka's rule)."""
        at = bisect.bisect_right(self.starts, offset)
        if at == 0:
            return None
        first_here = bisect.bisect_left(self.starts, offset)
        if first_here < len(self.starts) and self.starts[first_here] == offset:
            return self.epochs[first_here]
        return self.epochs[at - 1]

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) as Kafka's ``endOffsetFor``: for the latest epoch, the log
        end offset; else the largest epoch at or below ``epoch`` and the start of the next
        epoch above it; (-1, -1) for an undefined or too-large epoch."""
        if epoch == UNDEFINED_EPOCH or not self.epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self.epochs[-1]:
            return epoch, log_end_offset
        higher = bisect.bisect_right(self.epochs, epoch)
        if higher >= len(self.epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return epoch, self.starts[0]
        return self.epochs[higher - 1], self.starts[higher]

    def entries_in_range(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """The entries seen from ``[start_offset, end_offset)`` (Kafka's
        ``epochEntriesInRange``): entries starting at or after ``end_offset`` dropped; of
        those at or below ``start_offset`` (if >= 0) only the last is kept, moved to
        ``start_offset``."""
        entries = self.entries()
        if start_offset >= 0:
            below = [entry for entry in entries if entry[1] <= start_offset]
            if below:
                entries = [(below[-1][0], start_offset)] + [e for e in entries if e[1] > start_offset]
        if end_offset >= 0:
            entries = [entry for entry in entries if entry[1] < end_offset]
        return entries


def filtered_epochs(epochs: Mapping[int, int]) -> dict[int, int]:
    """``epochs`` (epoch -> start offset, ascending) without the epochs that hold no
    record: an epoch whose successor starts at the same offset (Kafka's
    ``buildFilteredLeaderEpochMap``)."""
    ordered = sorted(epochs.items())
    return {
        epoch: start
        for index, (epoch, start) in enumerate(ordered)
        if index + 1 == len(ordered) or ordered[index + 1][1] != start
    }


def segment_within_lineage(
    metadata: RemoteLogSegmentMetadata, log_end_offset: int, lineage: Mapping[int, int]
) -> bool:
    """Whether the remote segment ``metadata`` belongs to ``lineage`` (the partition's
    filtered leader epochs, ``filtered_epochs``) with the local log ending at
    ``log_end_offset`` (Kafka's ``isRemoteSegmentWithinLeaderEpochs``):

    * the segment's last epoch lies within the lineage's epochs;
    * from the segment's first epoch at or above the lineage's first, each of its epochs
      is in the lineage; that first one starts no earlier than the lineage says (unless it
      is the lineage's first epoch); every epoch but its last is followed by the same
      next epoch at the same offset as in the lineage; its end is before the lineage's
      next epoch after its last;
    * it ends before the log end offset.
    """
    if not lineage:
        return False
    ordered = sorted(lineage.items())
    lineage_epochs = [epoch for epoch, _ in ordered]
    segment = sorted(filtered_epochs(metadata.leader_epochs).items())
    last_epoch = segment[-1][0]
    if last_epoch < lineage_epochs[0] or last_epoch > lineage_epochs[-1]:
        return False
    first_valid = next((epoch for epoch, _ in segment if epoch >= lineage_epochs[0]), None)
    if first_valid is None:
        return False

    def higher(entries: list[tuple[int, int]], epoch: int) -> tuple[int, int] | None:
        at = bisect.bisect_right([e for e, _ in entries], epoch)
        return entries[at] if at < len(entries) else None

    for epoch, offset in segment:
        if epoch < first_valid:
            continue
        if epoch not in lineage:
            return False
        if epoch == first_valid and epoch != lineage_epochs[0] and offset < lineage[epoch]:
            return False
        if epoch == last_epoch:
            following = higher(ordered, epoch)
            if following is not None and metadata.end_offset > following[1] - 1:
                return False
        elif higher(ordered, epoch) != higher(segment, epoch):
            return False
    return metadata.end_offset < log_end_offset
