"""Chunk names as paths in a folder tree, for bindings over a hierarchical namespace.

The filesystem and HDFS bindings (and any future one whose storage has folders with a
limit on each path component) store chunk ``name`` at ``<root>/<PathCodec.relpath(name)>``
and list, sweep and prune through the functions here; each binding supplies only its I/O.

The encoding (``PathCodec.relpath``): the name is split on ``/``; each component is
percent-encoded (UTF-8, uppercase hex) down to the codec's ``safe`` characters and
``%XX``. A component made only of dots (possible only where ``.`` is safe) has its dots
encoded. Folders get the suffix ``%``; an empty last component becomes ``empty_file``.
At most ``folders_max`` components become folders (if set): the rest stays in the file's
part, ``/`` encoded as ``%2F``. A part whose encoding does not fit in
``component_bytes_max`` has all its dots encoded and is cut into pieces of one byte less,
every piece but the last a folder with the suffix ``~``.

Invariants (asserted in ``relpath``; checked by ``tests/conformance/test_path_codec.py``):

1. Every part of a path is non-empty, not ``.``/``..``, at most ``component_bytes_max``
   bytes, made only of safe characters, ``%`` and ``~``, and is never ``TMP_FOLDER``.
2. Encoded text never contains ``~`` and never ends in a lone ``%``, so a path parses back
   uniquely (a ``~`` folder: the component goes on; a ``%`` folder: the component ends; the
   file: the last part): ``decode(relpath(name)) == name`` for every valid name, and no
   chunk's path is a folder on another chunk's path (file ``a`` vs. folder ``a%``).
3. ``TMP_FOLDER`` (``%tmp``) directly below the root is no chunk's folder: chunks being
   created live there, and a walk reports only files at their name's canonical path.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from slts.errors import ChunkNameInvalid

from .base import CHUNK_NAME_BYTES_MAX, check_name

#: Suffix of a folder that ends a name component.
DIR_SUFFIX = "%"
#: Suffix of a folder holding a piece of a component too long for one path component.
CONTINUED_SUFFIX = "~"
#: The folder below the root where chunks are written before they are published.
TMP_FOLDER = "%tmp"
#: Temporary files older than this are debris of a crash and are removed at start.
TMP_AGE_S_MAX = 3600.0

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a folder listing, as a binding reports it to ``PathCodec.names_below``."""

    name: str  # the last path component
    folder: bool  # False: a regular file (bindings leave out links and other kinds)


