"""Frames: how a chunk's bytes are stored when transforms are on (docs/security.md).

A write's bytes are cut into frames of ``frame_bytes`` (the last one of a write may be
shorter: a frame ends where a write ends, so an append never rewrites stored bytes). Each
frame is decodable alone, so a read decodes only the frames it overlaps:

1. compressed with zstd, if compression is on, the write did not look compressed already
   (``compression.compressed_already``, or its first frame did not shrink) and the frame
   shrank to at most ``PAYS_BELOW`` of its size; else kept as it is;
2. encrypted with AES-256-GCM under the chunk's data key, if encryption is on: the stored
   frame is the ciphertext and its 16-byte tag. The nonce is the frame's *ordinal*, its
   position among the frames ever written to the chunk under that key (8 bytes, big-endian,
   after 4 zero bytes); the associated data binds the ordinal, the decoded length and the
   compression flag, so a frame that was changed, cut, moved or swapped for another fails
   its tag: ``ChunkCorrupted``, never wrong bytes. Unencrypted frames carry a CRC32C of their
   stored bytes instead.

Nonces never repeat under a key: a data key belongs to one chunk, only the instance that
created the chunk appends to it, ordinals only grow, and an instance stops appending to a
chunk after any append that failed (its stored bytes past the recorded ones are then
unknown; see ``ChunkedSegmentStorage._appendable``). Concat and defrag move stored frames
without decoding them, so a chunk made by defrag holds frames under several data keys:
each frame names its key by index into the chunk's list of wrapped keys.

The frame map (``FrameMap``) is in the chunk's record, packed compactly: runs of frames
with the same key and consecutive ordinals (16 bytes a run), then per frame its stored and
decoded lengths (8 bytes; 12 with the CRC32C of an unencrypted frame): about what the block
checksum list costs (8 bytes per 64 KiB block).
"""

from __future__ import annotations

import bisect
import functools
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from slts.buffers import filled_bytes
from slts.errors import ChunkCorrupted, InvalidArgument
from slts.transforms.compression import PAYS_BELOW, compressed_already
from slts.transforms.extras import require
from slts.transforms.keys import DataKey

#: Default frame: the checksum block's 64 KiB (a 4 KiB random read decodes one frame).
FRAME_BYTES_DEFAULT = 64 << 10
#: Largest frame (a frame's lengths are u31: the top bit of the stored length is a flag).
FRAME_BYTES_MAX = 64 << 20
#: zstd levels allowed (the library's range).
LEVELS = range(1, 23)
#: AES-GCM's tag, appended to every encrypted frame.
TAG_BYTES = 16
#: The key index of an unencrypted frame.
NO_KEY = 0xFFFF
#: Most data keys one chunk's frames may name.
KEYS_MAX = NO_KEY

_RUN = struct.Struct(">HHQI")  # key index, flags, first ordinal, frame count
_FRAME = struct.Struct(">II")  # stored length (top bit: compressed), decoded length
_CHECK = struct.Struct(">I")  # CRC32C of the stored bytes (unencrypted frames)
_AAD = struct.Struct(">QIB")  # ordinal, decoded length, compressed
_NONCE_PREFIX = bytes(4)
_COMPRESSED = 1 << 31
_RUN_CHECKED = 1  # flags: the run's frames carry a CRC32C (they are not encrypted)


