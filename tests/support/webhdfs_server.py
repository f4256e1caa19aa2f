"""A WebHDFS test server: the part of the WebHDFS REST API the HDFS binding uses.

Built from the public WebHDFS REST API documentation (hadoop-hdfs ``WebHDFS.md``) and the
NameNode's rules for each operation (``FSDirConcatOp``, ``FSDirTruncateOp``, the old-style
rename, the single-writer lease), so the binding meets the same answers a cluster gives:

* two HTTP servers on two loopback ports: a **NameNode** (``/webhdfs/v1/<path>?op=...``)
  that answers CREATE, APPEND and OPEN with ``307 Temporary Redirect`` to the **datanode**,
  which takes (201 Created / 200 OK) or serves the bytes;
* GETFILESTATUS, LISTSTATUS (``FileStatus``/``FileStatuses`` JSON shapes of the spec), MKDIRS,
  DELETE (``recursive``), RENAME (``{"boolean": false}`` when the destination exists or its
  folder is missing; into an existing folder it moves the source inside), CONCAT (target
  and sources in one folder, sources non-empty and closed, sources removed), TRUNCATE
  (``{"boolean": true}`` on a block boundary, else ``false`` and a block recovery during
  which appends get RecoveryInProgressException), SETPERMISSION;
* POSIX-like permissions checked for every user but the superuser (``hdfs``), ``user.name``
  from the query (``dr.who`` without it);
* the single-writer lease: while a CREATE or APPEND streams its bytes, another APPEND,
  TRUNCATE or CREATE of that file gets AlreadyBeingCreatedException;
* errors as ``{"RemoteException": {"exception", "javaClassName", "message"}}`` with the
  status codes of the spec (400 IllegalArgument, 401 Security, 403 IOException and its
  subclasses, 404 FileNotFound, 500 Runtime);
* safe mode and standby NameNodes, path limits (255-byte components, 8000 characters,
  1000 levels, ``.``/``..``/``:`` refused).

Deviations from HDFS (``docs/bindings.md`` lists them too): everything lives in memory;
bytes of a CREATE/APPEND become visible all at once when the datanode closes the file
(HDFS shows completed blocks earlier); a truncate's block recovery ends after
``truncate_recovery_ops`` further lease-checking requests on the file (HDFS: after the
datanodes report, seconds later) or ``finish_recoveries()``; leases never expire by time
(a dropped connection releases them, as the datanode closes its stream); no groups (the
owner's bits or the "other" bits apply), ACLs, quotas, snapshots, tokens or Kerberos;
no replication or real blocks (block size only decides what a truncate does).

Test hooks: ``raw_*`` read and change the namespace without HTTP; ``inject`` makes the
next matching requests fail (a RemoteException, or a dropped connection before or after
the operation took effect, or after part of a body); ``pause_writes`` holds a datanode
write after it took the lease; ``requests`` counts requests per (role, op).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

WEBHDFS_PREFIX = "/webhdfs/v1"
PATH_CHARS_MAX = 8000
PATH_DEPTH_MAX = 1000
COMPONENT_BYTES_MAX = 255
BLOCK_SIZE_DEFAULT = 128 << 20
SUPERUSER = "hdfs"
SUPERGROUP = "supergroup"
DEFAULT_WEB_USER = "dr.who"
CLIENT_MACHINE = "127.0.0.1"
#: How long a paused datanode write waits for ``release`` before giving up.
PAUSE_S_MAX = 60.0
BODY_BYTES_MAX = 1 << 30

# exception name -> (HTTP status, Java class): the spec's mapping of exceptions to codes.
EXCEPTIONS: dict[str, tuple[int, str]] = {
    "IllegalArgumentException": (400, "java.lang.IllegalArgumentException"),
    "HadoopIllegalArgumentException": (400, "org.apache.hadoop.HadoopIllegalArgumentException"),
    "InvalidPathException": (400, "org.apache.hadoop.fs.InvalidPathException"),
    "UnsupportedOperationException": (400, "java.lang.UnsupportedOperationException"),
    "SecurityException": (401, "java.lang.SecurityException"),
    "IOException": (403, "java.io.IOException"),
    "EOFException": (403, "java.io.EOFException"),
    "AccessControlException": (403, "org.apache.hadoop.security.AccessControlException"),
    "FileAlreadyExistsException": (403, "org.apache.hadoop.fs.FileAlreadyExistsException"),
    "AlreadyBeingCreatedException": (
        403,
        "org.apache.hadoop.hdfs.protocol.AlreadyBeingCreatedException",
    ),
    "RecoveryInProgressException": (
        403,
        "org.apache.hadoop.hdfs.protocol.RecoveryInProgressException",
    ),
    "LeaseExpiredException": (403, "org.apache.hadoop.hdfs.server.namenode.LeaseExpiredException"),
    "SafeModeException": (403, "org.apache.hadoop.hdfs.server.namenode.SafeModeException"),
    "StandbyException": (403, "org.apache.hadoop.ipc.StandbyException"),
    "RetriableException": (403, "org.apache.hadoop.ipc.RetriableException"),
    "PathIsNotEmptyDirectoryException": (
        403,
        "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException",
    ),
    "ParentNotDirectoryException": (403, "org.apache.hadoop.fs.ParentNotDirectoryException"),
    "PathComponentTooLongException": (
        403,
        "org.apache.hadoop.hdfs.protocol.FSLimitException$PathComponentTooLongException",
    ),
    "NSQuotaExceededException": (403, "org.apache.hadoop.hdfs.protocol.NSQuotaExceededException"),
    "DSQuotaExceededException": (403, "org.apache.hadoop.hdfs.protocol.DSQuotaExceededException"),
    "FileNotFoundException": (404, "java.io.FileNotFoundException"),
    "RuntimeException": (500, "java.lang.RuntimeException"),
    "NullPointerException": (500, "java.lang.NullPointerException"),
}

# Operations per HTTP method (the real ones; the server implements the ones marked in OPS).
_REAL_OPS = {
    "GET": {
        "OPEN",
        "GETFILESTATUS",
        "LISTSTATUS",
        "LISTSTATUS_BATCH",
        "GETCONTENTSUMMARY",
        "GETQUOTAUSAGE",
        "GETFILECHECKSUM",
        "GETHOMEDIRECTORY",
        "GETDELEGATIONTOKEN",
        "GETTRASHROOT",
        "GETXATTRS",
        "LISTXATTRS",
        "CHECKACCESS",
        "GETALLSTORAGEPOLICY",
        "GETSTORAGEPOLICY",
        "GETSNAPSHOTDIFF",
        "GETFILEBLOCKLOCATIONS",
        "GETACLSTATUS",
    },
    "PUT": {
        "CREATE",
        "MKDIRS",
        "CREATESYMLINK",
        "RENAME",
        "SETREPLICATION",
        "SETOWNER",
        "SETPERMISSION",
        "SETTIMES",
        "RENEWDELEGATIONTOKEN",
        "CANCELDELEGATIONTOKEN",
        "ALLOWSNAPSHOT",
        "DISALLOWSNAPSHOT",
        "CREATESNAPSHOT",
        "RENAMESNAPSHOT",
        "SETXATTR",
        "REMOVEXATTR",
        "SETSTORAGEPOLICY",
        "SETACL",
        "MODIFYACLENTRIES",
    },
    "POST": {"APPEND", "CONCAT", "TRUNCATE", "UNSETSTORAGEPOLICY"},
    "DELETE": {"DELETE", "DELETESNAPSHOT"},
}
_OP_CLASSES = {
    "GET": "GetOpParam",
    "PUT": "PutOpParam",
    "POST": "PostOpParam",
    "DELETE": "DeleteOpParam",
}
OPS = {
    "GET": {"OPEN", "GETFILESTATUS", "LISTSTATUS"},
    "PUT": {"CREATE", "MKDIRS", "RENAME", "SETPERMISSION"},
    "POST": {"APPEND", "CONCAT", "TRUNCATE"},
    "DELETE": {"DELETE"},
}
_CREATE_FLAGS = {
    "CREATE",
    "OVERWRITE",
    "APPEND",
    "SYNC_BLOCK",
    "LAZY_PERSIST",
    "NEW_BLOCK",
    "NO_LOCAL_WRITE",
    "SHOULD_REPLICATE",
    "IGNORE_CLIENT_LOCALITY",
}
_MUTATING = {"MKDIRS", "DELETE", "RENAME", "SETPERMISSION", "CONCAT", "TRUNCATE"}


class RemoteError(Exception):
    """A Java exception as WebHDFS reports it."""

    def __init__(self, exception: str, message: str) -> None:
        super().__init__(f"{exception}: {message}")
        self.status, self.java_class = EXCEPTIONS[exception]
        self.exception = exception
        self.message = message

    def body(self) -> bytes:
        return json.dumps(
            {
                "RemoteException": {
                    "exception": self.exception,
                    "javaClassName": self.java_class,
                    "message": self.message,
                }
            }
        ).encode()


@dataclass(eq=False)
class Inode:
    kind: str  # "FILE" or "DIRECTORY"
    owner: str
    group: str
    permission: int
    file_id: int
    mtime_ms: int
    children: dict[str, Inode] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    block_size: int = 0
    replication: int = 0
    sync_block: bool = False
    #: Lease holder while the file is under construction (a write or a block recovery).
    writer: str | None = None
    #: Further lease-checking requests a running truncate recovery refuses.
    recovery_ops_left: int = 0
    recovery_length: int = -1
    deleted: bool = False

    @property
    def recovering(self) -> bool:
        return self.recovery_length >= 0


@dataclass
class Injection:
    """Makes the next ``count`` requests of ``op`` (to ``role``, below ``path``) misbehave."""

    role: str
    op: str
    action: str  # "error", "drop_before", "drop_after", "drop_partial"
    exception: str | None
    message: str
    count: int
    path: str | None
    hits: int = 0


@dataclass
class Pause:
    """A datanode write of ``path`` holds its lease until ``release`` is set."""

    path: str
    lease_taken: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class _Dropped(Exception):
    """Close the connection without an answer."""


def _components(path: str) -> list[str]:
    return [] if path == "/" else path.split("/")[1:]


def _mode_string(inode: Inode) -> str:
    bits = "".join(ch if inode.permission & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return ("d" if inode.kind == "DIRECTORY" else "-") + bits


class WebHdfsTestServer:
    """A NameNode and a datanode on two loopback ports sharing one in-memory namespace."""

    def __init__(
        self,
        *,
        block_size: int = BLOCK_SIZE_DEFAULT,
        truncate_recovery_ops: int = 1,
        root_permission: int = 0o777,
        host: str = "127.0.0.1",
    ) -> None:
        assert block_size > 0 and truncate_recovery_ops >= 0
        self.block_size = block_size
        self.truncate_recovery_ops = truncate_recovery_ops
        self.host = host
        self.safe_mode = False
        self.standby = False
        self.requests: Counter[tuple[str, str]] = Counter()
        #: Unexpected exceptions inside the server (bugs): tests assert there are none.
        self.internal_errors: list[str] = []
        self._lock = threading.RLock()
        self._ids = itertools.count(16386)
        self._clients = itertools.count(1)
        self._root = Inode("DIRECTORY", SUPERUSER, SUPERGROUP, root_permission, 16385, self._now())
        self._injections: list[Injection] = []
        self._pauses: dict[str, Pause] = {}
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []
        self.namenode_address = ""
        self.datanode_address = ""

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> WebHdfsTestServer:
        assert not self._servers, "started twice"
        self.namenode_address = self._serve("namenode")
        self.datanode_address = self._serve("datanode")
        return self

    def add_standby_namenode(self) -> str:
        """Another NameNode address that answers every request with StandbyException."""
        return self._serve("standby")

    def _serve(self, role: str) -> str:
        httpd = _HttpServer((self.host, 0), _Handler)
        httpd.owner = self
        httpd.role = role
        thread = threading.Thread(target=httpd.serve_forever, name=f"webhdfs-{role}", daemon=True)
        thread.start()
        self._servers.append(httpd)
        self._threads.append(thread)
        return f"{self.host}:{httpd.server_address[1]}"

    def stop(self) -> None:
        servers, self._servers = self._servers, []
        for httpd in servers:
            httpd.shutdown()
            httpd.server_close()
            httpd.drop_connections()
        for thread in self._threads:
            thread.join(10)
        self._threads = []
        for pause in list(self._pauses.values()):
            pause.release.set()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def url(self, root: str, **options: object) -> str:
        """An ``hdfs://`` URL of this server for the binding."""
        query = urlencode({key: str(value) for key, value in options.items()})
        return f"hdfs://{self.namenode_address}{quote(root)}" + (f"?{query}" if query else "")

    # -- test hooks ----------------------------------------------------------------------------

    def inject(
        self,
        op: str,
        exception: str | None = None,
        message: str = "injected by the test",
        *,
        role: str = "namenode",
        action: str = "error",
        count: int = 1,
        path: str | None = None,
    ) -> Injection:
        assert action in ("error", "drop_before", "drop_after", "drop_partial"), action
        assert (action == "error") == (exception is not None), (action, exception)
        assert exception is None or exception in EXCEPTIONS, exception
        assert role in ("namenode", "datanode"), role
        injection = Injection(role, op.upper(), action, exception, message, count, path)
        with self._lock:
            self._injections.append(injection)
        return injection

    def clear_injections(self) -> None:
        with self._lock:
            self._injections.clear()

    @contextlib.contextmanager
    def pause_writes(self, path: str) -> Iterator[Pause]:
        pause = Pause(path)
        with self._lock:
            assert path not in self._pauses
            self._pauses[path] = pause
        try:
            yield pause
        finally:
            pause.release.set()
            with self._lock:
                self._pauses.pop(path, None)

    def finish_recoveries(self) -> None:
        with self._lock:
            stack = [self._root]
            while stack:
                inode = stack.pop()
                stack.extend(inode.children.values())
                if inode.recovering:
                    self._end_recovery(inode)

    def raw_read(self, path: str) -> bytes:
        with self._lock:
            inode = self._lookup(path)
            if inode is None or inode.kind != "FILE":
                raise KeyError(path)
            return bytes(inode.data)

    def raw_exists(self, path: str) -> bool:
        with self._lock:
            inode = self._lookup(path)
            return inode is not None and inode.kind == "FILE"

    def raw_status(self, path: str) -> dict | None:
        with self._lock:
            inode = self._lookup(path)
            return None if inode is None else self._file_status(inode, "")

    def raw_inode(self, path: str) -> Inode | None:
        with self._lock:
            return self._lookup(path)

    def raw_write(
        self,
        path: str,
        data: bytes,
        *,
        owner: str = SUPERUSER,
        permission: int = 0o644,
        mtime_ms: int | None = None,
    ) -> None:
        """Store a closed file (replacing one), creating folders owned by ``owner``."""
        with self._lock:
            parent = self.raw_mkdirs(path.rsplit("/", 1)[0] or "/", owner=owner)
            name = path.rsplit("/", 1)[1]
            old = parent.children.get(name)
            assert old is None or old.kind == "FILE", path
            inode = self._new_file(owner, permission, self.block_size, 3)
            inode.data[:] = data
            if mtime_ms is not None:
                inode.mtime_ms = mtime_ms
            parent.children[name] = inode

    def raw_mkdirs(self, path: str, *, owner: str = SUPERUSER, permission: int = 0o755) -> Inode:
        with self._lock:
            inode = self._root
            for component in _components(path):
                child = inode.children.get(component)
                if child is None:
                    child = Inode("DIRECTORY", owner, SUPERGROUP, permission, next(self._ids), self._now())
                    inode.children[component] = child
                assert child.kind == "DIRECTORY", path
                inode = child
            return inode

    def raw_delete(self, path: str) -> None:
        with self._lock:
            parent = self._lookup(path.rsplit("/", 1)[0] or "/")
            if parent is not None and parent.kind == "DIRECTORY":
                removed = parent.children.pop(path.rsplit("/", 1)[1], None)
                if removed is not None:
                    self._mark_deleted(removed)

    def raw_list(self, path: str) -> list[str]:
        with self._lock:
            inode = self._lookup(path)
            return sorted(inode.children) if inode is not None else []

    # -- namespace helpers (under the lock) -----------------------------------------------------

    @staticmethod
    def _now() -> int:
        return int(time.time() * 1000)

    def _new_file(self, owner: str, permission: int, block_size: int, replication: int) -> Inode:
        now = self._now()
        inode = Inode("FILE", owner, SUPERGROUP, permission, next(self._ids), now)
        inode.block_size, inode.replication = block_size, replication
        return inode

    def _lookup(self, path: str) -> Inode | None:
        inode = self._root
        for component in _components(path):
            if inode.kind != "DIRECTORY":
                return None
            child = inode.children.get(component)
            if child is None:
                return None
            inode = child
        return inode

    def _mark_deleted(self, inode: Inode) -> None:
        stack = [inode]
        while stack:
            node = stack.pop()
            node.deleted = True
            stack.extend(node.children.values())

    @staticmethod
    def _check_valid(path: str) -> None:
        """``DFSUtil.isValidName``: absolute, no ``.``/``..``/empty component, no ``:``."""
        if not path.startswith("/"):
            raise RemoteError("InvalidPathException", f"Invalid path name Path is not absolute: {path}")
        for component in _components(path):
            if component in ("", ".", "..") or ":" in component:
                raise RemoteError("InvalidPathException", f"Invalid path name Invalid file name: {path}")

    @staticmethod
    def _check_limits(path: str) -> None:
        if len(path) > PATH_CHARS_MAX or len(_components(path)) > PATH_DEPTH_MAX:
            raise RemoteError(
                "IOException",
                f"Pathname too long.  Limit {PATH_CHARS_MAX} characters, {PATH_DEPTH_MAX} levels.",
            )
        parent = ""
        for component in _components(path):
            length = len(component.encode("utf-8"))
            if length > COMPONENT_BYTES_MAX:
                raise RemoteError(
                    "PathComponentTooLongException",
                    f"The maximum path component name limit of {component} in directory "
                    f"{parent or '/'} is exceeded: limit={COMPONENT_BYTES_MAX} length={length}",
                )
            parent += "/" + component

    def _allowed(self, user: str, inode: Inode, access: str) -> bool:
        if user == SUPERUSER:
            return True
        shift = 6 if user == inode.owner else 0
        need = {"READ": 4, "WRITE": 2, "EXECUTE": 1, "READ_EXECUTE": 5, "WRITE_EXECUTE": 3}[access]
        return (inode.permission >> shift) & need == need

    def _check_access(self, user: str, inode: Inode, path: str, access: str) -> None:
        if not self._allowed(user, inode, access):
            raise RemoteError(
                "AccessControlException",
                f'Permission denied: user={user}, access={access}, inode="{path}":'
                f"{inode.owner}:{inode.group}:{_mode_string(inode)}",
            )

    def _traverse(self, user: str, path: str) -> None:
        """EXECUTE on every existing ancestor folder."""
        inode, walked = self._root, ""
        for component in _components(path)[:-1]:
            self._check_access(user, inode, walked or "/", "EXECUTE")
            child = inode.children.get(component)
            if child is None or child.kind != "DIRECTORY":
                return
            inode, walked = child, walked + "/" + component

    def _resolve_file(self, path: str, missing: str) -> Inode:
        inode = self._lookup(path)
        if inode is None:
            raise RemoteError("FileNotFoundException", missing)
        if inode.kind != "FILE":
            raise RemoteError("FileNotFoundException", f"Path is not a file: {path}")
        return inode

    def _parent(self, path: str) -> Inode | None:
        return self._lookup(path.rsplit("/", 1)[0] or "/")

    def _mkdirs(self, user: str, path: str, permission: int) -> Inode:
        inode, walked = self._root, ""
        components = _components(path)
        for index, component in enumerate(components):
            child = inode.children.get(component)
            if child is None:
                self._check_access(user, inode, walked or "/", "WRITE_EXECUTE")
                child = Inode("DIRECTORY", user, SUPERGROUP, permission, next(self._ids), self._now())
                inode.children[component] = child
                inode.mtime_ms = self._now()
            elif child.kind != "DIRECTORY":
                target = walked + "/" + component
                if index == len(components) - 1:
                    raise RemoteError("FileAlreadyExistsException", f"Path is not a directory: {target}")
                raise RemoteError("ParentNotDirectoryException", f"{target} (is not a directory)")
            inode, walked = child, walked + "/" + component
        return inode

    def _file_status(self, inode: Inode, suffix: str) -> dict:
        is_file = inode.kind == "FILE"
        return {
            "accessTime": inode.mtime_ms if is_file else 0,
            "blockSize": inode.block_size if is_file else 0,
            "childrenNum": 0 if is_file else len(inode.children),
            "fileId": inode.file_id,
            "group": inode.group,
            "length": len(inode.data) if is_file else 0,
            "modificationTime": inode.mtime_ms,
            "owner": inode.owner,
            "pathSuffix": suffix,
            "permission": format(inode.permission, "o"),
            "replication": inode.replication if is_file else 0,
            "storagePolicy": 0,
            "type": inode.kind,
        }

    def _end_recovery(self, inode: Inode) -> None:
        inode.recovery_length = -1
        inode.recovery_ops_left = 0
        inode.writer = None

    def _recover_lease(self, inode: Inode, path: str, op_label: str, client: str) -> None:
        """``FSNamesystem.recoverLeaseInternal``: refuse while the file is under construction."""
        if inode.recovering:
            inode.recovery_ops_left -= 1
            if inode.recovery_ops_left <= 0:
                self._end_recovery(inode)
            raise RemoteError(
                "RecoveryInProgressException",
                f"Failed to {op_label} {path} for {client} on {CLIENT_MACHINE} because lease "
                "recovery is in progress. Try again later.",
            )
        if inode.writer is not None:
            raise RemoteError(
                "AlreadyBeingCreatedException",
                f"Failed to {op_label} {path} for {client} on {CLIENT_MACHINE} because this file "
                f"lease is currently owned by {inode.writer} on {CLIENT_MACHINE}",
            )

    def _new_client(self) -> str:
        return f"DFSClient_NONMAPREDUCE_{next(self._clients)}_1"

    def _check_safe_mode(self, what: str) -> None:
        if self.safe_mode:
            raise RemoteError(
                "SafeModeException",
                f"Cannot {what}. Name node is in safe mode.\nIt was turned on manually. "
                'Use "hdfs dfsadmin -safemode leave" to turn safe mode off.',
            )

    def _take_injection(self, role: str, op: str, path: str) -> Injection | None:
        with self._lock:
            for injection in self._injections:
                if (
                    injection.count > 0
                    and injection.role == role
                    and injection.op == op
                    and (injection.path is None or path.startswith(injection.path))
                ):
                    injection.count -= 1
                    injection.hits += 1
                    return injection
        return None

    # -- NameNode ----------------------------------------------------------------------------------

    def namenode(self, method: str, op: str, path: str, params: dict[str, str], user: str) -> tuple:
        """One NameNode request; returns ``(status, body, headers)``."""
        if op in _MUTATING:
            self._check_safe_mode(f"{op.lower()} {path}")
        if op in ("CREATE", "APPEND", "OPEN"):
            return self._redirect(op, path, params, user)
        with self._lock:
            self._traverse(user, path)
            handler = getattr(self, f"_nn_{op.lower()}")
            return handler(path, params, user)

    def _redirect(self, op: str, path: str, params: dict[str, str], user: str) -> tuple:
        with self._lock:
            self._traverse(user, path)
            if op == "CREATE":
                _boolean(params, "overwrite", False)
                _octal(params, "permission", 0o644)
                _positive(params, "blocksize", self.block_size)
                _positive(params, "replication", 3)
                _create_flags(params)
            else:
                inode = self._lookup(path)
                if inode is None:
                    raise RemoteError("FileNotFoundException", f"File {path} not found.")
                if op == "OPEN":
                    if inode.kind != "FILE":
                        raise RemoteError("FileNotFoundException", f"Path is not a file: {path}")
                    self._check_access(user, inode, path, "READ")
                    offset = _long(params, "offset", 0)
                    _long(params, "length", -1, minimum=-1)
                    length = len(inode.data)
                    if offset >= length > 0:
                        raise RemoteError(
                            "IOException",
                            f"Offset={offset} out of the range [0, {length}); OPEN, path={path}",
                        )
        forwarded = dict(params)
        forwarded["op"] = op
        forwarded["user.name"] = user
        forwarded["namenoderpcaddress"] = self.namenode_address
        location = f"http://{self.datanode_address}{WEBHDFS_PREFIX}{quote(path)}?{urlencode(forwarded)}"
        return 307, b"", {"Location": location, "Content-Type": "application/octet-stream"}

    def _nn_getfilestatus(self, path: str, params: dict[str, str], user: str) -> tuple:
        inode = self._lookup(path)
        if inode is None:
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}")
        return _json(200, {"FileStatus": self._file_status(inode, "")})

    def _nn_liststatus(self, path: str, params: dict[str, str], user: str) -> tuple:
        inode = self._lookup(path)
        if inode is None:
            raise RemoteError("FileNotFoundException", f"File {path} does not exist.")
        if inode.kind == "FILE":
            statuses = [self._file_status(inode, "")]
        else:
            self._check_access(user, inode, path, "READ_EXECUTE")
            names = sorted(inode.children, key=lambda n: n.encode("utf-8"))
            statuses = [self._file_status(inode.children[n], n) for n in names]
        return _json(200, {"FileStatuses": {"FileStatus": statuses}})

    def _nn_mkdirs(self, path: str, params: dict[str, str], user: str) -> tuple:
        self._check_valid(path)
        self._check_limits(path)
        self._mkdirs(user, path, _octal(params, "permission", 0o755))
        return _json(200, {"boolean": True})

    def _nn_delete(self, path: str, params: dict[str, str], user: str) -> tuple:
        recursive = _boolean(params, "recursive", False)
        inode = self._lookup(path)
        if path == "/" or inode is None:
            return _json(200, {"boolean": False})
        parent = self._parent(path)
        assert parent is not None
        self._check_access(user, parent, path.rsplit("/", 1)[0] or "/", "WRITE_EXECUTE")
        if inode.kind == "DIRECTORY" and inode.children and not recursive:
            raise RemoteError(
                "PathIsNotEmptyDirectoryException", f"`{path} is non empty': Directory is not empty"
            )
        del parent.children[path.rsplit("/", 1)[1]]
        parent.mtime_ms = self._now()
        self._mark_deleted(inode)
        return _json(200, {"boolean": True})

    def _nn_rename(self, path: str, params: dict[str, str], user: str) -> tuple:
        """The old-style rename (no ``renameoptions``): answers false rather than overwrite."""
        destination = params.get("destination")
        if not destination or not destination.startswith("/"):
            raise RemoteError(
                "IllegalArgumentException",
                f'Invalid parameter value: destination = "{destination}" is not an absolute path.',
            )
        self._check_valid(path)
        self._check_valid(destination)
        destination = destination.rstrip("/") or "/"
        source = self._lookup(path)
        if source is None or path == "/":
            return _json(200, {"boolean": False})  # "source does not exist"
        source_parent = self._parent(path)
        assert source_parent is not None
        self._check_access(user, source_parent, path.rsplit("/", 1)[0] or "/", "WRITE_EXECUTE")
        target_inode = self._lookup(destination)
        if target_inode is not None and target_inode.kind == "DIRECTORY":
            destination = destination.rstrip("/") + "/" + path.rsplit("/", 1)[1]
        if destination == path:
            return _json(200, {"boolean": True})
        if destination.startswith(path + "/"):
            raise RemoteError(
                "IOException",
                f"Failed to rename {path} to {destination} because destination starts with src",
            )
        self._check_limits(destination)
        if self._lookup(destination) is not None:
            return _json(200, {"boolean": False})  # "destination exists"
        target_parent = self._parent(destination)
        if target_parent is None or target_parent.kind != "DIRECTORY":
            return _json(200, {"boolean": False})  # "destination's parent does not exist"
        self._check_access(user, target_parent, destination.rsplit("/", 1)[0] or "/", "WRITE_EXECUTE")
        del source_parent.children[path.rsplit("/", 1)[1]]
        target_parent.children[destination.rsplit("/", 1)[1]] = source
        source_parent.mtime_ms = target_parent.mtime_ms = self._now()
        return _json(200, {"boolean": True})

    def _nn_setpermission(self, path: str, params: dict[str, str], user: str) -> tuple:
        permission = _octal(params, "permission", 0o755)
        inode = self._lookup(path)
        if inode is None:
            raise RemoteError("FileNotFoundException", f"File does not exist: {path}")
        if user != SUPERUSER and user != inode.owner:
            raise RemoteError(
                "AccessControlException",
                f"Permission denied. user={user} is not the owner of inode={path}",
            )
        inode.permission = permission
        return 200, b"", {}

    def _nn_concat(self, path: str, params: dict[str, str], user: str) -> tuple:
        """``FSDirConcatOp``: moves the sources' blocks to the end of the target, deletes them."""
        sources = [s for s in params.get("sources", "").split(",") if s]
        if not sources:
            raise RemoteError("IllegalArgumentException", "No sources given")
        target = self._resolve_file(path, f"File does not exist: {path}")
        self._check_access(user, target, path, "WRITE")
        if target.writer is not None or target.recovering:
            raise RemoteError(
                "HadoopIllegalArgumentException",
                f"concat: target file {path} is under construction",
            )
        target_parent = self._parent(path)
        files: list[tuple[str, Inode]] = []
        for source in sources:
            self._check_valid(source)
            inode = self._resolve_file(source, f"File does not exist: {source}")
            self._check_access(user, inode, source, "READ")
            parent = self._parent(source)
            assert parent is not None
            self._check_access(user, parent, source.rsplit("/", 1)[0] or "/", "WRITE")
            if parent is not target_parent:
                raise RemoteError(
                    "HadoopIllegalArgumentException",
                    f"Source file {source} is not in the same directory with the target {path}",
                )
            if inode is target:
                raise RemoteError(
                    "HadoopIllegalArgumentException",
                    f"concat: the src file {source} is the same with the target file {path}",
                )
            if inode.writer is not None or inode.recovering or not inode.data:
                raise RemoteError(
                    "HadoopIllegalArgumentException",
                    f"concat: source file {source} is invalid or empty or underConstruction",
                )
            if inode.block_size > target.block_size:
                raise RemoteError(
                    "HadoopIllegalArgumentException",
                    f"concat: source file {source} has preferred block size {inode.block_size} "
                    "which is greater than the target file's preferred block size "
                    f"{target.block_size}",
                )
            files.append((source, inode))
        if len({id(inode) for _, inode in files}) < len(files):
            raise RemoteError(
                "HadoopIllegalArgumentException",
                "concat: at least two of the source files are the same",
            )
        assert target_parent is not None
        for source, inode in files:
            target.data += inode.data
            del target_parent.children[source.rsplit("/", 1)[1]]
            self._mark_deleted(inode)
        target.mtime_ms = target_parent.mtime_ms = self._now()
        return 200, b"", {}

    def _nn_truncate(self, path: str, params: dict[str, str], user: str) -> tuple:
        """``FSDirTruncateOp``: true on a block boundary, else false and a block recovery."""
        if "newlength" not in params:
            raise RemoteError("IllegalArgumentException", "newLength parameter is Missing")
        new_length = _long(params, "newlength", 0, minimum=None)
        if new_length < 0:
            raise RemoteError(
                "HadoopIllegalArgumentException",
                f"Cannot truncate to a negative file size: {new_length}.",
            )
        inode = self._resolve_file(path, f"File does not exist: {path}")
        self._check_access(user, inode, path, "WRITE")
        client = self._new_client()
        if inode.recovering and new_length == inode.recovery_length:
            inode.recovery_ops_left -= 1  # "already being truncated with the same length"
            if inode.recovery_ops_left <= 0:
                self._end_recovery(inode)
            return _json(200, {"boolean": False})
        self._recover_lease(inode, path, "TRUNCATE_FILE", client)
        old_length = len(inode.data)
        if old_length == new_length:
            return _json(200, {"boolean": True})
        if old_length < new_length:
            raise RemoteError(
                "HadoopIllegalArgumentException",
                f"Cannot truncate to a larger file size. Current size: {old_length}, "
                f"truncate size: {new_length}.",
            )
        del inode.data[new_length:]
        inode.mtime_ms = self._now()
        if new_length % inode.block_size == 0:
            return _json(200, {"boolean": True})
        inode.writer = client
        inode.recovery_length = new_length
        inode.recovery_ops_left = self.truncate_recovery_ops
        if inode.recovery_ops_left == 0:
            self._end_recovery(inode)
        return _json(200, {"boolean": False})

    # -- datanode -------------------------------------------------------------------------------

    def datanode_open(self, path: str, params: dict[str, str], user: str) -> tuple:
        offset = _long(params, "offset", 0)
        length = _long(params, "length", -1, minimum=-1)
        with self._lock:
            inode = self._resolve_file(path, f"File does not exist: {path}")
            self._check_access(user, inode, path, "READ")
            if offset > len(inode.data):
                raise RemoteError("EOFException", "Cannot seek after EOF")
            end = len(inode.data) if length < 0 else min(len(inode.data), offset + length)
            data = bytes(inode.data[offset:end])
        headers = {"Content-Type": "application/octet-stream", "Connection": "close"}
        return 200, data, headers

    def datanode_create_begin(self, path: str, params: dict[str, str], user: str) -> tuple[Inode, str]:
        """The datanode's ``DFSClient.create``: the file appears, empty and under construction."""
        overwrite = _boolean(params, "overwrite", False)
        permission = _octal(params, "permission", 0o644)
        block_size = _positive(params, "blocksize", self.block_size)
        replication = _positive(params, "replication", 3)
        flags = _create_flags(params) or ({"CREATE", "OVERWRITE"} if overwrite else {"CREATE"})
        if overwrite:
            flags.add("OVERWRITE")
        if not flags & {"CREATE", "OVERWRITE", "APPEND"}:
            raise RemoteError(
                "HadoopIllegalArgumentException", f"{sorted(flags)} does not specify any options"
            )
        create_parent = _boolean(params, "createparent", True)
        client = self._new_client()
        with self._lock:
            self._check_safe_mode(f"create file{path}")
            self._check_valid(path)
            self._check_limits(path)
            self._traverse(user, path)
            folder = path.rsplit("/", 1)[0] or "/"
            parent = self._lookup(folder)
            if parent is None:
                if not create_parent:
                    raise RemoteError("FileNotFoundException", f"Parent directory doesn't exist: {folder}")
                parent = self._mkdirs(user, folder, 0o755)
            elif parent.kind != "DIRECTORY":
                raise RemoteError("ParentNotDirectoryException", f"{folder} (is not a directory)")
            name = path.rsplit("/", 1)[1]
            existing = parent.children.get(name)
            if existing is not None:
                if existing.kind == "DIRECTORY":
                    raise RemoteError("FileAlreadyExistsException", f"{path} already exists as a directory")
                self._recover_lease(existing, path, "CREATE_FILE", client)
                if "OVERWRITE" not in flags:
                    raise RemoteError(
                        "FileAlreadyExistsException",
                        f"{path} for client {CLIENT_MACHINE} already exists",
                    )
                self._check_access(user, existing, path, "WRITE")
                self._mark_deleted(existing)
            self._check_access(user, parent, folder, "WRITE_EXECUTE")
            inode = self._new_file(user, permission, block_size, replication)
            inode.sync_block = "SYNC_BLOCK" in flags
            inode.writer = client
            parent.children[name] = inode
            parent.mtime_ms = self._now()
        return inode, client

    def datanode_append_begin(self, path: str, params: dict[str, str], user: str) -> tuple[Inode, str]:
        """The datanode's ``DFSClient.append``: takes the file's lease."""
        client = self._new_client()
        with self._lock:
            self._check_safe_mode(f"append to file{path}")
            self._traverse(user, path)
            inode = self._resolve_file(
                path, f"Failed to append to non-existent file {path} for client {CLIENT_MACHINE}"
            )
            self._check_access(user, inode, path, "WRITE")
            self._recover_lease(inode, path, "APPEND_FILE", client)
            inode.writer = client
        return inode, client

    def datanode_finish(self, inode: Inode, client: str, path: str, data: bytes) -> None:
        """Close the output stream: the bytes become the file's, the lease is released."""
        with self._lock:
            if inode.deleted or inode.writer != client:
                if inode.writer == client:
                    inode.writer = None
                raise RemoteError(
                    "FileNotFoundException",
                    f"No lease on {path} (inode {inode.file_id}): File does not exist. "
                    f"Holder {client} does not have any open files.",
                )
            inode.data += data
            inode.writer = None
            inode.mtime_ms = self._now()

    def pause_for(self, path: str) -> Pause | None:
        with self._lock:
            return self._pauses.get(path)


