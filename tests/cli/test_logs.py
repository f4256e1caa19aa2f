"""SLTS's logs: one ``slts`` logger tree, JSON lines for machines, no credential in any
line: unit tests of the redaction, the handler in process, and ``slts`` in child
processes against the filesystem binding and a real S3 server at debug level."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from slts.errors import InvalidArgument
from slts.logs import LOGGER_NAME, configure_logging, redact
from tests.support.cli import run_slts as slts
from tests.support.s3server import shared_server_or_skip

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"s3://AKIAIOSFODNN7EXAMPLE:{SECRET}@host/bucket", "s3://***@host/bucket"),
        (f"https://user:{SECRET}@example.com:9000/x", "https://***@example.com:9000/x"),
        (f"s3://b/p?endpoint_url=http://h:1&aws_secret_access_key={SECRET}&x=1", "endpoint_url=http://h:1"),
        (f'{{"SecretAccessKey": "{SECRET}", "Bucket": "b"}}', '"Bucket": "b"'),
        (f"password: {SECRET}, user: alice", "user: alice"),
        (f"Authorization: AWS4-HMAC-SHA256 Credential=x, Signature={SECRET}", "Authorization: ***"),
        (f"X-Amz-Signature={SECRET}&X-Amz-Security-Token={SECRET}", "X-Amz-Signature=***"),
        ("key id AKIAIOSFODNN7EXAMPLE in a message", "key id *** in a message"),
    ],
)
def test_redact_removes_credentials_and_keeps_the_rest(text: str, kept: str) -> None:
    redacted = redact(text)
    assert SECRET not in redacted and "AKIAIOSFODNN7EXAMPLE" not in redacted, redacted
    assert kept in redacted, redacted


def test_redact_leaves_ordinary_messages_alone() -> None:
    text = "concat into 'orders/1': merging the chunks at the seam failed (offset 4096, epoch 3)"
    assert redact(text) == text


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = configure_logging("debug", "json", stream)
    yield stream
    logging.getLogger(LOGGER_NAME).removeHandler(handler)
    logging.getLogger(LOGGER_NAME).setLevel(logging.NOTSET)


def test_every_logger_of_the_tree_goes_through_the_filter(captured: io.StringIO) -> None:
    logging.getLogger("slts.bindings.s3").warning("retry of %s", f"s3://k:{SECRET}@h/b")
    logging.getLogger("slts.gc").info("pass", extra={"detail": f"token={SECRET}", "chunks": 3})
    try:
        raise RuntimeError(f"boto said secret_key={SECRET}")
    except RuntimeError:
        logging.getLogger("slts.journal").exception("step failed")
    logging.getLogger("other.library").warning("not ours: %s", SECRET)  # outside the tree
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert [line["logger"] for line in lines] == ["slts.bindings.s3", "slts.gc", "slts.journal"]
    assert {"timestamp", "level", "logger", "message"} <= set(lines[0])
    assert lines[1]["chunks"] == 3 and lines[1]["detail"] == "token=***", "extra fields are fields"
    assert "RuntimeError" in lines[2]["exc_info"]
    assert SECRET not in captured.getvalue()


def test_a_second_configuration_replaces_the_first(captured: io.StringIO) -> None:
    other = io.StringIO()
    handler = configure_logging("warning", "text", other)
    try:
        logging.getLogger("slts.gc").info("below the level")
        logging.getLogger("slts.gc").warning("shown once")
        assert captured.getvalue() == "" and other.getvalue().count("shown once") == 1
        assert "WARNING slts.gc: shown once" in other.getvalue()
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(handler)


def _failure_logged(level: str, fmt: str) -> str:
    stream = io.StringIO()
    handler = configure_logging(level, fmt, stream)
    try:
        try:
            raise RuntimeError(f"tier-2 went away\nsecret_key={SECRET}, key AKIAIOSFODNN7EXAMPLE")
        except RuntimeError:
            logging.getLogger("slts.journal").exception("metadata copy step failed; retrying in %s s", 1.0)
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(handler)
        logging.getLogger(LOGGER_NAME).setLevel(logging.NOTSET)
    return stream.getvalue()


@pytest.mark.parametrize("level", ["info", "warning", "error"])
def test_below_debug_a_failure_is_one_line_with_its_error(level: str) -> None:
    text = _failure_logged(level, "text")
    assert text.count("\n") == 1 and "Traceback" not in text, text
    assert text.rstrip().endswith(
        "ERROR slts.journal: metadata copy step failed; retrying in 1.0 s "
        "(RuntimeError: tier-2 went away secret_key=***, key ***)"
    ), text
    assert SECRET not in text
    (line,) = [json.loads(line) for line in _failure_logged(level, "json").splitlines()]
    assert "exc_info" not in line and line["message"].endswith(
        "(RuntimeError: tier-2 went away secret_key=***, key ***)"
    )


def test_at_debug_a_failure_keeps_its_traceback() -> None:
    text = _failure_logged("debug", "text")
    assert "metadata copy step failed; retrying in 1.0 s\nTraceback (most recent call last):" in text, text
    assert SECRET not in text


def test_bad_level_or_format_is_a_typed_error() -> None:
    with pytest.raises(InvalidArgument, match="log level"):
        configure_logging("loud")
    with pytest.raises(InvalidArgument, match="log format"):
        configure_logging("info", "xml")


def test_the_cli_writes_json_lines(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(b"x" * 1000)
    store = ["--store", str(tmp_path / "store"), "--log-level", "info", "--log-format", "json"]
    assert slts("put", "s", str(tmp_path / "data"), *store).returncode == 0
    assert slts("rm", "s", *store).returncode == 0
    result = slts("gc", *store, "--set", "gc_delay_s=0")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    started = next(line for line in lines if line["logger"] == "slts.storage")
    assert started["level"] == "INFO" and started["epoch"] == 3 and started["container"] == 0
    gc = next(line for line in lines if line["logger"] == "slts.gc")
    assert gc["chunks_deleted"] == 1 and gc["tombstones_finished"] == 1


@pytest.mark.slow  # the SeaweedFS server
def test_no_credential_in_any_line_at_debug_level_on_s3(tmp_path: Path) -> None:
    server = shared_server_or_skip()
    bucket = server.new_bucket("logs")
    url = f"s3://{bucket}/c?endpoint_url={server.endpoint_url}"
    flags = [
        "--store",
        url,
        "--metadata",
        str(tmp_path / "md"),
        "--log-level",
        "debug",
        "--log-format",
        "json",
    ]
    (tmp_path / "data").write_bytes(b"0123456789" * 30_000)  # text: `cat` prints it
    env = server.credentials()
    results = [
        slts(
            "put", "s", str(tmp_path / "data"), *flags, "--set", "rolling_length_bytes_default=65536", env=env
        ),
        slts("cat", "s", *flags, env=env),
        slts("rm", "s", *flags, env=env),
        slts("gc", *flags, "--set", "gc_delay_s=0", env=env),
        slts("cat", "s", *flags, env=env),  # fails: the segment is gone
    ]
    assert [r.returncode for r in results] == [0, 0, 0, 0, 3], [r.stderr for r in results]
    logged = "".join(r.stderr for r in results)
    assert '"logger": "slts.storage"' in logged and '"logger": "slts.gc"' in logged
    assert server.secret_key not in logged and server.access_key not in logged
