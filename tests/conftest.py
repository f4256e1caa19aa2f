"""Fixtures shared by every test folder, and the ``slow`` marker.

``slow`` (``pytest -m "not slow"`` is the quick local loop; CI runs everything): the
tests of the folders that start real servers or processes (SeaweedFS, Spark, SIGKILL
crash runs, the WebHDFS server), every test parametrized over the S3 binding or the
WebHDFS server (its id names ``s3`` or ``hdfs``), and the tests in ``SLOW_TESTS``
(measured over 10 s). ``azure`` likewise (Azurite, ``tests/support/azurite.py``).

``s3_server``: the session's SeaweedFS S3 server (``tests/support/s3server.py``): endpoint, test
credentials, ``new_bucket()``. Started on first use (also by the S3 entries of the
conformance and storage suites), stopped (SIGTERM, grace, SIGKILL) when the session
ends; tests that need it skip with the reason when ``weed`` or boto3 is not installed.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.support import azurite
from tests.support.gcsserver import stop_shared_emulator
from tests.support.s3server import SeaweedServer, shared_server_or_skip, stop_shared_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedServer]:
    server = shared_server_or_skip()
    try:
        yield server
    finally:
        stop_shared_server()


@pytest.fixture(scope="session", autouse=True)
def _stop_s3_server_at_session_end() -> Iterator[None]:
    # Suites that start the shared server without the fixture: stopped at the end too
    # (atexit is only the fallback).
    yield
    stop_shared_server()
    stop_shared_emulator()  # the GCS emulator of tests/support/gcsserver.py, the same way


@pytest.fixture(scope="session", autouse=True)
def _stop_azurite_at_session_end() -> Iterator[None]:
    # The session's Azurite (tests/support/azurite.py), if anything started it.
    yield
    azurite.stop_shared_server()


#: Folders whose tests start servers or processes.
SLOW_FOLDERS = ("s3", "spark", "crash", "hdfs", "gcs", "azure")
#: Tests of other folders that take over 10 s on the 2-core machine (file::name prefixes).
SLOW_TESTS: tuple[str, ...] = (
    "storage/test_stateful.py::",
    "storage/test_layout_changes.py::test_concat_cost_does_not_depend_on_source_chunks",
    "conformance/test_model.py::test_binding_matches_the_model",
    "metadata/test_metadata_model.py::test_store_matches_dict_model",
    "journal/test_system_journal.py::test_boot_after_many_records",
    "simulation/test_simulate.py::test_fixed_seeds_have_no_unknown_violation",
    "cli/test_cli.py::test_console_script_and_demo",
    "cli/test_cli_errors.py::test_verify_reports_damaged_metadata_instead_of_crashing",
    "cli/test_bench.py::",
    "cli/test_damaged_metadata.py::",  # damaged LMDB files, each command in a child process
    "storage/test_consistent_layouts.py::",  # an owner beside threads that walk and scrub
    "simulation/test_simulate.py::test_an_observer_seeing_a_mix_of_layouts_is_caught",
    "chunk_cache/test_model.py::",  # hypothesis programs through a cache against the binding
)


#: Tests allowed longer than the per-test limit (pyproject: ``timeout = 120``), and why
#: (file::name prefixes, or a folder with ``/``). A test's own ``timeout`` mark wins, and
#: so does ``--timeout N`` on the command line (soaks run with ``--timeout 0``).
TIMEOUT_OVERRIDES: dict[str, int] = {
    "spark/": 300,  # a JVM and a Spark session start on first use; batches of thousands of tasks
    "crash/": 300,  # SIGKILL matrices: child processes, a SeaweedFS server killed and restarted
    "storage/test_stateful.py::": 300,  # hypothesis programs against the model: 33 s measured
}


def _relative_id(item: pytest.Item) -> str:
    return item.nodeid.split("[")[0].removeprefix("tests/")


def _is_slow(item: pytest.Item) -> bool:
    relative = pathlib.Path(str(item.path)).relative_to(pathlib.Path(__file__).parent)
    if relative.parts[0] in SLOW_FOLDERS:
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and {"s3", "hdfs", "gcs", "azure"} & set(
        callspec.id.replace("+", "-").split("-")
    ):
        return True  # the SeaweedFS server, the WebHDFS server, the GCS emulator, Azurite
    return _relative_id(item).startswith(SLOW_TESTS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # ``--timeout N`` on the command line (``--timeout 0`` for a soak) wins over the table.
    overrides = TIMEOUT_OVERRIDES if config.getoption("timeout", None) is None else {}
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("timeout") is None:
            for prefix, seconds in overrides.items():
                if _relative_id(item).startswith(prefix):
                    item.add_marker(pytest.mark.timeout(seconds))
                    break
