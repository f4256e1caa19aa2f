"""``slts cost`` as a user runs it: the requests every command made, recorded across
processes by class, the bytes stored, priced at the configured rates (flags, variables,
the file), ``--json``, a bad rate refused naming its key; on S3 the counts are the
binding's own requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slts.cost import GiB
from tests.support.cli import run_slts
from tests.support.s3server import shared_server_or_skip

CHUNK = 4096


def cost(*flags: str, env: dict[str, str] | None = None) -> dict:
    result = run_slts("cost", "--json", *flags, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def put(name: str, data: Path, *flags: str, env: dict[str, str] | None = None) -> None:
    result = run_slts(
        "put", name, str(data), *flags, "--write-bytes", str(CHUNK),
        "--set", f"rolling_length_bytes_default={CHUNK}", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_requests_of_every_process_are_recorded_and_priced(tmp_path: Path) -> None:
    store = ["--store", str(tmp_path / "store")]
    data = tmp_path / "data"
    data.write_bytes(b"x" * (10 * CHUNK))
    put("a", data, *store)
    first = cost(*store)
    assert first["exact_requests"] is False  # the filesystem: what an object store would count
    stored = {"segments": 1, "chunks": 10, "bytes": 10 * CHUNK, "gc_queued_chunks": 0}
    stored["logical_bytes"] = stored["bytes"]  # no transforms
    assert first["stored"] == stored
    writes = first["classes"]["tail_write"]
    assert writes["requests"]["PUT"] >= 10 and writes["bytes_sent"] >= 10 * CHUNK

    put("b", data, *store)
    assert run_slts("cat", "a", *store).returncode == 0
    second = cost(*store)
    assert second["stored"]["chunks"] == 20 and second["stored"]["bytes"] == 20 * CHUNK
    assert second["classes"]["tail_write"]["requests"]["PUT"] >= writes["requests"]["PUT"] + 10
    assert second["classes"]["read"]["bytes_received"] >= 10 * CHUNK  # cat read segment a
    assert second["classes"]["read"]["requests"]["GET"] >= 10

    # Priced as configured: every PUT-class request at 1 per 1,000, stored bytes at 2 per GB.
    (tmp_path / "store" / "slts.toml").write_text("[prices]\nput_per_1000 = 1.0\n")
    priced = cost(*store, "--set", "prices.storage_gb_month=2", env={"SLTS_PRICES_GET_PER_1000": "0"})
    total = priced["total"]["requests"]
    put_class = sum(total.get(kind, 0) for kind in ("PUT", "COPY", "MULTIPART", "LIST"))
    assert priced["prices"]["put_per_1000"] == 1.0 and priced["prices"]["get_per_1000"] == 0.0
    assert priced["total"]["cost"] == pytest.approx(put_class / 1000)
    assert priced["storage_cost_per_month"] == pytest.approx(20 * CHUNK / GiB * 2)

    text = run_slts("cost", *store)
    assert text.returncode == 0 and "tail_write" in text.stdout and "per month" in text.stdout


def test_defrag_and_gc_requests_land_in_their_classes(tmp_path: Path) -> None:
    store = ["--store", str(tmp_path / "store")]
    data = tmp_path / "data"
    data.write_bytes(b"y" * (8 * CHUNK))
    for i in range(4):
        put(f"txn{i}", data, *store)
        assert run_slts("seal", f"txn{i}", *store).returncode == 0
    assert run_slts("put", "s", "/dev/null", *store).returncode == 0
    for i in range(4):
        assert run_slts("concat", "s", f"txn{i}", *store).returncode == 0
    before = cost(*store)["classes"]
    defrag = run_slts("defrag", "s", *store, "--json")
    gc = run_slts("gc", *store, "--set", "gc_delay_s=0", "--json")
    assert defrag.returncode == gc.returncode == 0, defrag.stderr + gc.stderr
    defragged, collected = json.loads(defrag.stdout), json.loads(gc.stdout)
    assert defragged["runs_committed"] == 1 and collected["chunks_deleted"] > 0
    after = cost(*store)
    # The run's native concat is one COPY of its bytes in the DEFRAG class (concat's seam
    # merges before it were DEFRAG work too); every chunk GC deleted is one DELETE in GC.
    copied = after["classes"]["defrag"]["bytes_copied"] - before["defrag"]["bytes_copied"]
    assert copied == defragged["bytes_native"] > 0
    assert after["classes"]["defrag"]["requests"]["COPY"] == before["defrag"]["requests"]["COPY"] + 1
    assert after["classes"]["gc"]["requests"]["DELETE"] == collected["chunks_deleted"]
    assert after["stored"]["chunks"] == defragged["chunks_after"]


def test_a_bad_rate_is_refused_naming_its_key(tmp_path: Path) -> None:
    store = ["--store", str(tmp_path / "store")]
    result = run_slts("cost", *store, "--set", "prices.put_per_1000=-1")
    assert result.returncode == 5 and "prices.put_per_1000" in result.stderr
    result = run_slts("cost", *store, env={"SLTS_PRICES_GET_PER_1000": "cheap"})
    assert result.returncode == 5 and "SLTS_PRICES_GET_PER_1000" in result.stderr
    assert not (tmp_path / "store").exists(), "nothing is created for a refused command"


@pytest.mark.slow  # the SeaweedFS server
def test_on_s3_the_counts_are_the_binding_requests(tmp_path: Path) -> None:
    server = shared_server_or_skip()
    bucket = server.new_bucket("cost")
    flags = [
        "--store",
        f"s3://{bucket}/c?endpoint_url={server.endpoint_url}",
        "--metadata",
        str(tmp_path / "md"),
    ]
    env = server.credentials()
    data = tmp_path / "data"
    data.write_bytes(b"z" * (3 * CHUNK))
    put("s", data, *flags, env=env)
    report = cost(*flags, env=env)
    assert report["exact_requests"] is True
    assert report["stored"]["chunks"] == 3 and report["stored"]["bytes"] == 3 * CHUNK
    assert report["classes"]["tail_write"]["requests"]["PUT"] >= 3
