"""Configuration of a container instance: every limit named with its unit last.

``StorageConfig`` is frozen and checks itself (and the relations between its limits)
on construction; a bad value raises ``InvalidConfig`` naming the field.
``StorageConfig.from_mapping`` builds one from loose keyword/TOML/env values.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slts.errors import InvalidConfig

MiB = 1 << 20
#: Largest value of any integer setting (and of a segment's ``max_rolling_length``):
#: records store them as msgpack integers, and no size or count comes near it.
INTEGER_MAX = 1 << 62
#: The default size of the blocks a chunk's checksums cover (HDFS keeps one per 512 bytes).
CHECKSUM_BLOCK_BYTES_DEFAULT = 64 * 1024

#: Fields where 0 means "off" (or "no delay") rather than a bad value.
_ZERO_ALLOWED = (
    "combined_writes_linger_us",
    "gc_delay_s",
    "gc_interval_s",
    "metadata_log_flush_interval_s",
    "defrag_batch_lease_s",
    "usage_flush_interval_s",
    "read_ahead_bytes",
    "compression_level",
    "chunk_cache_bytes",
)
#: The zstd levels ``compression_level`` may name (0: off).
COMPRESSION_LEVEL_MAX = 22
#: Largest ``frame_bytes`` (a frame's lengths are 31-bit in the frame map).
FRAME_BYTES_MAX = 64 * 1024 * 1024

#: Environment variables ``SLTS_<FIELD>`` (upper case) override defaults.
ENV_PREFIX = "SLTS_"


#: The values of ``StorageConfig.combined_writes``.
COMBINED_WRITES = ("auto", "always", "off")

#: The longest ``StorageConfig.combined_writes_linger_us`` (a wait on every group's path).
COMBINED_WRITES_LINGER_US_MAX = 100_000


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """Limits and switches of ``ChunkedSegmentStorage``."""

    #: Default ``max_rolling_length`` of new segments: a chunk is not appended past it.
    rolling_length_bytes_default: int = 64 * MiB
    #: Largest single ``write``; bigger writes are rejected (they are held in memory).
    write_bytes_max: int = 256 * MiB
    #: Most new chunks one ``write`` may need (a write that would need more, for its
    #: size and the segment's ``max_rolling_length``, is rejected): bounds its commit.
    write_chunks_max: int = 10_000
    #: Small writes (below 256 KiB) that append all their bytes to their segment's last
    #: chunk, combined across writers: their data syncs issued together, one metadata
    #: commit for the group (docs/architecture.md, "Combined small writes"). ``auto``:
    #: while another write of the instance is in flight (the only one runs alone: it
    #: would be a group of its own); ``always``: a lone write too, as a group of one;
    #: ``off``: never. Anything else is ``InvalidConfig``.
    combined_writes: str = "auto"
    #: A group of combined writes waits up to this long for the writers the group before
    #: it answered to write again (a writer's loop does at once), so that groups hold every
    #: busy writer instead of alternating between two halves of them (docs/architecture.md,
    #: "Combined small writes"). 0: groups start at once.
    combined_writes_linger_us: int = 300
    #: Largest single ``read``.
    read_bytes_max: int = 256 * MiB
    #: Reads at least this large that span several chunks fetch chunks in parallel.
    read_parallel_bytes_min: int = 4 * MiB
    #: Threads for parallel ("burst mode") reads, and for read-ahead.
    read_threads: int = 8
    #: Most bytes an instance reads ahead, buffered or in flight, all segments together:
    #: once reads of a segment arrive in order (each starting where the one before ended),
    #: the chunk bytes that follow are fetched on ``read_threads`` threads while the caller
    #: consumes what it asked for (``slts.storage.read_ahead``). On by default on bindings
    #: with high-latency reads (S3, HDFS); elsewhere see ``read_ahead_low_latency``. 0: off.
    read_ahead_bytes: int = 32 * MiB
    #: Read-ahead fetches a chunk in ranged reads of this size (cut at its multiples
    #: within the chunk), in parallel: at most ``read_ahead_bytes``.
    read_ahead_part_bytes: int = 8 * MiB
    #: Read ahead also on bindings without high-latency reads (filesystem, memory); on a
    #: local file system the page cache reads ahead already.
    read_ahead_low_latency: bool = False
    #: ``read_view`` hands out views of the chunk file's own pages where the binding maps
    #: its files (filesystem: ``slts.bindings.mapped_reads``), checked like any read, with
    #: no copy. Off: views of bytes read by copy (a disk error under a mapped page, or a
    #: chunk file shortened behind SLTS's back, ends the process with SIGBUS instead of
    #: raising an error, as with the metadata's own mapped LMDB file).
    read_mapped: bool = True
    #: A folder on local disk for the chunk cache (``slts.bindings.chunk_cache``,
    #: docs/chunk_cache.md): chunk bytes read from a binding with high-latency reads (S3,
    #: HDFS) are kept there, checked by their own CRC32C, and served from there when read
    #: again, by every reader of the process. One process at a time per folder.
    chunk_cache_dir: str = ""
    #: Most bytes the chunk cache keeps on disk (its files' sizes, never exceeded); 0: no
    #: cache. Ignored, with a log line saying why, on bindings whose reads are local
    #: (filesystem, memory). Needs ``chunk_cache_dir``.
    chunk_cache_bytes: int = 0
    #: The chunk cache keeps each chunk in blocks of this size (a block holds one run of
    #: its bytes, cut at the block's bounds): the unit of eviction. Keep it a divisor of
    #: ``read_ahead_part_bytes``, so each part read ahead fills whole blocks.
    chunk_cache_block_bytes: int = 8 * MiB
    #: Threads that write the chunk cache's files, in the background: a read never waits
    #: for the cache to be filled.
    chunk_cache_fill_threads: int = 2
    #: Most bytes waiting to be written to the chunk cache, or being written; bytes read
    #: while this is full are not cached (the read is served all the same).
    chunk_cache_fill_bytes_max: int = 64 * MiB
    #: Write the chunk cache's files with ``O_DIRECT`` (where the folder's file system
    #: takes it): a fill then costs little CPU and leaves the page cache to what is read,
    #: but a file's first hit reads the disk, and hits of such files were measured slower
    #: than of files written through the page cache (docs/chunk_cache.md, "Fills").
    chunk_cache_direct_fills: bool = False
    #: Entries in the write-through metadata cache.
    metadata_cache_entries: int = 100_000
    #: Before the LMDB metadata file is mapped, walk it in a child process when it may
    #: have changed other than by LMDB since it was last known good (a copy, bytes changed
    #: in place, the first open after an OS crash), so that no damage to it can kill this
    #: process: damage raises ``MetadataCorrupted`` (docs/metadata.md). Off: only its
    #: meta pages are checked.
    metadata_check: bool = True
    #: Keep per-chunk CRC32C checksums in chunk records.
    checksums: bool = True
    #: Verify what every read returns: the CRC32C of each block it touches (chunks
    #: written before block checksums: the chunk's CRC32C when a read covers it whole).
    verify_checksums_on_read: bool = True
    #: Size of the blocks a write cuts for their checksums (``slts.storage.block_checksums``).
    checksum_block_bytes: int = CHECKSUM_BLOCK_BYTES_DEFAULT
    #: Client-side zstd compression of new chunks at this level (docs/security.md); 0: off.
    compression_level: int = 0
    #: Client-side encryption of new chunks (AES-256-GCM under data keys wrapped by the key
    #: ring the instance is opened with, docs/security.md).
    encryption: bool = False
    #: A transformed chunk's frame size: a read decodes only the frames it overlaps.
    frame_bytes: int = CHECKSUM_BLOCK_BYTES_DEFAULT
    #: Writes that look compressed already (a compressed Kafka batch, a compressed format's
    #: magic number, a first frame that did not shrink) are stored as they are.
    compression_skips_compressed: bool = True
    #: How long a chunk waits in the GC queue before it may be deleted.
    gc_delay_s: float = 60.0
    #: Most queue entries (or chunks of a deleted segment) one GC batch handles.
    gc_batch_max: int = 1000
    #: Most chunk deletes one GC batch has in flight at once (its own threads, for the
    #: batch only); 1 deletes in list order on the caller's thread.
    gc_delete_threads: int = 8
    #: Seconds between background GC passes; 0 turns the background worker off
    #: (``storage.gc.run_once()`` still works on demand).
    gc_interval_s: float = 30.0
    #: Seconds between additions of the container's chunk storage usage (requests by
    #: kind and bytes, per traffic class: what ``slts cost`` prices) to the metadata store;
    #: a killed process loses at most this much of it. 0: only when the instance closes.
    usage_flush_interval_s: float = 30.0
    #: How often a conflicting metadata commit is re-based and retried.
    commit_retries_max: int = 3
    #: Defrag merges runs of consecutive chunks each smaller than this.
    defrag_small_chunk_bytes: int = 8 * MiB
    #: Largest chunk defrag makes (also bounded by the segment's ``max_rolling_length``).
    defrag_run_bytes_max: int = 64 * MiB
    #: Most chunks one defrag run merges (bounds the commit).
    defrag_run_chunks_max: int = 1000
    #: The lease of a defrag batch run's GC intents: they are queued this far ahead of
    #: now, so the owner's GC leaves them alone for ``defrag_batch_lease_s + gc_delay_s``,
    #: and the driver renews the lease every third of it while the batch builds. So it
    #: bounds how long a driver may stall (not renewing) and how long the leftovers of a
    #: driver that died wait. A run whose intent was collected all the same is dropped
    #: and its chunk queued again (*expired*). 0: no lease, no renewal.
    defrag_batch_lease_s: float = 600.0
    #: After a concat, merge the chunks on both sides of the seam if both are small.
    concat_merge_seam: bool = True
    #: Keep the durable copy of the metadata on tier-2 (system journal, metadata log and
    #: snapshots, DESIGN.md §6). Off, only the local store holds the metadata.
    journal: bool = True
    #: Seconds between flushes of the metadata log to tier-2: the recovery point
    #: objective for the loss of the machine. 0 turns the background flusher off
    #: (``storage.durable.flush()`` still works; GC flushes before deleting).
    metadata_log_flush_interval_s: float = 1.0
    #: Most bytes of log records one flush appends at once.
    metadata_log_batch_bytes: int = 4 * MiB
    #: Take a metadata snapshot (and truncate the log) once the log holds this much.
    metadata_snapshot_log_bytes: int = 64 * MiB
    #: ... or once this long passed since the last snapshot (and the log is not empty).
    metadata_snapshot_interval_s: float = 3600.0
    #: The system journal takes a snapshot of the system segments' layout every this
    #: many records (PDP-34 default 100) ...
    journal_snapshot_records: int = 100
    #: ... or every this many seconds (PDP-34 default 5 minutes).
    journal_snapshot_interval_s: float = 300.0
    #: A new journal file is started once the active one holds this much.
    journal_file_bytes_max: int = 4 * MiB
    #: A system segment's chunk is not appended past this length.
    system_rolling_length_bytes: int = 64 * MiB

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check_field(field.name, getattr(self, field.name))
        if self.combined_writes not in COMBINED_WRITES:
            raise InvalidConfig(
                f"combined_writes must be one of {', '.join(COMBINED_WRITES)}, got {self.combined_writes!r}"
            )
        if self.combined_writes_linger_us > COMBINED_WRITES_LINGER_US_MAX:
            raise InvalidConfig(
                f"combined_writes_linger_us must be at most {COMBINED_WRITES_LINGER_US_MAX} "
                f"(a group's wait for returning writers), got {self.combined_writes_linger_us}"
            )
        if self.read_parallel_bytes_min > self.read_bytes_max:
            raise InvalidConfig("read_parallel_bytes_min must not exceed read_bytes_max")
        if self.chunk_cache_bytes:
            if not self.chunk_cache_dir:
                raise InvalidConfig("chunk_cache_bytes > 0 needs chunk_cache_dir (a folder on local disk)")
            if self.chunk_cache_bytes < 2 * self.chunk_cache_block_bytes:
                raise InvalidConfig(
                    f"chunk_cache_bytes ({self.chunk_cache_bytes}) must hold at least two blocks of "
                    f"chunk_cache_block_bytes ({self.chunk_cache_block_bytes}), or be 0 (off)"
                )
            if self.chunk_cache_fill_bytes_max < self.chunk_cache_block_bytes:
                raise InvalidConfig(
                    "chunk_cache_fill_bytes_max must be at least chunk_cache_block_bytes "
                    "(a block is written whole)"
                )
        if self.read_ahead_bytes and self.read_ahead_part_bytes > self.read_ahead_bytes:
            raise InvalidConfig(
                "read_ahead_part_bytes must not exceed read_ahead_bytes (0 turns read-ahead off)"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], env: Mapping[str, str] | None = None) -> StorageConfig:
        """Defaults, overridden by ``SLTS_*`` variables of ``env`` (default ``os.environ``),
        overridden by ``values``. Unknown keys raise ``InvalidConfig``."""
        env = os.environ if env is None else env
        fields = {field.name: field for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise InvalidConfig(f"unknown configuration keys: {', '.join(unknown)}")
        merged: dict[str, Any] = {}
        for name, field in fields.items():
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None:
                try:
                    merged[name] = parse_value(str(field.type), raw)
                except ValueError:
                    raise InvalidConfig(
                        f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {field.type}"
                    ) from None
        merged.update(values)
        return cls(**merged)


def check_field(name: str, value: Any) -> None:
    """``InvalidConfig`` naming ``name`` unless ``value`` is of the field's type and in its
    range (relations between fields are ``StorageConfig``'s own check)."""
    type_name = str(_FIELD_TYPES[name])
    if "str" in type_name:
        if not isinstance(value, str) or "\x00" in value:
            raise InvalidConfig(f"{name} must be a text without NUL, got {value!r}")
        return
    if "bool" in type_name:
        if not isinstance(value, bool):
            raise InvalidConfig(f"{name} must be true or false, got {value!r}")
        return
    kind: tuple[type, ...] = (int, float) if "float" in type_name else (int,)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise InvalidConfig(f"{name} must be a number, got {value!r}")
    assert isinstance(value, int | float)
    if value < 0 or (value == 0 and name not in _ZERO_ALLOWED):
        raise InvalidConfig(f"{name} must be > 0, got {value!r}")
    if not value <= INTEGER_MAX:  # also NaN
        raise InvalidConfig(f"{name} must be at most {INTEGER_MAX}, got {value!r}")
    if name == "checksum_block_bytes" and value >= 1 << 32:
        raise InvalidConfig(f"checksum_block_bytes must be below 2**32, got {value}")
    if name == "compression_level" and value > COMPRESSION_LEVEL_MAX:
        raise InvalidConfig(f"compression_level must be 0 (off) or a zstd level 1-22, got {value}")
    if name == "frame_bytes" and value > FRAME_BYTES_MAX:
        raise InvalidConfig(f"frame_bytes must be at most {FRAME_BYTES_MAX}, got {value}")


def parse_value(type_name: str, raw: str) -> Any:
    """The text ``raw`` (an environment variable's, a flag's) as a value of the field type
    ``type_name``; ``ValueError`` if it is not one."""
    if "str" in type_name:
        return raw
    if "bool" in type_name:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(raw)
    if "float" in type_name:
        return float(raw)
    return int(raw)


_FIELD_TYPES = {field.name: field.type for field in dataclasses.fields(StorageConfig)}