@dataclass(frozen=True, slots=True)
class TransformConfig:
    """What transforms new writes get: zstd at ``compression_level`` (None: off), AES-256-GCM
    (``encrypt``), frames of ``frame_bytes``, and whether writes that look compressed
    already skip compression (``skip_compressed``)."""

    compression_level: int | None = None
    encrypt: bool = False
    frame_bytes: int = FRAME_BYTES_DEFAULT
    skip_compressed: bool = True

    def __post_init__(self) -> None:
        level = self.compression_level
        if level is not None and (
            isinstance(level, bool) or not isinstance(level, int) or level not in LEVELS
        ):
            raise InvalidArgument(f"compression_level is None (off) or a zstd level 1-22, got {level!r}")
        if not isinstance(self.encrypt, bool) or not isinstance(self.skip_compressed, bool):
            raise InvalidArgument("encrypt and skip_compressed are booleans")
        frame = self.frame_bytes
        if isinstance(frame, bool) or not isinstance(frame, int) or not 0 < frame <= FRAME_BYTES_MAX:
            raise InvalidArgument(f"frame_bytes is 1..{FRAME_BYTES_MAX}, got {frame!r}")

    @property
    def active(self) -> bool:
        """Whether any transform is on (else chunks are stored as written)."""
        return self.compression_level is not None or self.encrypt


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: its ``ordinal`` under its data key (``key_index`` into the chunk's keys,
    ``NO_KEY`` if not encrypted), the bytes it decodes to (``logical``) and stores
    (``stored``), whether it is ``compressed``, and the CRC32C of its stored bytes where it
    is not encrypted (``check``)."""

    ordinal: int
    logical: int
    stored: int
    compressed: bool
    key_index: int
    check: int | None

    @property
    def encrypted(self) -> bool:
        return self.key_index != NO_KEY


class FrameMap:
    """A chunk's frames, in stored order, with the offsets of each in the decoded bytes
    (``logical_length`` in all) and in the stored ones (``stored_length``)."""

    __slots__ = ("_frames", "_logical_ends", "_stored_ends")

    def __init__(self, frames: Sequence[Frame] = ()) -> None:
        self._frames = tuple(frames)
        logical, stored, logical_ends, stored_ends = 0, 0, [], []
        for frame in self._frames:
            logical += frame.logical
            stored += frame.stored
            logical_ends.append(logical)
            stored_ends.append(stored)
        self._logical_ends = logical_ends
        self._stored_ends = stored_ends

    def __len__(self) -> int:
        return len(self._frames)

    def __iter__(self) -> Iterator[Frame]:
        return iter(self._frames)

    def __getitem__(self, index: int) -> Frame:
        return self._frames[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FrameMap) and self._frames == other._frames

    def __hash__(self) -> int:
        return hash(self._frames)

    def __repr__(self) -> str:
        return f"FrameMap({len(self)} frames, {self.logical_length} bytes in {self.stored_length})"

    @property
    def logical_length(self) -> int:
        return self._logical_ends[-1] if self._frames else 0

    @property
    def stored_length(self) -> int:
        return self._stored_ends[-1] if self._frames else 0

    def then(self, frames: Sequence[Frame] | FrameMap, key_offset: int = 0) -> FrameMap:
        """This map followed by ``frames`` (an append, or the next chunk of a defrag, whose
        key indexes move up by ``key_offset``: its keys follow this chunk's)."""
        moved = frames if not key_offset else [_moved_keys(frame, key_offset) for frame in frames]
        return FrameMap([*self._frames, *moved])

    def span(self, offset: int, length: int) -> tuple[int, int]:
        """The frames ``[first, end)`` that hold decoded bytes ``[offset, offset+length)``
        (``length`` > 0, within the map)."""
        assert length > 0 and offset >= 0 and offset + length <= self.logical_length, (offset, length)
        first = bisect.bisect_right(self._logical_ends, offset)
        end = bisect.bisect_left(self._logical_ends, offset + length) + 1
        return first, end

    def logical_start(self, index: int) -> int:
        """Where frame ``index`` starts in the decoded bytes."""
        return self._logical_ends[index - 1] if index else 0

    def stored_start(self, index: int) -> int:
        """Where frame ``index`` starts in the stored bytes."""
        return self._stored_ends[index - 1] if index else 0

    def pack(self) -> bytes:
        """The map as stored in a chunk record (module doc)."""
        out = bytearray()
        frames = self._frames
        i = 0
        while i < len(frames):
            head = frames[i]
            j = i + 1
            while (
                j < len(frames)
                and frames[j].key_index == head.key_index
                and frames[j].ordinal == head.ordinal + (j - i)
            ):
                j += 1
            checked = not head.encrypted
            out += _RUN.pack(head.key_index, _RUN_CHECKED if checked else 0, head.ordinal, j - i)
            for frame in frames[i:j]:
                out += _FRAME.pack(frame.stored | (_COMPRESSED if frame.compressed else 0), frame.logical)
                if checked:
                    assert frame.check is not None
                    out += _CHECK.pack(frame.check)
            i = j
        return bytes(out)

    @classmethod
    def unpack(cls, data: bytes) -> FrameMap:
        """The inverse of ``pack``; ``InvalidArgument`` for bytes that are not a frame map."""
        if not isinstance(data, bytes):
            raise InvalidArgument(f"a frame map is bytes, got {type(data).__name__}")
        frames: list[Frame] = []
        at = 0
        try:
            while at < len(data):
                key_index, flags, ordinal, count = _RUN.unpack_from(data, at)
                at += _RUN.size
                checked = bool(flags & _RUN_CHECKED)
                if checked != (key_index == NO_KEY) or count == 0:
                    raise InvalidArgument(f"frame map: a run at byte {at - _RUN.size} is not well formed")
                for n in range(count):
                    stored, logical = _FRAME.unpack_from(data, at)
                    at += _FRAME.size
                    check = None
                    if checked:
                        (check,) = _CHECK.unpack_from(data, at)
                        at += _CHECK.size
                    frames.append(
                        Frame(
                            ordinal + n,
                            logical,
                            stored & ~_COMPRESSED,
                            bool(stored & _COMPRESSED),
                            key_index,
                            check,
                        )
                    )
        except struct.error:
            raise InvalidArgument(f"frame map: cut short at byte {at} of {len(data)}") from None
        return cls(frames)


def _moved_keys(frame: Frame, key_offset: int) -> Frame:
    if not frame.encrypted:
        return frame
    index = frame.key_index + key_offset
    if index >= KEYS_MAX:
        raise InvalidArgument(f"a chunk's frames may name at most {KEYS_MAX} data keys")
    return Frame(frame.ordinal, frame.logical, frame.stored, frame.compressed, index, frame.check)


#: Most ciphers a ``Codec`` keeps (one per data key it used; all dropped when full).
CIPHERS_KEPT_MAX = 1024


class Codec:
    """Encodes writes into frames and decodes frames back, for one ``TransformConfig``.
    Thread-safe (the zstd contexts are per call; the cipher objects are immutable)."""

    def __init__(self, config: TransformConfig) -> None:
        self.config = config
        self._zstd: Any = require("zstandard") if config.compression_level is not None else None
        # Decoding needs the cipher whatever the config says: a store's old chunks may be
        # encrypted where new writes are not (and the other way round).
        self._aead: Any = None
        self._invalid_tag: type[Exception] = _NeverRaised
        self._decrypts_into = False
        self._ciphers: dict[bytes, Any] = {}  # key material -> its cipher (``_aes``)
        self._scratches = threading.local()  # per thread: ``_scratch``
        if config.encrypt:
            self._load_cipher()

    def _load_cipher(self) -> None:
        self._aead = require("cryptography.hazmat.primitives.ciphers.aead")
        self._invalid_tag = require("cryptography.exceptions").InvalidTag
        self._decrypts_into = hasattr(self._aead.AESGCM, "decrypt_into")  # cryptography >= 44

    def encode(
        self, data: bytes | memoryview, key: DataKey | None, key_index: int, first_ordinal: int
    ) -> tuple[bytes, list[Frame]]:
        """``data`` as frames (module doc): their stored bytes, one after the other, and
        their entries, ordinals from ``first_ordinal``. ``key`` (at ``key_index`` among the chunk's keys) is
        required when encryption is on, refused when it is off."""
        config = self.config
        if config.encrypt != (key is not None):
            raise InvalidArgument("a data key is required exactly when encryption is on")
        if config.encrypt and not 0 <= key_index < KEYS_MAX:
            raise InvalidArgument(f"key_index is 0..{KEYS_MAX - 1}, got {key_index!r}")
        view = memoryview(data).cast("B")
        size = config.frame_bytes
        compress = config.compression_level is not None and not (
            config.skip_compressed and compressed_already(view)
        )
        compressor = self._zstd.ZstdCompressor(level=config.compression_level) if compress else None
        cipher = self._aes(key) if key is not None else None
        if cipher is not None and compressor is None and hasattr(cipher, "encrypt_into"):
            return self._sealed_in_place(view, cipher, key_index, first_ordinal)
        pieces: list[bytes] = []
        frames: list[Frame] = []
        for n, start in enumerate(range(0, len(view), size)):
            plain = view[start : start + size]
            body = bytes(plain)
            compressed = False
            if compressor is not None:
                packed = compressor.compress(body)
                if len(packed) <= PAYS_BELOW * len(body):
                    body, compressed = packed, True
                elif n == 0 and config.skip_compressed:
                    compressor = None  # the first frame did not shrink: the rest are not tried
            ordinal = first_ordinal + n
            if cipher is not None:
                aad = _AAD.pack(ordinal, len(plain), compressed)
                body = cipher.encrypt(_nonce(ordinal), body, aad)
                frames.append(Frame(ordinal, len(plain), len(body), compressed, key_index, None))
            else:
                frames.append(Frame(ordinal, len(plain), len(body), compressed, NO_KEY, crc32c.crc32c(body)))
            pieces.append(body)
        return b"".join(pieces), frames

    def _sealed_in_place(
        self, view: memoryview, cipher: Any, key_index: int, first_ordinal: int
    ) -> tuple[bytes, list[Frame]]:
        """``encode`` of frames encrypted, not compressed: every frame's size is known
        ahead, so they are sealed straight from the data into one piece of stored bytes
        (``slts.buffers.filled_bytes``; no copy of a frame before or after its cipher)."""
        size = self.config.frame_bytes
        starts = range(0, len(view), size)
        logical = [min(size, len(view) - start) for start in starts]
        frames = [
            Frame(first_ordinal + n, length, length + TAG_BYTES, False, key_index, None)
            for n, length in enumerate(logical)
        ]

        def fill(out: memoryview) -> None:
            at = 0
            for frame, start in zip(frames, starts, strict=True):
                aad = _AAD.pack(frame.ordinal, frame.logical, False)
                plain = view[start : start + frame.logical]
                cipher.encrypt_into(_nonce(frame.ordinal), plain, aad, out[at : at + frame.stored])
                at += frame.stored

        return filled_bytes(sum(frame.stored for frame in frames), fill), frames

    def decode(
        self,
        stored: bytes | memoryview,
        frames: Sequence[Frame],
        keys: Sequence[DataKey | None],
        *,
        chunk: str,
        stored_offset: int,
        cut: int = 0,
        length: int | None = None,
        run: Callable[[Sequence[Callable[[], None]]], None] | None = None,
        parts: int = 1,
    ) -> bytes:
        """The decoded bytes of ``frames``, consecutive in the stored bytes ``stored``
        (which start at ``stored_offset`` in chunk ``chunk``: for messages), from ``cut``
        on, ``length`` of them (default: to the end). Every frame the range overlaps is
        checked whole, also one it covers in part (frames passed beside them, outside the
        range, are not decoded). ``keys[i]`` is the chunk's data key ``i`` (None
        where it was not unwrapped: its frames cannot be decoded here). The result is
        decoded in place (``slts.buffers.filled_bytes``): frames inside the range straight
        into it, the (at most two) it cuts through into a frame's worth of scratch first.
        With ``run`` (runs tasks, perhaps at once, and raises the first failing one's error
        in their order; a thread pool) the frames are decoded in up to ``parts`` runs of
        consecutive frames, each into its own part of the result (the cipher releases the
        interpreter while it works).
        ``ChunkCorrupted`` for a frame that fails its tag or CRC32C, does not decompress,
        or decodes to another length."""
        view = memoryview(stored).cast("B")
        stop = None if length is None else cut + length
        wanted = []  # (frame, stored body, where, start and end in the result) of each frame it needs
        at = position = 0  # in the stored bytes, in the decoded frames
        for frame in frames:
            if position + frame.logical > cut and (stop is None or position < stop):
                body = view[at : at + frame.stored]  # (else outside: fetched only as a neighbour's)
                start = position - cut
                wanted.append((frame, body, stored_offset + at, start, start + frame.logical))
            at += frame.stored
            position += frame.logical
        if at != len(view):
            raise ChunkCorrupted(
                f"chunk {chunk!r}: {len(view)} stored bytes at {stored_offset} for frames of {at}",
                chunk=chunk,
                offset=stored_offset,
            )
        length = position - cut if length is None else length
        assert cut >= 0 and length >= 0 and cut + length <= position, (cut, length, position)
        ciphers: dict[int, Any] = {}

        if len(wanted) == 1 and (wanted[0][3] < 0 or wanted[0][4] > length):  # within one frame
            frame, body, where, start, _ = wanted[0]
            scratch = self._scratch(frame.logical)
            self._decode_frame(body, frame, keys, ciphers, scratch, chunk, where)
            return bytes(scratch[-start : length - start])

        def decode_into(out: memoryview, part: Sequence[tuple[Frame, memoryview, int, int, int]]) -> None:
            for frame, body, where, start, end in part:
                if start >= 0 and end <= length:
                    self._decode_frame(body, frame, keys, ciphers, out[start:end], chunk, where)
                    continue
                scratch = self._scratch(frame.logical)
                self._decode_frame(body, frame, keys, ciphers, scratch, chunk, where)
                low, high = max(start, 0), min(end, length)
                out[low:high] = scratch[low - start : high - start]

        def fill(out: memoryview) -> None:
            count = min(parts, len(wanted)) if run is not None else 1
            if count <= 1:
                decode_into(out, wanted)
                return
            size = -(-len(wanted) // count)
            assert run is not None
            parts_of = [wanted[i : i + size] for i in range(0, len(wanted), size)]
            run([functools.partial(decode_into, out, part) for part in parts_of])

        return filled_bytes(length, fill)

    def _scratch(self, size: int) -> memoryview:
        """This thread's scratch of ``size`` bytes (a frame a read cuts through is decoded
        there whole, then the part wanted copied out): kept, so a random read does not
        make and zero a frame's worth of memory each time."""
        buffer: bytearray | None = getattr(self._scratches, "buffer", None)
        if buffer is None or len(buffer) < size:
            buffer = self._scratches.buffer = bytearray(max(size, self.config.frame_bytes))
        return memoryview(buffer)[:size]

    def _decode_frame(
        self,
        body: memoryview,
        frame: Frame,
        keys: Sequence[DataKey | None],
        ciphers: dict[int, Any],
        target: memoryview,
        chunk: str,
        where: int,
    ) -> None:
        """Check and decode one frame's stored ``body`` into ``target`` (its logical size).
        Runs per frame of every decoded read: an encrypted, uncompressed frame is decrypted
        into place with no call but the cipher's."""
        index = frame.key_index
        if index != NO_KEY:
            cipher = ciphers.get(index) or ciphers.setdefault(index, self._cipher(keys, frame, chunk, where))
            nonce = _nonce(frame.ordinal)
            aad = _AAD.pack(frame.ordinal, frame.logical, frame.compressed)
            try:
                if self._decrypts_into and not frame.compressed and len(body) == len(target) + TAG_BYTES:
                    cipher.decrypt_into(nonce, body, aad, target)
                    return
                body = memoryview(cipher.decrypt(nonce, bytes(body), aad))  # (a cut frame fails here)
            except self._invalid_tag:
                raise ChunkCorrupted(
                    f"chunk {chunk!r}: the frame at {where} fails its authentication tag"
                    " (changed, cut, moved or not this chunk's)",
                    chunk=chunk,
                    offset=where,
                ) from None
        elif crc32c.crc32c(body) != frame.check:
            raise ChunkCorrupted(
                f"chunk {chunk!r}: the frame at {where} fails its CRC32C", chunk=chunk, offset=where
            )
        plain = _decompressed(body, frame, chunk, where) if frame.compressed else body
        if len(plain) != frame.logical:
            raise ChunkCorrupted(
                f"chunk {chunk!r}: the frame at {where} decodes to {len(plain)} bytes, not {frame.logical}",
                chunk=chunk,
                offset=where,
            )
        target[:] = plain

    def _cipher(self, keys: Sequence[DataKey | None], frame: Frame, chunk: str, where: int) -> Any:
        """The cipher of ``frame``'s data key (``ChunkCorrupted`` if the chunk has none)."""
        if self._aead is None:
            self._load_cipher()
        key = keys[frame.key_index] if frame.key_index < len(keys) else None
        if key is None:
            raise ChunkCorrupted(
                f"chunk {chunk!r}: a frame at {where} names data key {frame.key_index},"
                " which the chunk's record does not hold",
                chunk=chunk,
                offset=where,
            )
        return self._aes(key)

    def _aes(self, key: DataKey) -> Any:
        """The AES-GCM cipher of ``key``, made once per key (a random read decodes one
        frame: making the cipher would cost as much as decrypting it)."""
        cipher = self._ciphers.get(key.material)
        if cipher is None:
            if len(self._ciphers) >= CIPHERS_KEPT_MAX:
                self._ciphers.clear()
            cipher = self._ciphers[key.material] = self._aead.AESGCM(key.material)
        return cipher


def _nonce(ordinal: int) -> bytes:
    return _NONCE_PREFIX + ordinal.to_bytes(8, "big")


class _NeverRaised(Exception):
    """What ``Codec`` catches as a bad tag before it loaded the cipher."""


def _decompressed(body: memoryview, frame: Frame, chunk: str, where: int) -> bytes:
    zstd = require("zstandard")
    try:
        plain: bytes = zstd.ZstdDecompressor().decompress(body, max_output_size=frame.logical)
    except zstd.ZstdError as exc:
        raise ChunkCorrupted(
            f"chunk {chunk!r}: the frame at {where} does not decompress: {exc}", chunk=chunk, offset=where
        ) from None
    return plain
