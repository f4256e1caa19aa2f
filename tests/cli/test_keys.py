"""``slts keys``: a key ring created, rotated and listed; an encrypted store written and
read through the CLI with ``--key-ring``; data keys re-wrapped under the active key
(records only, resumable); errors exit with their code and change nothing; no output holds
key material."""

from __future__ import annotations

import json
import os

from tests.support.cli import run_slts as slts


def ok(result) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}


def key_files(ring: str) -> list[bytes]:
    found = []
    for name in os.listdir(ring):
        if name.endswith(".key"):
            with open(os.path.join(ring, name), "rb") as file:
                found.append(file.read())
    return found


def test_a_ring_is_created_rotated_listed_and_the_store_rewrapped(tmp_path) -> None:
    ring, store = str(tmp_path / "ring"), str(tmp_path / "store")
    payload = tmp_path / "payload"
    payload.write_bytes(b"card=4111-1111-1111-1111;" * 500)
    flags = ["--store", store, "--key-ring", ring, "--json"]
    outputs = []

    def run(*argv: str) -> dict:
        result = slts(*argv)
        outputs.append(result.stdout + result.stderr)
        return ok(result)

    assert run("keys", "create", "--id", "first", *flags) == {"active": "first", "ring": ring}
    run("put", "a", str(payload), "--set", "encryption=true", *flags)
    assert run("keys", "rotate", "--id", "second", *flags) == {"active": "second", "previous": "first"}
    run("put", "b", str(payload), "--set", "encryption=true", *flags)
    listed = run("keys", "ls", *flags)["keys"]
    assert listed == [
        {"id": "first", "active": False, "data_keys": 1},
        {"id": "second", "active": True, "data_keys": 1},
    ]
    report = run("keys", "rewrap", *flags)
    assert (report["keys_rewrapped"], report["chunks_changed"], report["chunks_seen"]) == (1, 1, 2)
    assert run("keys", "rewrap", *flags)["keys_rewrapped"] == 0, "a second run has nothing left"
    assert [k["data_keys"] for k in run("keys", "ls", *flags)["keys"]] == [0, 2]
    for name in ("a", "b"):
        result = slts("cat", name, "--store", store, "--key-ring", ring)
        assert result.returncode == 0 and result.stdout == payload.read_text()
    secrets = key_files(ring)
    assert len(secrets) == 2
    for text in outputs:
        for secret in secrets:
            assert secret.hex() not in text and secret.hex().upper() not in text


def test_reading_without_the_ring_names_the_key_and_exits_3(tmp_path) -> None:
    ring, store = str(tmp_path / "ring"), str(tmp_path / "store")
    payload = tmp_path / "payload"
    payload.write_bytes(b"x" * 1000)
    ok(slts("keys", "create", "--id", "only", "--key-ring", ring))
    ok(slts("put", "a", str(payload), "--set", "encryption=true", "--store", store, "--key-ring", ring))
    result = slts("cat", "a", "--store", store)
    assert result.returncode == 3 and "KeyUnavailable" in result.stderr and "'only'" in result.stderr
    assert result.stdout == ""


def test_encryption_without_a_ring_exits_5_and_creates_nothing(tmp_path) -> None:
    store = tmp_path / "store"
    payload = tmp_path / "payload"
    payload.write_bytes(b"x")
    result = slts("put", "a", str(payload), "--set", "encryption=true", "--store", str(store))
    assert result.returncode == 5 and "key ring" in result.stderr
    assert not (store / "chunks").exists() or not any((store / "chunks").iterdir())


def test_keys_errors_exit_with_their_codes_and_change_nothing(tmp_path) -> None:
    ring = tmp_path / "ring"
    assert slts("keys", "ls").returncode == 5, "no ring named"
    assert slts("keys", "ls", "--key-ring", str(ring)).returncode == 5, "no ring there"
    ring.mkdir()
    (ring / "something").write_text("x")
    result = slts("keys", "create", "--key-ring", str(ring))
    assert result.returncode == 5 and "not empty" in result.stderr
    assert sorted(os.listdir(ring)) == ["something"]
    other = str(tmp_path / "other")
    ok(slts("keys", "create", "--id", "k1", "--key-ring", other))
    result = slts("keys", "rotate", "--id", "k1", "--key-ring", other)
    assert result.returncode == 5 and "already" in result.stderr
    assert json.loads(slts("keys", "ls", "--key-ring", other, "--json").stdout)["keys"] == [
        {"id": "k1", "active": True}
    ]


def test_restore_of_an_encrypted_store_needs_its_ring(tmp_path) -> None:
    ring, store = str(tmp_path / "ring"), str(tmp_path / "store")
    payload = tmp_path / "payload"
    payload.write_bytes(b"y" * 3000)
    ok(slts("keys", "create", "--key-ring", ring))
    ok(slts("put", "a", str(payload), "--set", "encryption=true", "--store", store, "--key-ring", ring))
    target = tmp_path / "restored"
    result = slts("restore", "--to", str(target), "--store", store)
    assert result.returncode == 3 and "KeyUnavailable" in result.stderr and not target.exists()
    ok(slts("restore", "--to", str(target), "--store", store, "--key-ring", ring))
    url = f"file://{store}/chunks"
    result = slts("cat", "a", "--store", url, "--metadata", str(target), "--key-ring", ring)
    assert result.returncode == 0 and result.stdout == payload.read_text()


def test_info_shows_the_bytes_stored_next_to_the_length(tmp_path) -> None:
    ring, store = str(tmp_path / "ring"), str(tmp_path / "store")
    values = tmp_path / "values"
    values.write_bytes(b"".join(b'{"user": "u%03d", "event": "view"}\n' % (i % 500) for i in range(20_000)))
    ok(slts("keys", "create", "--key-ring", ring))
    flags = ["--store", store, "--key-ring", ring]
    ok(slts("put", "z", str(values), "--set", "encryption=true", "--set", "compression_level=3", *flags))
    ok(slts("put", "p", str(values), *flags))
    squeezed = ok(slts("info", "z", "--json", *flags))
    plain = ok(slts("info", "p", "--json", *flags))
    assert squeezed["length"] == plain["length"] == values.stat().st_size
    assert squeezed["stored_bytes"] <= 0.35 * squeezed["length"]
    assert plain["stored_bytes"] == plain["length"]
