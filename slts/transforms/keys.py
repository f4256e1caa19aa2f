"""Keys: the data keys that encrypt frames, and the key ring whose keys wrap them.

Envelope encryption, as Aiven's tiered storage does it:

* a **data key** (DEK) is 32 random bytes that encrypt the frames of one chunk
  (AES-256-GCM, ``slts.transforms.frames``). It is never stored in the clear: the chunk's
  record keeps it *wrapped* (AES key wrap, RFC 3394) by a key-encryption key, with that
  key's id (``WrappedKey``);
* a **key ring** holds the key-encryption keys (KEKs): one is *active* and wraps new data
  keys; the others stay for unwrapping what they wrapped. Rotation adds a key and makes it
  active; re-wrapping old data keys under it changes records only, never stored bytes.

``KeyRing`` is the provider interface (a KMS can be plugged in behind it later);
``FolderKeyRing`` keeps its keys in a folder: one file per key, ``<id>.key`` (32 bytes,
mode 0600, in a folder only its owner may enter), and ``ACTIVE`` (the active key's id).
Files are written whole, synced, and renamed into place, so a crash leaves the old state
or the new one.

Key material never appears in a ``repr``, a message, a log or an exception: ``DataKey``
prints as redacted, and errors name key ids only.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import threading
from dataclasses import dataclass
from typing import Protocol

from slts.errors import InvalidArgument, InvalidConfig, KeyUnavailable
from slts.transforms.extras import require

#: Bytes of a data key and of a key-encryption key (AES-256).
KEY_BYTES = 32
#: Bytes of a data key wrapped by RFC 3394 (the key and one 8-byte integrity block).
WRAPPED_BYTES = KEY_BYTES + 8
#: A key id: what ``FolderKeyRing`` names (and a KMS may name) a key-encryption key.
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
ACTIVE_FILE = "ACTIVE"
_SUFFIX = ".key"


def check_key_id(key_id: object) -> str:
    """``key_id`` if it is a valid key id (1-64 of ``A-Za-z0-9._-``, not starting with a
    dot or dash), else ``InvalidArgument``."""
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise InvalidArgument(
            f"a key id is 1-64 characters of A-Za-z0-9._- (not first . or -), got {key_id!r}"
        )
    return key_id


class DataKey:
    """A data key's material, kept out of every printout."""

    __slots__ = ("_material",)

    def __init__(self, material: bytes) -> None:
        if not isinstance(material, bytes) or len(material) != KEY_BYTES:
            raise InvalidArgument(f"a data key is {KEY_BYTES} bytes")
        self._material = material

    @classmethod
    def generate(cls) -> DataKey:
        """A new random data key (the operating system's CSPRNG)."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @property
    def material(self) -> bytes:
        """The key's bytes: for the cipher only."""
        return self._material

    def __repr__(self) -> str:
        return "DataKey(<redacted>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataKey) and secrets.compare_digest(self._material, other._material)

    def __hash__(self) -> int:
        return hash(DataKey)  # equal keys hash alike; the material stays out of it


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A data key wrapped by the key-encryption key ``key_id``: safe to store anywhere."""

    key_id: str
    blob: bytes

    def __post_init__(self) -> None:
        check_key_id(self.key_id)
        if not isinstance(self.blob, bytes) or len(self.blob) != WRAPPED_BYTES:
            raise InvalidArgument(f"a wrapped data key is {WRAPPED_BYTES} bytes")

    def to_list(self) -> list[object]:
        """Its form in a record: ``[key_id, blob]``."""
        return [self.key_id, self.blob]

    @classmethod
    def from_list(cls, value: object) -> WrappedKey:
        """The inverse of ``to_list``; ``InvalidArgument`` for anything else."""
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise InvalidArgument(f"a wrapped key is [key_id, blob], got {type(value).__name__}")
        return cls(value[0], value[1])


class KeyRing(Protocol):
    """Where key-encryption keys live: one active (wraps new data keys), others kept to
    unwrap what they wrapped. Implementations must be safe to share between threads."""

    def active_id(self) -> str:
        """The active key's id (``InvalidConfig`` if the ring has none)."""
        ...

    def ids(self) -> list[str]:
        """Every key's id, sorted."""
        ...

    def wrap(self, data_key: DataKey, key_id: str | None = None) -> WrappedKey:
        """``data_key`` wrapped by key ``key_id`` (default: the active one).
        ``KeyUnavailable`` if that key is not in the ring."""
        ...

    def unwrap(self, wrapped: WrappedKey) -> DataKey:
        """The data key ``wrapped`` holds. ``KeyUnavailable`` (naming the key id) if its
        key is not in the ring or is not the key that wrapped it."""
        ...


