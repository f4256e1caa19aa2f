"""Fixtures of the Azure binding's tests: the session's Azurite (tests/support/azurite.py)."""

from __future__ import annotations

import pytest

from tests.support.azurite import AzuriteServer, shared_server_or_skip


@pytest.fixture(scope="session")
def azurite() -> AzuriteServer:
    return shared_server_or_skip()
