"""Whether compressing a write pays: data that is compressed already is stored as it is.

Checked once per write, on its first bytes (as Aiven's heuristic looks at a segment's first
batch): a Kafka v2 record batch whose attributes name a codec, or the magic number of a
compressed or packed format; then, for anything else, the first frame itself is compressed
and the write's frames are compressed only if that one shrank to at most
``PAYS_BELOW`` of its size.
"""

from __future__ import annotations

import struct

#: A compressed frame is kept if it is at most this fraction of the frame (else the frame is
#: stored as it is: decoding it then costs nothing).
PAYS_BELOW = 0.9

#: Magic numbers of formats that are compressed (or encrypted-looking) already.
_MAGIC = (
    b"\x28\xb5\x2f\xfd",  # zstd frame
    b"\x1f\x8b",  # gzip
    b"\x04\x22\x4d\x18",  # LZ4 frame
    b"\xff\x06\x00\x00sNaPpY",  # Snappy framing format
    b"\xfd7zXZ\x00",  # xz
    b"BZh",  # bzip2
    b"PK\x03\x04",  # zip
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",  # JPEG
)
#: A Kafka v2 record batch: baseOffset i64, batchLength i32, partitionLeaderEpoch i32,
#: magic i8 (2), crc u32, attributes i16 (bits 0-2: the codec, 0 = none).
_KAFKA_BATCH = struct.Struct(">qiibIh")


def compressed_already(data: bytes | memoryview) -> bool:
    """Whether ``data`` starts as compressed data does (module doc)."""
    head = bytes(data[: _KAFKA_BATCH.size])
    if len(head) == _KAFKA_BATCH.size:
        _, length, _, magic, _, attributes = _KAFKA_BATCH.unpack(head)
        if magic == 2 and length >= _KAFKA_BATCH.size - 12 and attributes & 0x7:
            return True
    return any(head.startswith(magic) for magic in _MAGIC)
