"""``slts.buffers.filled_bytes``: the reference and its compiled twin answer alike. Where
the twin is not built its runs skip, saying so, unless ``SLTS_REQUIRE_NATIVE=1`` (set by
tests/run.sh, so CI runs both): then they fail."""

from __future__ import annotations

import importlib
import os
import random
from types import ModuleType

import pytest

from slts import buffers


def _built() -> ModuleType | None:
    try:
        return importlib.import_module("slts._buffers")  # whatever SLTS_PURE_PYTHON says
    except ImportError:
        return None


BUILT = _built()
TWINS = {"python": buffers.filled_bytes_python, "compiled": getattr(BUILT, "filled_bytes", None)}


@pytest.fixture(params=list(TWINS))
def twin(request: pytest.FixtureRequest) -> str:
    if TWINS[request.param] is None:
        if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
            pytest.fail("SLTS_REQUIRE_NATIVE=1, but slts._buffers is not built")
        pytest.skip("slts._buffers is not built (no C compiler at install)")
    return request.param


def test_the_compiled_twin_is_used_where_built() -> None:
    if os.environ.get("SLTS_PURE_PYTHON") == "1" or BUILT is None:
        assert buffers.NATIVE is None and buffers.filled_bytes is buffers.filled_bytes_python
    else:
        assert buffers.filled_bytes is BUILT.filled_bytes


def test_the_bytes_hold_what_fill_wrote(twin: str) -> None:
    rng = random.Random(3)
    for size in (0, 1, 7, 4096, 100_003):
        wanted = rng.randbytes(size)

        def fill(view: memoryview, wanted: bytes = wanted) -> None:
            assert not view.readonly and len(view) == len(wanted)
            half = len(wanted) // 2
            view[:half] = wanted[:half]  # in pieces, as a decoder writes frames
            view[half:] = wanted[half:]

        made = TWINS[twin](size, fill)
        assert type(made) is bytes and made == wanted


def test_an_error_in_fill_passes_through_and_nothing_is_returned(twin: str) -> None:
    def fill(view: memoryview) -> None:
        view[:1] = b"x"
        raise KeyError("fill failed")

    with pytest.raises(KeyError, match="fill failed"):
        TWINS[twin](3, fill)


def test_a_fill_that_keeps_its_view_is_refused(twin: str) -> None:
    kept: list[memoryview] = []
    with pytest.raises(RuntimeError, match="kept its view"):
        TWINS[twin](4, kept.append)
    with pytest.raises(ValueError):  # released: the bytes it saw can no longer be written
        kept[0][:1] = b"z"


def test_bad_arguments_are_refused(twin: str) -> None:
    with pytest.raises(ValueError, match="size"):
        TWINS[twin](-1, lambda view: None)
    with pytest.raises(TypeError):
        TWINS[twin](1, "not callable")  # type: ignore[arg-type]
