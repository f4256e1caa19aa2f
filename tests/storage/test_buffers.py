"""``slts.buffers.filled_bytes``: the reference and its compiled twin answer alike."""

from __future__ import annotations

import random

import pytest

from slts import buffers

TWINS = {"python": buffers.filled_bytes_python}
if buffers.NATIVE is not None:
    TWINS["compiled"] = buffers.NATIVE.filled_bytes


def test_the_compiled_twin_is_built_here() -> None:
    """CI builds it (the README's install compiles it): both twins are tested."""
    assert buffers.NATIVE is not None
    assert buffers.filled_bytes is buffers.NATIVE.filled_bytes


@pytest.mark.parametrize("twin", list(TWINS))
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


@pytest.mark.parametrize("twin", list(TWINS))
def test_an_error_in_fill_passes_through_and_nothing_is_returned(twin: str) -> None:
    def fill(view: memoryview) -> None:
        view[:1] = b"x"
        raise KeyError("fill failed")

    with pytest.raises(KeyError, match="fill failed"):
        TWINS[twin](3, fill)


@pytest.mark.parametrize("twin", list(TWINS))
def test_a_fill_that_keeps_its_view_is_refused(twin: str) -> None:
    kept: list[memoryview] = []
    with pytest.raises(RuntimeError, match="kept its view"):
        TWINS[twin](4, kept.append)
    with pytest.raises(ValueError):  # released: the bytes it saw can no longer be written
        kept[0][:1] = b"z"


@pytest.mark.parametrize("twin", list(TWINS))
def test_bad_arguments_are_refused(twin: str) -> None:
    with pytest.raises(ValueError, match="size"):
        TWINS[twin](-1, lambda view: None)
    with pytest.raises(TypeError):
        TWINS[twin](1, "not callable")  # type: ignore[arg-type]
