"""Admin and repair features on the engine's public seam (``ChunkedSegmentStorage.context``).

* ``verify``: every invariant of a segment or a container, the leak check and the tier-2 copy;
* ``backup``: a segment's export to one file and its import;
* ``rolling``: RollingStorage headers (export a segment's layout as a header, import one);
* ``orphans``: the orphan reconciler (chunks on the chunk storage no record knows).
"""
