"""HDFS chunk storage over WebHDFS (``pyhdfs``): one HDFS file per chunk below a root folder.

URL: ``hdfs://HOST:PORT[,HOST2:PORT]/base/folder?user=NAME&...``. The port is the
NameNode's **HTTP** (WebHDFS) port, 9870 by default in Hadoop 3, not its RPC port 8020;
several comma-separated hosts are the NameNodes of an HA pair (a standby one is skipped).
Options: ``user`` (HDFS user, default ``$HADOOP_USER_NAME`` or the login name),
``timeout_s`` (per HTTP request), ``max_attempts`` and ``backoff_s`` (bounded retries of
transient failures: the ``RetryPolicy`` of ``retry``, first delay ``backoff_s``, doubled up to
``BACKOFF_S_MAX``, with jitter), ``https`` (``1`` for swebhdfs). Anything else is
``InvalidConfig`` (the old spelling ``attempts_max`` too, with a hint to the new one).

Invariants (asserted or enforced here, checked by ``tests/hdfs`` and the conformance suite):

1. **Names never escape the root** (``chunk_relpath``: the codec of ``hierarchical_paths``).
   Each component is percent-encoded down to ``[A-Za-z0-9_-]`` and ``%XX`` (the dot too,
   so no part is ``.``, ``..``, ``.snapshot`` or ``.reserved``, and ``:`` never reaches
   HDFS); folders get the suffix ``%``, an empty last component is the file ``%%``. At most
   ``FOLDERS_MAX`` components become folders (HDFS refuses paths deeper than 1000 levels):
   the rest stays in the file's part, ``/`` encoded as ``%2F``. Parts longer than HDFS's
   255-byte component limit are cut into ``~`` folders. Every path decodes to one name,
   and the file ``a`` never meets the folder ``a%`` (HDFS's old-style RENAME would move a
   file *into* an existing folder).
2. **Exclusive, atomic create**: the bytes go to ``%tmp/<uuid>`` (a folder no name maps
   to), then RENAME to the final path; RENAME answers ``false`` instead of overwriting, so
   of two creators exactly one wins. Readers never see the file while it is being written.
3. **Append only at the end**: under a per-name lock (threads of this process) the
   length is read, compared with the offset, then APPENDed. Across processes HDFS's
   single-writer lease stops two appends from interleaving, but not a stale length check:
   as on NFS, the engine's epochs keep one writer per chunk.
4. **One error vocabulary**: every ``pyhdfs``/``requests`` exception becomes an
   ``slts.errors`` type in ``_translated``, the cause kept; nothing of ``pyhdfs`` leaves
   this module.
5. **Bounded retries** of ``StorageUnavailable`` (``max_attempts``, one ``RetryPolicy``); a
   retried append, rename or delete first checks whether the failed attempt landed, so
   nothing is written twice.

Durability: a WebHDFS CREATE or APPEND returns after the datanode closed its HDFS output
stream, i.e. after every datanode of the write pipeline acknowledged every packet
(``hflush`` level: the bytes survive this process, and any machine's crash unless it held
every replica). Creates ask
for ``SYNC_BLOCK`` (``createflag``), so the datanodes fsync the block when it closes
(``hsync`` level). WebHDFS cannot ask that for an APPEND: appended bytes reach the disks
when the datanodes flush, unless the cluster sets ``dfs.datanode.synconclose=true``.

``supports_concat`` is off: HDFS CONCAT moves whole source files into an existing target
and deletes the sources, while the contract builds a *new* chunk from *ranges* of sources
that stay readable (see ``docs/bindings.md``). The engine copies through the client instead.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import threading
import time
import urllib.request
import uuid
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import pyhdfs
import requests
import urllib3.exceptions

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNameInvalid,
    ChunkNotFound,
    ChunkReadOnly,
    ChunkStorageError,
    InvalidConfig,
    SltsError,
    StorageUnavailable,
)

from .base import ChunkHandle, ChunkInfo, ChunkStorage
from .hierarchical_paths import TMP_AGE_S_MAX as TMP_AGE_S_MAX  # re-exported: its age limit
from .hierarchical_paths import TMP_FOLDER, Entry, PathCodec, remove_stale
from .retry import MAX_ATTEMPTS_DEFAULT, RetryPolicy

_T = TypeVar("_T")

#: HDFS's default ``dfs.namenode.fs-limits.max-component-length``.
_COMPONENT_BYTES_MAX = 255
#: Name components that become folders; deeper ``/`` stay inside the file's part.
FOLDERS_MAX = 32
#: Names as paths: no dot kept (HDFS reserves ``.snapshot``, ``.reserved``), ``%%`` for an
#: empty last component, at most ``FOLDERS_MAX`` folders per name.
CODEC = PathCodec(
    safe=frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"),
    empty_file="%%",
    component_bytes_max=_COMPONENT_BYTES_MAX,
    folders_max=FOLDERS_MAX,
)
#: NameNode HTTP port of Hadoop 3 (Hadoop 2: 50070).
DEFAULT_PORT = 9870
#: Cap of the exponential backoff between attempts.
BACKOFF_S_MAX = 2.0
#: Cap of the backoff while polling a truncate's block recovery (exact delays, no jitter).
_RECOVERY_BACKOFF_S_MAX = 1.0
#: Polls for the block recovery a truncate inside a block starts (about 30 s with backoff).
RECOVERY_ATTEMPTS_MAX = 40
#: Rounds of mkdir + rename per attempt when a delete prunes the folder in between.
_PUBLISH_ATTEMPTS_MAX = 16
_LOCK_STRIPES = 64
_FILE_MODE = "644"
_DIR_MODE = "755"
_READONLY_MODE = "444"

# RemoteException classes (the ``exception`` field of WebHDFS error bodies) by meaning.
_NOT_FOUND = {"FileNotFoundException"}
_EXISTS = {"FileAlreadyExistsException"}
_DENIED = {"AccessControlException", "AuthorizationException", "SnapshotAccessControlException"}
#: The single-writer lease: another writer (or a truncate's block recovery) holds the file.
_LEASE = {"AlreadyBeingCreatedException", "RecoveryInProgressException", "LeaseExpiredException"}
#: The NameNode cannot serve now (starting, safe mode, standby, failing over).
_TRANSIENT = {
    "SafeModeException",
    "RetriableException",
    "StandbyException",
    "ObserverRetryOnActiveException",
    "ConnectException",
    "SocketTimeoutException",
    # A bare IOException from WebHDFS is almost always the datanode pipeline ("All
    # datanodes are bad", "Could not obtain block"); specific causes have subclasses.
    "IOException",
}
_NAME = {"PathComponentTooLongException", "InvalidPathException"}
_RANGE = {"EOFException"}
#: (operation, class) pairs whose meaning depends on the call: a truncate beyond the end
#: (the chunk shrank after our length check) is HadoopIllegalArgumentException.
_RANGE_BY_OP = {("truncate", "HadoopIllegalArgumentException")}


# -- name mapping ----------------------------------------------------------------------------------


def chunk_relpath(name: str) -> str:
    """The path of chunk ``name`` relative to the root (see the module doc)."""
    return CODEC.relpath(name)


# -- the few WebHDFS calls the binding makes -------------------------------------------------------


class _ThreadLocalSession:
    """One ``requests.Session`` per thread (a Session is not documented as thread-safe),
    with a timeout on every request: ``pyhdfs`` sends the data step of CREATE/APPEND/OPEN
    through this object without a timeout of its own."""

    def __init__(self, timeout_s: float, https: bool) -> None:
        self._timeout_s = timeout_s
        self._trust_env = _environment_matters(https)
        self._local = threading.local()
        self._lock = threading.Lock()
        # Weak: a finished thread's session goes with its thread-local slot.
        self._sessions: weakref.WeakSet[requests.Session] = weakref.WeakSet()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # Reading proxies, CA bundles and .netrc from the environment costs a third
            # of a small request; skip it when the environment has none of them.
            session.trust_env = self._trust_env
            self._local.session = session
            with self._lock:
                self._sessions.add(session)
        return session

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self._timeout_s)
        return self._session().request(method, url, **kwargs)

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", url, **kwargs)

    def put(self, url: str, **kwargs: Any) -> requests.Response:
        return self.request("PUT", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> requests.Response:
        return self.request("DELETE", url, **kwargs)

    def close(self) -> None:
        with self._lock:
            sessions = list(self._sessions)
            self._sessions = weakref.WeakSet()
        for session in sessions:
            session.close()
        self._local = threading.local()


def _environment_matters(https: bool) -> bool:
    """Whether ``requests`` would find proxies, credentials or (for https) CA bundles in
    the environment."""
    variables = ("NETRC",) + (("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE") if https else ())
    return bool(
        urllib.request.getproxies()
        or any(os.environ.get(variable) for variable in variables)
        or os.path.exists(os.path.expanduser("~/.netrc"))
    )


@dataclass(frozen=True, slots=True)
class _Status:
    """What the binding reads of a WebHDFS ``FileStatus``."""

    suffix: str
    type: str  # "FILE", "DIRECTORY" or "SYMLINK"
    length: int
    mode: int  # permission bits
    mtime_ms: int


def _status_of(raw: Any) -> _Status:
    return _Status(
        suffix=str(raw["pathSuffix"]),
        type=str(raw["type"]),
        length=int(raw["length"]),
        mode=int(str(raw["permission"]), 8),
        mtime_ms=int(raw["modificationTime"]),
    )


def _protocol(method: Callable[..., _T]) -> Callable[..., _T]:
    """A WebHDFS answer ``pyhdfs`` cannot parse (missing JSON keys, wrong types) raises
    ``KeyError``/``TypeError``/``ValueError`` inside it: make that a ``pyhdfs`` error, which
    ``_translated`` knows."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        try:
            return method(*args, **kwargs)
        except requests.RequestException:
            raise  # a JSONDecodeError is one too: transport trouble, translated as such
        except (KeyError, TypeError, ValueError) as exc:
            raise pyhdfs.HdfsException(f"malformed WebHDFS answer: {exc!r}") from exc

    return wrapper


