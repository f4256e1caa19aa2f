"""Frames: every transform round-trips, a read decodes only the frames it overlaps, the
frame map packs compactly and back, and a changed, cut, moved or swapped frame is
``ChunkCorrupted``, never wrong bytes. Nonces never repeat under a key."""

from __future__ import annotations

import json
import random
import struct
import threading
from collections.abc import Callable, Sequence

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from slts.errors import ChunkCorrupted, InvalidArgument, InvalidConfig
from slts.transforms.compression import compressed_already
from slts.transforms.frames import NO_KEY, TAG_BYTES, Codec, Frame, FrameMap, TransformConfig
from slts.transforms.keys import DataKey

CONFIGS = {
    "zstd": TransformConfig(compression_level=3, frame_bytes=1000),
    "aes": TransformConfig(encrypt=True, frame_bytes=1000),
    "zstd+aes": TransformConfig(compression_level=3, encrypt=True, frame_bytes=1000),
}


def json_like(size: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    lines = []
    while sum(map(len, lines)) < size:
        record = {
            "user": f"user-{rng.randrange(500)}",
            "action": rng.choice(["click", "view", "buy"]),
            "ts": 1_700_000_000 + rng.randrange(10**6),
            "page": f"/p/{rng.randrange(100)}",
        }
        lines.append(json.dumps(record).encode() + b"\n")
    return b"".join(lines)[:size]


class Chunk:
    """A chunk as the storage keeps it: stored bytes, the frame map, the data keys."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.stored = bytearray()
        self.map = FrameMap()
        self.keys: list[DataKey | None] = [DataKey.generate()] if codec.config.encrypt else []

    def append(self, data: bytes) -> None:
        key = self.keys[0] if self.keys else None
        stored, frames = self.codec.encode(data, key, 0, len(self.map))
        self.stored += stored
        self.map = self.map.then(frames)

    def read(self, offset: int, length: int, parts: int = 1) -> bytes:
        """``parts`` > 1: the frames decoded in that many runs on threads (``run_in_threads``)."""
        first, end = self.map.span(offset, length)
        start, stop = self.map.stored_start(first), self.map.stored_start(end)
        frames = [self.map[i] for i in range(first, end)]
        return self.codec.decode(
            bytes(self.stored[start:stop]),
            frames,
            self.keys,
            chunk="c",
            stored_offset=start,
            cut=offset - self.map.logical_start(first),
            length=length,
            run=run_in_threads if parts > 1 else None,
            parts=parts,
        )


def run_in_threads(tasks: Sequence[Callable[[], None]]) -> None:
    """Every task on its own thread at once; the first failing task's error, in their order."""
    errors: list[BaseException | None] = [None] * len(tasks)

    def run(i: int) -> None:
        try:
            tasks[i]()
        except BaseException as exc:  # raised below, in order
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(tasks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for error in errors:
        if error is not None:
            raise error


@pytest.mark.parametrize("name", list(CONFIGS))
def test_writes_round_trip_and_any_range_reads_back(name: str) -> None:
    rng = random.Random(7)
    chunk = Chunk(Codec(CONFIGS[name]))
    expected = bytearray()
    for _ in range(20):
        data = rng.choice([rng.randbytes, lambda n: json_like(n, rng.randrange(99))])(rng.randrange(1, 3500))
        chunk.append(data)
        expected += data
    assert chunk.map.logical_length == len(expected) and chunk.map.stored_length == len(chunk.stored)
    for _ in range(200):
        offset = rng.randrange(len(expected))
        length = rng.randrange(1, len(expected) - offset + 1)
        assert chunk.read(offset, length) == expected[offset : offset + length]


@settings(max_examples=40, deadline=None)
@given(
    writes=st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=8),
    frame_bytes=st.sampled_from([1, 7, 512, 4096]),
    config=st.sampled_from(list(CONFIGS)),
    reads=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), max_size=10),
    parts=st.sampled_from([1, 2, 3]),
)
def test_property_appends_and_reads_match_the_plain_bytes(writes, frame_bytes, config, reads, parts) -> None:
    base = CONFIGS[config]
    chunk = Chunk(Codec(TransformConfig(base.compression_level, base.encrypt, frame_bytes)))
    for data in writes:
        chunk.append(data)
    expected = b"".join(writes)
    assert FrameMap.unpack(chunk.map.pack()) == chunk.map
    for a, b in reads:
        offset = int(a * (len(expected) - 1))
        length = max(1, int(b * (len(expected) - offset)))
        assert chunk.read(offset, length, parts) == expected[offset : offset + length]


def test_a_frame_ends_where_a_write_ends_so_appends_never_rewrite_stored_bytes() -> None:
    chunk = Chunk(Codec(CONFIGS["zstd+aes"]))
    chunk.append(b"a" * 1500)
    before = bytes(chunk.stored)
    chunk.append(b"b" * 10)
    assert bytes(chunk.stored[: len(before)]) == before
    assert [frame.logical for frame in chunk.map] == [1000, 500, 10]


