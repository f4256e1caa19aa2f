"""The WebHDFS test server's own protocol, for the parts the binding relies on.

Plain HTTP with ``requests`` (redirects not followed), checked against the WebHDFS REST
API documentation and the NameNode's rules, so that the binding's tests mean something:
if the server answered differently from HDFS, these fail before the binding's do.
"""

from __future__ import annotations

import threading
from urllib.parse import quote, urlsplit

import pytest
import requests

from tests.support.webhdfs_server import SUPERUSER, WebHdfsTestServer

USER = "slts"


class Http:
    """WebHDFS requests to one server, as ``USER`` unless told otherwise."""

    def __init__(self, server: WebHdfsTestServer) -> None:
        self.server = server

    def nn(self, method: str, path: str, op: str, user: str = USER, **params: object) -> requests.Response:
        url = f"http://{self.server.namenode_address}/webhdfs/v1{quote(path)}"
        query = {"op": op, "user.name": user, **{k: str(v) for k, v in params.items()}}
        return requests.request(method, url, params=query, allow_redirects=False, timeout=30)

    def follow(self, first: requests.Response, method: str, data: bytes | None = None) -> requests.Response:
        assert first.status_code == 307, first.text
        return requests.request(method, first.headers["Location"], data=data, timeout=30)

    def create(self, path: str, data: bytes, user: str = USER, **params: object) -> requests.Response:
        return self.follow(self.nn("PUT", path, "CREATE", user, **params), "PUT", data)

    def append(self, path: str, data: bytes, user: str = USER) -> requests.Response:
        return self.follow(self.nn("POST", path, "APPEND", user), "POST", data)

    def open(self, path: str, **params: object) -> requests.Response:
        first = self.nn("GET", path, "OPEN", **params)
        return first if first.status_code != 307 else self.follow(first, "GET")

    def status(self, path: str) -> dict:
        response = self.nn("GET", path, "GETFILESTATUS")
        assert response.status_code == 200, response.text
        return response.json()["FileStatus"]


