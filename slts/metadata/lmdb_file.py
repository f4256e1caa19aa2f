"""A check of an LMDB data file against LMDB's own meta pages, before it is mapped.

LMDB maps ``data.mdb`` into memory and trusts it: a file cut short (a failed copy, a
full disk, a truncation by hand) makes the first access past its end kill the process
with SIGBUS, which no Python code can catch. So before an existing file is mapped, its
two meta pages (pages 0 and 1; LMDB writes both when it creates the file and the newer
one at each commit) are read and checked:

* each starts, after the 16-byte page header, with the magic ``0xBEEFC0DE`` and data
  format version 1;
* the page size LMDB recorded (kept in the free-list database's ``md_pad`` field) is a
  power of two the file can hold two pages of;
* the file holds every page up to the last one each meta page says is in use
  (``mm_last_pg``): ``(last_pg + 1) * page_size <= file size``.

A file that fails raises ``MetadataCorrupted`` naming it and the way back
(``slts restore`` rebuilds the metadata from tier-2). Layout (native byte order, 64-bit
build): page header 16 bytes; meta: magic u32 @16, version u32 @20, address @24,
map size @32, two ``MDB_db`` of 48 bytes @40 (the first one's ``md_pad`` is the page
size), ``mm_last_pg`` u64 @136, ``mm_txnid`` u64 @144.

Damage inside the later pages (a flipped byte in a branch page's child number, a node
size past its page) passes that check and still kills the process once LMDB reads the
page. So ``vouch`` also *walks* the file, when it may have changed outside LMDB, in a
child process that nothing it reads can take down with it (``lmdb_walk``): it reads every
record of every database through LMDB and walks the free-page list with bounded reads.
A child that reports damage, or dies of SIGBUS or SIGSEGV, makes the open raise
``MetadataCorrupted``; the process that asked is never mapped onto the damage.

The walk costs time in proportion to the file (docs/metadata.md has the figure), and a
restart must not (DESIGN.md §11), so by default (``metadata_check = "changed"``) it runs
only when the file may have changed other than by LMDB since it was last known good.
That state is kept in ``FOLDER/slts-check.json`` (``record_good_state``): the file's
device, inode, size, modification time and newest transaction id, the boot it was seen
in (``/proc/sys/kernel/random/boot_id``) and whether it had just been synced. An open
trusts the file without a walk when it is the same file (device and inode) and

* in the same boot, it is unchanged, or only LMDB transactions were added (its newest
  transaction id grew: writers commit through LMDB, whatever process they run in, and
  a process crash loses nothing LMDB wrote);
* in another boot, it is unchanged since a state recorded right after a sync (a durable
  writer's open or close), so an OS crash or power loss cannot have torn it since.

Anything else (a copy, a file replaced in place, bytes changed without a new
transaction, a first open after an OS crash, no or an unreadable marker) walks. A
writer's clean close records the state it leaves, synced, so a clean restart walks
nothing. ``"always"`` walks at every open; ``"never"`` only reads the meta pages (and a
process opened that way does not vouch for the file: it leaves the marker alone).
What no marker can see is damage that changes neither size, time nor transaction id
(bit rot under a file nobody rewrote): ``slts verify`` walks the file whatever changed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import struct
import subprocess
import sys
from dataclasses import asdict, dataclass

from slts.errors import InvalidArgument, MetadataCorrupted, MetadataError

DATA_FILE = "data.mdb"
#: The last state of the data file known good (module doc), beside it in the folder.
MARKER_FILE = "slts-check.json"
#: When an open walks the data file: ``changed`` (the default), ``always``, ``never``.
CHECK_MODES = ("changed", "always", "never")
_MARKER_VERSION = 1
_WALKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lmdb_walk.py")
#: Signals a walk dies of when the file sends LMDB astray (damage); others (SIGKILL of an
#: out-of-memory killer, SIGTERM) stopped the check without telling anything.
_FAULTS = frozenset({signal.SIGBUS, signal.SIGSEGV, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_log = logging.getLogger("slts.metadata")
_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_META = struct.Struct("=II")  # magic, version @16
_PAGE_SIZE = struct.Struct("=I")  # @40
_LAST_PAGE = struct.Struct("=QQ")  # last page, txnid @136
_META_BYTES = 152
_PAGE_BYTES_MIN, _PAGE_BYTES_MAX = 512, 1 << 16


@dataclass(frozen=True, slots=True)
class DataFileState:
    """What identifies one state of a data file: the file (device, inode), its size and
    modification time, and the newest transaction id of its two meta pages."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    txnid: int


