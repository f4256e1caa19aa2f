"""What a binding brings to the conformance suite, and helpers the tests share.

A binding under test is three things (``BindingUnderTest``):

* ``storage``: the ``ChunkStorage`` the tests drive;
* ``raw``: a ``RawAccess`` hook that reaches the same chunks *without* the binding (the file
  itself, the dict, the bucket through its own SDK call), so the tests can check that what
  the binding stored is exactly the bytes written, with no header or footer, and that
  bytes stored by someone else read back exactly;
* ``reopen``: builds a second instance on the same storage, as a restarted process would.

Tests that need an optional operation call ``require(storage, flag, reason)``: they skip
themselves with the reason when the capability flag is off. They never look at the class.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import pytest
from slts.bindings import ChunkStorage

#: Reasons given when a test skips for want of a capability (one wording everywhere).
NO_APPEND = "binding has no append"
NO_CONCAT = "binding has no native concat"
NO_TRUNCATE = "binding cannot truncate"
NO_READONLY = "binding cannot set chunks read-only"

CAPABILITY_FLAGS = ("supports_append", "supports_concat", "supports_truncate", "supports_readonly")


class RawAccess(Protocol):
    """Reaches a binding's chunks by a path that bypasses the binding under test."""

    def read(self, name: str) -> bytes:
        """The bytes stored for chunk ``name`` (raises ``KeyError`` if there is none)."""

    def write(self, name: str, data: bytes) -> None:
        """Store chunk ``name`` holding ``data`` as another writer would (overwrites)."""

    def exists(self, name: str) -> bool:
        """Whether something is stored for chunk ``name``."""


@dataclass
class BindingUnderTest:
    id: str
    storage: ChunkStorage
    raw: RawAccess
    reopen: Callable[[], ChunkStorage]
    #: Removes what the binding left behind (run after ``storage.close()``).
    cleanup: Callable[[], None] = field(default=lambda: None)
    #: Programs the model test (``test_model.py``) runs: fewer for a binding behind a
    #: network server, where every step costs dozens of requests.
    model_examples: int = 100


def require(storage: ChunkStorage, flag: str, reason: str) -> None:
    """Skip the calling test with ``reason`` unless ``storage`` announces ``flag``."""
    assert flag in CAPABILITY_FLAGS, flag
    if not getattr(storage, flag):
        pytest.skip(reason)


def require_missing(storage: ChunkStorage, flag: str, reason: str) -> None:
    """Skip the calling test (about a missing capability) when ``storage`` has ``flag``."""
    assert flag in CAPABILITY_FLAGS, flag
    if getattr(storage, flag):
        pytest.skip(f"binding has {flag}; {reason!r} does not apply")


def content(storage: ChunkStorage, name: str) -> bytes:
    """The whole chunk, read through the binding."""
    handle = storage.open_read(name)
    return storage.read(handle, 0, storage.get_info(name).length)


def pattern(length: int, seed: int = 0) -> bytes:
    """Deterministic bytes that differ at every offset modulo 251 (catches shifted reads)."""
    return bytes((seed + i) % 251 for i in range(length))


def remove_tree(path: str) -> None:
    """Delete a folder tree without recursion.

    A 1024-byte chunk name can be 1024 folders deep on a filesystem binding, beyond the
    recursion limit of ``shutil.rmtree`` in Python 3.11 (and of pytest's own clean-up of
    old temporary folders, which would then fail for everybody).
    """
    stack = [path]
    for _ in range(10_000_000):  # bounded: every pass removes an entry or pushes a folder
        if not stack:
            return
        folder = stack[-1]
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            stack.pop()
            continue
        subfolders = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
        if subfolders:
            stack.extend(subfolders)
        else:
            os.rmdir(folder)
            stack.pop()
    raise AssertionError(f"could not remove {path}")
