"""The hierarchical path codec shared by the filesystem and HDFS bindings
(bindings/hierarchical_paths.py, invariants 1-3).

The pinned tables were computed with the two bindings' own encoders before the codec was
shared (``chunk_relpath`` of ``filesystem.py`` and ``hdfs.py`` at commit 4cf1da4): data
on disk and in HDFS stays readable only while every name keeps exactly its path. A long
path is pinned by its SHA-256 (first 32 hex digits) and its number of parts.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slts.bindings.base import CHUNK_NAME_BYTES_MAX
from slts.bindings.filesystem import CODEC as FILESYSTEM_CODEC
from slts.bindings.filesystem import FileSystemChunkStorage
from slts.bindings.filesystem import chunk_relpath as filesystem_relpath
from slts.bindings.hierarchical_paths import TMP_AGE_S_MAX, TMP_FOLDER, Entry, PathCodec, remove_stale


def digest(sha256_head: str, parts: int) -> tuple[str, int]:
    return sha256_head, parts


def pinned(relpath: str, expected: str | tuple[str, int]) -> bool:
    """``relpath`` is the path the tables below pin (literally or by digest)."""
    if isinstance(expected, str):
        return relpath == expected
    return (hashlib.sha256(relpath.encode()).hexdigest()[:32], relpath.count("/") + 1) == expected


FILESYSTEM_PATHS: dict[str, str | tuple[str, int]] = {
    "a": "a",
    "a/b": "a%/b",
    "a/": "a%/%2F",
    "/": "%/%2F",
    "//": "%/%/%2F",
    "/a": "%/a",
    "a//b": "a%/%/b",
    ".": "%2E",
    "..": "%2E%2E",
    "./a": "%2E%/a",
    "a/./b": "a%/%2E%/b",
    "a/../b": "a%/%2E%2E%/b",
    "...": "%2E%2E%2E",
    ".hidden": ".hidden",
    "a.b": "a.b",
    "a/.b/c.": "a%/.b%/c.",
    "%": "%25",
    "%%": "%25%25",
    "%2F": "%252F",
    "a%": "a%25",
    "a%/b": "a%25%/b",
    "~": "%7E",
    "a~b": "a%7Eb",
    "a~/b~": "a%7E%/b%7E",
    "%tmp": "%25tmp",
    "%tmp/x": "%25tmp%/x",
    "é": "%C3%A9",
    "日本/語": "%E6%97%A5%E6%9C%AC%/%E8%AA%9E",
    "emoji😀": "emoji%F0%9F%98%80",
    "a b": "a%20b",
    "a:b": "a%3Ab",
    "x\\y": "x%5Cy",
    "\t": "%09",
    "\x7f": "%7F",
    "-_": "-_",
    "\u00a0": "%C2%A0",
    "\ufeff": "%EF%BB%BF",
    "a\r\nb": "a%0D%0Ab",
    "?#&=": "%3F%23%26%3D",
    "a" * 254: digest("136496c2a16a22b58bbd01529b66d851", parts=1),
    "a" * 255: digest("b0f3323e7a3cad8ae6778340cc2a17ae", parts=1),
    "a" * 256: digest("f640d2bcb97cf3a875227c112dbe7811", parts=2),
    "a" * 254 + "/b": digest("06858bc97fc685de94426eef7e807a4c", parts=2),
    "a" * 255 + "/b": digest("0970a78eb816cdc58bd769f48ee743e0", parts=3),
    "a" * 253 + "/b": digest("71e5143d2749746d678133ee136bd397", parts=2),
    "." * 300: digest("e68f2306be9be858bcfc08e57d6d4bc2", parts=4),
    "é" * 85: digest("2062eb7dcff7e52d95aaa580c0a05ba3", parts=3),
    "é" * 200: digest("662bafc92799146313fd2c586388df16", parts=5),
    "d/" + "é" * 100 + "/f": digest("69213601dbf62c5ed4de1c4dd9959ad8", parts=5),
    "%" * 100: digest("ff0b3d68fc7eae846f5085510c571e31", parts=2),
    "/".join(
        ["c"] * 32
    ): "c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c",
    "/".join(
        ["c"] * 33
    ): "c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c",
    "/".join(["c"] * 40) + "x": digest("e5a8807276bc677051607415205e6a95", parts=40),
    "a/" * 33: digest("5c5fff6f949c28cea5cf3c41f0bc447a", parts=34),
    "/" * 40: "%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%2F",
    "x" * 1024: digest("e56a03dd372f6810dcb76fcd97b68cce", parts=5),
    "/" * 1024: digest("1e4791fa2ac6c402efaaf822bf61e29b", parts=1025),
    "é" * 512: digest("4f69b4c5ed5e60503008697733d128ee", parts=13),
    "." * 1024: digest("7f061cb7ebd6f9fab5d30aae533bc99b", parts=13),
    "ab/" * 341 + "a": digest("b7109abd684bf4b32cb8cb666174c22a", parts=342),
}


HDFS_PATHS: dict[str, str | tuple[str, int]] = {
    "a": "a",
    "a/b": "a%/b",
    "a/": "a%/%%",
    "/": "%/%%",
    "//": "%/%/%%",
    "/a": "%/a",
    "a//b": "a%/%/b",
    ".": "%2E",
    "..": "%2E%2E",
    "./a": "%2E%/a",
    "a/./b": "a%/%2E%/b",
    "a/../b": "a%/%2E%2E%/b",
    "...": "%2E%2E%2E",
    ".hidden": "%2Ehidden",
    "a.b": "a%2Eb",
    "a/.b/c.": "a%/%2Eb%/c%2E",
    "%": "%25",
    "%%": "%25%25",
    "%2F": "%252F",
    "a%": "a%25",
    "a%/b": "a%25%/b",
    "~": "%7E",
    "a~b": "a%7Eb",
    "a~/b~": "a%7E%/b%7E",
    "%tmp": "%25tmp",
    "%tmp/x": "%25tmp%/x",
    "é": "%C3%A9",
    "日本/語": "%E6%97%A5%E6%9C%AC%/%E8%AA%9E",
    "emoji😀": "emoji%F0%9F%98%80",
    "a b": "a%20b",
    "a:b": "a%3Ab",
    "x\\y": "x%5Cy",
    "\t": "%09",
    "\x7f": "%7F",
    "-_": "-_",
    "\u00a0": "%C2%A0",
    "\ufeff": "%EF%BB%BF",
    "a\r\nb": "a%0D%0Ab",
    "?#&=": "%3F%23%26%3D",
    "a" * 254: digest("136496c2a16a22b58bbd01529b66d851", parts=1),
    "a" * 255: digest("b0f3323e7a3cad8ae6778340cc2a17ae", parts=1),
    "a" * 256: digest("f640d2bcb97cf3a875227c112dbe7811", parts=2),
    "a" * 254 + "/b": digest("06858bc97fc685de94426eef7e807a4c", parts=2),
    "a" * 255 + "/b": digest("0970a78eb816cdc58bd769f48ee743e0", parts=3),
    "a" * 253 + "/b": digest("71e5143d2749746d678133ee136bd397", parts=2),
    "." * 300: digest("e68f2306be9be858bcfc08e57d6d4bc2", parts=4),
    "é" * 85: digest("2062eb7dcff7e52d95aaa580c0a05ba3", parts=3),
    "é" * 200: digest("662bafc92799146313fd2c586388df16", parts=5),
    "d/" + "é" * 100 + "/f": digest("69213601dbf62c5ed4de1c4dd9959ad8", parts=5),
    "%" * 100: digest("ff0b3d68fc7eae846f5085510c571e31", parts=2),
    "/".join(
        ["c"] * 32
    ): "c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c",
    "/".join(
        ["c"] * 33
    ): "c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c%/c",
    "/".join(["c"] * 40) + "x": digest("33cdc8e2e8bc713697ed1ca1395bfad3", parts=33),
    "a/" * 33: digest("8e617011bb4f0e882a4c8b7d95408293", parts=33),
    "/" * 40: "%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%/%2F%2F%2F%2F%2F%2F%2F%2F",
    "x" * 1024: digest("e56a03dd372f6810dcb76fcd97b68cce", parts=5),
    "/" * 1024: digest("5e545de961c84778cb3827907a0b1830", parts=44),
    "é" * 512: digest("4f69b4c5ed5e60503008697733d128ee", parts=13),
    "." * 1024: digest("7f061cb7ebd6f9fab5d30aae533bc99b", parts=13),
    "ab/" * 341 + "a": digest("6f32dec4f4ef4ae79e77003b41ee5df3", parts=39),
}


def hdfs_codec() -> PathCodec:
    hdfs = pytest.importorskip(
        "slts.bindings.hdfs", reason="pyhdfs is not installed (pip install 'slts[hdfs]')"
    )
    return hdfs.CODEC


@pytest.mark.parametrize("name", list(FILESYSTEM_PATHS))
def test_filesystem_paths_are_pinned(name: str) -> None:
    assert pinned(filesystem_relpath(name), FILESYSTEM_PATHS[name])


@pytest.mark.parametrize("name", list(HDFS_PATHS))
def test_hdfs_paths_are_pinned(name: str) -> None:
    hdfs = pytest.importorskip(
        "slts.bindings.hdfs", reason="pyhdfs is not installed (pip install 'slts[hdfs]')"
    )
    assert pinned(hdfs.chunk_relpath(name), HDFS_PATHS[name])


# -- round trip ------------------------------------------------------------------------------------


def valid(name: str) -> bool:
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return bool(name) and "\x00" not in name and len(encoded) <= CHUNK_NAME_BYTES_MAX


SPECIAL = st.sampled_from(list("/.%~-_aZ9 é\\:*😀\t+2EF"))
NAMES = st.one_of(
    st.text(min_size=1, max_size=60),
    st.lists(SPECIAL, min_size=1, max_size=60).map("".join),
    st.lists(st.text(alphabet="a.%~é", max_size=4), min_size=1, max_size=60).map("/".join),
    st.text(alphabet="a.é/%", min_size=250, max_size=600),
).filter(valid)


@pytest.fixture(scope="module", params=["filesystem", "hdfs"])
def codec(request: pytest.FixtureRequest) -> PathCodec:
    return FILESYSTEM_CODEC if request.param == "filesystem" else hdfs_codec()


@settings(max_examples=300, deadline=None)
@given(name=NAMES)
def test_decode_inverts_relpath(codec: PathCodec, name: str) -> None:
    relpath = codec.relpath(name)
    assert codec.decode(relpath) == name
    assert len(relpath.split("/")) <= codec.depth_max


@settings(max_examples=300, deadline=None)
@given(name=NAMES, other=NAMES)
def test_no_path_is_another_names_folder(codec: PathCodec, name: str, other: str) -> None:
    if name != other:
        one, two = codec.relpath(name), codec.relpath(other)
        assert one != two and not one.startswith(two + "/") and not two.startswith(one + "/")


@pytest.mark.parametrize(
    "relpath",
    [
        f"{TMP_FOLDER}/0123abcd",
        "a%",
        "a~",
        "a~/b~",
        "a%/%2F%2F",
        "%FF",
        "a%/%C3",
        "%2e",
        "x%25%/%%%",
        "A%/a.b/c",
    ],
)
def test_foreign_paths_decode_to_no_name(codec: PathCodec, relpath: str) -> None:
    name = codec.decode(relpath)
    assert name is None or codec.relpath(name) == relpath


# -- the walk, the prune and the sweep, over a fake folder tree ------------------------------------


class FakeTree:
    """Folders as a dict of path -> {entry name: is folder}, rooted at ``/r``."""

    def __init__(self, codec: PathCodec, names: Iterable[str], foreign: Iterable[str] = ()) -> None:
        self.folders: dict[str, dict[str, bool]] = {"/r": {}}
        self.listed: list[str] = []
        for relpath in [codec.relpath(name) for name in names] + list(foreign):
            self.add(f"/r/{relpath}")

    def add(self, path: str) -> None:
        folder, _, leaf = path.rpartition("/")
        self._make_folder(folder)
        self.folders[folder][leaf] = False

    def _make_folder(self, path: str) -> None:
        if path not in self.folders:
            parent, _, leaf = path.rpartition("/")
            self._make_folder(parent)
            self.folders[path] = {}
            self.folders[parent][leaf] = True

    def list_folder(self, path: str) -> list[Entry]:
        self.listed.append(path)
        return [Entry(name, folder) for name, folder in self.folders.get(path, {}).items()]

    def remove_empty(self, path: str) -> bool:
        if self.folders.get(path):
            return False
        del self.folders[path]
        parent, _, leaf = path.rpartition("/")
        del self.folders[parent][leaf]
        return True


@settings(max_examples=200, deadline=None)
@given(names=st.lists(NAMES, max_size=12, unique=True), prefix=st.text(alphabet="a.%~é/", max_size=6))
def test_names_below_lists_exactly_the_names_with_the_prefix(
    codec: PathCodec, names: list[str], prefix: str
) -> None:
    tree = FakeTree(codec, names, foreign=[f"{TMP_FOLDER}/0123abcd", "%FF", "a%/%2e"])
    assert codec.names_below("/r", prefix, tree.list_folder) == sorted(
        n for n in names if n.startswith(prefix)
    )


def test_names_below_lists_only_folders_that_can_hold_the_prefix(codec: PathCodec) -> None:
    tree = FakeTree(codec, ["a/b/c", "a/x", "b/c", "ab/c"])
    assert codec.names_below("/r", "a/", tree.list_folder) == ["a/b/c", "a/x"]
    assert "/r/b%" not in tree.listed and "/r/ab%" not in tree.listed


def test_prune_folders_removes_empty_folders_up_to_the_root(codec: PathCodec) -> None:
    tree = FakeTree(codec, ["a/b/c", "a/d"])
    path = f"/r/{codec.relpath('a/b/c')}"
    del tree.folders["/r/a%/b%"]["c"]
    codec.prune_folders("/r", path, tree.remove_empty)
    assert set(tree.folders) == {"/r", "/r/a%"}
    del tree.folders["/r/a%"]["d"]
    codec.prune_folders("/r", f"/r/{codec.relpath('a/d')}", tree.remove_empty)
    assert tree.folders == {"/r": {}}  # the root itself stays


def test_remove_stale_removes_only_old_files() -> None:
    removed: list[str] = []
    now_s = 10_000.0
    remove_stale([("old", now_s - TMP_AGE_S_MAX - 1), ("young", now_s - 5)], now_s, removed.append)
    assert removed == ["old"]


# -- through the filesystem binding ------------------------------------------------------------------


def test_filesystem_list_skips_foreign_files_that_are_not_utf8(tmp_path: Path) -> None:
    storage = FileSystemChunkStorage(str(tmp_path))
    storage.create("a", b"x")
    (tmp_path / "%FF").write_bytes(b"")  # undecodable: once crashed the listing
    os.mkdir(tmp_path / "%FE%")
    (tmp_path / "%FE%" / "b").write_bytes(b"")
    assert list(storage.list()) == ["a"]


def test_every_binding_codec_is_a_path_codec() -> None:
    codecs: list[Callable[[], PathCodec]] = [lambda: FILESYSTEM_CODEC, hdfs_codec]
    for make in codecs:
        assert isinstance(make(), PathCodec)
