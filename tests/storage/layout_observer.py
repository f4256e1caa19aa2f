"""A read-only observer in a process of its own, for ``test_consistent_layouts.py``:
``python layout_observer.py CHUNKS METADATA SEGMENT STOP``.

Opens the container read-only on the chunk folder and the LMDB folder, then, until the
file STOP exists, walks SEGMENT's layout (``chunks``), verifies it, scrubs it and reads
it whole, each time checking that what it saw is one layout: contiguous chunk starts
ending at the length it read with it, no problem from verify, no anomaly from scrub, and
the bytes of the read equal to the model (every byte at segment offset ``o`` is
``o % 251``). Prints ``pass N`` after each round, flushed, and ``failure ...`` and exits
1 at the first thing wrong.
"""

from __future__ import annotations

import os
import sys
import traceback

from slts.bindings.filesystem import FileSystemChunkStorage

from slts.admin.scrub import scrub
from slts.admin.verify import verify_segment
from slts.config import StorageConfig
from slts.errors import SegmentTruncated
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import TABLES
from slts.storage.chunked import ChunkedSegmentStorage


def expected(offset: int, length: int) -> bytes:
    return bytes((offset + i) % 251 for i in range(length))


def main(chunks: str, metadata: str, segment: str, stop: str) -> int:
    store = LmdbMetadataStore(metadata, TABLES)
    config = StorageConfig(read_ahead_low_latency=True, read_ahead_part_bytes=4096, read_ahead_bytes=65536)
    observer = ChunkedSegmentStorage(0, None, FileSystemChunkStorage(chunks), store, config, read_only=True)
    rounds = 0
    try:
        while not os.path.exists(stop):
            layout = observer.chunks(segment)
            info = observer.info(segment)
            starts = [start for start, _ in layout]
            ends = [start + chunk.length for start, chunk in layout]
            assert starts[1:] == ends[:-1], ("not contiguous", starts, ends)
            assert not layout or ends[-1] >= info.start_offset, ("ends below the start", ends, info)
            problems = verify_segment(observer, segment, checksums=True)
            assert not problems, problems
            report = scrub(observer, prefix=segment)
            assert not report.anomalies, report.anomalies
            handle = observer.open_read(segment)
            position = info.start_offset
            while position < info.length:
                size = min(24 * 1024, info.length - position)
                try:
                    data = observer.read(handle, position, size)
                except SegmentTruncated:
                    break  # truncated past this position meanwhile
                assert data == expected(position, size), ("bytes", position, size)
                position += size
            rounds += 1
            print(f"pass {rounds}", flush=True)
    except BaseException:
        print("failure " + traceback.format_exc().replace("\n", " | "), flush=True)
        return 1
    finally:
        observer.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
