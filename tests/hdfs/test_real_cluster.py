"""The real-cluster run: the conformance suite's ``hdfs-real`` entry needs ``SLTS_HDFS_URL``.

Without it this module skips once with the reason, and ``tests/conformance/conftest.py``
leaves the entry out (rather than skipping every conformance test one by one).
"""

from __future__ import annotations

from tests.conformance import conftest as conformance
from tests.support.hdfs import real_cluster_configured, real_cluster_url


def test_the_real_cluster_entry_runs_when_configured() -> None:
    url = real_cluster_url()  # skips, printing why, when SLTS_HDFS_URL is not set
    assert real_cluster_configured() and url
    assert "hdfs-real" in conformance.BINDINGS
