"""System segments, the epoch-fenced system journal and snapshots (``slts.journal``).

DESIGN.md §6. Built so far: ``framing`` (the ``[length][crc32c][msgpack]`` record format
and a reader that survives torn tails and corrupt records). The system segments, the
journal with its snapshots and boot, and restore from tier-2 are still to come: until
then the local LMDB store is the only copy of the metadata.
"""