class _WebHdfs:
    """The narrow protocol the binding needs, over ``pyhdfs.HdfsClient``.

    Raises ``pyhdfs``/``requests`` exceptions; the binding translates them. CREATE, APPEND
    and OPEN are two requests each: the NameNode answers 307 with the datanode's URL,
    ``pyhdfs`` sends (or fetches) the bytes there.
    """

    def __init__(self, hosts: list[str], user: str, timeout_s: float, scheme: str) -> None:
        self.session = _ThreadLocalSession(timeout_s, https=scheme == "https")
        # max_tries=1: pyhdfs would sleep retry_delay between its own rounds; the binding
        # retries with its own bounded backoff. Host order kept: the first is tried first.
        self.client = pyhdfs.HdfsClient(
            hosts=hosts,
            randomize_hosts=False,
            user_name=user,
            timeout=timeout_s,
            max_tries=1,
            retry_delay=0,
            scheme=scheme,
            requests_session=self.session,  # type: ignore[arg-type]
        )

    @_protocol
    def status(self, path: str) -> _Status:
        return _status_of(self.client.get_file_status(path))

    @_protocol
    def list(self, path: str) -> list[_Status]:
        return [_status_of(raw) for raw in self.client.list_status(path)]

    @_protocol
    def mkdirs(self, path: str) -> None:
        self.client.mkdirs(path, permission=_DIR_MODE)

    @_protocol
    def create(self, path: str, data: bytes) -> None:
        # SYNC_BLOCK: the datanodes fsync the block when the stream closes.
        self.client.create(
            path, data, overwrite="false", permission=_FILE_MODE, createflag="CREATE,SYNC_BLOCK"
        )

    @_protocol
    def append(self, path: str, data: bytes) -> None:
        self.client.append(path, data)

    @_protocol
    def read(self, path: str, offset: int, length: int) -> bytes:
        raw: Any = self.client.open(path, offset=offset, length=length)  # a urllib3 response
        try:
            data = raw.read()
        except BaseException:
            raw.close()  # half-read: this connection must not serve another request
            raise
        raw.release_conn()
        return data

    @_protocol
    def rename(self, source: str, target: str) -> bool:
        """Old-style RENAME: ``False`` (nothing moved) if ``target`` exists or its folder
        is missing; a ``target`` that is a folder would receive ``source`` inside it."""
        return bool(self.client.rename(source, destination=target))

    @_protocol
    def delete(self, path: str, recursive: bool = False) -> bool:
        return bool(self.client.delete(path, recursive="true" if recursive else "false"))

    def remove_empty_folder(self, path: str) -> bool:
        """Delete the folder ``path`` if it is empty; ``False`` if it is not (or is gone)."""
        try:
            return self.delete(path)
        except pyhdfs.HdfsPathIsNotEmptyDirectoryException:
            return False

    @_protocol
    def truncate(self, path: str, length: int) -> bool:
        """TRUNCATE; ``False`` means the cut is inside a block and block recovery runs.

        ``pyhdfs`` has no method for it; its generic request helper does the HA failover
        and the RemoteException decoding like for every other call.
        """
        response = self.client._post(path, "TRUNCATE", newlength=length)  # noqa: SLF001 - see above
        return bool(response.json()["boolean"])

    @_protocol
    def set_permission(self, path: str, mode: str) -> None:
        self.client.set_permission(path, permission=mode)

    def close(self) -> None:
        self.session.close()


