"""What every ``slts`` subcommand module shares: the exit codes and the error each one
answers, the store the global flags name, the configuration they resolve, JSON or text
output, and the argument types.

``slts.tools.cli`` (the parser and the core subcommands) and the modules that register
subcommands of their own (``remote_cli``, ``offload_cli``, ``config_cli``,
``metrics_cli``) import this module; it imports none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote, urlparse

from slts.errors import (
    ChunkNotFound,
    ChunkStorageError,
    EntryOutOfRange,
    Fenced,
    IllegalStateTransition,
    InvalidArgument,
    InvalidConfig,
    InvalidOffloadObject,
    KeyUnavailable,
    MetadataCorrupted,
    OffloadNotFound,
    RemoteOffsetOutOfRange,
    RemoteSegmentNotFound,
    SegmentError,
    SegmentExists,
    SegmentNotFound,
    SltsError,
    StoreNotFound,
)

DEFAULT_STORE = "slts-data"
IO_BYTES = 8 << 20

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_EXISTS = 0, 1, 2, 3, 4
EXIT_INVALID, EXIT_FENCED, EXIT_CHUNK_STORAGE, EXIT_STATE = 5, 6, 7, 8
EXIT_FILE, EXIT_CORRUPT = 9, 10

_EXIT_BY_ERROR: tuple[tuple[type[SltsError], int], ...] = (
    (SegmentNotFound, EXIT_NOT_FOUND),
    (RemoteSegmentNotFound, EXIT_NOT_FOUND),
    (OffloadNotFound, EXIT_NOT_FOUND),
    (EntryOutOfRange, EXIT_INVALID),
    (IllegalStateTransition, EXIT_STATE),
    (RemoteOffsetOutOfRange, EXIT_INVALID),
    (ChunkNotFound, EXIT_NOT_FOUND),
    (StoreNotFound, EXIT_NOT_FOUND),
    (KeyUnavailable, EXIT_NOT_FOUND),
    (MetadataCorrupted, EXIT_CORRUPT),
    (SegmentExists, EXIT_EXISTS),
    (InvalidArgument, EXIT_INVALID),
    (Fenced, EXIT_FENCED),
    (InvalidOffloadObject, EXIT_CHUNK_STORAGE),
    (ChunkStorageError, EXIT_CHUNK_STORAGE),
    (SegmentError, EXIT_STATE),
)


def exit_code(error: SltsError) -> int:
    """The documented exit code for ``error``."""
    for kind, code in _EXIT_BY_ERROR:
        if isinstance(error, kind):
            return code
    return EXIT_ERROR


def store_locations(store: str, metadata: str | None) -> tuple[str, str]:
    """(chunk storage URL, metadata folder) for ``--store``/``--metadata``."""
    if "://" in store:
        if not metadata:
            raise InvalidArgument(f"--metadata FOLDER is required with a storage URL ({store})")
        return store, metadata
    root = os.path.abspath(store)
    return f"file://{os.path.join(root, 'chunks')}", metadata or os.path.join(root, "metadata")


def resolve_config(args: argparse.Namespace) -> Any:
    """The configuration the flags, ``$SLTS_*`` and the config file give (``ResolvedConfig``;
    docs/config.md): ``--config``, else ``$SLTS_CONFIG``, else ``slts.toml`` in the store's
    folder (with a storage URL: the metadata folder)."""
    from slts.config_sources import find_config_file, resolve_config

    folder = args.metadata if "://" in args.store else args.store
    path = find_config_file(args.config, os.environ, folder)
    return resolve_config(path, os.environ, args.set)


@contextlib.contextmanager
def open_storage(args: argparse.Namespace, *, read_only: bool = False) -> Iterator[Any]:
    """The container instance the global flags name, closed afterwards. Read-only
    commands observe without taking the container over, so they fence nobody."""
    import slts
    from slts.config import StorageConfig
    from slts.storage.factory import check_key_ring

    url, metadata = store_locations(args.store, args.metadata)
    config = resolve_config(args)  # a bad setting is refused before anything is opened
    ring = key_ring(args)
    check_key_ring(StorageConfig.from_mapping(config.fields()), ring)
    created = [] if read_only else missing_folders(metadata)
    if read_only:
        require_chunk_storage(url)  # slts.open(read_only=True) checks the metadata folder
    elif file_url_path(url) is not None:
        os.makedirs(metadata, exist_ok=True)
    try:
        storage = slts.open(
            url,
            metadata=metadata,
            container_id=args.container,
            read_only=read_only,
            limiter=config.limiter(),
            key_ring=ring,
            **config.fields(),
        )
    except BaseException:
        remove_new_metadata(created)  # a refused store leaves no metadata folder behind
        raise
    try:
        yield storage
    finally:
        storage.close()


def missing_folders(path: str) -> list[str]:
    """The folders up to ``path`` that do not exist yet, outermost first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing[::-1]