def wrap_with(kek: bytes, data_key: DataKey, key_id: str) -> WrappedKey:
    """``data_key`` wrapped by the key-encryption key ``kek`` (RFC 3394)."""
    keywrap = require("cryptography.hazmat.primitives.keywrap")
    return WrappedKey(key_id, keywrap.aes_key_wrap(kek, data_key.material))


def unwrap_with(kek: bytes, wrapped: WrappedKey) -> DataKey:
    """The data key in ``wrapped``, unwrapped with ``kek``; ``KeyUnavailable`` if ``kek``
    is not the key that wrapped it (RFC 3394's integrity check fails)."""
    keywrap = require("cryptography.hazmat.primitives.keywrap")
    try:
        return DataKey(keywrap.aes_key_unwrap(kek, wrapped.blob))
    except keywrap.InvalidUnwrap:
        raise KeyUnavailable(
            f"key {wrapped.key_id!r} of the key ring is not the key that wrapped this data key",
            key_id=wrapped.key_id,
        ) from None


class _KeysById:
    """What every key ring here shares: ``wrap``, ``unwrap`` and ``activate`` on a ``_kek``
    lookup (``KeyUnavailable`` for an id it has no key for) and ``_set_active``."""

    def active_id(self) -> str:
        raise NotImplementedError

    def activate(self, key_id: str) -> None:
        """Make ``key_id`` the active key: new data keys are wrapped by it.
        ``KeyUnavailable`` if the ring has no such key."""
        self._kek(check_key_id(key_id))
        self._set_active(key_id)

    def wrap(self, data_key: DataKey, key_id: str | None = None) -> WrappedKey:
        """``data_key`` wrapped by ``key_id`` (default: the active key)."""
        key_id = self.active_id() if key_id is None else check_key_id(key_id)
        return wrap_with(self._kek(key_id), data_key, key_id)

    def unwrap(self, wrapped: WrappedKey) -> DataKey:
        """The data key ``wrapped`` holds (``KeyUnavailable``: missing or wrong key)."""
        return unwrap_with(self._kek(wrapped.key_id), wrapped)

    def _kek(self, key_id: str) -> bytes:
        raise NotImplementedError

    def _set_active(self, key_id: str) -> None:
        raise NotImplementedError


