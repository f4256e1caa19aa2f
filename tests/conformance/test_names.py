"""Chunk names and ``list(prefix)``, on every binding.

A chunk name is any string of 1 to 1024 UTF-8 bytes without NUL. ``/`` has no meaning to
the contract: ``a`` and ``a/b`` are two unrelated chunks, and ``list(prefix)`` is plain
string-prefix matching (``list("a")`` finds ``ab`` too), in ascending ``str`` order.
"""

from __future__ import annotations

import pytest
from slts.bindings.base import CHUNK_NAME_BYTES_MAX

from tests.support.conformance import content

HOSTILE_NAMES = [
    "plain",
    "with space",
    " lead",
    "trail ",
    "100%",
    "%",
    "%2F",
    "%25",
    "%tmp",
    "%tmp/x",
    "a%",
    "a~",
    "~",
    "a.b",
    ".",
    "..",
    "...",
    ".hidden",
    "../x",
    "../../etc/passwd",
    "a/../b",
    "./a",
    "a/./b",
    "/abs",
    "/",
    "//",
    "a//b",
    "x/",
    "x//",
    "a/b/c",
    "ünïcödé/名前",
    "emoji😀",
    "tab\tnl\n",
    "back\\slash",
    'colon:star*?<>|"',
    "CON",
    "nul",
    "\x01\x7f",
    "\u202e",
    "\ufeff",
    "e\u0301",
    "é",
    "Case",
    "case",
    "+plus",
    "semi;colon",
]

LONGEST_NAMES = [
    "x" * CHUNK_NAME_BYTES_MAX,  # one component far longer than a file name may be
    "é" * (CHUNK_NAME_BYTES_MAX // 2),
    "😀" * (CHUNK_NAME_BYTES_MAX // 4),
    "%" * CHUNK_NAME_BYTES_MAX,
    "." * CHUNK_NAME_BYTES_MAX,
    "/" * CHUNK_NAME_BYTES_MAX,  # 1024 empty components
    "a/" * (CHUNK_NAME_BYTES_MAX // 2 - 1) + "b",
    "../" * (CHUNK_NAME_BYTES_MAX // 3),
    ("é" * 200 + "/") * 2 + "." * 200,
]


def _data(index: int, name: str) -> bytes:
    return f"{index}:{name}".encode("utf-8", "surrogatepass")


def test_hostile_names_are_stored_and_listed_exactly(storage, raw):
    for index, name in enumerate(HOSTILE_NAMES):
        storage.create(name, _data(index, name))
    for index, name in enumerate(HOSTILE_NAMES):
        assert storage.exists(name), name
        assert storage.get_info(name).name == name
        assert content(storage, name) == _data(index, name)
        assert raw.read(name) == _data(index, name)
    assert list(storage.list()) == sorted(HOSTILE_NAMES)


def test_names_of_exactly_the_maximum_length_are_accepted(storage, raw):
    for name in LONGEST_NAMES:
        assert len(name.encode()) <= CHUNK_NAME_BYTES_MAX
        storage.create(name, name.encode()[:50])
    for name in LONGEST_NAMES:
        assert storage.exists(name)
        assert content(storage, name) == name.encode()[:50]
        assert raw.read(name) == name.encode()[:50]
        assert name in list(storage.list(name))
    assert list(storage.list()) == sorted(LONGEST_NAMES)


def test_a_chunk_and_chunks_below_its_name_coexist(storage):
    names = ["a", "a/b", "a/b/c", "a/", "a//", "ab", "a b", "a/b/"]
    for name in names:
        storage.create(name, name.encode())
    storage.delete(storage.open_read("a"))
    storage.delete(storage.open_read("a/b"))
    rest = sorted(set(names) - {"a", "a/b"})
    assert list(storage.list()) == rest
    for name in rest:
        assert content(storage, name) == name.encode()


PREFIX_NAMES = [
    "a",
    "a/b",
    "a/b/c",
    "a/bc",
    "a/",
    "ab",
    "b",
    "a%",
    "a.b",
    "é",
    "é/x",
    "/x",
    "//y",
    "x/",
]


def test_list_is_exact_string_prefix_matching_in_order(storage):
    for name in PREFIX_NAMES:
        storage.create(name)
    # Every prefix of every name, plus prefixes no name has.
    prefixes = {name[:cut] for name in PREFIX_NAMES for cut in range(len(name) + 1)}
    prefixes |= {"zzz", "a/b/c/d", ".", "..", "%", "a/b//", "x//", "é/x/"}
    for prefix in sorted(prefixes):
        expected = sorted(name for name in PREFIX_NAMES if name.startswith(prefix))
        assert list(storage.list(prefix)) == expected, prefix
    assert list(storage.list()) == sorted(PREFIX_NAMES)


def test_list_of_an_empty_storage_is_empty(storage):
    assert list(storage.list()) == []
    assert list(storage.list("a/")) == []


@pytest.mark.parametrize("prefix", ["a\x00", "x" * (CHUNK_NAME_BYTES_MAX + 1), "%tmp", "%tmp/"])
def test_list_with_a_prefix_no_chunk_has_is_empty(storage, prefix):
    storage.create("x", b"1")
    storage.create("x" * CHUNK_NAME_BYTES_MAX, b"2")
    assert list(storage.list(prefix)) == []


def test_list_forgets_deleted_chunks_and_their_folders(storage):
    handle = storage.create("a/b/c", b"x")
    storage.create("a/z")
    storage.delete(handle)
    assert list(storage.list()) == ["a/z"]
    assert list(storage.list("a/b")) == []
    storage.delete(storage.open_read("a/z"))
    assert list(storage.list()) == []
    assert list(storage.list("a")) == []


def test_lone_surrogates_are_rejected(storage) -> None:
    """Object stores and HDFS need valid UTF-8 names, so every binding refuses others."""
    from slts.errors import ChunkNameInvalid

    with pytest.raises(ChunkNameInvalid):
        storage.create("bad\udcffname", b"x")
    assert list(storage.list("")) == []
