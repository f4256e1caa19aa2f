"""A second process for the LMDB tests: ``python metadata_child.py COMMAND PATH ARGS...``.

Commands:

* ``commit PATH KEY VALUE EXPECTED``: one conditional commit to table ``segments``;
  prints the sequence.
* ``grow PATH COUNT VALUE_BYTES``: opens with a 64 KiB map and commits COUNT values of
  VALUE_BYTES each, so the map must grow; prints the final map size.
* ``loop PATH COUNT PREFIX``: durable commits of ``PREFIX%06d`` keys, printing ``index
  sequence`` after each ``commit()`` returned (the acknowledgement), flushed at once.
"""

from __future__ import annotations

import sys

from slts.metadata import Expect, LmdbMetadataStore, Put

TABLES = ("segments", "chunks", "index")


def main(argv: list[str]) -> int:
    command, path = argv[0], argv[1]
    if command == "commit":
        key, value, expected = argv[2].encode(), argv[3].encode(), int(argv[4])
        with LmdbMetadataStore(path, TABLES) as store:
            print(store.commit([Put("segments", key, value)], [Expect("segments", key, expected)]))
        return 0
    if command == "grow":
        count, value_bytes = int(argv[2]), int(argv[3])
        with LmdbMetadataStore(path, TABLES, map_size_bytes=64 << 10) as store:
            for index in range(count):
                store.commit([Put("chunks", b"big%06d" % index, bytes([index % 256]) * value_bytes)])
            print(store.map_size_bytes)
        return 0
    if command == "loop":
        count, prefix = int(argv[2]), argv[3].encode()
        with LmdbMetadataStore(path, TABLES, durable=True) as store:
            for index in range(count):
                sequence = store.commit([Put("segments", prefix + b"%06d" % index, b"payload-%d" % index)])
                sys.stdout.write(f"{index} {sequence}\n")
                sys.stdout.flush()
        return 0
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