class MemoryKeyRing(_KeysById):
    """A key ring held in memory (tests, the simulator, an application that brings its own
    key storage): ``add`` a key, ``activate`` one. Thread-safe."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._active: str | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryKeyRing(keys={self.ids()!r})"

    def ids(self) -> list[str]:
        with self._lock:
            return sorted(self._keys)

    def active_id(self) -> str:
        with self._lock:
            if self._active is None:
                raise InvalidConfig("the key ring has no active key")
            return self._active

    def add(self, key_id: str | None = None) -> str:
        """A new random key, ``key_id`` or a new random id (``InvalidArgument`` if taken)."""
        key_id = check_key_id(key_id if key_id is not None else "k-" + secrets.token_hex(6))
        with self._lock:
            if key_id in self._keys:
                raise InvalidArgument(f"the key ring has a key {key_id!r} already")
            self._keys[key_id] = secrets.token_bytes(KEY_BYTES)
        return key_id

    def _set_active(self, key_id: str) -> None:
        with self._lock:
            self._active = key_id

    def _kek(self, key_id: str) -> bytes:
        with self._lock:
            kek = self._keys.get(key_id)
        if kek is None:
            raise KeyUnavailable(f"the key ring has no key {key_id!r}", key_id=key_id)
        return kek


class FolderKeyRing(_KeysById):
    """A key ring in a folder (module doc). ``open`` an existing one, ``create`` a new
    empty one; ``add`` a key, ``activate`` one. Thread-safe (keys are read once and kept;
    a key added by another process is found on first use)."""

    def __init__(self, folder: str) -> None:
        """Open the key ring in ``folder``: ``InvalidConfig`` if it is not a folder, or if
        it or a key file in it can be read by others than its owner."""
        if not isinstance(folder, str) or not folder:
            raise InvalidConfig(f"a key ring is a folder path, got {folder!r}")
        if not os.path.isdir(folder):
            raise InvalidConfig(f"key ring {folder!r} does not exist (create it: slts keys create)")
        _check_private(folder, stat.S_IRWXG | stat.S_IRWXO, "folder")
        self.folder = folder
        self._keys: dict[str, bytes] = {}

    @classmethod
    def create(cls, folder: str) -> FolderKeyRing:
        """A new, empty key ring in ``folder`` (created, mode 0700; it may exist empty).
        ``InvalidConfig`` if it holds anything already."""
        if not isinstance(folder, str) or not folder:
            raise InvalidConfig(f"a key ring is a folder path, got {folder!r}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if os.listdir(folder):
            raise InvalidConfig(f"{folder!r} is not empty: a new key ring needs an empty folder")
        os.chmod(folder, 0o700)
        return cls(folder)

    def __repr__(self) -> str:
        return f"FolderKeyRing({self.folder!r}, keys={self.ids()!r})"

    def ids(self) -> list[str]:
        """Every key's id, sorted."""
        return sorted(name[: -len(_SUFFIX)] for name in os.listdir(self.folder) if name.endswith(_SUFFIX))

    def active_id(self) -> str:
        """The active key's id; ``InvalidConfig`` if none is active."""
        try:
            with open(os.path.join(self.folder, ACTIVE_FILE), encoding="ascii") as file:
                key_id = file.read().strip()
        except FileNotFoundError:
            raise InvalidConfig(f"key ring {self.folder!r} has no active key (slts keys rotate)") from None
        check_key_id(key_id)
        return key_id

    def add(self, key_id: str | None = None) -> str:
        """A new random key-encryption key, ``key_id`` or a new random id; not active yet.
        ``InvalidArgument`` for a bad or taken id. Returns its id."""
        key_id = check_key_id(key_id if key_id is not None else "k-" + secrets.token_hex(6))
        path = self._path(key_id)
        if os.path.exists(path):
            raise InvalidArgument(f"key ring {self.folder!r} has a key {key_id!r} already")
        _write_private(self.folder, os.path.basename(path), secrets.token_bytes(KEY_BYTES), exclusive=True)
        return key_id

    def _set_active(self, key_id: str) -> None:
        _write_private(self.folder, ACTIVE_FILE, key_id.encode("ascii"), exclusive=False)

    def _path(self, key_id: str) -> str:
        return os.path.join(self.folder, key_id + _SUFFIX)

    def _kek(self, key_id: str) -> bytes:
        kek = self._keys.get(key_id)
        if kek is not None:
            return kek
        path = self._path(key_id)
        try:
            _check_private(path, stat.S_IRWXG | stat.S_IRWXO, "key file")
            with open(path, "rb") as file:
                kek = file.read()
        except FileNotFoundError:
            raise KeyUnavailable(f"key ring {self.folder!r} has no key {key_id!r}", key_id=key_id) from None
        if len(kek) != KEY_BYTES:
            raise KeyUnavailable(
                f"key {key_id!r} in {self.folder!r} is not a {KEY_BYTES}-byte key", key_id=key_id
            )
        self._keys[key_id] = kek
        return kek


def _check_private(path: str, forbidden: int, what: str) -> None:
    mode = os.stat(path).st_mode
    if mode & forbidden:
        raise InvalidConfig(
            f"key ring {what} {path!r} can be read by others than its owner (mode {stat.S_IMODE(mode):o}):"
            " chmod it 0700 (folder) or 0600 (key file)"
        )


def _write_private(folder: str, name: str, content: bytes, *, exclusive: bool) -> None:
    """Write ``folder/name`` whole (mode 0600), durably: a temporary file synced, renamed
    into place (``exclusive``: linked, so an existing file is never replaced), the folder
    synced."""
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        if exclusive:
            try:
                os.link(temporary, os.path.join(folder, name))
            except FileExistsError:
                raise InvalidArgument(f"{name!r} exists in key ring {folder!r}") from None
        else:
            os.replace(temporary, os.path.join(folder, name))
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