# -- parameters ------------------------------------------------------------------------------------


def _invalid(name: str, value: str, why: str) -> RemoteError:
    return RemoteError("IllegalArgumentException", f'Invalid value for webhdfs parameter "{name}": {why}')


def _boolean(params: dict[str, str], name: str, default: bool) -> bool:
    value = params.get(name)
    if value is None or value == "":
        return default
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _invalid(name, value, f'Failed to parse "{value}" to Boolean.')


def _octal(params: dict[str, str], name: str, default: int) -> int:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        parsed = int(value, 8)
    except ValueError:
        parsed = -1
    if not 0 <= parsed <= 0o1777:
        raise _invalid(name, value, f'Failed to parse "{value}" as a radix-8 short integer.')
    return parsed


def _long(params: dict[str, str], name: str, default: int, minimum: int | None = 0) -> int:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        parsed = int(value)
    except ValueError:
        raise _invalid(name, value, f'Failed to parse "{value}" as a radix-10 long integer.') from None
    if minimum is not None and parsed < minimum:
        raise _invalid(name, value, f"Invalid parameter range: {name} = {parsed} < {minimum}")
    return parsed


def _positive(params: dict[str, str], name: str, default: int) -> int:
    value = _long(params, name, default, minimum=1)
    return value


def _create_flags(params: dict[str, str]) -> set[str]:
    value = params.get("createflag", "")
    flags = {flag.strip().upper() for flag in value.split(",") if flag.strip()}
    unknown = flags - _CREATE_FLAGS
    if unknown:
        raise _invalid(
            "createflag",
            value,
            f"No enum constant org.apache.hadoop.fs.CreateFlag.{min(unknown)}",
        )
    return flags


