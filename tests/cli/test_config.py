"""The configuration file, ``SLTS_*`` variables and ``--set`` flags: precedence, sources
named in every error, nothing opened or changed after one, the settings reaching the
engine, and ``docs/config.md`` generated from ``slts/config.py``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from slts.tools import cli
from slts.tools.config_cli import config_reference

from slts.config_sources import resolve_config
from slts.errors import InvalidConfig
from slts.limiter import Limit, TrafficClass
from tests.support.cli import run_slts as slts

ROOT = Path(__file__).resolve().parents[2]


def shown(result: subprocess.CompletedProcess[str]) -> dict[str, tuple[object, str]]:
    assert result.returncode == 0, result.stderr
    return {f["field"]: (f["value"], f["source"]) for f in json.loads(result.stdout)["fields"]}


def test_docs_config_md_is_generated_from_the_field_comments() -> None:
    assert (ROOT / "docs" / "config.md").read_text() == config_reference(), (
        "docs/config.md is out of date: run `slts config doc > docs/config.md`"
    )


def test_file_then_variables_then_flags(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "slts.toml").write_text("gc_delay_s = 120\nread_threads = 2\nchecksums = true\n")
    result = slts(
        "config", "show", "--json", "--store", str(store), "--set", "checksums=false",
        env={"SLTS_READ_THREADS": "3"},
    )  # fmt: skip
    fields = shown(result)
    toml = str(store / "slts.toml")
    assert fields["gc_delay_s"] == (120, toml)
    assert fields["read_threads"] == (3, "$SLTS_READ_THREADS"), "a variable beats the file"
    assert fields["checksums"] == (False, "--set"), "a flag beats both"
    assert fields["write_bytes_max"][1] == "default"
    assert json.loads(result.stdout)["file"] == toml


def test_the_file_named_by_flag_or_variable_wins_over_the_stores(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "slts.toml").write_text("gc_delay_s = 1\n")
    (tmp_path / "a.toml").write_text("gc_delay_s = 2\n")
    (tmp_path / "b.toml").write_text("gc_delay_s = 3\n")
    by_variable = slts(
        "config", "show", "--json", "--store", str(store), env={"SLTS_CONFIG": str(tmp_path / "b.toml")}
    )
    assert shown(by_variable)["gc_delay_s"][0] == 3
    by_flag = slts(
        "config", "show", "--json", "--store", str(store), "--config", str(tmp_path / "a.toml"),
        env={"SLTS_CONFIG": str(tmp_path / "b.toml")},
    )  # fmt: skip
    assert shown(by_flag)["gc_delay_s"] == (2, str(tmp_path / "a.toml"))


def test_the_settings_reach_the_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "slts.toml").write_text("rolling_length_bytes_default = 4096\n")
    (tmp_path / "data").write_bytes(os.urandom(10_000))
    assert cli.main(["put", "s", str(tmp_path / "data"), "--store", str(store)]) == 0
    assert cli.main(["info", "s", "--json", "--store", str(store)]) == 0
    info = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert info["max_rolling_length"] == 4096 and info["chunk_count"] == 3


@pytest.mark.parametrize(
    ("toml", "env", "flags", "says"),
    [
        ("gc_delay = 3\n", {}, [], "slts.toml: gc_delay: unknown key"),
        ('gc_delay_s = "soon"\n', {}, [], "slts.toml: gc_delay_s: 'soon' is not a float"),
        ("checksums = 1\n", {}, [], "slts.toml: checksums: 1 is not a bool"),
        ("read_threads = 2.5\n", {}, [], "slts.toml: read_threads: 2.5 is not a int"),
        ("read_threads = 0\n", {}, [], "slts.toml: read_threads: read_threads must be > 0"),
        ("read_threads = [\n", {}, [], "is not valid TOML"),
        ("", {"SLTS_GC_DELAY_S": "soon"}, [], "$SLTS_GC_DELAY_S: 'soon' is not a float"),
        ("", {"SLTS_READ_THREADS": "-1"}, [], "$SLTS_READ_THREADS: read_threads must be > 0"),
        ("", {}, ["read_thread=3"], "--set read_thread=3: not FIELD=VALUE"),
        ("", {}, ["checksums=maybe"], "--set checksums=maybe: 'maybe' is not a bool"),
        ("read_bytes_max = 1024\n", {}, [], "read_bytes_max from"),
        ("", {"SLTS_CONFIG": "/nonexistent.toml"}, [], "$SLTS_CONFIG names '/nonexistent.toml'"),
    ],
)
def test_a_bad_setting_names_its_key_and_source_and_nothing_is_opened(
    tmp_path: Path, toml: str, env: dict[str, str], flags: list[str], says: str
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "slts.toml").write_text(toml)
    (tmp_path / "data").write_bytes(b"x" * 100)
    sets = [arg for flag in flags for arg in ("--set", flag)]
    result = slts("put", "s", str(tmp_path / "data"), "--store", str(store), *sets, env=env)
    assert result.returncode == 5, result.stderr
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert sorted(p.name for p in store.iterdir()) == ["slts.toml"], "no store was created, nobody fenced"


def test_the_library_resolves_the_same_way(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text("gc_delay_s = 7\nread_bytes_max = 8388608\n")
    resolved = resolve_config(str(tmp_path / "c.toml"), {"SLTS_GC_DELAY_S": "8"}, ["gc_delay_s=9"])
    assert resolved.config.gc_delay_s == 9 and resolved.sources["gc_delay_s"] == "--set"
    assert resolved.config.read_bytes_max == 8 << 20
    with pytest.raises(InvalidConfig, match=r"must not exceed read_bytes_max \(.*read_bytes_max from --set"):
        resolve_config(str(tmp_path / "c.toml"), {}, ["read_bytes_max=1024"])


def test_limits_come_from_the_file_variables_and_flags(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "slts.toml").write_text(
        "gc_delay_s = 5\n[limits]\nmin_share = 0.02\n[limits.total]\nbytes_per_s = 400_000_000\n"
        "[limits.defrag]\nbytes_per_s = 50_000_000\nrequests_per_s = 100\n"
    )
    result = slts(
        "config", "show", "--json", "--store", str(store), "--set", "limits.gc.requests_per_s=20",
        env={"SLTS_LIMITS_DEFRAG_BYTES_PER_S": "60000000"},
    )  # fmt: skip
    fields = shown(result)
    toml = str(store / "slts.toml")
    assert fields["limits.min_share"] == (0.02, toml) and fields["limits.total.bytes_per_s"] == (4e8, toml)
    assert fields["limits.defrag.bytes_per_s"] == (6e7, "$SLTS_LIMITS_DEFRAG_BYTES_PER_S")
    assert fields["limits.defrag.requests_per_s"] == (100, toml)
    assert fields["limits.gc.requests_per_s"] == (20, "--set")
    assert "limits.read.bytes_per_s" not in fields, "unset limits are not listed"

    resolved = resolve_config(toml, {}, ["limits.gc.requests_per_s=20"])
    limiter = resolved.limiter()
    assert limiter is not None and limiter.min_share == 0.02 and limiter.total.bytes_per_s == 4e8
    assert (
        limiter.limits[TrafficClass.DEFRAG] == Limit(5e7, 100)
        and limiter.limits[TrafficClass.GC].requests_per_s == 20
    )
    assert resolve_config(None, {}, []).limiter() is None, "no limit set: no limiter"


@pytest.mark.parametrize(
    ("toml", "flags", "says"),
    [
        ("[limits.defragg]\nbytes_per_s = 1\n", [], "limits.defragg.bytes_per_s: unknown key"),
        (
            "[limits.defrag]\nbytes_per_s = -1\n",
            [],
            "limits.defrag.bytes_per_s: -1 is not a non-negative number",
        ),
        ('[limits.gc]\nrequests_per_s = "many"\n', [], "'many' is not a non-negative number"),
        ("[limits]\nmin_share = 0.5\n", [], "limits: min_share must be in"),
        (
            "",
            ["limits.total.bytes_per_s=fast"],
            "--set limits.total.bytes_per_s=fast: 'fast' is not a number",
        ),
    ],
)
def test_a_bad_limit_names_its_key_and_source(tmp_path: Path, toml: str, flags: list[str], says: str) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "slts.toml").write_text(toml)
    sets = [arg for flag in flags for arg in ("--set", flag)]
    result = slts("ls", "--store", str(store), *sets)
    assert result.returncode == 5 and says in result.stderr, result.stderr


def test_defrag_runs_under_limits_from_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "slts.toml").write_text("[limits.defrag]\nbytes_per_s = 1_000_000_000\n")
    for i in range(3):
        (tmp_path / f"p{i}").write_bytes(bytes([i]) * 5000)
        assert cli.main(["put", f"p{i}", str(tmp_path / f"p{i}"), "--store", str(store)]) == 0
        assert cli.main(["seal", f"p{i}", "--store", str(store)]) == 0
    assert cli.main(["put", "s", str(tmp_path / "p0"), "--store", str(store)]) == 0
    for i in (1, 2):
        assert (
            cli.main(["concat", "s", f"p{i}", "--store", str(store), "--set", "concat_merge_seam=false"]) == 0
        )
    capsys.readouterr()
    assert cli.main(["defrag", "s", "--json", "--store", str(store)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chunks_before"] == 3 and report["chunks_after"] < 3, "merged under the limiter"
