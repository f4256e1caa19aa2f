"""Sealed records: the metadata's copy on tier-2 (metadata log, snapshots) and the system
journal, encrypted record by record (docs/security.md, "What is transformed").

Those records are read at boot and by ``slts restore`` before any metadata exists, so each
sealed record carries what opening it needs besides the key ring: the id of the key that
wrapped its data key, the wrapped data key and its nonce. A sealed body is::

    0xC1 | version (1) | key id length u8 | key id | wrapped data key (40) | nonce (12) | ciphertext and tag

``0xC1`` is the one byte msgpack never writes, so a sealed body is told from a plain
msgpack map at its first byte and both read back (a store that turned encryption on keeps
its older plain records readable). The framing's CRC32C still covers the stored body.

A writer seals under one data key for at most ``RECORDS_PER_KEY`` records, then draws a
new one; nonces are random (96 bits), so with that bound the chance of a repeat under a
key stays below 2**-48 (NIST SP 800-38D's bound for random nonces is 2**32 per key).
"""

from __future__ import annotations

import os
import struct
import threading
from typing import Any

from slts.errors import InvalidArgument, KeyUnavailable, MetadataCorrupted
from slts.transforms.extras import require
from slts.transforms.keys import WRAPPED_BYTES, DataKey, KeyRing, WrappedKey

MARKER = 0xC1
VERSION = 1
NONCE_BYTES = 12
#: Records sealed under one data key before a writer draws a new one.
RECORDS_PER_KEY = 1 << 24
_HEAD = struct.Struct(">BBB")


class RecordSeal:
    """Seals records with ``key_ring``'s active key (``sealing``) and opens sealed ones;
    ``key_ring`` None: only plain records can be read (a sealed one is ``KeyUnavailable``).
    Thread-safe."""

    def __init__(self, key_ring: KeyRing | None, *, sealing: bool) -> None:
        if sealing and key_ring is None:
            raise InvalidArgument("sealing records needs a key ring")
        self.key_ring = key_ring
        self.sealing = sealing
        self._lock = threading.Lock()
        self._sealed = 0
        self._key: tuple[Any, bytes] | None = None  # (cipher, header) of the current data key
        self._opened: dict[WrappedKey, Any] = {}

    def seal(self, body: bytes) -> bytes:
        """``body`` sealed (``sealing``), or as it is."""
        if not self.sealing:
            return body
        with self._lock:
            if self._key is None or self._sealed >= RECORDS_PER_KEY:
                self._key = self._new_key()
                self._sealed = 0
            self._sealed += 1
            cipher, head = self._key
        nonce = os.urandom(NONCE_BYTES)
        return head + nonce + cipher.encrypt(nonce, body, head)

    def open(self, body: bytes) -> bytes:
        """A record's msgpack bytes: ``body`` itself if it is plain, else opened.
        ``KeyUnavailable`` (naming the key) without its key; ``MetadataCorrupted`` for a
        sealed body that does not parse or fails its tag."""
        if not body or body[0] != MARKER:
            return body
        try:
            _, version, id_length = _HEAD.unpack_from(body)
            at = _HEAD.size
            key_id = bytes(body[at : at + id_length]).decode("ascii")
            at += id_length
            wrapped = WrappedKey(key_id, bytes(body[at : at + WRAPPED_BYTES]))
            at += WRAPPED_BYTES
            nonce = bytes(body[at : at + NONCE_BYTES])
            at += NONCE_BYTES
        except (struct.error, UnicodeDecodeError, InvalidArgument):
            raise MetadataCorrupted("a sealed record's header does not parse") from None
        if version != VERSION or len(nonce) != NONCE_BYTES:
            raise MetadataCorrupted(f"a sealed record of version {version} (this code reads {VERSION})")
        cipher = self._cipher(wrapped)
        try:
            plain: bytes = cipher.decrypt(nonce, bytes(body[at:]), bytes(body[: at - NONCE_BYTES]))
        except require("cryptography.exceptions").InvalidTag:
            raise MetadataCorrupted("a sealed record fails its authentication tag") from None
        return plain

    def _new_key(self) -> tuple[Any, bytes]:
        assert self.key_ring is not None
        key = DataKey.generate()
        wrapped = self.key_ring.wrap(key)
        key_id = wrapped.key_id.encode("ascii")
        head = _HEAD.pack(MARKER, VERSION, len(key_id)) + key_id + wrapped.blob
        return require("cryptography.hazmat.primitives.ciphers.aead").AESGCM(key.material), head

    def _cipher(self, wrapped: WrappedKey) -> Any:
        with self._lock:
            cipher = self._opened.get(wrapped)
        if cipher is None:
            if self.key_ring is None:
                raise KeyUnavailable(
                    f"the metadata's copy on tier-2 is encrypted under key {wrapped.key_id!r}:"
                    " give its key ring",
                    key_id=wrapped.key_id,
                )
            key = self.key_ring.unwrap(wrapped)
            cipher = require("cryptography.hazmat.primitives.ciphers.aead").AESGCM(key.material)
            with self._lock:
                self._opened[wrapped] = cipher
        return cipher
