"""A real GCS emulator for the tests: ``gcp-storage-emulator`` (PyPI), run as its own process.

``GcsEmulator(workdir)`` runs ``python -m gcp_storage_emulator -d DATA start`` on a free
port bound to 127.0.0.1, with its data folder under ``workdir`` (objects as files and one
``.meta`` JSON index), so that a killed emulator restarts on the same objects.

* ``start()`` picks a free port (``restart()`` after ``kill()`` reuses it) and waits until
  the emulator answers a bucket listing (bounded by ``startup_s_max``; on timeout the error
  shows the tail of its log).
* ``stop()`` ends it by its own process group (started in a new session): SIGTERM,
  ``STOP_GRACE_S`` of grace, then SIGKILL; from the fixture's finalizer and at interpreter
  exit. ``kill()`` is SIGKILL at once (the crash tests).
* ``new_bucket()`` creates a fresh bucket; ``client()`` is an SDK client with anonymous
  credentials pointed at it (tests only: production uses Application Default Credentials).

``shared_emulator()`` is the session's one emulator (started on first use); without the
package ``shared_emulator_or_skip()`` skips with the reason. The emulator serves one request
at a time, ignores ``ifGenerationMatch`` and answers a read past the end with an empty 206:
the binding's ``preconditions=auto`` probe detects the second (docs/bindings.md).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

STARTUP_S_MAX = 60.0
STOP_GRACE_S = 2.0
PROBE_INTERVAL_S = 0.1
LOG_TAIL_LINES = 40
#: Requests a binding keeps in flight against the emulator: it serves one at a time from a
#: listen backlog of 5 (http.server's default), so a 6th concurrent connection waits for a
#: TCP SYN retransmit (1 s); bindings on it bound themselves below that (``requests_max``).
REQUESTS_MAX = 4


class EmulatorUnavailable(Exception):
    """``gcp-storage-emulator`` or ``google-cloud-storage`` is not installed: tests skip."""


def check_installed() -> None:
    """Raise ``EmulatorUnavailable`` (naming what to install) if a package is missing."""
    for module, package in (
        ("gcp_storage_emulator", "gcp-storage-emulator"),
        ("google.cloud.storage", "slts[gcs]"),
    ):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise EmulatorUnavailable(f"{package} is not installed: pip install '{package}'")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before ``exec``: SIGKILL it when the test process dies (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


_live: set[GcsEmulator] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        emulators = list(_live)
    for emulator in emulators:
        emulator.stop()


class GcsEmulator:
    """One ``gcp-storage-emulator`` process; see the module doc."""

    def __init__(self, workdir: str | os.PathLike[str], *, startup_s_max: float = STARTUP_S_MAX) -> None:
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "emulator.log"
        self.startup_s_max = startup_s_max
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._client: Any = None
        self._buckets = itertools.count()
        self._session_id = uuid.uuid4().hex[:8]

    @property
    def endpoint(self) -> str:
        assert self.port is not None, "not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, same_port: bool = False) -> None:
        """Start the emulator (on the previous port if ``same_port``) and wait until it serves."""
        assert not self.running(), "already running"
        check_installed()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not same_port or self.port is None:
            self.port = _free_port()
        arguments = [
            sys.executable,
            "-m",
            "gcp_storage_emulator",
            "-d",
            str(self.data_dir),
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--quiet",
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {' '.join(arguments)}\n".encode())
            self._process = subprocess.Popen(
                arguments,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent  # noqa: PLW1509 - prctl only, from the main thread
                if threading.current_thread() is threading.main_thread()
                else None,
            )
        with _live_lock:
            _live.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        """Until a bucket listing answers 200 (bounded by ``startup_s_max``)."""
        assert self._process is not None
        deadline = time.monotonic() + self.startup_s_max
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"{self.endpoint}/storage/v1/b?project=test", timeout=2
                ) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = exc
            try:
                code = self._process.wait(timeout=PROBE_INTERVAL_S)
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"the GCS emulator exited with {code} during startup; log:\n{self.log_tail()}")
        raise RuntimeError(
            f"the GCS emulator did not answer within {self.startup_s_max:.0f} s ({last!r}); "
            f"log:\n{self.log_tail()}"
        )

    def kill(self) -> None:
        """SIGKILL at once (a crash), keeping its data folder and port."""
        if self.running():
            self._signal(signal.SIGKILL)
            assert self._process is not None
            self._process.wait(timeout=30)

    def restart(self) -> None:
        """Start again on the same data folder and port (after ``kill`` or ``stop``)."""
        if self.running():
            self.kill()
        self.start(same_port=True)

    def stop(self) -> None:
        """SIGTERM, ``STOP_GRACE_S`` of grace, then SIGKILL; idempotent."""
        if self._process is not None and self._process.poll() is None:
            self._signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=STOP_GRACE_S)
            self._signal(signal.SIGKILL)
            self._process.wait(timeout=30)
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        with _live_lock:
            _live.discard(self)

    def _signal(self, signum: int) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)  # its own group: started in a new session

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- clients and buckets ----------------------------------------------------------------------

    def client(self, *, fresh: bool = False) -> Any:
        """An SDK client for the emulator (anonymous credentials; shared unless ``fresh``)."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        if self._client is not None and not fresh:
            return self._client
        client = storage.Client(
            project="slts-test",
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=self.endpoint),
        )
        if not fresh:
            self._client = client
        return client

    def new_bucket(self, label: str = "t") -> str:
        """A new, empty bucket whose name is unique to this emulator."""
        bucket = f"{label}-{self._session_id}-{next(self._buckets)}".lower()
        self.client().create_bucket(bucket)
        return bucket

    def binding_kwargs(self) -> dict[str, Any]:
        """Constructor arguments of ``GcsChunkStorage`` for this emulator."""
        return {"endpoint": self.endpoint, "anonymous": True, "requests_max": REQUESTS_MAX}

    def url(self, bucket: str, prefix: str = "chunks") -> str:
        """The binding URL of ``bucket/prefix`` on this emulator."""
        return f"gs://{bucket}/{prefix}?endpoint={self.endpoint}&anonymous=1&requests_max={REQUESTS_MAX}"

    def __repr__(self) -> str:
        return f"GcsEmulator({self.workdir}, port={self.port}, pid={self.pid})"


# -- the session's shared emulator ------------------------------------------------------------------

_shared: GcsEmulator | None = None
_shared_error: BaseException | None = None
_shared_lock = threading.Lock()


def shared_emulator() -> GcsEmulator:
    """The test session's emulator, started on first use (one attempt: a failure is cached)."""
    global _shared, _shared_error
    with _shared_lock:
        if _shared is not None:
            return _shared
        if _shared_error is not None:
            raise _shared_error
        workdir = tempfile.mkdtemp(prefix="slts-gcs-emulator-")
        emulator = GcsEmulator(workdir)
        try:
            emulator.start()
        except BaseException as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            _shared_error = exc
            raise
        _shared = emulator
        atexit.register(stop_shared_emulator)
        return emulator


def shared_emulator_or_skip() -> GcsEmulator:
    """The session's emulator, or skip the calling test when a package is missing."""
    import pytest

    try:
        return shared_emulator()
    except EmulatorUnavailable as exc:
        pytest.skip(str(exc))


def stop_shared_emulator() -> None:
    """Stop the session's emulator if it was started (the fixture's finalizer)."""
    global _shared
    with _shared_lock:
        emulator, _shared = _shared, None
    if emulator is not None:
        emulator.stop()
        shutil.rmtree(emulator.workdir, ignore_errors=True)
