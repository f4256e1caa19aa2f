"""System segments, the epoch-fenced system journal and snapshots (``slts.journal``).

DESIGN.md §6, PDP-34 "Why SLTS needs System Journal?". Modules, bottom up:

* ``framing``: the ``[length][crc32c][msgpack]`` record format and its readers;
* ``system_names``: predictable, unique names of journal files, snapshots, checkpoints;
* ``system_layout``: the pinned layout of the system segments and what each record means;
* ``replay``: boot replay from tier-2 (latest valid checkpoint, then journal files);
* ``journal``: one epoch's writer: records, snapshots, checkpoints, clean-up;
* ``system_segments``: append/truncate/read system segments through the journal;
* ``metadata_copy``: the metadata log and metadata snapshots in system segments;
* ``durable_copy``: a running owner's copy (boot, background flush, GC barrier);
* ``restore``: rebuild a metadata store from tier-2 alone, and check that it would.
"""