@dataclass(frozen=True, slots=True)
class PathCodec:
    """The name <-> relative path mapping of one binding (see module doc).

    ``safe``: the characters kept as they are (a subset of ``[A-Za-z0-9._-]``);
    ``empty_file``: the file part of a name ending in ``/``; ``component_bytes_max``: the
    storage's limit on one path component; ``folders_max``: how many name components may
    become folders (``None``: all).
    """

    safe: frozenset[str]
    empty_file: str
    component_bytes_max: int = 255
    folders_max: int | None = None

    def __post_init__(self) -> None:
        assert self.safe <= frozenset(_ALNUM + "._-"), "safe characters must survive every storage"
        assert self.empty_file.startswith("%") and CONTINUED_SUFFIX not in self.empty_file
        assert self.component_bytes_max > 3 * 4 + 1, "a piece must hold one encoded character"
        assert self.folders_max is None or self.folders_max >= 0

    # -- encoding --------------------------------------------------------------------------

    @property
    def depth_max(self) -> int:
        """The most parts a path can have: a bound on every walk up or down a chunk's path."""
        folders = CHUNK_NAME_BYTES_MAX if self.folders_max is None else self.folders_max
        return folders + 3 * CHUNK_NAME_BYTES_MAX // (self.component_bytes_max - 1) + 8

    def relpath(self, name: str) -> str:
        """The path of chunk ``name`` relative to the root; ``ChunkNameInvalid`` for a name
        no binding must store (``check_name``)."""
        folders, last = self.split(check_name(name))
        parts = self.folder_parts(folders) + self._pieces(last, folder=False)
        allowed = self.safe | {"%", CONTINUED_SUFFIX}
        for part in parts:
            assert part not in ("", ".", "..", TMP_FOLDER), (name, part)
            assert len(part) <= self.component_bytes_max and set(part) <= allowed, (name, part)
        return "/".join(parts)

    def split(self, name: str) -> tuple[list[str], str]:
        """The components of ``name`` (or of a name prefix) that become folders, and the
        rest, which becomes the file's part."""
        components = name.split("/")
        count = len(components) - 1
        if self.folders_max is not None:
            count = min(count, self.folders_max)
        return components[:count], "/".join(components[count:])

    def folder_parts(self, folders: Sequence[str]) -> list[str]:
        """The path parts of name components that are folders."""
        return [part for folder in folders for part in self._pieces(folder, folder=True)]

    def _encode(self, text: str) -> str:
        # One regex pass in C; only unsafe characters reach Python (a hot path of listing).
        return _unsafe_characters(self.safe).sub(_percent_encoded, text)

    def _pieces(self, text: str, *, folder: bool) -> list[str]:
        """The path parts of one folder component or of the file's part."""
        if not text and not folder:
            return [self.empty_file]
        suffix = DIR_SUFFIX if folder else ""
        encoded = self._encode(text)
        if encoded and encoded.strip(".") == "":
            encoded = encoded.replace(".", "%2E")
        if len(encoded) + len(suffix) <= self.component_bytes_max:
            return [encoded + suffix]
        # Too long for one component. With every dot encoded no piece can be "." or "..".
        encoded = encoded.replace(".", "%2E")
        step = self.component_bytes_max - 1  # room for one suffix character
        pieces = [encoded[i : i + step] for i in range(0, len(encoded), step)]
        return [piece + CONTINUED_SUFFIX for piece in pieces[:-1]] + [pieces[-1] + suffix]

    # -- decoding --------------------------------------------------------------------------

    def decode(self, relpath: str) -> str | None:
        """The chunk name stored at ``relpath``, or ``None`` if ``relpath`` is not the path
        of any chunk (a temporary or foreign file)."""
        *folders, file_part = relpath.split("/")
        base, pending = "", ""
        for part in folders:
            if part.endswith(CONTINUED_SUFFIX):
                pending += part[:-1]
            elif part.endswith(DIR_SUFFIX) and part != self.empty_file:
                base, pending = base + self._decode_text(pending + part[:-1]) + "/", ""
            else:
                return None
        return self._file_name(base, pending + file_part, relpath)

    def _decode_text(self, encoded: str) -> str:
        # "replace": a foreign path with invalid UTF-8 decodes to a name whose canonical
        # path differs from it, so it is skipped like any foreign file.
        return unquote(encoded, encoding="utf-8", errors="replace")

    def _file_name(self, base: str, encoded: str, relpath: str) -> str | None:
        """The name of the file whose encoded part is ``encoded`` below the folders that
        decode to ``base``, if ``relpath`` is that name's canonical path."""
        name = base + ("" if encoded == self.empty_file else self._decode_text(encoded))
        try:
            return name if self.relpath(name) == relpath else None
        except ChunkNameInvalid:  # e.g. a NUL or an overlong name: no chunk has it
            return None

    # -- walks shared by the bindings ------------------------------------------------------

    def names_below(self, root: str, prefix: str, list_folder: Callable[[str], Iterable[Entry]]) -> list[str]:
        """The names of the chunks below ``root`` that start with ``prefix``, sorted.

        ``list_folder(path)`` lists one folder (``root`` and paths built below it with
        ``/``); it returns no entries for a folder that does not exist. Only folders that
        can hold a matching name are listed; only files at their name's canonical path are
        chunks. Iterative: a 1024-byte name can be 1024 folders deep.
        """
        folders, _ = self.split(prefix)
        start = "/".join([root, *self.folder_parts(folders)])
        names: list[str] = []
        stack = [(start, "".join(folder + "/" for folder in folders), "")]  # folder, name so far, pending
        while stack:
            folder, base, pending = stack.pop()
            for entry in list_folder(folder):
                path = f"{folder}/{entry.name}"
                if entry.folder:
                    if entry.name.endswith(CONTINUED_SUFFIX):
                        stack.append((path, base, pending + entry.name[:-1]))
                    elif entry.name.endswith(DIR_SUFFIX) and entry.name != self.empty_file:
                        sub = base + self._decode_text(pending + entry.name[:-1]) + "/"
                        if sub.startswith(prefix) or prefix.startswith(sub):
                            stack.append((path, sub, ""))
                else:
                    name = self._file_name(base, pending + entry.name, path[len(root) + 1 :])
                    if name is not None and name.startswith(prefix):
                        names.append(name)
        return sorted(names)

    def prune_folders(self, root: str, path: str, remove_empty: Callable[[str], bool]) -> None:
        """Remove the folders above chunk file ``path`` (below ``root``) while they are empty.

        ``remove_empty(folder)`` removes ``folder`` if it is empty and says whether it did;
        the walk up stops at the first it did not remove (its parents are not empty either)
        and never touches ``root``. Bounded by ``depth_max``.
        """
        folder = path.rsplit("/", 1)[0]
        below_root = root.rstrip("/") + "/"
        for _ in range(self.depth_max):
            if folder == root or not folder.startswith(below_root) or not remove_empty(folder):
                return
            folder = folder.rsplit("/", 1)[0]


@functools.cache
def _unsafe_characters(safe: frozenset[str]) -> re.Pattern[str]:
    """A pattern matching one character outside ``safe`` (one per codec, compiled once)."""
    return re.compile("[^" + re.escape("".join(sorted(safe))) + "]")


def _percent_encoded(match: re.Match[str]) -> str:
    """The UTF-8 bytes of the matched character as ``%XX`` escapes."""
    return "".join(f"%{byte:02X}" for byte in match.group().encode("utf-8"))


def remove_stale(entries: Iterable[tuple[str, float]], now_s: float, remove: Callable[[str], None]) -> None:
    """Remove the temporary files older than ``TMP_AGE_S_MAX``, given as (name, mtime in
    seconds) pairs of ``TMP_FOLDER``: debris of a crash between writing and publishing.
    ``remove(name)`` deletes one, best effort (it suppresses its own storage's errors)."""
    cutoff_s = now_s - TMP_AGE_S_MAX
    for name, mtime_s in entries:
        if mtime_s < cutoff_s:
            remove(name)
