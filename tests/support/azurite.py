"""A real Blob Storage service for the tests: Azurite (Microsoft's emulator, npm ``azurite``).

``AzuriteServer(workdir)`` runs one ``azurite-blob`` (Node.js) on a free port bound to
127.0.0.1, with its data in ``workdir/data`` and one test account whose name and key
are random (``AZURITE_ACCOUNTS``), so no well-known emulator key is involved.

* ``start()`` picks a free port (or reuses the last one: ``restart()`` after ``kill()``
  runs on the same data folder and port, as a restarted service would) and waits until a
  probe blob can be stored and read back (bounded by ``startup_s_max``; on timeout the
  error shows the tail of the emulator's log).
* ``stop()`` ends the emulator by its own process group (started in a new session):
  SIGTERM, a short grace, then SIGKILL; from the fixture's finalizer and at interpreter
  exit. ``kill()`` is SIGKILL at once (crash tests).
* ``persisted()`` waits until Azurite has saved its metadata (below).

Where Azurite is found: ``$SLTS_AZURITE`` (the ``azurite-blob`` script), the project's
git-ignored ``.azurite/`` folder (``tests/run.sh`` runs ``npm install`` there on a fresh
machine), or ``PATH``. Without it (or without Node.js or azure-storage-blob) the tests
skip with the reason.

**What a kill loses.** Azurite writes blob bytes to its extent files at once, but keeps
its metadata (which blobs exist, their blocks and sizes, and where their bytes are) in two
LokiJS databases that it saves to ``__azurite_db_blob__.json`` and
``__azurite_db_blob_extent__.json`` every 5 s (when changed). A SIGKILL loses the
changes since the last save: acknowledged writes vanish. That is the emulator's loss, not
SLTS's (Blob Storage acknowledges only durable writes); ``persisted()`` waits for the
save (the file is replaced by a newer one) so a crash test can tell one from the other.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

#: Generous: a cold Node.js start on a busy 2-core machine.
STARTUP_S_MAX = 120.0
STOP_GRACE_S = 2.0
PROBE_INTERVAL_S = 0.2
PORT_ATTEMPTS_MAX = 3
LOG_TAIL_LINES = 40
#: Azurite's save interval is 5 s; a save is awaited at most this long.
PERSIST_S_MAX = 30.0
#: The version tests/run.sh installs (the one these tests were written against).
AZURITE_VERSION = "3.37.0"
DB_FILE = "__azurite_db_blob__.json"
EXTENT_DB_FILE = "__azurite_db_blob_extent__.json"
REPO = Path(__file__).resolve().parents[2]


class AzuriteUnavailable(Exception):
    """Azurite or Node.js is not installed: tests that need it skip with this reason."""


def find_azurite() -> list[str]:
    """The command that starts ``azurite-blob``: ``$SLTS_AZURITE``, ``.azurite/`` below the
    repository (tests/run.sh installs it there), or ``PATH``; run by ``node``."""
    node = shutil.which("node")
    candidates = [
        os.environ.get("SLTS_AZURITE", ""),
        str(REPO / ".azurite" / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"),
        shutil.which("azurite-blob") or "",
    ]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate):
            if candidate.endswith(".js"):
                if node is None:
                    raise AzuriteUnavailable("Node.js (node) is not installed; Azurite needs it")
                return [node, candidate]
            return [candidate]
    raise AzuriteUnavailable(
        f"Azurite is not installed: npm install --prefix .azurite azurite@{AZURITE_VERSION} "
        "(tests/run.sh does it), or set SLTS_AZURITE"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before ``exec``: SIGKILL it when the test process dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


_live: set[AzuriteServer] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        server.stop()


class AzuriteServer:
    """One ``azurite-blob``; see the module doc."""

    def __init__(self, workdir: str | os.PathLike[str], *, startup_s_max: float = STARTUP_S_MAX) -> None:
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "azurite.log"
        self.startup_s_max = startup_s_max
        self.account = "sltstest" + secrets.token_hex(4)
        self.account_key = base64.b64encode(secrets.token_bytes(32)).decode("ascii")
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._service: Any = None
        self._containers = itertools.count()
        self._session_id = uuid.uuid4().hex[:8]

    # -- life cycle ------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.account}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, same_port: bool = False) -> None:
        """Start (on the previous port if ``same_port``) and wait until it serves."""
        assert not self.running(), "already running"
        command = find_azurite()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, PORT_ATTEMPTS_MAX + 1):
            if not same_port:
                self.port = _free_port()
            self._spawn(command)
            try:
                self._wait_ready()
                return
            except RuntimeError:
                log = self.log_tail()
                self.stop()
                if same_port or attempt == PORT_ATTEMPTS_MAX or "EADDRINUSE" not in log:
                    raise
        raise AssertionError("unreachable")

    def _spawn(self, command: list[str]) -> None:
        arguments = [
            *command,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(self.port),
            "--location",
            str(self.data_dir),
            "--silent",
            "--disableTelemetry",
            # The SDK speaks a newer API version than this Azurite knows by name; the
            # calls the binding makes are the same.
            "--skipApiVersionCheck",
            "--disableProductStyleUrl",
        ]
        env = dict(os.environ, AZURITE_ACCOUNTS=f"{self.account}:{self.account_key}")
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {' '.join(arguments)}\n".encode())
            self._process = subprocess.Popen(
                arguments,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches its children
                preexec_fn=_die_with_parent  # noqa: PLW1509 - prctl only, from the main thread
                if threading.current_thread() is threading.main_thread()
                else None,
            )
        with _live_lock:
            _live.add(self)

    def _wait_ready(self) -> None:
        """Until a probe blob is stored and read back (bounded by ``startup_s_max``)."""
        from azure.core.exceptions import AzureError, ResourceExistsError

        assert self._process is not None
        service = self.service(fresh=True)
        deadline = time.monotonic() + self.startup_s_max
        last: Exception | None = None
        probe = f"probe-{self._session_id}"
        while time.monotonic() < deadline:
            try:
                container = service.get_container_client(probe)
                with contextlib.suppress(ResourceExistsError):
                    container.create_container()
                container.upload_blob("probe", b"ok", overwrite=True)
                if container.download_blob("probe").readall() == b"ok":
                    service.close()
                    return
            except AzureError as exc:
                last = exc
            try:
                code = self._process.wait(timeout=PROBE_INTERVAL_S)
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"azurite exited with {code} during startup; log tail:\n{self.log_tail()}")
        raise RuntimeError(
            f"azurite did not serve within {self.startup_s_max:.0f} s (last error: {last!r}); "
            f"log tail:\n{self.log_tail()}"
        )

    def persisted(self, *, extents: bool = True) -> None:
        """Wait until Azurite has saved its blob metadata, and its extent metadata too if
        ``extents`` (bytes were written), after this call began: each database file is
        replaced by one written later (see the module doc). Only call it with unsaved
        changes (else no save comes): bounded by ``PERSIST_S_MAX``, then ``RuntimeError``."""
        files = [self.data_dir / DB_FILE] + ([self.data_dir / EXTENT_DB_FILE] if extents else [])
        since = time.time()
        deadline = time.monotonic() + PERSIST_S_MAX
        pending = list(files)
        while time.monotonic() < deadline:
            for path in list(pending):
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime > since:
                        pending.remove(path)
            if not pending:
                return
            assert self._process is not None
            try:
                self._process.wait(timeout=PROBE_INTERVAL_S)  # returns early if it dies
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError("azurite died while its metadata was awaited")
        raise RuntimeError(f"azurite did not save {[p.name for p in pending]} within {PERSIST_S_MAX:.0f} s")

    def kill(self) -> None:
        """SIGKILL at once (a crash), keeping the data folder and port."""
        if not self.running():
            return
        self._signal(signal.SIGKILL)
        assert self._process is not None
        self._process.wait(timeout=30.0)

    def restart(self) -> None:
        """Start again on the same data folder and port (after ``kill`` or ``stop``)."""
        if self.running():
            self.kill()
        self.start(same_port=True)

    def stop(self) -> None:
        """SIGTERM, ``STOP_GRACE_S`` of grace, then SIGKILL; always, and idempotent."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            self._signal(signal.SIGKILL)
            self._process.wait(timeout=30.0)
        if self._service is not None:
            with contextlib.suppress(Exception):
                self._service.close()
            self._service = None
        with _live_lock:
            _live.discard(self)

    def _signal(self, signum: int) -> None:
        assert self._process is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- clients and containers -------------------------------------------------------------------

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.account_key};"
            f"BlobEndpoint={self.endpoint_url};"
        )

    def service(self, *, fresh: bool = False) -> Any:
        """A ``BlobServiceClient`` for this emulator (shared unless ``fresh``), retries off."""
        from azure.storage.blob import BlobServiceClient

        if self._service is not None and not fresh:
            return self._service
        service = BlobServiceClient.from_connection_string(
            self.connection_string, retry_total=0, connection_timeout=2, read_timeout=60
        )
        if not fresh:
            self._service = service
        return service

    def new_container(self, label: str = "t") -> str:
        """A new, empty container with a name unique to this emulator."""
        name = f"{label}-{self._session_id}-{next(self._containers)}".lower()
        self.service().create_container(name)
        return name

    def credentials(self) -> dict[str, str]:
        """The test account as the usual Azure environment variable."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def __repr__(self) -> str:  # no secret in it
        endpoint = self.endpoint_url if self.port else None
        return f"AzuriteServer({self.workdir}, endpoint={endpoint}, pid={self.pid})"


# -- the session's shared emulator -------------------------------------------------------------------

_shared: AzuriteServer | None = None
_shared_error: BaseException | None = None
_shared_lock = threading.Lock()


def shared_server() -> AzuriteServer:
    """The test session's emulator, started on first use (one attempt: a failure is cached)."""
    global _shared, _shared_error
    with _shared_lock:
        if _shared is not None:
            return _shared
        if _shared_error is not None:
            raise _shared_error
        workdir = tempfile.mkdtemp(prefix="slts-azurite-")
        server = AzuriteServer(workdir)
        try:
            server.start()
        except BaseException as exc:
            server.stop()
            shutil.rmtree(workdir, ignore_errors=True)
            _shared_error = exc
            raise
        _shared = server
        atexit.register(stop_shared_server)
        return server


def shared_server_or_skip() -> AzuriteServer:
    """The session's emulator, or skip the calling test when Azurite or the SDK is missing."""
    import pytest

    pytest.importorskip(
        "azure.storage.blob", reason="azure-storage-blob is not installed (pip install 'slts[azure]')"
    )
    try:
        return shared_server()
    except AzuriteUnavailable as exc:
        pytest.skip(str(exc))


def stop_shared_server() -> None:
    """Stop the session's emulator if it was started (the fixture's finalizer)."""
    global _shared
    with _shared_lock:
        server, _shared = _shared, None
    if server is not None:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)
