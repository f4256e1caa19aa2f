"""Fixtures for the GCS binding's own tests: the session's emulator and a bucket per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.gcsserver import GcsEmulator, shared_emulator_or_skip, stop_shared_emulator


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    """The session's emulator (shared with the conformance suite's ``gcs`` entry)."""
    emulator = shared_emulator_or_skip()
    try:
        yield emulator
    finally:
        stop_shared_emulator()


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator) -> str:
    """A new, empty bucket on the emulator."""
    return gcs_emulator.new_bucket("gcs")