def check_data_file(folder: str) -> DataFileState | None:
    """Raise ``MetadataCorrupted`` if ``folder``'s ``data.mdb`` exists and is not a whole
    LMDB file as its meta pages tell (see module doc); else its state. No file yet:
    nothing to check (None). Reads two pages whatever the file's size."""
    path = os.path.join(folder, DATA_FILE)
    try:
        with open(path, "rb") as file:
            status = os.fstat(file.fileno())
            size = status.st_size
            head = file.read(_META_BYTES)
            page_bytes = _PAGE_SIZE.unpack_from(head, 40)[0] if len(head) == _META_BYTES else 0
            if _PAGE_BYTES_MIN <= page_bytes <= _PAGE_BYTES_MAX and page_bytes & (page_bytes - 1) == 0:
                file.seek(page_bytes)
                second = file.read(_META_BYTES)
            else:
                second = b""
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MetadataCorrupted(f"cannot read the metadata file {path!r}: {exc}", path=path) from exc
    problem = _problem(head, second, page_bytes, size)
    if problem:
        raise _damaged(path, problem)
    txnid = max(_LAST_PAGE.unpack_from(page, 136)[1] for page in (head, second))
    return DataFileState(status.st_dev, status.st_ino, size, status.st_mtime_ns, txnid)


def _damaged(path: str, problem: str) -> MetadataCorrupted:
    return MetadataCorrupted(
        f"the metadata file {path!r} is damaged ({problem}); it cannot be opened safely. "
        "Rebuild the metadata from tier-2 with `slts restore --to NEW_FOLDER`",
        path=path,
    )


#: What ``vouch`` found: no file yet, a trusted marker, a clean walk, or nothing checked.
NEW, TRUSTED, WALKED, UNCHECKED = "new", "trusted", "walked", "unchecked"


def vouch(folder: str, mode: str = "changed") -> str:
    """Make sure that mapping ``folder``'s data file cannot kill this process, as far as
    ``mode`` asks (module doc): check its meta pages, then walk it in a child process
    unless the marker shows it unchanged but by LMDB (``changed``), or always
    (``always``), or never (``never``).

    Returns ``NEW`` (no file yet: LMDB creates it), ``TRUSTED`` (the marker vouches for
    it), ``WALKED`` (a clean walk) or ``UNCHECKED`` (``never``); all but the last let the
    opener record the file's state (``record_good_state``). Raises ``MetadataCorrupted`` (damage: the
    message says what, and how to restore), ``MetadataError`` (the check could not run),
    ``InvalidArgument`` (an unknown mode). Changes nothing in the folder."""
    if mode not in CHECK_MODES:
        raise InvalidArgument(f"metadata_check {mode!r} is not one of {', '.join(CHECK_MODES)}")
    state = check_data_file(folder)
    if state is None:
        return NEW
    if mode == "never":
        return UNCHECKED
    if mode == "changed" and _trusted(_read_marker(folder), state, _boot_id()):
        return TRUSTED
    walk_in_child(folder)
    return WALKED


