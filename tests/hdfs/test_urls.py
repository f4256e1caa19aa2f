"""``hdfs://`` URLs: what the binding takes, and ``InvalidConfig`` for everything else."""

from __future__ import annotations

import pytest

pytest.importorskip("pyhdfs", reason="pyhdfs is not installed (pip install 'slts[hdfs]')")

from slts.bindings import from_url
from slts.bindings.hdfs import DEFAULT_PORT, HdfsChunkStorage, _check_host

from slts.errors import InvalidConfig
from tests.support.hdfs import TEST_USER

BAD_URLS = [
    "hdfs://",
    "hdfs:///no/host",
    "hdfs://nn:notaport/r",
    "hdfs://nn:0/r",
    "hdfs://nn:70000/r",
    "hdfs://nn:9870,/r",
    "hdfs://nn:9870",
    "hdfs://nn:9870/",
    "hdfs://nn:9870/a/../b",
    "hdfs://nn:9870/a/./b",
    "hdfs://nn:9870/a//b",
    "hdfs://nn:9870/a:b",
    "hdfs://nn:9870/r/%tmp",
    "hdfs://nn:9870/r%FF",
    "hdfs://nn:9870/r#fragment",
    "hdfs://nn:9870/r?bogus=1",
    "hdfs://nn:9870/r?max_attempts=0",
    "hdfs://nn:9870/r?max_attempts=x",
    "hdfs://nn:9870/r?max_attempts=101",
    "hdfs://nn:9870/r?attempts_max=3",  # the old spelling: refused with a hint (below)
    "hdfs://nn:9870/r?backoff_s=-1",
    "hdfs://nn:9870/r?backoff_s=60",
    "hdfs://nn:9870/r?timeout_s=0",
    "hdfs://nn:9870/r?https=maybe",
    "hdfs://nn:9870/r?user=",
    "hdfs://nn:9870/r?user=a&user=b",
    "webhdfs://nn:9870/r",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_bad_urls_are_invalid_config(url):
    with pytest.raises(InvalidConfig):
        from_url(url) if url.startswith("hdfs") else HdfsChunkStorage.from_url(url)


def test_credentials_in_the_url_are_refused_without_being_echoed():
    with pytest.raises(InvalidConfig) as caught:
        from_url("hdfs://alice:s3cret@nn:9870/r")
    assert "s3cret" not in str(caught.value)


def test_the_old_option_name_points_to_the_new_one():
    with pytest.raises(InvalidConfig, match="'attempts_max' is now 'max_attempts'"):
        from_url("hdfs://nn:9870/r?attempts_max=3")


def test_a_good_url_sets_every_option(server, root):
    url = server.url(root + "/", user=TEST_USER, max_attempts=3, backoff_s=0.25, timeout_s=5, https=0)
    storage = from_url(url)
    assert isinstance(storage, HdfsChunkStorage)
    assert storage.retry.max_attempts == 3 and storage.retry.delay_s_base == 0.25
    assert (storage.root, storage.user, storage.max_attempts, storage.backoff_s) == (
        root,
        TEST_USER,
        3,
        0.25,
    )
    assert storage.url == url
    storage.create("c", b"x")
    assert from_url(url).exists("c")  # a second instance from the same URL sees it
    storage.close()


def test_the_port_defaults_to_the_namenode_http_port():
    assert _check_host("nn", "u") == f"nn:{DEFAULT_PORT}"
    assert _check_host("nn:50070", "u") == "nn:50070"
    assert _check_host("[::1]", "u") == f"[::1]:{DEFAULT_PORT}"
    assert _check_host("[::1]:8000", "u") == "[::1]:8000"