def remove_new_metadata(created: list[str]) -> None:
    """Undo the metadata folders an open that failed made (``created``, outermost first):
    each is removed, with the files a new metadata folder gets, if it holds nothing else
    (best effort: what cannot be removed stays, and the open's error is what is raised)."""
    from slts.metadata.lmdb_file import DATA_FILE, MARKER_FILE

    new_files = {DATA_FILE, "lock.mdb", MARKER_FILE}  # the LMDB files, the file check's marker
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            names = set(os.listdir(folder))
            if names <= new_files:
                for name in names:
                    os.unlink(os.path.join(folder, name))
                os.rmdir(folder)


def key_ring(args: argparse.Namespace) -> Any:
    """The key ring ``--key-ring`` (or ``$SLTS_KEY_RING``) names, or None."""
    folder = getattr(args, "key_ring", None)
    if not folder:
        return None
    from slts.transforms.keys import FolderKeyRing

    return FolderKeyRing(folder)


def record_seal(args: argparse.Namespace) -> Any:
    """What opens the sealed records of an encrypted store's tier-2 copy: the key ring of
    ``--key-ring`` (None without one: plain records only)."""
    ring = key_ring(args)
    if ring is None:
        return None
    from slts.transforms.sealed import RecordSeal

    return RecordSeal(ring, sealing=False)


def require_chunk_storage(url: str) -> None:
    """Check the chunk storage URL of a look before any metadata is looked for:
    ``InvalidConfig`` for a URL no binding accepts (unknown scheme, no path, no bucket,
    no NameNode, an unknown option...), ``StoreNotFound`` unless a ``file://`` chunk
    storage's folder exists (a look at a mistyped path must not create it: building the
    filesystem binding would). Other bindings are built and closed again: building one
    checks its URL and sends no request."""
    folder = file_url_path(url)
    if folder is not None:
        if not os.path.isdir(folder):
            raise StoreNotFound(f"no chunk storage at {folder!r}")
        return
    if urlparse(url).scheme != "memory":  # memory bindings are shared in the process: leave them be
        from slts.bindings import from_url

        from_url(url).close()


def file_url_path(url: str) -> str | None:
    """The folder of a ``file://`` URL, as the filesystem binding reads it (None for
    another scheme); ``InvalidConfig`` if it names none."""
    parsed = urlparse(url)
    if parsed.scheme != "file":
        return None
    path = unquote(parsed.netloc + parsed.path)
    if not path:
        raise InvalidConfig(f"file URL has no path: {url!r}")
    return path


def emit(args: argparse.Namespace, value: Any, text: str) -> None:
    """Print ``value`` as JSON with ``--json``, else ``text``."""
    if args.json:
        print(json.dumps(value, sort_keys=True))
    elif text:
        print(text)


def non_negative(text: str) -> int:
    """An argument type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive(text: str) -> int:
    """An argument type: an integer > 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value