def walk_in_child(folder: str) -> dict[str, int]:
    """Walk ``folder``'s data file in a child process (``lmdb_walk``); its outcome
    (``txnid`` walked, ``records``, ``pages``). Raises ``MetadataCorrupted`` if the child
    found damage or died of a fault signal, ``MetadataError`` if it could not check."""
    path = os.path.join(folder, DATA_FILE)
    if not sys.executable:
        raise MetadataError(
            f"cannot check the metadata file {path!r}: no Python interpreter to run the check "
            "in (sys.executable is empty); set metadata_check to 'never' to open it unchecked",
            path=path,
        )
    try:  # -P: the walker's folder does not go on sys.path (its neighbours are no modules to it)
        child = subprocess.run(
            [sys.executable, "-P", _WALKER, folder], capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise MetadataError(
            f"cannot start the check of the metadata file {path!r}: {exc}", path=path
        ) from exc
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        if -child.returncode in _FAULTS:
            raise _damaged(path, f"reading it killed the checking process with {name}")
        raise MetadataError(f"the check of the metadata file {path!r} was stopped by {name}", path=path)
    try:
        outcome = json.loads(child.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        outcome = {}
    if child.returncode == 0 and isinstance(outcome.get("txnid"), int):
        return {key: int(outcome[key]) for key in ("txnid", "records", "pages")}
    if child.returncode == 1 and outcome.get("problem"):
        raise _damaged(path, str(outcome["problem"]))
    detail = outcome.get("error") or " ".join(child.stderr.split()[-40:]) or f"exit {child.returncode}"
    raise MetadataError(f"the check of the metadata file {path!r} could not run: {detail}", path=path)


def record_good_state(folder: str, *, synced: bool) -> None:
    """Record the data file's current state as known good (module doc), ``synced`` if it
    was just synced. Only for a file this process vouched for and opened. Best effort: a
    folder it cannot write to (a read-only look) keeps the old marker, and the next open
    decides from that."""
    try:
        state = check_data_file(folder)
    except MetadataCorrupted:
        return
    if state is None:
        return
    old = _read_marker(folder)
    new = {"v": _MARKER_VERSION, **asdict(state), "boot": _boot_id(), "synced": synced}
    if old == new or (old is not None and old.get("synced") and _same_state(old, state)):
        return  # nothing to add (a synced record of this very state is worth more)
    path = os.path.join(folder, MARKER_FILE)
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w") as file:
            json.dump(new, file)
        os.replace(temporary, path)
    except OSError as exc:
        _log.debug("could not record the metadata file's state in %s: %s", path, exc)
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def _trusted(marker: dict[str, object] | None, state: DataFileState, boot: str | None) -> bool:
    """Whether ``state`` follows from the known good ``marker`` by LMDB alone (module doc)."""
    if marker is None or marker.get("v") != _MARKER_VERSION:
        return False
    if (marker.get("device"), marker.get("inode")) != (state.device, state.inode):
        return False
    if boot is not None and marker.get("boot") == boot:
        txnid = marker.get("txnid")
        return _same_state(marker, state) or (isinstance(txnid, int) and state.txnid > txnid)
    return bool(marker.get("synced")) and _same_state(marker, state)


def _same_state(marker: dict[str, object], state: DataFileState) -> bool:
    return all(marker.get(key) == value for key, value in asdict(state).items())


def _read_marker(folder: str) -> dict[str, object] | None:
    try:
        with open(os.path.join(folder, MARKER_FILE)) as file:
            marker = json.load(file)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _boot_id() -> str | None:
    """This boot's id (Linux), or None where there is none: then only a synced record of
    an unchanged file is trusted."""
    try:
        with open(_BOOT_ID) as file:
            return file.read().strip() or None
    except OSError:
        return None


def _problem(first: bytes, second: bytes, page_bytes: int, size: int) -> str | None:
    if len(first) < _META_BYTES:
        return f"{size} bytes, shorter than LMDB's meta page"
    if not (_PAGE_BYTES_MIN <= page_bytes <= _PAGE_BYTES_MAX and page_bytes & (page_bytes - 1) == 0):
        return f"page size {page_bytes} is not a valid LMDB page size"
    if size < 2 * page_bytes or len(second) < _META_BYTES:
        return f"{size} bytes, shorter than LMDB's two meta pages"
    for number, page in enumerate((first, second)):
        magic, version = _META.unpack_from(page, 16)
        if magic != _MAGIC or version != _DATA_VERSION:
            return f"meta page {number} has magic {magic:#x} version {version}, not an LMDB meta page"
        last_page, _ = _LAST_PAGE.unpack_from(page, 136)
        if (last_page + 1) * page_bytes > size:
            return f"meta page {number} uses pages up to {last_page}, but the file holds {size // page_bytes}"
    return None
