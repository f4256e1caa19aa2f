"""The metadata store suite (one contract, every store)."""
