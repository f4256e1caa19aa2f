"""SLTS's logs: one logger tree, text or JSON lines, never a credential.

Every module logs to a logger under ``slts`` (``slts.gc``, ``slts.journal``,
``slts.bindings.s3``, ...), so an application configures SLTS's logs in one place, and SLTS
configures nothing unless asked: a library user's ``logging`` setup applies as it is.
``configure_logging(level, fmt)`` (what ``slts --log-level/--log-format`` calls) puts one
handler on ``slts``: text lines, or one JSON object per line (``timestamp``, ``level``,
``logger``, ``message``, and the record's extra fields) for log shippers. Below ``debug``
a record's exception is one summary at the end of its line (``OneLineExceptions``: a
failing background worker writes one line per failure, not a traceback); at ``debug``
the traceback follows the line.

Credentials never reach a line: ``RedactingFilter``, on that handler, replaces URL user info,
``key=value`` pairs whose key names a secret (secret, password, token, access key,
credential, signature), ``Authorization`` headers and AWS access key ids in the message, its
extra fields and the formatted exception with ``***``. The S3 binding scrubs its own
messages too (its session's keys); this filter is the second guard for every logger of the
tree. Add it to your own handler to get the same.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import IO

from pythonjsonlogger.json import JsonFormatter

from slts.errors import InvalidArgument

#: The root of SLTS's logger tree.
LOGGER_NAME = "slts"
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

_SECRET_KEY = r"[\w.-]*(?:secret|password|passwd|token|access[_-]?key|credential|signature)[\w.-]*"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host -> scheme://***@host
    # (a password may hold "/": after the user's ":" anything up to the "@" goes)
    (re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)(?:[^\s/@:]*:[^\s@]+|[^\s/@]+)@"), r"\g<scheme>***@"),
    # key=value, key: value, "key": "value" with a secret-looking key
    (
        re.compile(rf"(?i)(?P<key>[\"']?{_SECRET_KEY}[\"']?\s*[=:]\s*)(?P<quote>[\"']?)[^\s&,;\"'}}]+"),
        r"\g<key>\g<quote>***",
    ),
    (re.compile(r"(?i)(?P<key>authorization\s*[=:]\s*)[^\r\n,;]+"), r"\g<key>***"),
    # AWS access key ids (AKIA..., ASIA...) wherever they stand
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), "***"),
)
#: LogRecord attributes that are not extra fields.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def redact(text: str) -> str:
    """``text`` with every credential-looking part replaced by ``***`` (see module doc)."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Redacts a record's message, string extra fields and exception text in place
    (the message is formatted once, here, with its arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        for key, value in vars(record).items():
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, redact(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:  # formatters show exc_text when exc_info is gone: only the redacted text
            record.exc_text = redact(record.exc_text)
            record.exc_info = None
        return True


class OneLineExceptions(logging.Filter):
    """Replaces a record's traceback by one summary at the end of its message,
    ``message (ErrorType: error message)``, so a failure (a background worker's
    included) is one line. ``configure_logging`` puts it on its handler below ``debug``;
    at ``debug`` the whole traceback is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        summary = None
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            summary = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        elif record.exc_text:
            summary = record.exc_text.strip().splitlines()[-1]
        if summary is not None:
            record.msg = f"{record.getMessage()} ({' '.join(summary.split())})"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


class _SltsHandler(logging.StreamHandler):
    """The handler ``configure_logging`` installs (so a second call replaces it)."""


def configure_logging(
    level: str = "warning", fmt: str = "text", stream: IO[str] | None = None
) -> logging.Handler:
    """Send the ``slts`` tree's records at ``level`` and above to ``stream`` (default
    stderr) as ``fmt`` lines, through ``RedactingFilter`` (and, below ``debug``,
    ``OneLineExceptions``); replaces a handler an earlier call installed. Returns the
    handler. ``InvalidArgument`` for an unknown level or format."""
    if level not in LEVELS:
        raise InvalidArgument(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise InvalidArgument(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    logger = logging.getLogger(LOGGER_NAME)
    for installed in list(logger.handlers):
        if isinstance(installed, _SltsHandler):
            logger.removeHandler(installed)
    handler = _SltsHandler(stream if stream is not None else sys.stderr)
    if level != "debug":
        handler.addFilter(OneLineExceptions())  # before the redaction, which covers the summary too
    handler.addFilter(RedactingFilter())
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JsonFormatter(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "timestamp", "levelname": "level", "name": "logger"},
            datefmt="%Y-%m-%dT%H:%M:%S%z",
        )
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    return handler
