"""The compiled row framer (``slts.metadata._rows.frame_rows``) against its pure-Python twin
(``lmdb_store.frame_rows_python``), which is the reference: the same puts and deletes, or
the same refusal (None), for rows plain or strange; and LMDB's ``replicate_rows`` with
either, leaving the same store. Where the compiled framer is not built, its runs skip,
saying so, unless ``SLTS_REQUIRE_NATIVE=1`` (tests/run.sh, so CI runs both): then they fail."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slts.errors import InvalidArgument
from slts.metadata import LmdbMetadataStore, Versioned, lmdb_store
from slts.metadata.lmdb_store import frame_rows_python

from .conftest import TABLES

BUILT = lmdb_store.ROWS_NATIVE
T = TABLES[0]


def _require_built() -> Any:
    if BUILT is None:
        if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
            pytest.fail("SLTS_REQUIRE_NATIVE=1, but slts.metadata._rows is not built")
        pytest.skip("slts.metadata._rows is not built (no C compiler at install)")
    return BUILT


def test_the_compiled_framer_is_in_use_where_built() -> None:
    if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
        assert BUILT is not None, "CI installs with a C compiler: the extension must be built"


class Key(bytes):
    """A bytes subclass: not plain (the shared checks accept it; the framers leave it)."""


ODD = [
    Key(b"sub"),
    b"",
    b"x" * 512,
    "str",
    None,
    True,
    0,
    -1,
    1 << 64,
    1 << 70,
    3.0,
    bytearray(b"v"),
    Key(b"v"),
    [b"a", 1, b"v"],
]
KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e" * 511]) | st.sampled_from(ODD)
VERSIONS = st.integers(1, 40) | st.sampled_from(ODD)
VALUES = st.none() | st.binary(max_size=6) | st.sampled_from(ODD)
ROWS = st.lists(
    st.one_of(
        st.tuples(KEYS, VERSIONS, VALUES),
        st.tuples(KEYS, VERSIONS, VALUES).map(list),
        st.tuples(KEYS, VERSIONS),
        st.sampled_from(ODD),
    ),
    max_size=8,
)


@settings(max_examples=500, deadline=None)
@given(ROWS, st.sampled_from([1, 20, 40, (1 << 64) - 1]))
def test_the_compiled_framer_gives_the_answers_of_its_twin(rows: list[Any], sequence: int) -> None:
    built = _require_built()
    try:
        ordered = sorted(rows, key=lambda row: row[0])  # sorted (mostly) and as they come
    except (TypeError, IndexError, KeyError):
        ordered = rows
    assert built.frame_rows(ordered, sequence, 511) == frame_rows_python(ordered, sequence, 511)
    assert built.frame_rows(rows, sequence, 511) == frame_rows_python(rows, sequence, 511)


def test_plain_rows_are_framed() -> None:
    rows = [(b"a", 3, b"one"), (b"b", 9, None), [b"c", 20, b""]]
    expected = ([(b"a", (3).to_bytes(8, "big") + b"one"), (b"c", (20).to_bytes(8, "big"))], [b"b"])
    assert frame_rows_python(rows, 20, 511) == expected
    if BUILT is not None:
        assert BUILT.frame_rows(rows, 20, 511) == expected
    assert frame_rows_python([(b"a", 21, b"v")], 20, 511) is None  # a version past the sequence
    assert frame_rows_python([(b"a", 1, b"v"), (b"a", 2, None)], 20, 511) is None  # repeated
    assert frame_rows_python([(b"b", 1, b"v"), (b"a", 2, None)], 20, 511) is None  # not sorted


@pytest.mark.parametrize("framer", ["native", "python"])
def test_lmdb_replicate_rows_with_either_framer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, framer: str
) -> None:
    monkeypatch.setattr(lmdb_store, "ROWS_NATIVE", _require_built() if framer == "native" else None)
    with LmdbMetadataStore(str(tmp_path / "lmdb"), TABLES) as store:
        store.replicate_rows(5, {T: [(b"b", 5, b"B"), (b"a", 2, b"A")]})
        store.replicate_rows(9, {T: [(Key(b"c"), 9, Key(b"C")), (b"a", 0, None)]})  # unusual: shared checks
        assert store.dump()[T] == {b"b": Versioned(5, b"B"), b"c": Versioned(9, b"C")}
        with pytest.raises(InvalidArgument, match="twice"):
            store.replicate_rows(10, {T: [(b"x", 10, b"1"), (b"x", 10, b"2")]})
        assert store.last_sequence == 9