def test_nonces_never_repeat_under_a_key() -> None:
    """Ordinals (the nonces) of a chunk's frames are all distinct, across appends; the same
    bytes at two ordinals encrypt differently."""
    chunk = Chunk(Codec(CONFIGS["aes"]))
    for _ in range(30):
        chunk.append(b"same bytes " * 100)
    ordinals = [frame.ordinal for frame in chunk.map]
    assert len(set(ordinals)) == len(ordinals) == len(chunk.map)
    pieces = {
        bytes(chunk.stored[chunk.map.stored_start(i) : chunk.map.stored_start(i + 1)])
        for i in range(len(chunk.map))
    }
    assert len(pieces) == len(chunk.map), "no two frames store the same bytes"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_flipped_byte_anywhere_is_chunk_corrupted(name: str) -> None:
    chunk = Chunk(Codec(CONFIGS[name]))
    chunk.append(json_like(5000))
    good = bytes(chunk.stored)
    for position in range(0, len(good), 97):
        chunk.stored = bytearray(good)
        chunk.stored[position] ^= 0x40
        with pytest.raises(ChunkCorrupted):
            chunk.read(0, 5000)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_frames_decoded_in_parts_fail_on_the_first_bad_frame_in_order(name: str) -> None:
    """Decoded in runs on threads at once, a read still checks every frame it fetched
    and reports the first bad one in the chunk's order, whichever run finished first."""
    chunk = Chunk(Codec(CONFIGS[name]))
    data = json_like(20_000)
    chunk.append(data)
    assert chunk.read(0, len(data), parts=4) == data
    good = bytes(chunk.stored)
    late, early = chunk.map.stored_start(len(chunk.map) - 2), chunk.map.stored_start(3)
    chunk.stored[late] ^= 0x01
    with pytest.raises(ChunkCorrupted) as caught:
        chunk.read(0, len(data), parts=4)
    assert caught.value.context["offset"] == late
    chunk.stored[early] ^= 0x01
    with pytest.raises(ChunkCorrupted) as caught:
        chunk.read(0, len(data), parts=4)
    assert caught.value.context["offset"] == early
    chunk.stored = bytearray(good)
    cut = chunk.map.logical_start(5) + 3  # through frames, both ends cut
    assert chunk.read(cut, 7_000, parts=3) == data[cut : cut + 7_000]


@pytest.mark.parametrize("name", ["aes", "zstd+aes"])
def test_swapped_moved_cut_or_foreign_frames_are_chunk_corrupted(name: str) -> None:
    codec = Codec(CONFIGS[name])
    chunk = Chunk(codec)
    chunk.append(bytes(range(256)) * 12)  # frames of the same length
    frames, stored = list(chunk.map), bytes(chunk.stored)
    size = frames[0].stored
    assert all(frame.stored == size for frame in frames[:2])
    swapped = stored[size : 2 * size] + stored[:size] + stored[2 * size :]
    with pytest.raises(ChunkCorrupted, match="authentication tag"):
        codec.decode(swapped, frames, chunk.keys, chunk="c", stored_offset=0)
    with pytest.raises(ChunkCorrupted):  # cut short
        codec.decode(stored[:-1], frames, chunk.keys, chunk="c", stored_offset=0)
    with pytest.raises(ChunkCorrupted, match="authentication tag"):  # frame 1 read as frame 0
        codec.decode(stored[size : 2 * size], frames[:1], chunk.keys, chunk="c", stored_offset=0)
    other = Chunk(codec)
    other.append(bytes(range(256)) * 12)  # the same bytes, ordinals, lengths: another key
    with pytest.raises(ChunkCorrupted, match="authentication tag"):
        codec.decode(bytes(other.stored), frames, chunk.keys, chunk="c", stored_offset=0)
    with pytest.raises(ChunkCorrupted, match="does not hold"):
        codec.decode(stored, frames, [None], chunk="c", stored_offset=0)


def test_frames_of_several_chunks_concatenated_decode_with_their_own_keys() -> None:
    """What defrag does: stored frames moved without decoding, key indexes shifted."""
    codec = Codec(CONFIGS["zstd+aes"])
    a, b = Chunk(codec), Chunk(codec)
    a.append(json_like(2500, 1))
    b.append(json_like(2500, 2))
    merged = Chunk(codec)
    merged.keys = a.keys + b.keys
    merged.stored = a.stored + b.stored
    merged.map = a.map.then(b.map, key_offset=len(a.keys))
    assert merged.read(0, 5000) == json_like(2500, 1) + json_like(2500, 2)
    assert {frame.key_index for frame in merged.map} == {0, 1}
    assert FrameMap.unpack(merged.map.pack()) == merged.map


def test_compression_pays_on_json_and_is_skipped_on_compressed_data() -> None:
    codec = Codec(TransformConfig(compression_level=3))
    data = json_like(1 << 20)
    stored, frames = codec.encode(data, None, NO_KEY, 0)
    assert len(stored) <= 0.35 * len(data)
    assert all(frame.compressed for frame in frames)
    packed = zstandard.ZstdCompressor().compress(json_like(300_000))
    assert compressed_already(packed)
    stored, frames = codec.encode(packed, None, NO_KEY, 0)
    assert not any(frame.compressed for frame in frames) and stored == packed
    noise = random.Random(3).randbytes(200_000)
    _, frames = codec.encode(noise, None, NO_KEY, 0)
    assert not any(frame.compressed for frame in frames), "incompressible: stored as it is"


