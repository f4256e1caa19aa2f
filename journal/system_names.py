"""Names of a container's system objects on the chunk storage (DESIGN.md §6).

Everything lives under ``<container>/_system/`` (a prefix user segments cannot have):

* journal files ``<c>/_system/journal/E<epoch>.F<file>``
* journal snapshots ``<c>/_system/journal-snapshots/E<epoch>.S<number>``
* checkpoints (snapshot-info records) ``<c>/_system/checkpoints/E<epoch>.C<number>.A<attempt>``
* chunks of the system segments ``<c>/_system/<segment>/E<epoch>.O<offset>.<random>``
  (leaf from ``slts.chunk_names.chunk_leaf``, like every chunk);
* the store's identity ``<c>/_system/identity`` (``slts.journal.identity``).

Numbers are zero-padded to 10 digits so that a listing in name order is also numeric
order, but readers parse the numbers and never rely on that. Every name carries the
container, the epoch of the writer and an increasing number, so two instances never
write the same name (PDP-34 "Key assumptions").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slts.chunk_names import chunk_leaf

SYSTEM_DIR = "_system"
METADATA_LOG = f"{SYSTEM_DIR}/metadata-log"
METADATA_SNAPSHOTS = f"{SYSTEM_DIR}/metadata-snapshots"
#: The system segments of a container, in the order boot reports them.
SYSTEM_SEGMENTS = (METADATA_LOG, METADATA_SNAPSHOTS)

_JOURNAL = "journal"
_SNAPSHOTS = "journal-snapshots"
_CHECKPOINTS = "checkpoints"


def system_prefix(container_id: int) -> str:
    """Every system object of the container starts with this."""
    return f"{container_id}/{SYSTEM_DIR}/"


def identity_object(container_id: int) -> str:
    """The object holding the store's identity on the chunk storage."""
    return f"{system_prefix(container_id)}identity"


def journal_prefix(container_id: int) -> str:
    return f"{system_prefix(container_id)}{_JOURNAL}/"


def snapshots_prefix(container_id: int) -> str:
    return f"{system_prefix(container_id)}{_SNAPSHOTS}/"


def checkpoints_prefix(container_id: int) -> str:
    return f"{system_prefix(container_id)}{_CHECKPOINTS}/"


def segment_chunks_prefix(container_id: int, segment: str) -> str:
    """Every chunk of system segment ``segment`` starts with this."""
    return f"{container_id}/{segment}/"


def system_chunk(container_id: int, segment: str, epoch: int, offset: int) -> str:
    """A new unique chunk name for system segment ``segment`` starting at ``offset``."""
    return f"{segment_chunks_prefix(container_id, segment)}{chunk_leaf(epoch, offset)}"


def journal_file(container_id: int, epoch: int, number: int) -> str:
    return f"{journal_prefix(container_id)}E{epoch:010d}.F{number:010d}"


def journal_snapshot(container_id: int, epoch: int, number: int) -> str:
    return f"{snapshots_prefix(container_id)}E{epoch:010d}.S{number:010d}"


def checkpoint(container_id: int, epoch: int, number: int, attempt: int) -> str:
    return f"{checkpoints_prefix(container_id)}E{epoch:010d}.C{number:010d}.A{attempt}"


@dataclass(frozen=True, slots=True, order=True)
class Numbered:
    """A parsed system object name: sorts by (epoch, number, attempt)."""

    epoch: int
    number: int
    attempt: int
    name: str


_JOURNAL_LEAF = re.compile(r"E(?P<epoch>[0-9]+)\.F(?P<number>[0-9]+)")
_SNAPSHOT_LEAF = re.compile(r"E(?P<epoch>[0-9]+)\.S(?P<number>[0-9]+)")
_CHECKPOINT_LEAF = re.compile(r"E(?P<epoch>[0-9]+)\.C(?P<number>[0-9]+)\.A(?P<attempt>[0-9]+)")


def parse(name: str, prefix: str, pattern: re.Pattern[str]) -> Numbered | None:
    """The numbers in ``name`` if it is ``prefix`` + a leaf matching ``pattern``."""
    if not name.startswith(prefix):
        return None
    match = pattern.fullmatch(name[len(prefix) :])
    if match is None:
        return None
    attempt = int(match["attempt"]) if "attempt" in match.groupdict() else 0
    return Numbered(int(match["epoch"]), int(match["number"]), attempt, name)


def parse_journal_file(container_id: int, name: str) -> Numbered | None:
    return parse(name, journal_prefix(container_id), _JOURNAL_LEAF)


def parse_journal_snapshot(container_id: int, name: str) -> Numbered | None:
    return parse(name, snapshots_prefix(container_id), _SNAPSHOT_LEAF)


def parse_checkpoint(container_id: int, name: str) -> Numbered | None:
    return parse(name, checkpoints_prefix(container_id), _CHECKPOINT_LEAF)
