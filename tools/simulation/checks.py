"""The invariants a simulated run checks, and the leak check.

After every step (faults off):

* ``content``: the engine lists exactly the model's segments, and each one's start,
  length, sealed flag and readable bytes are the model's;
* ``verify``: ``verify_container`` finds no problem (every segment's list, records and
  index agree; every chunk on storage is referenced, awaited by a tombstone or queued
  for GC; the tier-2 copy of the metadata restores); a report whose only problems are
  system chunks no journal state references is its own kind, ``verify_system_chunk_leak``;
* ``leak``: ``find_leaks`` finds nothing: no index entry, chunk record or GC entry that
  nothing can reach.

* ``nonce_reuse`` (``NonceLedger``, a store with encryption on): no two different frames
  were ever stored under one data key and ordinal (GCM's nonce) in the run, counting
  frames whose chunks are gone since (docs/security.md, "Nonces never repeat under a key").

After a full GC past its delay (and the batch lease): ``exact``: the chunk storage holds
exactly the chunks the live segments reference, the GC queue and the tombstones are
empty and every chunk record belongs to a live segment.
"""

from __future__ import annotations

import hashlib
from typing import Any

from slts.journal.system_names import system_prefix

from slts.admin import verify as verify_module
from slts.errors import ChunkNotFound
from slts.metadata.records import ChunkRecord, GcEntry
from slts.metadata.schema import CHUNKS, DELETED, GC
from slts.metadata.store import scan_all
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.frames import FrameMap

from .model import State

#: The names of the remote room's segments (``slts.remote.rsm``) and of the offload room's
#: (``slts.offload.names``), left out of ``observe``: each room has its own oracle.
REMOTE_PREFIX = "remote/"
OFFLOAD_PREFIX = "offload/"
ROOM_PREFIXES = (REMOTE_PREFIX, OFFLOAD_PREFIX)


