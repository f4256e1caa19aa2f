"""``slts`` in a child process, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without its ``SLTS_*`` and ``AWS_*`` variables (a test
    names the settings and credentials it means), plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLTS_", "AWS_"))}
    return {**base, **(extra or {})}


def slts_command(*argv: str) -> list[str]:
    """The command line of ``slts argv...``."""
    return [sys.executable, "-m", "slts.tools.cli", *argv]


def run_slts(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``slts argv...`` to the end; its exit code, stdout and stderr as text."""
    return subprocess.run(
        slts_command(*argv), capture_output=True, text=True, env=child_env(env), check=False
    )
