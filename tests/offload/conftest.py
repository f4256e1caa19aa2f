"""``framer``: a test runs once with the compiled framer (``slts.offload._framing``) and once
with the pure-Python one, which stays the reference (``slts.offload.framing``). Where the
compiled one is not built, its runs skip, saying so, unless ``SLTS_REQUIRE_NATIVE=1`` (set by
tests/run.sh, so CI runs both): then they fail."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from slts.offload import framing

BUILT = framing.NATIVE


@pytest.fixture(params=["native", "python"])
def framer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "native":
        if BUILT is None:
            if os.environ.get("SLTS_REQUIRE_NATIVE") == "1":
                pytest.fail("SLTS_REQUIRE_NATIVE=1, but slts.offload._framing is not built")
            pytest.skip("slts.offload._framing is not built (no C compiler at install)")
        monkeypatch.setattr(framing, "NATIVE", BUILT)
    else:
        monkeypatch.setattr(framing, "NATIVE", None)
    yield request.param
