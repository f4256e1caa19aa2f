"""System segments, the epoch-fenced system journal and snapshots (``slts.journal``).

DESIGN.md §6. Not built yet: the foundation stores metadata in the local LMDB store
only; the journal that makes it restorable from tier-2 is its own piece of work.
"""