# -- the one place where backend errors become typed errors ----------------------------------------


@contextlib.contextmanager
def _translated(name: str, binding: str, op: str = "") -> Iterator[None]:
    """Translate every ``pyhdfs``/``requests`` failure of the block into ``slts.errors``."""
    try:
        yield
    except SltsError:
        raise  # already typed (ChunkNotFound and ChunkReadOnly are OSErrors too)
    except pyhdfs.HdfsHttpException as exc:
        remote = str(exc.exception)
        message = str(exc.message or "")
        context = {"chunk": name, "binding": binding, "remote_exception": remote}
        text = f"chunk {name!r}: {remote}: {_first_line(message)}"
        if remote in _NOT_FOUND:
            raise ChunkNotFound(text, **context) from exc
        if remote in _EXISTS:
            raise ChunkExists(text, **context) from exc
        if remote in _DENIED:
            raise ChunkReadOnly(text, **context) from exc
        if remote in _LEASE:
            raise StorageUnavailable(text, lease=True, **context) from exc
        if remote in _TRANSIENT or "SafeModeException" in message:
            raise StorageUnavailable(text, **context) from exc
        if remote in _NAME:
            raise ChunkNameInvalid(text, **context) from exc
        if remote in _RANGE or (op, remote) in _RANGE_BY_OP:
            raise ChunkInvalidOffset(text, **context) from exc
        raise ChunkStorageError(f"{text} (HTTP {exc.status_code})", **context) from exc
    except pyhdfs.HdfsNoServerException as exc:
        raise StorageUnavailable(
            f"chunk {name!r}: no NameNode answered ({binding})", chunk=name, binding=binding
        ) from exc
    except pyhdfs.HdfsException as exc:
        # An answer that is not WebHDFS JSON: a proxy or gateway in the way.
        raise StorageUnavailable(
            f"chunk {name!r}: unexpected answer: {_first_line(str(exc))}",
            chunk=name,
            binding=binding,
        ) from exc
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise StorageUnavailable(
            f"chunk {name!r}: {type(exc).__name__} talking to WebHDFS", chunk=name, binding=binding
        ) from exc


