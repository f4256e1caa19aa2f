"""The engine's side of client-side transforms (docs/security.md): what a write stores
of its bytes, and what a read decodes, for chunks of frames (``slts.transforms``).

``ChunkTransforms`` is built once per instance from its config and key ring. A write with
transforms on encodes each of its pieces: a new chunk gets a fresh data key (wrapped by the
key ring's active key, recorded with the chunk it was made for) and frames from ordinal 0;
an append continues the chunk's frames under the chunk's own key. A read maps its range to
the frames it overlaps, fetches their stored bytes, and decodes them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import crc32c

from slts.config import StorageConfig
from slts.errors import ChunkCorrupted, InvalidConfig, KeyUnavailable
from slts.metadata.records import ChunkRecord
from slts.transforms.frames import Codec, FrameMap, TransformConfig
from slts.transforms.keys import DataKey, KeyRing, WrappedKey
from slts.transforms.sealed import RecordSeal

#: A wrapped data key as a chunk record keeps it: (key id, blob, the chunk it was made for).
StoredKey = tuple[str, bytes, str]


@dataclass(frozen=True, slots=True)
class Encoded:
    """What a write stores of a piece of its bytes, and the chunk record's fields after it."""

    stored: bytes
    frames: bytes
    stored_length: int
    data_keys: tuple[StoredKey, ...] | None
    checksum: int | None


@functools.lru_cache(maxsize=4096)
def frame_map(packed: bytes) -> FrameMap:
    """The frame map a chunk record holds, unpacked once per distinct map."""
    return FrameMap.unpack(packed)


class ChunkTransforms:
    """Encode and decode chunks of frames for one instance. Thread-safe."""

    def __init__(self, config: StorageConfig, key_ring: KeyRing | None) -> None:
        """``InvalidConfig`` if encryption is on without a key ring (or the ring has no
        active key), or if the transforms' extra is not installed."""
        self.config = TransformConfig(
            compression_level=config.compression_level or None,
            encrypt=config.encryption,
            frame_bytes=config.frame_bytes,
            skip_compressed=config.compression_skips_compressed,
        )
        self.key_ring = key_ring
        if self.config.encrypt:
            if key_ring is None:
                raise InvalidConfig("encryption is on: open the store with a key ring (slts keys create)")
            key_ring.active_id()  # InvalidConfig now rather than at the first write
        self._codec = Codec(self.config)
        #: Seals the records of the metadata's copy on tier-2 and of the system journal
        #: with encryption on, and opens sealed ones with a key ring (None: no key ring).
        self.record_seal = RecordSeal(key_ring, sealing=self.config.encrypt) if key_ring is not None else None
        self._keys: dict[tuple[object, object], DataKey] = {}  # (key id, wrapped blob) -> key
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether new chunks are transformed."""
        return self.config.active

    def appendable(self, chunk: ChunkRecord) -> bool:
        """Whether a write may append to ``chunk`` under today's transforms: a plain chunk
        with transforms off; a transformed one with transforms on, encrypted alike, holding
        frames under one data key made for it alone (so the next ordinal is fresh under
        that key: docs/security.md, "Nonces never repeat under a key"). O(1): such a chunk
        was made by ``encode_new`` and grown by ``encode_append`` only, so its ordinals run
        from 0 by construction."""
        if not chunk.transformed:
            return not self.active
        if not self.active:
            return False
        keys = chunk.data_keys or ()
        if self.config.encrypt != bool(keys):
            return False
        return not keys or (len(keys) == 1 and keys[0][2] == chunk.name)

    def encode_new(self, name: str, data: bytes) -> Encoded:
        """``data`` as the stored bytes of new chunk ``name`` (a fresh data key)."""
        keys: tuple[StoredKey, ...] | None = None
        key: DataKey | None = None
        if self.config.encrypt:
            assert self.key_ring is not None
            key = DataKey.generate()
            wrapped = self.key_ring.wrap(key)
            keys = ((wrapped.key_id, wrapped.blob, name),)
        stored, frames = self._codec.encode(data, key, 0, 0)
        return Encoded(stored, FrameMap(frames).pack(), len(stored), keys, crc32c.crc32c(stored))

    def encode_append(self, chunk: ChunkRecord, data: bytes) -> Encoded:
        """``data`` as frames appended to ``chunk`` (``appendable``), under its key."""
        assert chunk.transformed and self.appendable(chunk), chunk
        before = frame_map(chunk.frames or b"")
        key = self._key(chunk, 0) if chunk.data_keys else None
        stored, frames = self._codec.encode(data, key, 0, len(before))
        # The map grows by a run (runs need not be maximal): no repacking of the frames before.
        return Encoded(
            stored,
            (chunk.frames or b"") + FrameMap(frames).pack(),
            chunk.stored + len(stored),
            tuple(tuple(key) for key in chunk.data_keys) if chunk.data_keys else None,  # type: ignore[misc]
            crc32c.crc32c(stored, chunk.checksum) if chunk.checksum is not None else None,
        )

    def decode(
        self,
        chunk: str,
        packed: bytes,
        data_keys: Sequence[Sequence[object]] | None,
        offset: int,
        length: int,
        fetch: Callable[[int, int], bytes | memoryview],
        run: Callable[[Sequence[Callable[[], None]]], None] | None = None,
        parts: int = 1,
    ) -> bytes:
        """Bytes ``[offset, offset+length)`` of transformed chunk ``chunk`` (its frame map
        ``packed`` and ``data_keys``): the frames they overlap are fetched (``fetch(stored
        offset, stored length)``) and decoded, in up to ``parts`` runs given to ``run``
        (``Codec.decode``). ``ChunkCorrupted``, ``KeyUnavailable``."""
        frames = frame_map(packed)
        if offset + length > frames.logical_length:
            raise ChunkCorrupted(
                f"chunk {chunk!r}: its frames hold {frames.logical_length} bytes, not {offset + length}",
                chunk=chunk,
            )
        if not length:
            return b""
        first, end = frames.span(offset, length)
        start, stop = frames.stored_start(first), frames.stored_start(end)
        stored = fetch(start, stop - start)
        span = [frames[i] for i in range(first, end)]
        needed = {frame.key_index for frame in span if frame.encrypted}  # a defrag's chunk has many
        keys = [self._unwrap(key) if i in needed else None for i, key in enumerate(data_keys or ())]
        cut = offset - frames.logical_start(first)
        return self._codec.decode(
            stored, span, keys, chunk=chunk, stored_offset=start, cut=cut, length=length, run=run, parts=parts
        )

    def _key(self, chunk: ChunkRecord, index: int) -> DataKey:
        assert chunk.data_keys is not None
        return self._unwrap(chunk.data_keys[index])

    def _unwrap(self, stored: Sequence[object]) -> DataKey:
        """The data key a record stores wrapped as ``[key_id, blob]``: unwrapped by the
        ring once, then found by the pair (a read unwraps the keys of its frames)."""
        pair = (stored[0], stored[1])
        key = self._keys.get(pair)  # a dict lookup is atomic; additions take the lock
        if key is None:
            key_id = pair[0]
            if self.key_ring is None:
                raise KeyUnavailable(
                    f"the data is encrypted under key {key_id!r}: open the store with its key ring",
                    key_id=key_id,
                )
            key = self.key_ring.unwrap(WrappedKey(key_id, pair[1]))  # type: ignore[arg-type]
            with self._lock:
                self._keys[pair] = key
        return key
