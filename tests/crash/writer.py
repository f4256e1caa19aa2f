"""Crash-test writer: appends deterministic writes and acknowledges each on stdout.

Run as ``python writer.py FOLDER SEGMENTS [threads]``; it never stops by itself. After
each ``write`` returns it prints ``ACK <segment> <end offset>`` and flushes. With
``threads`` every segment has a writer thread of its own: the writes commit in shared
groups (the pipelined group commit, its syncs shared and overlapped). The parent kills
it with SIGKILL at a random moment. Each write's size and bytes depend only on
(segment, offset) (``piece``), so a reader can regenerate what any prefix must hold.
"""

from __future__ import annotations

import os
import random
import sys
import threading

ROLLING_BYTES = 16 << 10
WRITE_BYTES_MAX = 20_000


def piece(segment: str, offset: int) -> bytes:
    """The bytes of the write that starts at ``offset`` of ``segment``."""
    rng = random.Random(f"{segment}@{offset}")
    return rng.randbytes(rng.randint(1, WRITE_BYTES_MAX))


def expected_prefix(segment: str, length: int) -> bytes | None:
    """What the segment must hold at ``length``, or None if ``length`` is not a write boundary."""
    parts, offset = [], 0
    while offset < length:
        data = piece(segment, offset)
        parts.append(data)
        offset += len(data)
    return b"".join(parts) if offset == length else None


#: A key ring folder: the store is then compressed and encrypted (docs/security.md).
KEY_RING_VARIABLE = "SLTS_CRASH_KEY_RING"


def transforms() -> dict[str, object]:
    """The key ring and transforms ``$SLTS_CRASH_KEY_RING`` asks for (none without it)."""
    folder = os.environ.get(KEY_RING_VARIABLE)
    if not folder:
        return {}
    from slts.transforms.keys import FolderKeyRing

    return {
        "key_ring": FolderKeyRing(folder),
        "encryption": True,
        "compression_level": 1,
        "frame_bytes": 4096,
    }


def open_storage(folder: str, **overrides: object):
    import slts

    options = {
        "gc_delay_s": 3600.0,
        "rolling_length_bytes_default": ROLLING_BYTES,
        **transforms(),
        **overrides,
    }
    return slts.open(f"file://{folder}/chunks", metadata=f"{folder}/metadata", **options)


def main() -> None:
    folder, segments = sys.argv[1], int(sys.argv[2])
    os.makedirs(f"{folder}/metadata", exist_ok=True)
    storage = open_storage(folder)
    names = [f"crash/{i}" for i in range(segments)]
    for name in names:
        if not storage.exists(name):
            storage.create(name)
    handles = {name: storage.open_write(name) for name in names}
    print(f"READY {storage.epoch}", flush=True)
    if len(sys.argv) > 3 and sys.argv[3] == "threads":
        printing = threading.Lock()

        def append_forever(name: str) -> None:
            offset = storage.info(name).length
            while True:
                data = piece(name, offset)
                storage.write(handles[name], offset, data)
                offset += len(data)
                with printing:
                    print(f"ACK {name} {offset}", flush=True)

        for name in names:
            threading.Thread(target=append_forever, args=(name,), daemon=True).start()
        threading.Event().wait()
    rng = random.Random()
    while True:
        name = rng.choice(names)
        offset = storage.info(name).length
        data = piece(name, offset)
        storage.write(handles[name], offset, data)
        print(f"ACK {name} {offset + len(data)}", flush=True)


if __name__ == "__main__":
    main()
