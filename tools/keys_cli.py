"""``slts keys ...``: the key ring of an encrypted store (docs/security.md, "Rotation").

``create`` makes a new key ring with one active key; ``rotate`` adds a key and makes it
active (new chunks' data keys are wrapped by it); ``ls`` lists the keys, the active one, and
with a store how many data keys each wraps; ``rewrap`` re-wraps the store's data keys under
the active key (records only; fenced; resumable). Every action takes the ring from
``--key-ring`` (or ``$SLTS_KEY_RING``). No output ever holds key material.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

# ``slts.tools.cli`` imports this module inside ``build_parser``, after it has loaded.
from slts.tools.command_line import EXIT_OK, emit, open_storage, store_locations

from slts.errors import InvalidArgument
from slts.transforms.keys import FolderKeyRing


def _ring_folder(args: argparse.Namespace) -> str:
    if not args.key_ring:
        raise InvalidArgument("name the key ring: --key-ring FOLDER (or $SLTS_KEY_RING)")
    folder: str = args.key_ring
    return folder


def cmd_keys_create(args: argparse.Namespace) -> int:
    """Create a new key ring in --key-ring FOLDER (absent or empty) with one active key."""
    ring = FolderKeyRing.create(_ring_folder(args))
    key_id = ring.add(args.id)
    ring.activate(key_id)
    emit(args, {"ring": ring.folder, "active": key_id}, f"key ring {ring.folder}: key {key_id} (active)")
    return EXIT_OK


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    """Add a key to the ring and make it active: new data keys are wrapped by it; the old
    keys stay to unwrap what they wrapped (slts keys rewrap moves those to the new key)."""
    ring = FolderKeyRing(_ring_folder(args))
    previous = ring.active_id()
    key_id = ring.add(args.id)
    ring.activate(key_id)
    emit(args, {"active": key_id, "previous": previous}, f"key {key_id} is active (was {previous})")
    return EXIT_OK


def cmd_keys_ls(args: argparse.Namespace) -> int:
    """The ring's keys, the active one, and (with a store that exists) how many of the
    store's data keys each wraps: a key that wraps none may leave the ring."""
    ring = FolderKeyRing(_ring_folder(args))
    active = ring.active_id()
    usage: dict[str, int] | None = None
    if _store_exists(args):
        from slts.admin.keys import key_usage

        with open_storage(args, read_only=True) as storage:
            usage = dict(key_usage(storage))
    rows: list[dict[str, Any]] = []
    for key_id in ring.ids():
        row: dict[str, Any] = {"id": key_id, "active": key_id == active}
        if usage is not None:
            row["data_keys"] = usage.get(key_id, 0)
        rows.append(row)
    text = "\n".join(
        f"{row['id']}{' (active)' if row['active'] else ''}"
        + (f"  {row['data_keys']} data keys" if "data_keys" in row else "")
        for row in rows
    )
    emit(args, {"keys": rows}, text)
    return EXIT_OK


def cmd_keys_rewrap(args: argparse.Namespace) -> int:
    """Re-wrap every data key of the store that another key wraps under the active key:
    chunk records change, stored bytes do not. Safe to stop and run again."""
    from slts.admin.keys import rewrap

    ring = FolderKeyRing(_ring_folder(args))
    with open_storage(args) as storage:
        report = rewrap(storage, ring, batch=args.batch)
    value = {
        "active": report.active,
        "chunks_seen": report.chunks_seen,
        "chunks_changed": report.chunks_changed,
        "keys_rewrapped": report.keys_rewrapped,
    }
    emit(
        args,
        value,
        f"{report.keys_rewrapped} data keys of {report.chunks_changed} chunks re-wrapped under"
        f" {report.active} ({report.chunks_seen} encrypted chunks)",
    )
    return EXIT_OK


def _store_exists(args: argparse.Namespace) -> bool:
    _, metadata = store_locations(args.store, args.metadata)
    return os.path.isdir(metadata)


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``keys`` and its actions to the ``slts`` parser's subcommands ``sub``."""
    keys = sub.add_parser("keys", help="the key ring of an encrypted store: create, ls, rotate, rewrap")
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        action = actions.add_parser(name, parents=[common], help=help_text, description=func.__doc__)
        action.set_defaults(func=func)
        return action

    add("create", cmd_keys_create, "a new key ring with one active key").add_argument(
        "--id", default=None, help="the first key's id (default: a random one)"
    )
    add("rotate", cmd_keys_rotate, "a new key, made active").add_argument(
        "--id", default=None, help="the new key's id (default: a random one)"
    )
    add("ls", cmd_keys_ls, "the ring's keys, and the data keys each wraps in the store")
    add("rewrap", cmd_keys_rewrap, "re-wrap the store's data keys under the active key").add_argument(
        "--batch", type=int, default=256, help="chunk records per commit (default 256)"
    )