def _json(status: int, body: object) -> tuple:
    return status, json.dumps(body).encode(), {"Content-Type": "application/json"}


# -- HTTP ------------------------------------------------------------------------------------------


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    owner: WebHdfsTestServer
    role: str

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Cut every open connection, as a server that died would (keep-alive ones too)."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 120  # an idle keep-alive connection ends eventually
    server: _HttpServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- plumbing ----------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)
        if (headers or {}).get("Connection") == "close":
            self.close_connection = True

    def _read_body(self, partial_ok: bool = False) -> tuple[bytes, bool]:
        """The request body and whether it arrived whole (a client may hang up midway)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            pieces = []
            total = 0
            while True:
                line = self.rfile.readline(1024)
                if not line:
                    return b"".join(pieces), False
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(pieces), True
                piece = self.rfile.read(size)
                pieces.append(piece)
                total += len(piece)
                if len(piece) < size or total > BODY_BYTES_MAX:
                    return b"".join(pieces), False
                self.rfile.readline(8)
        length = int(self.headers.get("Content-Length") or 0)
        assert 0 <= length <= BODY_BYTES_MAX, length
        data = self.rfile.read(length) if length else b""
        return data, len(data) == length

    def _dispatch(self, method: str) -> None:
        owner = self.server.owner
        role = self.server.role
        try:
            parts = urlsplit(self.path)
            if not parts.path.startswith(WEBHDFS_PREFIX):
                self._read_body()
                self._send(404, b"Not Found: not a WebHDFS URL", {"Content-Type": "text/plain"})
                return
            try:
                path = unquote(parts.path[len(WEBHDFS_PREFIX) :] or "/", errors="strict")
            except UnicodeDecodeError:
                raise RemoteError("IllegalArgumentException", "path is not valid UTF-8") from None
            if len(path) > 1:
                path = path.rstrip("/") or "/"
            params: dict[str, str] = {}
            for key, value in parse_qsl(parts.query, keep_blank_values=True):
                params[key.lower()] = value
            op = params.get("op", "").upper()
            with owner._lock:
                owner.requests[(role, op)] += 1
            user = params.get("user.name") or DEFAULT_WEB_USER
            if role == "datanode":
                self._datanode(method, op, path, params, user)
                return
            self._read_body()  # a NameNode takes no data; keep the connection in step
            if role == "standby" or owner.standby:
                raise RemoteError(
                    "StandbyException",
                    "Operation category READ is not supported in state standby. "
                    "Visit https://s.apache.org/sbnn-error",
                )
            if op not in _REAL_OPS[method]:
                raise RemoteError(
                    "IllegalArgumentException",
                    f'Invalid value for webhdfs parameter "op": No enum constant '
                    f"org.apache.hadoop.hdfs.web.resources.{_OP_CLASSES[method]}.Op.{op}",
                )
            if op not in OPS[method]:
                raise RemoteError(
                    "UnsupportedOperationException",
                    f"{op} is not implemented by the WebHDFS test server",
                )
            injection = owner._take_injection(role, op, path)
            if injection is not None and injection.action == "error":
                assert injection.exception is not None
                raise RemoteError(injection.exception, injection.message)
            if injection is not None and injection.action in ("drop_before", "drop_partial"):
                raise _Dropped()
            status, body, headers = owner.namenode(method, op, path, params, user)
            if injection is not None:
                raise _Dropped()  # drop_after: it happened, the answer is lost
            self._send(status, body, headers)
        except _Dropped:
            self.close_connection = True
        except RemoteError as error:
            self._send(error.status, error.body(), {"Content-Type": "application/json"})
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as exc:
            owner.internal_errors.append(f"{type(exc).__name__}: {exc} ({method} {self.path})")
            error = RemoteError("RuntimeException", f"test server bug: {type(exc).__name__}: {exc}")
            self._send(error.status, error.body(), {"Content-Type": "application/json"})

    def _datanode(self, method: str, op: str, path: str, params: dict[str, str], user: str) -> None:
        owner = self.server.owner
        known = {("PUT", "CREATE"), ("POST", "APPEND"), ("GET", "OPEN")}
        if (method, op) not in known:
            self._read_body()
            raise RemoteError("IllegalArgumentException", f"Invalid operation {op}")
        injection = owner._take_injection("datanode", op, path)
        if op == "OPEN":
            if injection is not None and injection.action == "error":
                assert injection.exception is not None
                raise RemoteError(injection.exception, injection.message)
            status, body, headers = owner.datanode_open(path, params, user)
            if injection is not None and injection.action == "drop_partial":
                # The whole Content-Length announced, half the bytes sent, then hang up.
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                raise _Dropped()
            if injection is not None:
                raise _Dropped()
            self._send(status, body, headers)
            return
        try:
            if injection is not None and injection.action == "error":
                assert injection.exception is not None
                raise RemoteError(injection.exception, injection.message)
            begin = owner.datanode_create_begin if op == "CREATE" else owner.datanode_append_begin
            inode, client = begin(path, params, user)
        except RemoteError:
            self._read_body()
            raise
        pause = owner.pause_for(path)
        if pause is not None:
            pause.lease_taken.set()
            pause.release.wait(PAUSE_S_MAX)
        data, whole = self._read_body()
        action = injection.action if injection is not None else None
        if action == "drop_before":
            data = b""
        elif action == "drop_partial":
            data = data[: len(data) // 2]
        # Like the datanode's HdfsWriter, a stream the client abandoned is closed, not
        # discarded: what arrived is kept and the lease is released.
        owner.datanode_finish(inode, client, path, data)
        if not whole or action is not None:
            raise _Dropped()
        if op == "CREATE":
            location = f"hdfs://{owner.namenode_address}{quote(path)}"
            self._send(201, b"", {"Location": location})
        else:
            self._send(200)


# -- one server per test process -------------------------------------------------------------------

_shared_lock = threading.Lock()
_shared: WebHdfsTestServer | None = None


def shared_server() -> WebHdfsTestServer:
    """The process's test server, started on first use (stopped at exit or by the fixture)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WebHdfsTestServer().start()
        return _shared


def stop_shared_server() -> None:
    global _shared
    with _shared_lock:
        server, _shared = _shared, None
    if server is not None:
        server.stop()


atexit.register(stop_shared_server)
