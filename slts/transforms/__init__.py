"""Client-side transforms of everything SLTS writes to tier-2: compression (zstd), then
authenticated encryption (AES-256-GCM) with data keys wrapped by a key ring
(docs/security.md)."""