def test_a_compressed_kafka_batch_is_recognised() -> None:
    header = (0).to_bytes(8, "big") + (100).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"\x02" + bytes(4)
    assert compressed_already(header + (4).to_bytes(2, "big") + bytes(50))  # zstd codec
    assert not compressed_already(header + (0).to_bytes(2, "big") + bytes(50))  # none


def test_encrypted_frames_cost_their_tag_and_a_small_map() -> None:
    codec = Codec(TransformConfig(encrypt=True))
    key = DataKey.generate()
    stored, frames = codec.encode(bytes(64 << 20), key, 0, 0)
    assert [frame.stored for frame in frames] == [(64 << 10) + TAG_BYTES] * 1024
    assert len(stored) == sum(frame.stored for frame in frames)
    packed = FrameMap(frames).pack()
    assert len(packed) <= 16 + 8 * 1024, len(packed)


@pytest.mark.parametrize(
    "bad",
    [
        {"compression_level": 0},
        {"compression_level": 23},
        {"compression_level": True},
        {"encrypt": "yes"},
        {"frame_bytes": 0},
        {"frame_bytes": (64 << 20) + 1},
        {"skip_compressed": None},
    ],
)
def test_bad_configs_are_refused(bad: dict) -> None:
    with pytest.raises(InvalidArgument):
        TransformConfig(**bad)


def test_a_key_is_required_exactly_when_encryption_is_on() -> None:
    with pytest.raises(InvalidArgument):
        Codec(CONFIGS["aes"]).encode(b"x", None, 0, 0)
    with pytest.raises(InvalidArgument):
        Codec(CONFIGS["zstd"]).encode(b"x", DataKey.generate(), 0, 0)


@pytest.mark.parametrize("bad", [b"\x00", b"\xff" * 16 + b"\x00", "text", bytes(16)])
def test_a_frame_map_that_does_not_parse_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument):
        FrameMap.unpack(bad)  # type: ignore[arg-type]


def test_frame_entries_are_what_the_map_holds() -> None:
    frames = [
        Frame(5, 10, 26, True, 2, None),
        Frame(6, 3, 19, False, 2, None),
        Frame(0, 4, 4, False, NO_KEY, 99),
    ]
    assert list(FrameMap.unpack(FrameMap(frames).pack())) == frames


@pytest.mark.parametrize(
    ("config", "module"), [(CONFIGS["zstd"], "zstandard"), (CONFIGS["aes"], "cryptography")]
)
def test_a_missing_extra_is_invalid_config_naming_it(monkeypatch, config, module) -> None:
    import importlib

    from slts.transforms import extras

    real_import = importlib.import_module

    def without(name: str, package: str | None = None):
        if name.split(".")[0] == module:
            raise ModuleNotFoundError(f"No module named {module!r}")
        return real_import(name, package)

    monkeypatch.setattr(extras.importlib, "import_module", without)
    with pytest.raises(InvalidConfig, match=r"slts\[transforms\]"):
        Codec(config)


def test_a_map_grown_by_appending_packed_runs_is_the_same_map() -> None:
    """An append adds its frames' packed runs after the chunk's (no repacking)."""
    codec = Codec(CONFIGS["zstd+aes"])
    key = DataKey.generate()
    _, first = codec.encode(json_like(3000), key, 0, 0)
    _, second = codec.encode(json_like(2000, 2), key, 0, len(first))
    grown = FrameMap(first).pack() + FrameMap(second).pack()
    assert FrameMap.unpack(grown) == FrameMap(first).then(second)


def test_frames_sealed_in_place_are_the_frames_the_format_describes() -> None:
    """Encrypted, not compressed, a write's frames are sealed straight into its stored
    bytes: each is AES-256-GCM of its bytes under nonce (4 zero bytes, ordinal) with the
    AAD (ordinal, logical size, compressed), its tag after it (docs/formats.md)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key = DataKey.generate()
    data = random.Random(9).randbytes(2_500)
    stored, frames = Codec(TransformConfig(encrypt=True, frame_bytes=1000)).encode(data, key, 2, 40)
    cipher = AESGCM(key.material)

    def nonce(ordinal: int) -> bytes:
        return bytes(4) + ordinal.to_bytes(8, "big")

    expected = b"".join(
        cipher.encrypt(nonce(40 + n), piece, struct.pack(">QIB", 40 + n, len(piece), 0))
        for n, piece in enumerate(data[i : i + 1000] for i in range(0, len(data), 1000))
    )
    assert stored == expected
    assert [(f.ordinal, f.logical, f.stored, f.key_index) for f in frames] == [
        (40, 1000, 1016, 2),
        (41, 1000, 1016, 2),
        (42, 500, 516, 2),
    ]