def remote(response: requests.Response, status: int, exception: str) -> str:
    """Assert a RemoteException body of the spec's shape; returns its message."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()["RemoteException"]
    assert body["exception"] == exception
    assert body["javaClassName"].rsplit(".", 1)[-1].rsplit("$", 1)[-1] == exception
    assert isinstance(body["message"], str) and body["message"]
    return body["message"]


@pytest.fixture
def http(server: WebHdfsTestServer) -> Http:
    return Http(server)


@pytest.fixture
def folder(http: Http, root: str) -> str:
    assert http.nn("PUT", root, "MKDIRS").json() == {"boolean": True}
    return root


# -- two-step create, append, open -----------------------------------------------------------------


def test_create_redirects_to_the_datanode_which_takes_the_bytes(http, server, folder):
    path = f"{folder}/file"
    first = http.nn("PUT", path, "CREATE", overwrite="false")
    assert first.status_code == 307
    assert first.content == b""
    location = urlsplit(first.headers["Location"])
    assert location.netloc == server.datanode_address != server.namenode_address
    assert location.path == f"/webhdfs/v1{path}"
    assert http.nn("GET", path, "GETFILESTATUS").status_code == 404  # nothing yet
    second = http.follow(first, "PUT", b"hello")
    assert second.status_code == 201
    assert second.content == b""
    assert second.headers["Location"] == f"hdfs://{server.namenode_address}{path}"
    status = http.status(path)
    assert (status["type"], status["length"], status["owner"], status["permission"]) == (
        "FILE",
        5,
        USER,
        "644",
    )


def test_append_and_open_are_redirected_too(http, server, folder):
    path = f"{folder}/file"
    http.create(path, b"hello")
    first = http.nn("POST", path, "APPEND")
    assert first.status_code == 307
    assert urlsplit(first.headers["Location"]).netloc == server.datanode_address
    second = http.follow(first, "POST", b" world")
    assert (second.status_code, second.content) == (200, b"")
    first = http.nn("GET", path, "OPEN", offset=3, length=5)
    assert first.status_code == 307
    assert urlsplit(first.headers["Location"]).netloc == server.datanode_address
    data = http.follow(first, "GET")
    assert (data.status_code, data.content) == (200, b"lo wo")
    assert data.headers["Content-Type"] == "application/octet-stream"
    assert http.open(path, offset=6).content == b"world"
    assert http.open(path, offset=6, length=10**9).content == b"world"


def test_open_refuses_offsets_at_or_past_the_end_of_a_non_empty_file(http, folder):
    path = f"{folder}/file"
    http.create(path, b"abc")
    for offset in (3, 4):
        message = remote(http.nn("GET", path, "OPEN", offset=offset), 403, "IOException")
        assert f"Offset={offset} out of the range [0, 3)" in message
    http.create(f"{folder}/empty", b"")
    assert http.open(f"{folder}/empty").content == b""
    remote(http.open(f"{folder}/empty", offset=1), 403, "EOFException")  # the datanode's seek


def test_create_of_an_existing_file_is_refused_at_the_datanode(http, folder):
    path = f"{folder}/file"
    http.create(path, b"one")
    first = http.nn("PUT", path, "CREATE", overwrite="false")
    assert first.status_code == 307  # the NameNode only picks a datanode
    message = remote(http.follow(first, "PUT", b"two"), 403, "FileAlreadyExistsException")
    assert path in message
    assert http.open(path).content == b"one"


def test_create_with_sync_block_is_recorded(http, server, folder):
    http.create(f"{folder}/synced", b"x", createflag="CREATE,SYNC_BLOCK")
    http.create(f"{folder}/plain", b"x")
    assert server.raw_inode(f"{folder}/synced").sync_block
    assert not server.raw_inode(f"{folder}/plain").sync_block
    bad = http.nn("PUT", f"{folder}/bad", "CREATE", createflag="CREATE,BOGUS")
    remote(bad, 400, "IllegalArgumentException")


# -- status, listing, folders ----------------------------------------------------------------------


def test_file_status_and_listing_have_the_shapes_of_the_spec(http, folder):
    http.create(f"{folder}/b", b"12345")
    http.nn("PUT", f"{folder}/a", "MKDIRS")
    listing = http.nn("GET", folder, "LISTSTATUS")
    assert listing.status_code == 200
    statuses = listing.json()["FileStatuses"]["FileStatus"]
    assert [(s["pathSuffix"], s["type"], s["length"]) for s in statuses] == [
        ("a", "DIRECTORY", 0),
        ("b", "FILE", 5),
    ]
    keys = {
        "accessTime",
        "blockSize",
        "childrenNum",
        "fileId",
        "group",
        "length",
        "modificationTime",
        "owner",
        "pathSuffix",
        "permission",
        "replication",
        "type",
    }
    assert all(keys <= set(status) for status in statuses)
    assert statuses[0]["permission"] == "755" and statuses[0]["replication"] == 0
    assert statuses[1]["permission"] == "644" and statuses[1]["blockSize"] > 0
    single = http.nn("GET", f"{folder}/b", "LISTSTATUS").json()["FileStatuses"]["FileStatus"]
    assert [(s["pathSuffix"], s["length"]) for s in single] == [("", 5)]  # "List a File"
    assert http.status(folder)["childrenNum"] == 2
    message = remote(http.nn("GET", f"{folder}/missing", "GETFILESTATUS"), 404, "FileNotFoundException")
    assert f"{folder}/missing" in message


def test_mkdirs_makes_parents_and_delete_needs_recursive_for_a_full_folder(http, folder):
    assert http.nn("PUT", f"{folder}/x/y/z", "MKDIRS").json() == {"boolean": True}
    assert http.nn("PUT", f"{folder}/x/y/z", "MKDIRS").json() == {"boolean": True}  # exists: fine
    http.create(f"{folder}/x/y/z/f", b"1")
    remote(http.nn("PUT", f"{folder}/x/y/z/f", "MKDIRS"), 403, "FileAlreadyExistsException")
    remote(http.nn("PUT", f"{folder}/x/y/z/f/g", "MKDIRS"), 403, "ParentNotDirectoryException")
    remote(http.nn("DELETE", f"{folder}/x", "DELETE"), 403, "PathIsNotEmptyDirectoryException")
    assert http.nn("DELETE", f"{folder}/x", "DELETE", recursive="false").status_code == 403
    assert http.nn("DELETE", f"{folder}/missing", "DELETE").json() == {"boolean": False}
    assert http.nn("DELETE", f"{folder}/x", "DELETE", recursive="true").json() == {"boolean": True}
    assert http.nn("GET", f"{folder}/x", "GETFILESTATUS").status_code == 404


@pytest.mark.parametrize("bad", ["/a/%2E%2E/b", "/a/%2E/b", "/a/b:c", "/a//b"])
def test_invalid_paths_are_refused(http, folder, bad):
    # Dots percent-encoded: urllib3 would resolve literal "." and ".." segments itself.
    url = f"http://{http.server.namenode_address}/webhdfs/v1{folder}{bad}?op=MKDIRS&user.name={USER}"
    remote(requests.put(url, timeout=30), 400, "InvalidPathException")


def test_path_limits_of_the_namenode(http, folder):
    message = remote(http.nn("PUT", f"{folder}/{'x' * 256}", "MKDIRS"), 403, "PathComponentTooLongException")
    assert "limit=255 length=256" in message
    assert http.nn("PUT", f"{folder}/{'x' * 255}", "MKDIRS").json() == {"boolean": True}
    deep = folder + "/d" * 1000
    assert "1000 levels" in remote(http.nn("PUT", deep, "MKDIRS"), 403, "IOException")


def test_unknown_and_unimplemented_operations(http, folder):
    message = remote(http.nn("GET", folder, "FROBNICATE"), 400, "IllegalArgumentException")
    assert "GetOpParam.Op.FROBNICATE" in message
    remote(http.nn("GET", folder, "CREATE"), 400, "IllegalArgumentException")  # a PUT op
    remote(http.nn("GET", folder, "GETCONTENTSUMMARY"), 400, "UnsupportedOperationException")
    assert requests.get(f"http://{http.server.namenode_address}/other", timeout=30).status_code == 404


# -- rename ----------------------------------------------------------------------------------------


def test_rename_answers_false_instead_of_overwriting(http, folder):
    http.create(f"{folder}/a", b"A")
    http.create(f"{folder}/b", b"B")
    assert http.nn("PUT", f"{folder}/a", "RENAME", destination=f"{folder}/b").json() == {"boolean": False}
    assert http.open(f"{folder}/a").content == b"A"
    assert http.open(f"{folder}/b").content == b"B"
    missing_parent = http.nn("PUT", f"{folder}/a", "RENAME", destination=f"{folder}/no/such")
    assert missing_parent.json() == {"boolean": False}
    missing_source = http.nn("PUT", f"{folder}/zz", "RENAME", destination=f"{folder}/c")
    assert missing_source.json() == {"boolean": False}
    assert http.nn("PUT", f"{folder}/a", "RENAME", destination=f"{folder}/c").json() == {"boolean": True}
    assert http.open(f"{folder}/c").content == b"A"
    assert http.nn("GET", f"{folder}/a", "GETFILESTATUS").status_code == 404


def test_rename_onto_a_folder_moves_the_source_inside(http, folder):
    http.create(f"{folder}/a", b"A")
    http.nn("PUT", f"{folder}/d", "MKDIRS")
    assert http.nn("PUT", f"{folder}/a", "RENAME", destination=f"{folder}/d").json() == {"boolean": True}
    assert http.open(f"{folder}/d/a").content == b"A"


def test_pyhdfs_reports_a_refused_rename_as_false(server, folder, http):
    pyhdfs = pytest.importorskip("pyhdfs")
    client = pyhdfs.HdfsClient(hosts=server.namenode_address, user_name=USER, max_tries=1)
    http.create(f"{folder}/a", b"A")
    http.create(f"{folder}/b", b"B")
    assert client.rename(f"{folder}/a", destination=f"{folder}/b") is False
    assert client.rename(f"{folder}/a", destination=f"{folder}/c") is True


# -- concat ----------------------------------------------------------------------------------------


def test_concat_moves_the_sources_into_the_target_and_removes_them(http, folder):
    for name, data in (("t", b"T"), ("s1", b"one"), ("s2", b"two")):
        http.create(f"{folder}/{name}", data)
    done = http.nn("POST", f"{folder}/t", "CONCAT", sources=f"{folder}/s1,{folder}/s2")
    assert (done.status_code, done.content) == (200, b"")
    assert http.open(f"{folder}/t").content == b"Tonetwo"
    for source in ("s1", "s2"):  # consumed: this is why the binding cannot use it
        assert http.nn("GET", f"{folder}/{source}", "GETFILESTATUS").status_code == 404


@pytest.mark.parametrize(
    ("sources", "status", "exception"),
    [
        ("{f}/other/s", 400, "HadoopIllegalArgumentException"),  # not in the target's folder
        ("{f}/empty", 400, "HadoopIllegalArgumentException"),  # empty source
        ("{f}/t", 400, "HadoopIllegalArgumentException"),  # the target itself
        ("{f}/s,{f}/s", 400, "HadoopIllegalArgumentException"),  # twice
        ("{f}/missing", 404, "FileNotFoundException"),
        ("", 400, "IllegalArgumentException"),
    ],
)
def test_concat_rules(http, folder, sources, status, exception):
    http.create(f"{folder}/t", b"T")
    http.create(f"{folder}/s", b"S")
    http.create(f"{folder}/empty", b"")
    http.create(f"{folder}/other/s", b"O")
    remote(
        http.nn("POST", f"{folder}/t", "CONCAT", sources=sources.format(f=folder)),
        status,
        exception,
    )
    assert http.open(f"{folder}/t").content == b"T"
    assert http.open(f"{folder}/s").content == b"S"


# -- truncate --------------------------------------------------------------------------------------


@pytest.fixture
def small_blocks() -> WebHdfsTestServer:
    with WebHdfsTestServer(block_size=16, truncate_recovery_ops=2) as private:
        yield private
        assert private.internal_errors == []


def test_truncate_on_a_block_boundary_is_done_at_once(small_blocks):
    http = Http(small_blocks)
    http.create("/f", bytes(40))
    assert http.nn("POST", "/f", "TRUNCATE", newlength=32).json() == {"boolean": True}
    assert http.nn("POST", "/f", "TRUNCATE", newlength=32).json() == {"boolean": True}  # same length
    assert http.status("/f")["length"] == 32
    assert http.append("/f", b"x").status_code == 200
    assert http.nn("POST", "/f", "TRUNCATE", newlength=0).json() == {"boolean": True}


def test_truncate_inside_a_block_starts_a_recovery_that_refuses_appends(small_blocks):
    http = Http(small_blocks)
    http.create("/f", b"0123456789")
    assert http.nn("POST", "/f", "TRUNCATE", newlength=4).json() == {"boolean": False}
    assert http.status("/f")["length"] == 4  # the new length shows at once
    assert http.open("/f").content == b"0123"
    message = remote(http.append("/f", b"x"), 403, "RecoveryInProgressException")
    assert "because lease recovery is in progress. Try again later." in message
    # The same truncate again is not an error while the recovery runs (the second and last
    # refused request of this server's recovery).
    assert http.nn("POST", "/f", "TRUNCATE", newlength=4).json() == {"boolean": False}
    assert http.append("/f", b"x").status_code == 200
    assert http.open("/f").content == b"0123x"


@pytest.mark.parametrize(
    ("new_length", "status", "exception", "text"),
    [
        (11, 400, "HadoopIllegalArgumentException", "Cannot truncate to a larger file size"),
        (-1, 400, "HadoopIllegalArgumentException", "negative file size"),
        ("x", 400, "IllegalArgumentException", "newlength"),
    ],
)
def test_truncate_refuses_bad_lengths(http, folder, new_length, status, exception, text):
    http.create(f"{folder}/f", b"0123456789")
    message = remote(http.nn("POST", f"{folder}/f", "TRUNCATE", newlength=new_length), status, exception)
    assert text in message
    assert http.open(f"{folder}/f").content == b"0123456789"


# -- permissions -----------------------------------------------------------------------------------


def test_permissions_are_checked_except_for_the_superuser(http, folder):
    path = f"{folder}/f"
    http.create(path, b"data")
    assert http.nn("PUT", path, "SETPERMISSION", permission="444").status_code == 200
    assert http.status(path)["permission"] == "444"
    message = remote(http.append(path, b"x"), 403, "AccessControlException")
    assert f'Permission denied: user={USER}, access=WRITE, inode="{path}"' in message
    remote(http.nn("POST", path, "TRUNCATE", newlength=0), 403, "AccessControlException")
    assert http.append(path, b"!", user=SUPERUSER).status_code == 200  # the superuser may
    assert http.open(path).content == b"data!"
    remote(
        http.nn("PUT", path, "SETPERMISSION", user="mallory", permission="777"),
        403,
        "AccessControlException",
    )
    assert http.nn("DELETE", path, "DELETE").json() == {"boolean": True}  # the folder's right


def test_a_folder_of_another_user_refuses_new_files(http, server, folder):
    server.raw_mkdirs(f"{folder}/theirs", owner="other", permission=0o755)
    remote(http.create(f"{folder}/theirs/f", b"x"), 403, "AccessControlException")
    remote(http.nn("PUT", f"{folder}/theirs/d", "MKDIRS"), 403, "AccessControlException")
    assert http.create(f"{folder}/theirs/f", b"x", user="other").status_code == 201


# -- the single-writer lease -----------------------------------------------------------------------


def test_one_writer_at_a_time_per_file(http, server, folder):
    path = f"{folder}/f"
    http.create(path, b"head")
    outcome: list[int] = []
    with server.pause_writes(path) as pause:
        writer = threading.Thread(target=lambda: outcome.append(http.append(path, b"-first").status_code))
        writer.start()
        assert pause.lease_taken.wait(30), "the first append never took the lease"
        message = remote(http.append(path, b"-second"), 403, "AlreadyBeingCreatedException")
        assert "because this file lease is currently owned by DFSClient_" in message
        remote(http.nn("POST", path, "TRUNCATE", newlength=0), 403, "AlreadyBeingCreatedException")
        remote(http.create(path, b"x", overwrite="true"), 403, "AlreadyBeingCreatedException")
        pause.release.set()
        writer.join(30)
    assert outcome == [200]
    assert http.open(path).content == b"head-first"
    assert http.append(path, b"-third").status_code == 200  # the lease was released


# -- modes and injected faults ---------------------------------------------------------------------


def test_safe_mode_refuses_changes_but_not_reads(http, server, folder):
    http.create(f"{folder}/f", b"x")
    server.safe_mode = True
    assert "Name node is in safe mode" in remote(
        http.nn("PUT", f"{folder}/d", "MKDIRS"), 403, "SafeModeException"
    )
    remote(http.create(f"{folder}/g", b"y"), 403, "SafeModeException")
    remote(http.append(f"{folder}/f", b"y"), 403, "SafeModeException")
    assert http.open(f"{folder}/f").content == b"x"


def test_a_standby_namenode_answers_standby_exception(server, http):
    address = server.add_standby_namenode()
    response = requests.get(f"http://{address}/webhdfs/v1/?op=GETFILESTATUS&user.name={USER}", timeout=30)
    assert "state standby" in remote(response, 403, "StandbyException")


def test_a_dropped_answer_after_the_change(http, server, folder):
    http.create(f"{folder}/a", b"A")
    injection = server.inject("RENAME", action="drop_after")
    with pytest.raises(requests.ConnectionError):
        http.nn("PUT", f"{folder}/a", "RENAME", destination=f"{folder}/b")
    assert injection.hits == 1
    assert http.open(f"{folder}/b").content == b"A"  # it happened; only the answer was lost


def test_injected_remote_exceptions_have_their_status(http, server, folder):
    server.inject("GETFILESTATUS", "NSQuotaExceededException", "quota", count=2)
    remote(http.nn("GET", folder, "GETFILESTATUS"), 403, "NSQuotaExceededException")
    remote(http.nn("GET", folder, "GETFILESTATUS"), 403, "NSQuotaExceededException")
    assert http.nn("GET", folder, "GETFILESTATUS").status_code == 200