class Violation(Exception):
    """An invariant failed: ``kind`` names which (the soak counts by it)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail

    def __reduce__(self) -> tuple[type[Violation], tuple[str, str]]:
        return (Violation, (self.kind, self.detail))  # picklable: results cross processes (--jobs)


def find_leaks(storage: ChunkedSegmentStorage) -> list[str]:
    """Index entries and chunk records nothing reaches (empty: none): the library's leak
    check (``slts.storage.leaks``); overdue GC entries are left to ``check_exact``, since
    between steps GC may simply not have run."""
    return storage.check_leaks().problems(gc=False)


def observe(storage: ChunkedSegmentStorage) -> State:
    """Every live segment as ``storage`` reads it (``read_failed`` if it cannot)."""
    result: State = {}
    try:
        for name in storage.list():
            if name.startswith(ROOM_PREFIXES):
                continue  # the remote and offload rooms' segments: their own oracles
            info = storage.info(name)
            data = storage.read(storage.open_read(name), info.start_offset, info.length - info.start_offset)
            result[name] = (info.start_offset, info.length, info.sealed, data)
    except Exception as exc:
        raise Violation("read_failed", f"reading back the store raised {type(exc).__name__}: {exc}") from exc
    return result


def check_content(observed: State, expected: State) -> None:
    if observed != expected:
        for name in sorted(set(observed) | set(expected)):
            if observed.get(name) != expected.get(name):
                seen, want = observed.get(name), expected.get(name)
                raise Violation(
                    "content",
                    f"{name}: store {seen[:3] if seen else None}, model {want[:3] if want else None}"
                    + (" (same layout, different bytes)" if seen and want and seen[:3] == want[:3] else ""),
                )


def check_verify(storage: ChunkedSegmentStorage, segments: int) -> None:
    try:
        report = verify_module.verify_container(storage)
    except Exception as exc:
        raise Violation("verify", f"verify_container raised {type(exc).__name__}: {exc}") from exc
    if report.problems:
        system_only = all(
            "system chunk" in problem and "no journal state" in problem for problem in report.problems
        )
        raise Violation(
            "verify_system_chunk_leak" if system_only else "verify", "; ".join(report.problems[:3])
        )
    segments += sum(1 for name in storage.list() if name.startswith(ROOM_PREFIXES))
    if report.segments != segments:
        raise Violation("verify", f"verify saw {report.segments} segments, the model has {segments}")


def check_leaks(storage: ChunkedSegmentStorage) -> None:
    leaks = find_leaks(storage)
    if leaks:
        raise Violation("index_leak", "; ".join(leaks[:3]))


class NonceLedger:
    """Every (wrapped data key, ordinal) a frame of the run was stored under, with a digest
    of the frame's stored bytes: a second, different frame under a pair is nonce reuse.
    A chunk's frames are read once each (its record grows by appends: only new frames are
    read), so the ledger keeps what deleted chunks held."""

    def __init__(self) -> None:
        self._frames: dict[tuple[bytes, int], bytes] = {}
        self._read: dict[str, int] = {}  # chunk -> frames of it in the ledger

    def check(self, store: Any, binding: Any) -> None:
        """Add the frames of ``store``'s chunk records (their bytes read from ``binding``)."""
        with store.snapshot() as view:
            records = [stored.value for _, stored in scan_all(view, CHUNKS)]
        for value in records:
            chunk = ChunkRecord.decode(value)
            if not chunk.data_keys or not chunk.frames:
                continue
            frames = FrameMap.unpack(chunk.frames)
            first = self._read.get(chunk.name, 0)
            if first >= len(frames):
                continue
            try:
                handle = binding.open_read(chunk.name)
                base = frames.stored_start(first)
                stored = binding.read(handle, base, chunk.stored - base)
            except ChunkNotFound:
                continue  # verify reports a missing chunk
            for index in range(first, len(frames)):
                frame = frames[index]
                if not frame.encrypted:
                    continue
                at = frames.stored_start(index) - base
                pair = (bytes(chunk.data_keys[frame.key_index][1]), frame.ordinal)
                digest = hashlib.sha256(stored[at : at + frame.stored]).digest()
                if self._frames.setdefault(pair, digest) != digest:
                    raise Violation(
                        "nonce_reuse",
                        f"chunk {chunk.name!r} frame {index}: ordinal {frame.ordinal} under data key"
                        f" {frame.key_index} holds other bytes than a frame stored under them before",
                    )
            self._read[chunk.name] = len(frames)


def segment_chunks(storage: ChunkedSegmentStorage, binding: Any) -> set[str]:
    """The container's segment chunks on ``binding`` (system objects left out)."""
    system = system_prefix(storage.container_id)
    return {name for name in binding.list(f"{storage.container_id}/") if not name.startswith(system)}


def check_exact(storage: ChunkedSegmentStorage, binding: Any) -> None:
    """After a full GC: storage holds exactly the referenced chunks (see module doc)."""
    referenced = {chunk.name for name in storage.list() for _, chunk in storage.chunks(name)}
    on_storage = segment_chunks(storage, binding)
    if on_storage != referenced:
        raise Violation(
            "gc_not_exact",
            f"after GC: {len(on_storage - referenced)} chunks nothing references "
            f"{sorted(on_storage - referenced)[:3]}, {len(referenced - on_storage)} referenced missing "
            f"{sorted(referenced - on_storage)[:3]}",
        )
    dump = storage.context.store.dump()
    if dump[GC]:
        entries = [GcEntry.decode(s.value) for s in dump[GC].values()]
        raise Violation(
            "gc_not_exact", f"{len(entries)} GC entries left after everything was due: {entries[:2]}"
        )
    if dump[DELETED]:
        raise Violation(
            "gc_tombstone_stuck", f"{len(dump[DELETED])} tombstones left after everything was due"
        )
    records = {key.decode() for key in dump[CHUNKS]}
    if records != referenced:
        raise Violation(
            "leak_chunk_records", f"chunk records of no live segment: {sorted(records - referenced)[:3]}"
        )