def _first_line(text: str) -> str:
    """A Java message without its stack trace (RemoteExceptions carry one)."""
    return text.split("\n", 1)[0][:500]


# -- the binding -----------------------------------------------------------------------------------


class _TmpVanished(ChunkStorageError):
    """A create's temporary file is gone before its RENAME: moved by an earlier attempt
    whose answer was lost (then the chunk is there: success), or removed by someone else."""


class HdfsChunkStorage(ChunkStorage):
    """Chunks as HDFS files below ``root``: append, truncate and read-only; no native concat."""

    supports_append = True
    supports_concat = False  # HDFS CONCAT consumes its sources: see the module doc
    supports_truncate = True
    supports_readonly = True
    #: Every read is a NameNode ``OPEN`` redirected to a DataNode: two HTTP round trips,
    #: so the engine reads ahead for sequential readers.
    high_latency_reads = True

    def __init__(
        self,
        hosts: Sequence[str],
        root: str,
        *,
        user: str | None = None,
        timeout_s: float = 20.0,
        max_attempts: int = MAX_ATTEMPTS_DEFAULT,
        backoff_s: float = 0.1,
        https: bool = False,
        url: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not hosts or not all(isinstance(host, str) and host for host in hosts):
            raise InvalidConfig(f"hdfs binding needs NameNode host:port addresses, got {hosts!r}")
        _check_root(root)
        if not (0 <= backoff_s <= BACKOFF_S_MAX) or not (0 < timeout_s <= 3600):
            raise InvalidConfig(f"backoff_s must be 0..{BACKOFF_S_MAX}, timeout_s 0..3600")
        #: How transient failures are retried (``max_attempts`` checked there).
        self.retry = RetryPolicy(max_attempts, delay_s_base=backoff_s, delay_s_max=BACKOFF_S_MAX)
        self._recovery_polls = RetryPolicy(
            RECOVERY_ATTEMPTS_MAX,
            delay_s_base=min(backoff_s, _RECOVERY_BACKOFF_S_MAX),
            delay_s_max=_RECOVERY_BACKOFF_S_MAX,
            jitter=0.0,
        )
        self.root = root.rstrip("/")
        self.user = user or os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
        self.url = url or f"hdfs://{','.join(hosts)}{quote(self.root)}"
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._tmp = f"{self.root}/{TMP_FOLDER}"
        self._hdfs = _WebHdfs(list(hosts), self.user, timeout_s, "https" if https else "http")
        self._locks = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))
        self._retrying(self.root, lambda: self._hdfs.mkdirs(self._tmp))
        self._remove_stale_tmp()

    @classmethod
    def from_url(cls, url: str) -> HdfsChunkStorage:
        """``hdfs://HOST:PORT[,HOST:PORT]/root?user=..&timeout_s=..&max_attempts=..&backoff_s=..``
        (and ``https=1`` for swebhdfs); see the module doc."""
        if not isinstance(url, str):
            raise InvalidConfig(f"not an hdfs:// URL: {url!r}")
        parts = urlsplit(url)
        if "@" in parts.netloc:  # not echoed: the part before "@" may be a password
            raise InvalidConfig("hdfs URL must not carry credentials; give the HDFS user as ?user=NAME")
        if parts.scheme != "hdfs":
            raise InvalidConfig(f"not an hdfs:// URL: {url!r}")
        if parts.fragment:
            raise InvalidConfig(f"hdfs URL must not have a fragment: {url!r}")
        hosts = [_check_host(host, url) for host in parts.netloc.split(",")] if parts.netloc else []
        if not hosts:
            raise InvalidConfig(f"hdfs URL names no NameNode (hdfs://host:port/path): {url!r}")
        options: dict[str, Any] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in options:
                raise InvalidConfig(f"hdfs URL repeats option {key!r}: {url!r}")
            options[key] = _parse_option(key, value, url)
        try:
            root = unquote(parts.path, errors="strict")
        except UnicodeDecodeError as exc:
            raise InvalidConfig(f"hdfs URL path is not UTF-8 once decoded: {url!r}") from exc
        return cls(hosts, root, url=url, **options)

    # -- helpers ----------------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        path = f"{self.root}/{chunk_relpath(name)}"
        assert path.startswith(self.root + "/") and "/../" not in path, (name, path)
        return path

    def _lock(self, name: str) -> threading.Lock:
        return self._locks[zlib.crc32(name.encode("utf-8")) % _LOCK_STRIPES]

    def _retrying(self, name: str, call: Callable[[], _T], op: str = "") -> _T:
        """``call()`` translated, retried while it raises ``StorageUnavailable`` (bounded).

        Only for calls that may run twice: reads, metadata, idempotent changes.
        """

        def attempt() -> _T:
            with _translated(name, self.url, op):
                return call()

        return self.retry.run(attempt, sleep=self._sleep)

    def _status(self, name: str) -> _Status:
        """The FileStatus of chunk ``name`` (one attempt); ``ChunkNotFound`` if not a file."""
        with _translated(name, self.url):
            status = self._hdfs.status(self._path(name))
        if status.type != "FILE":
            raise ChunkNotFound(f"chunk {name!r} not found", chunk=name, binding=self.url)
        return status

    def _check_writable(self, name: str, status: _Status) -> None:
        # Checked here because HDFS lets its superuser write read-only files.
        if not status.mode & 0o200:
            raise ChunkReadOnly(f"chunk {name!r} is read-only", chunk=name, binding=self.url)

    def _remove_stale_tmp(self) -> None:
        with contextlib.suppress(ChunkStorageError):
            with _translated(TMP_FOLDER, self.url):
                entries = self._hdfs.list(self._tmp)
            ages = [(entry.suffix, entry.mtime_ms / 1000) for entry in entries if entry.type == "FILE"]
            remove_stale(ages, time.time(), lambda suffix: self._discard(f"{self._tmp}/{suffix}"))

    # -- hooks (arguments checked by ChunkStorage) ---------------------------------------------------

    def _do_exists(self, name: str) -> bool:
        try:
            self._retrying(name, lambda: self._status(name))
        except ChunkNotFound:
            return False
        return True

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        path = self._path(name)

        def write_tmp() -> str:
            tmp = f"{self._tmp}/{uuid.uuid4().hex}"  # a fresh one per attempt
            try:
                with _translated(name, self.url):
                    self._hdfs.create(tmp, data)
            except StorageUnavailable:
                self._discard(tmp)
                raise
            return tmp

        tmp = self.retry.run(write_tmp, sleep=self._sleep)
        try:
            self._publish(name, tmp, path)
        except BaseException:
            self._discard(tmp)
            raise
        return ChunkHandle(name, readonly=False)

    def _publish(self, name: str, tmp: str, path: str) -> None:
        """RENAME ``tmp`` to ``path``: exclusive (RENAME never overwrites)."""
        parent = path.rsplit("/", 1)[0]

        def rename() -> None:
            for _ in range(_PUBLISH_ATTEMPTS_MAX):
                with _translated(name, self.url):
                    if parent != self.root:
                        self._hdfs.mkdirs(parent)
                    if self._hdfs.rename(tmp, path):
                        return
                    # Nothing moved: the name is taken, or a delete pruned the folder
                    # between our mkdirs and the rename, or an earlier attempt that
                    # seemed to fail had in fact moved the file (``settle``).
                    tmp_left = self._exists_path(tmp)
                    target = self._exists_path(path)
                if not tmp_left:
                    raise _TmpVanished(
                        f"chunk {name!r}: temporary file {tmp} vanished before it was published",
                        chunk=name,
                        binding=self.url,
                    )
                if target:
                    raise ChunkExists(f"chunk {name!r} exists", chunk=name, binding=self.url)
            raise StorageUnavailable(
                f"chunk {name!r}: its folder kept disappearing while publishing",
                chunk=name,
                binding=self.url,
            )

        def landed(error: Exception) -> bool:
            """After a lost answer: did our earlier rename move the file?"""
            if not isinstance(error, _TmpVanished):
                return False
            with _translated(name, self.url):
                return self._exists_path(path)

        self.retry.run(rename, sleep=self._sleep, settle=landed)

    def _exists_path(self, path: str) -> bool:
        try:
            self._hdfs.status(path)
        except pyhdfs.HdfsFileNotFoundException:
            return False
        return True

    def _discard(self, tmp: str) -> None:
        """Best-effort removal of a temporary file (stale ones are removed at start)."""
        with contextlib.suppress(ChunkStorageError), _translated(TMP_FOLDER, self.url):
            self._hdfs.delete(tmp)

    def _do_delete(self, handle: ChunkHandle) -> None:
        name = handle.name
        path = self._path(name)

        def delete_once() -> None:
            with _translated(name, self.url):
                if not self._hdfs.delete(path):
                    raise ChunkNotFound(f"chunk {name!r} not found", chunk=name, binding=self.url)

        # On a retry, "not found" may mean that the earlier, seemingly failed attempt
        # deleted it: the chunk is gone either way.
        self.retry.run(delete_once, sleep=self._sleep, settle=lambda error: isinstance(error, ChunkNotFound))
        # A create racing with this sees its RENAME fail for want of the folder and makes
        # the folder again (``_publish``).
        CODEC.prune_folders(self.root, path, self._remove_empty_folder)

    def _remove_empty_folder(self, folder: str) -> bool:
        """Delete ``folder`` if it is empty (best effort: False on any failure)."""
        try:
            with _translated(folder, self.url):
                return self._hdfs.remove_empty_folder(folder)
        except ChunkStorageError:
            return False

    def _do_open_read(self, name: str) -> ChunkHandle:
        self._retrying(name, lambda: self._status(name))
        return ChunkHandle(name, readonly=True)

    def _do_open_write(self, name: str) -> ChunkHandle:
        status = self._retrying(name, lambda: self._status(name))
        self._check_writable(name, status)
        return ChunkHandle(name, readonly=False)

    def _do_get_info(self, name: str) -> ChunkInfo:
        return ChunkInfo(name, self._retrying(name, lambda: self._status(name)).length)

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        name = handle.name
        return self._retrying(name, lambda: self._read_once(name, offset, length))

    def _read_once(self, name: str, offset: int, length: int) -> bytes:
        """One OPEN; the length is asked for only to explain a refused one.

        OPEN answers ``min(length, size - offset)`` bytes (``Content-Length``, enforced by
        urllib3), but refuses ``offset >= size`` for a non-empty file, so a read at the end
        and a read past it are told apart by GETFILESTATUS.
        """
        if length > 0:
            try:
                with _translated(name, self.url, op="read"):
                    return self._hdfs.read(self._path(name), offset, length)
            except (ChunkInvalidOffset, StorageUnavailable) as exc:
                refused: ChunkStorageError | None = exc
        else:
            refused = None
        size = self._status(name).length
        if offset > size:
            raise ChunkInvalidOffset(
                f"chunk {name!r}: read at {offset} past its end {size}", chunk=name, offset=offset
            ) from refused
        if offset == size or length == 0:
            return b""
        assert refused is not None
        raise refused

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        name = handle.name
        path = self._path(name)
        # True once an append failed in a way that may have written bytes: from then on a
        # grown chunk is checked for them instead of being appended to again.
        maybe_landed = False

        def append() -> int:
            nonlocal maybe_landed
            status = self._status(name)
            self._check_writable(name, status)
            if maybe_landed and status.length != offset:
                return self._settle_append(name, path, offset, data, status.length)
            if status.length != offset:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: write at {offset}, but its length is {status.length}",
                    chunk=name,
                    offset=offset,
                )
            if not data:
                return 0
            try:
                with _translated(name, self.url):
                    self._hdfs.append(path, data)
            except StorageUnavailable as exc:
                # A lease refusal comes before any byte is written; a lost answer may
                # come after all of them.
                maybe_landed = maybe_landed or not getattr(exc, "lease", False)
                raise
            return len(data)

        with self._lock(name):
            return self.retry.run(append, sleep=self._sleep)

    def _settle_append(self, name: str, path: str, offset: int, payload: bytes, size: int) -> int:
        """After an append whose answer was lost the chunk grew: did our bytes land?"""
        end = offset + len(payload)
        if size == end:
            with _translated(name, self.url):
                landed = self._hdfs.read(path, offset, len(payload))
            if landed == payload:
                return len(payload)
        raise StorageUnavailable(
            f"chunk {name!r}: an append at {offset} failed and the chunk is now {size} bytes long "
            f"(expected {offset} or {end}); its tail is not this write's",
            chunk=name,
            offset=offset,
            binding=self.url,
        )

    def _do_list(self, prefix: str) -> Iterator[str]:
        def entries(folder: str) -> list[Entry]:
            """One LISTSTATUS (retried); none for a missing folder."""
            try:
                statuses = self._retrying(prefix, functools.partial(self._hdfs.list, folder))
            except ChunkNotFound:
                return []
            kinds = {"DIRECTORY": True, "FILE": False}  # symlinks are no chunks
            return [Entry(st.suffix, kinds[st.type]) for st in statuses if st.type in kinds]

        return iter(CODEC.names_below(self.root, prefix, entries))

    def _do_truncate(self, handle: ChunkHandle, length: int) -> None:
        name = handle.name
        path = self._path(name)

        def cut() -> bool:
            status = self._status(name)
            self._check_writable(name, status)
            if length > status.length:
                raise ChunkInvalidOffset(
                    f"chunk {name!r}: cannot truncate to {length} > {status.length}",
                    chunk=name,
                    offset=length,
                )
            # Idempotent: during the recovery a truncate to the same length answers false.
            return self._hdfs.truncate(path, length)

        with self._lock(name):
            if not self._retrying(name, cut, op="truncate"):
                self._await_recovery(name, path)

    def _await_recovery(self, name: str, path: str) -> None:
        """Wait until the block recovery of a truncate inside a block is over.

        WebHDFS has no ``isFileClosed``; an empty APPEND is refused with
        RecoveryInProgressException until the file is closed again, then it changes
        nothing. So the chunk is appendable again when ``truncate`` returns.
        """

        def append_nothing() -> None:
            with _translated(name, self.url):
                self._hdfs.append(path, b"")

        try:
            self._recovery_polls.run(append_nothing, sleep=self._sleep)
        except StorageUnavailable as exc:
            raise StorageUnavailable(
                f"chunk {name!r}: truncated, but its block recovery is not over yet",
                chunk=name,
                binding=self.url,
            ) from exc

    def _do_set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        name = handle.name
        path = self._path(name)

        def change() -> None:
            self._status(name)
            self._hdfs.set_permission(path, _READONLY_MODE if readonly else _FILE_MODE)

        with self._lock(name):
            self._retrying(name, change)

    def close(self) -> None:
        self._hdfs.close()


