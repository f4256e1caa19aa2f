"""``slts offload ...``: Pulsar-style ledger offload (PIP-17/76/211) from the command line.

``put`` offloads a closed ledger kept in a local ledger file (``slts.offload.ledgers``'
framing) as one attempt; ``stream`` offers ledger files' entries to a managed ledger's
streaming offload (resuming its open segment if a crash left one); ``ls`` and
``segments`` list attempts and streaming segments; ``read`` writes a ledger's entries back
as a ledger file; ``delete`` removes an attempt or marks a streamed ledger deleted;
``cleanup`` removes what crashed attempts left. Every action takes ``--json``; errors are
the ``slts`` exit codes (docs/cli.md).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

# ``slts.tools.cli`` imports this module inside ``build_parser``, after it has loaded.
from slts.tools.command_line import EXIT_OK, emit, non_negative, open_storage, positive

from slts.errors import InvalidArgument, InvalidOffloadObject
from slts.offload.ledgers import Entry, FileLedger, LedgerReadHandle, check_entry_range, write_ledger_entries
from slts.offload.offloader import LedgerOffloader
from slts.offload.records import OffloadRecord, OffloadState, StreamSegmentRecord, StreamState
from slts.offload.streaming import OfferResult, OffloadHandle, StreamingOffloader, managed_ledgers
from slts.offload.throttle import FlowPermits


def _uid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a UUID") from None


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _ledger_file(text: str) -> tuple[int, str]:
    ledger, sep, path = text.partition("=")
    if not sep or not path or not ledger.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not LEDGER_ID=FILE")
    return int(ledger), path


@contextlib.contextmanager
def _open_ledger_file(ledger_id: int, path: str) -> Iterator[FileLedger]:
    """The ledger file ``path``, opened before the store (a bad file changes nothing);
    a file that does not parse is bad input, not a damaged offload object."""
    with open(path, "rb"):  # OSError: a missing file exits 3, an unreadable one 9, as for `put`
        pass
    try:
        ledger = FileLedger(ledger_id, path)
    except InvalidOffloadObject as exc:
        raise InvalidArgument(str(exc)) from exc
    with ledger:
        yield ledger


def _attempt_fields(record: OffloadRecord) -> dict[str, Any]:
    return {
        "ledger_id": record.ledger_id,
        "uid": str(record.id),
        "state": OffloadState(record.state).name,
        "epoch": record.epoch,
        "entries": record.entries,
        "bytes": record.length,
        "data_object_bytes": record.data_length,
        "blocks": record.blocks,
        "max_block_bytes": record.max_block_bytes,
        "extra_metadata": dict(record.extra_metadata),
    }


def _segment_fields(record: StreamSegmentRecord) -> dict[str, Any]:
    return {
        "sequence": record.sequence,
        "uid": str(record.id),
        "state": StreamState(record.state).name,
        "begin": [record.begin_ledger, record.begin_entry],
        "end": [record.end_ledger, record.end_entry],
        "bytes": record.data_length,
        "blocks": len(record.blocks),
        "ledgers": {str(k): {"entries": v[0], "bytes": v[1]} for k, v in sorted(record.ledgers.items())},
    }


def cmd_offload_put(args: argparse.Namespace) -> int:
    """Offload the closed ledger in FILE (a ledger file) as LEDGER_ID, attempt --uid (default:
    a new one), reading the file at most --rate bytes per second (PIP-211)."""
    uid = args.uid or uuid.uuid4()
    permits = FlowPermits(args.rate) if args.rate else None
    with _open_ledger_file(args.ledger_id, args.file) as ledger, open_storage(args) as storage:
        offloader = LedgerOffloader(storage, max_block_bytes=args.block_bytes, flow_permits=permits)
        record = offloader.offload(ledger, uid, dict(args.meta))
    fields = _attempt_fields(record)
    text = (
        f"ledger {record.ledger_id}: offloaded {record.entries} entries ({record.length} bytes)"
        f" in {record.blocks} block(s) as {record.id}"
    )
    emit(args, fields, text)
    return EXIT_OK


def cmd_offload_ls(args: argparse.Namespace) -> int:
    """List offload attempts (of LEDGER_ID) by ledger id: state, entries, bytes, uid."""
    with open_storage(args, read_only=True) as storage:
        records = LedgerOffloader(storage).attempts(args.ledger_id)
    attempts = [_attempt_fields(r) for r in records]
    lines = [
        f"{a['ledger_id']:>20} {a['state']:<9} {a['entries']:>10} {a['bytes']:>14} {a['uid']}"
        for a in attempts
    ]
    emit(args, {"attempts": attempts}, "\n".join(lines))
    return EXIT_OK


def cmd_offload_segments(args: argparse.Namespace) -> int:
    """List MANAGED_LEDGER's streaming segments in sequence: state, begin and end entries,
    bytes, ledgers."""
    with open_storage(args, read_only=True) as storage:
        segments = [_segment_fields(s) for s in StreamingOffloader(storage, args.managed_ledger).segments()]
    lines = [
        f"{s['sequence']:>6} {s['state']:<9} {s['begin'][0]}:{s['begin'][1]}..{s['end'][0]}:{s['end'][1]}"
        f" {s['bytes']:>14} {s['uid']}"
        for s in segments
    ]
    emit(args, {"managed_ledger": args.managed_ledger, "segments": segments}, "\n".join(lines))
    return EXIT_OK


def cmd_offload_stream(args: argparse.Namespace) -> int:
    """Offer the entries of ledger files (LEDGER_ID=FILE, ledger ids increasing) to
    MANAGED_LEDGER's streaming offload, rolling segments over by size and age, and close the
    last segment. A segment a crash left open is resumed first: entries up to its last
    durable one are skipped, so a rerun neither loses nor duplicates entries."""
    ledger_ids = [ledger_id for ledger_id, _ in args.ledgers]
    if ledger_ids != sorted(set(ledger_ids)):
        raise InvalidArgument(f"ledger ids must increase, got {ledger_ids}")
    with contextlib.ExitStack() as files:
        ledgers = [files.enter_context(_open_ledger_file(i, path)) for i, path in args.ledgers]
        with open_storage(args) as storage:
            offloader = StreamingOffloader(
                storage,
                args.managed_ledger,
                block_bytes=args.block_bytes,
                max_segment_bytes=args.max_segment_bytes,
                max_segment_age_s=args.max_segment_age_s,
            )
            offered, results = _stream(offloader, ledgers)
            segments = [_segment_fields(s) for s in offloader.segments()]
    closed = [
        {"uid": str(r.uid), "begin": [r.begin_ledger, r.begin_entry], "end": [r.end_ledger, r.end_entry]}
        for r in results
    ]
    text = f"{args.managed_ledger}: offered {offered} entries, closed {len(closed)} segment(s)"
    emit(
        args,
        {"managed_ledger": args.managed_ledger, "offered": offered, "closed": closed, "segments": segments},
        text,
    )
    return EXIT_OK


def _stream(offloader: StreamingOffloader, ledgers: list[FileLedger]) -> tuple[int, list[Any]]:
    """Drive ``offloader`` over ``ledgers``' entries as a managed ledger would; return the
    number of entries offered and the results of the segments closed."""
    open_one, failed = offloader.open_segment(), offloader.failed_segment()
    handle: OffloadHandle | None
    if failed is not None:  # its redo, from its begin, before anything else
        handle = offloader.streaming_offload(uuid.uuid4(), {}, failed.begin_ledger, failed.begin_entry)
        done: tuple[int, int] | None = (failed.begin_ledger, failed.begin_entry - 1)
    else:
        handle = offloader.streaming_offload(open_one.id) if open_one is not None else None
        done = handle.last_offered() if handle is not None else None
    offered, results = 0, []
    for ledger in ledgers:
        # After a resume, read on from the entry after the last durable one (not from 0).
        first = 0 if done is None or ledger.ledger_id > done[0] else done[1] + 1
        if (done is not None and ledger.ledger_id < done[0]) or first > ledger.last_entry_id:
            continue
        batches = _batches(ledger, first, ledger.last_entry_id)
        for entry_id, data in enumerate(itertools.chain.from_iterable(batches), start=first):
            while True:
                if handle is None:
                    handle = offloader.streaming_offload(uuid.uuid4(), {}, ledger.ledger_id, entry_id)
                outcome = handle.offer_entry(ledger.ledger_id, entry_id, bytes(data))
                if outcome == OfferResult.OK:
                    offered += 1
                    break
                if outcome == OfferResult.FAIL_BUFFER_FULL:
                    handle.wait_for_room()
                else:  # closed by size or age: its successor begins with this entry
                    results.append(handle.result())
                    handle = None
    if handle is not None:
        results.append(handle.close())
    return offered, results


def _read_source(args: argparse.Namespace, storage: Any) -> LedgerReadHandle:
    if (args.uid is None) == (args.managed_ledger is None):
        raise InvalidArgument("name the ledger's offload by exactly one of UID and --managed-ledger")
    if args.uid is not None:
        return LedgerOffloader(storage).read_offloaded(args.ledger_id, args.uid)
    return StreamingOffloader(storage, args.managed_ledger).read_ledger(args.ledger_id)


def cmd_offload_read(args: argparse.Namespace) -> int:
    """Read LEDGER_ID's entries --first..--last (default: all) from attempt UID or from
    --managed-ledger's streaming segments; write them as a ledger file to --out or stdout
    (with --json: a summary)."""
    with open_storage(args, read_only=True) as storage:
        ledger = _read_source(args, storage)
        default_first = getattr(ledger, "first_entry_id", 0)
        first = default_first if args.first is None else args.first
        last = ledger.last_entry_id if args.last is None else args.last
        first, last = check_entry_range(ledger, first, last)
        if args.json:
            count = sizes = 0
            for batch in _batches(ledger, first, last):
                count += len(batch)
                sizes += sum(len(e) for e in batch)
            fields = {
                "ledger_id": args.ledger_id,
                "first": first,
                "last": last,
                "entries": count,
                "bytes": sizes,
            }
            emit(args, fields, "")
            return EXIT_OK
        with _output(args.out) as out:
            next_id = first
            for batch in _batches(ledger, first, last):
                write_ledger_entries(out, batch, first_entry_id=next_id)
                next_id += len(batch)
    return EXIT_OK


def _batches(ledger: LedgerReadHandle, first: int, last: int, size: int = 256) -> Iterator[Sequence[Entry]]:
    for start in range(first, last + 1, size):
        yield ledger.read(start, min(start + size - 1, last))


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[BinaryIO]:
    if path and path != "-":
        with open(path, "wb") as out:
            yield out
    else:
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()


def cmd_offload_delete(args: argparse.Namespace) -> int:
    """Delete attempt UID of LEDGER_ID, or mark LEDGER_ID deleted in --managed-ledger (its
    segments go once all their ledgers are deleted)."""
    if (args.uid is None) == (args.managed_ledger is None):
        raise InvalidArgument("name the ledger's offload by exactly one of UID and --managed-ledger")
    with open_storage(args) as storage:
        if args.uid is not None:
            LedgerOffloader(storage).delete_offloaded(args.ledger_id, args.uid)
            removed: list[str] = []
        else:
            offloader = StreamingOffloader(storage, args.managed_ledger)
            removed = [str(u) for u in offloader.delete_ledger(args.ledger_id)]
    text = f"ledger {args.ledger_id}: deleted" + (
        f"; segments removed: {', '.join(removed)}" if removed else ""
    )
    emit(args, {"ledger_id": args.ledger_id, "segments_removed": removed}, text)
    return EXIT_OK


def cmd_offload_cleanup(args: argparse.Namespace) -> int:
    """Remove the objects and records of offload attempts a crash left (started by an
    earlier owner, or being deleted), and of every managed ledger's streaming segments
    being deleted, whose ledgers are all deleted, or failed (a failed segment's record
    stays for its redo)."""
    with open_storage(args) as storage:
        cleaned = [_attempt_fields(r) for r in LedgerOffloader(storage).cleanup()]
        segments = [
            {"managed_ledger": managed_ledger, "uid": str(uid)}
            for managed_ledger in managed_ledgers(storage)
            for uid in StreamingOffloader(storage, managed_ledger).cleanup()
        ]
    emit(
        args,
        {"cleaned": cleaned, "segments": segments},
        f"cleaned {len(cleaned)} attempt(s) and {len(segments)} streaming segment(s)",
    )
    return EXIT_OK


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``offload`` and its actions to the ``slts`` parser's subcommands ``sub``."""
    offload = sub.add_parser(
        "offload",
        help="Pulsar-style ledger offload (PIP-17/76/211): put, stream, ls, segments, read, delete, cleanup",
        description=__doc__,
    )
    actions = offload.add_subparsers(dest="action", required=True, metavar="ACTION")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        action = actions.add_parser(name, parents=[common], help=help_text, description=func.__doc__)
        action.set_defaults(func=func)
        return action

    put = add("put", cmd_offload_put, "offload a closed ledger from a ledger file")
    put.add_argument("ledger_id", metavar="LEDGER_ID", type=non_negative)
    put.add_argument("file", metavar="FILE")
    put.add_argument("--uid", type=_uid, default=None, help="the attempt's uid (default: a new one)")
    put.add_argument("--block-bytes", type=positive, default=64 << 20, help="block size (default 64 MiB)")
    put.add_argument("--meta", type=_key_value, action="append", default=[], metavar="KEY=VALUE")
    put.add_argument(
        "--rate", type=positive, default=None, metavar="BYTES/S", help="read the file at most this fast"
    )

    stream = add("stream", cmd_offload_stream, "stream ledger files into a managed ledger's offload")
    stream.add_argument("managed_ledger", metavar="MANAGED_LEDGER")
    stream.add_argument("ledgers", type=_ledger_file, nargs="+", metavar="LEDGER_ID=FILE")
    stream.add_argument(
        "--block-bytes", type=positive, default=5 << 20, help="least block size (default 5 MiB)"
    )
    stream.add_argument(
        "--max-segment-bytes", type=positive, default=1 << 30, help="roll over past this size"
    )
    stream.add_argument("--max-segment-age-s", type=float, default=600.0, help="roll over past this age")

    ls = add("ls", cmd_offload_ls, "list offload attempts")
    ls.add_argument("ledger_id", metavar="LEDGER_ID", type=non_negative, nargs="?", default=None)

    segments = add("segments", cmd_offload_segments, "list a managed ledger's streaming segments")
    segments.add_argument("managed_ledger", metavar="MANAGED_LEDGER")

    for name, func, help_text in (
        ("read", cmd_offload_read, "read an offloaded ledger's entries back as a ledger file"),
        ("delete", cmd_offload_delete, "delete an offloaded ledger"),
    ):
        action = add(name, func, help_text)
        action.add_argument("ledger_id", metavar="LEDGER_ID", type=non_negative)
        action.add_argument("uid", metavar="UID", type=_uid, nargs="?", default=None)
        action.add_argument("--managed-ledger", default=None, metavar="NAME", help="a streamed ledger")
        if name == "read":
            action.add_argument("--first", type=non_negative, default=None)
            action.add_argument("--last", type=non_negative, default=None)
            action.add_argument("--out", default=None, metavar="FILE", help="default: stdout")

    add("cleanup", cmd_offload_cleanup, "remove what crashed offload attempts left")