# -- URL parsing -----------------------------------------------------------------------------------


def _check_host(host: str, url: str) -> str:
    name, sep, port = host.rpartition(":")
    if not sep or (host.startswith("[") and host.endswith("]")):  # no port (IPv6 literal: [::1])
        name, port = host, str(DEFAULT_PORT)
    if not name or not port.isdigit() or not 0 < int(port) < 65536 or "/" in name:
        raise InvalidConfig(f"bad NameNode address {host!r} in {url!r} (want host:port)")
    return f"{name}:{int(port)}"


def _check_root(root: str) -> None:
    if not isinstance(root, str) or not root.startswith("/") or root.rstrip("/") == "":
        raise InvalidConfig(f"hdfs binding needs an absolute root folder below '/', got {root!r}")
    for component in root.rstrip("/").split("/")[1:]:
        if component in ("", ".", "..") or ":" in component or "\x00" in component:
            raise InvalidConfig(f"root {root!r} is not a valid HDFS path ({component!r})")
        if len(component.encode("utf-8", "surrogatepass")) > _COMPONENT_BYTES_MAX:
            raise InvalidConfig(f"root {root!r} has a component longer than 255 bytes")
    if TMP_FOLDER in root.split("/"):
        raise InvalidConfig(f"root {root!r} must not contain the reserved folder {TMP_FOLDER}")


_BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _parse_option(key: str, value: str, url: str) -> Any:
    try:
        if key == "user":
            if not value:
                raise ValueError("empty")
            return value
        if key in ("timeout_s", "backoff_s"):
            return float(value)
        if key == "max_attempts":
            return int(value)
        if key == "https":
            return _BOOLEANS[value.lower()]
    except (ValueError, KeyError) as exc:
        raise InvalidConfig(f"bad value {value!r} for option {key!r} in {url!r}") from exc
    if key == "attempts_max":
        raise InvalidConfig(f"option 'attempts_max' is now 'max_attempts' (as for every binding): {url!r}")
    known = "user, timeout_s, max_attempts, backoff_s, https"
    raise InvalidConfig(f"unknown option {key!r} in hdfs URL {url!r}; known: {known}")
