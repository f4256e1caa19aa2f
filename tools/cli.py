"""The ``slts`` command line: one function per subcommand, each a thin call into the library.

Store selection: ``--store`` is a folder (the embedded default: chunks in
``FOLDER/chunks`` through the filesystem binding, metadata in ``FOLDER/metadata`` as
LMDB) or a chunk storage URL together with ``--metadata FOLDER``. Default folder:
``$SLTS_STORE`` or ``./slts-data``. Commands that change something start the container
with the next epoch, which fences any older instance (one owner at a time); read-only
commands (``cat``, ``ls``, ``info``, ``verify``, ``export``, ``journal show``, ``restore``'s
source) observe without taking it over, and never create anything: where no store is,
they fail with exit code 3. Files named on the command line are opened before the store,
so a mistyped file changes nothing and fences nobody. Bad input and every ``SltsError``
end in a one-line message on stderr and a documented exit code, never a traceback.

Exit codes (also in ``docs/cli.md``):

== =====================================================================
0  success
1  any other SLTS error (``SltsError``)
2  usage error (bad flags)
3  segment, chunk, store or input file not found
4  segment already exists
5  invalid input (name, offset, length, configuration)
6  fenced: a newer instance owns the container
7  chunk storage failure (I/O, unavailable, corrupted)
8  segment state forbids it (sealed, not sealed, truncated)
9  a local file or folder named on the command line cannot be read or written
10 the metadata is damaged (restore it from tier-2 with ``slts restore``)
== =====================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, BinaryIO

from slts.tools import config_cli, keys_cli, metrics_cli, offload_cli, remote_cli
from slts.tools.command_line import (
    DEFAULT_STORE,
    EXIT_CHUNK_STORAGE,
    EXIT_ERROR,
    EXIT_FILE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    IO_BYTES,
    emit,
    exit_code,
    non_negative,
    open_storage,
    positive,
    record_seal,
    require_chunk_storage,
    resolve_config,
    store_locations,
)
from tqdm import tqdm

from slts.errors import (
    InvalidArgument,
    MetadataCorrupted,
    SltsError,
)
from slts.logs import FORMATS, LEVELS, LOGGER_NAME, configure_logging

if TYPE_CHECKING:  # imported where used: the bench modules load every benchmark suite
    from slts.tools.bench_report import Report

# -- subcommands ---------------------------------------------------------------------------------


def cmd_put(args: argparse.Namespace) -> int:
    """Append a file (or stdin) to a segment, creating the segment if needed."""
    with _input(args.file) as source, open_storage(args) as storage:
        if not storage.exists(args.name):
            storage.create(args.name)
        handle = storage.open_write(args.name)
        offset = start = storage.info(args.name).length
        while block := source.read(args.write_bytes):
            storage.write(handle, offset, block)
            offset += len(block)
        info = storage.info(args.name)
    emit(
        args,
        {"segment": args.name, "bytes_written": offset - start, "length": info.length},
        f"{args.name}: wrote {offset - start} bytes, length {info.length}",
    )
    return EXIT_OK


def cmd_cat(args: argparse.Namespace) -> int:
    """Write a segment's bytes (or a range) to stdout."""
    out = sys.stdout.buffer
    with open_storage(args, read_only=True) as storage:
        info = storage.info(args.name)
        offset = info.start_offset if args.offset is None else args.offset
        end = info.length if args.length is None else offset + args.length
        handle = storage.open_read(args.name)
        for bound in (offset, end):  # a bad range fails here, before any output
            storage.read(handle, bound, 0)
        while offset < end:
            size = min(IO_BYTES, end - offset)
            out.write(storage.read(handle, offset, size))
            offset += size
    out.flush()
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    """List segment names (with ``--long``, their lengths and chunk counts)."""
    with open_storage(args, read_only=True) as storage:
        names = list(storage.list(args.prefix))
        infos = [storage.info(name) for name in names] if (args.long or args.json) else []
    if args.json:
        emit(args, [asdict(info) for info in infos], "")
    elif args.long:
        for info in infos:
            flag = "sealed" if info.sealed else "active"
            print(f"{info.length:>14} {info.chunk_count:>8} {flag:<6} {info.name}")
    else:
        for name in names:
            print(name)
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """Show one segment's metadata, and the bytes its chunks hold on the chunk storage
    (``stored_bytes``: less than its length where compression paid, more with encryption's
    tags; whole chunks, so a truncated prefix inside the first chunk counts)."""
    with open_storage(args, read_only=True) as storage:
        info = storage.info(args.name)
        stored = sum(chunk.stored for _, chunk in storage.chunks(args.name))
    fields = {**asdict(info), "stored_bytes": stored}
    emit(args, fields, "\n".join(f"{key}: {value}" for key, value in fields.items()))
    return EXIT_OK


def cmd_seal(args: argparse.Namespace) -> int:
    """Seal a segment."""
    with open_storage(args) as storage:
        storage.seal(storage.open_write(args.name))
    emit(args, {"segment": args.name, "sealed": True}, f"{args.name}: sealed")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete a segment (its chunks go to garbage collection)."""
    with open_storage(args) as storage:
        storage.delete(storage.open_write(args.name))
    emit(args, {"segment": args.name, "deleted": True}, f"{args.name}: deleted")
    return EXIT_OK


def cmd_concat(args: argparse.Namespace) -> int:
    """Append sealed segment SOURCE to TARGET (at its current length); SOURCE is gone."""
    with open_storage(args) as storage:
        handle = storage.open_write(args.target)
        offset = storage.info(args.target).length if args.offset is None else args.offset
        storage.concat(handle, offset, args.source)
        info = storage.info(args.target)
    emit(
        args,
        {"target": args.target, "source": args.source, "offset": offset, "length": info.length},
        f"{args.source} -> {args.target} at {offset}: length {info.length}",
    )
    return EXIT_OK


def cmd_truncate(args: argparse.Namespace) -> int:
    """Make everything below OFFSET unreadable; whole chunks below it go to GC."""
    with open_storage(args) as storage:
        storage.truncate(storage.open_write(args.name), args.offset)
        info = storage.info(args.name)
    emit(
        args,
        {"segment": args.name, "start_offset": info.start_offset, "chunk_count": info.chunk_count},
        f"{args.name}: starts at {info.start_offset}, {info.chunk_count} chunks",
    )
    return EXIT_OK


def cmd_defrag(args: argparse.Namespace) -> int:
    """Merge runs of small consecutive chunks of one segment, or of every segment (under
    --prefix), as a batch beside the container's owner: this command fences nobody, a
    live writer keeps writing. In process, or with --spark on a Spark cluster."""
    from slts.storage.batch_defrag import ExecutorFactory, defrag_store, local_executor

    if (args.name is None) == (not args.all):
        raise InvalidArgument("give a segment NAME or --all, not both")
    if not args.spark and (args.master is not None or args.partitions is not None):
        raise InvalidArgument("--master and --partitions go with --spark")
    url, metadata = store_locations(args.store, args.metadata)
    resolved = resolve_config(args)
    if not os.path.isdir(metadata):
        raise InvalidArgument(f"no metadata folder {metadata!r}: nothing to defrag")
    executor: ExecutorFactory = local_executor(args.threads)
    if args.spark:
        from slts.tools.spark_defrag import spark_executor

        master, partitions = args.master or "local[*]", args.partitions
        executor = lambda _: spark_executor(master, partitions)  # noqa: E731 - one line, a factory
    quiet = args.json or not sys.stderr.isatty()
    with tqdm(desc="defrag", unit="run", disable=quiet) as bar:
        report = defrag_store(
            url,
            metadata,
            executor,
            container_id=args.container,
            config=resolved.config,
            limiter=resolved.limiter(),
            prefix=args.prefix,
            names=None if args.all else [args.name],
            batch_runs=args.batch_runs,
            batch_bytes=args.batch_bytes,
            progress=bar.update,
        )
    document = {
        **asdict(report),
        "segments": report.segments_scanned,
        "driver": "spark" if args.spark else "in-process",
    }
    emit(
        args,
        document,
        f"defrag ({document['driver']}): {report.segments_scanned} segments scanned, "
        f"chunks {report.chunks_before} -> {report.chunks_after}, runs {report.runs_planned} planned, "
        f"{report.runs_committed} committed, {report.runs_dropped} dropped, {report.runs_failed} failed, "
        f"{report.runs_expired} expired; "
        f"{report.bytes_native} bytes concatenated natively, {report.bytes_copied} copied through executors; "
        f"{report.seconds:.2f} s"
        + "".join(f"\nfailed: {error}" for error in report.errors)
        + (
            "\nfailed runs by error: "
            + ", ".join(f"{kind} {n}" for kind, n in sorted(report.error_kinds.items()))
            if report.error_kinds
            else ""
        ),
    )
    return EXIT_OK if not report.runs_failed else EXIT_CHUNK_STORAGE


def cmd_gc(args: argparse.Namespace) -> int:
    """Run garbage collection passes until nothing due is left (bounded passes).
    With --orphans, first find chunks nothing accounts for and queue them (--dry-run:
    only list them)."""
    if args.dry_run and not args.orphans:
        raise InvalidArgument("--dry-run goes with --orphans")
    if args.orphans:
        from slts.admin.orphans import reconcile

        with open_storage(args, read_only=args.dry_run) as storage:
            report = reconcile(storage, dry_run=args.dry_run)
        emit(
            args,
            {
                "listed": report.listed,
                "orphans": report.orphans,
                "foreign": report.foreign,
                "queued": report.queued,
            },
            f"orphans: {len(report.orphans)} of {report.listed} chunks"
            f" ({'dry run' if args.dry_run else f'{report.queued} queued for GC'}),"
            f" {len(report.foreign)} foreign names left alone",
        )
        if args.dry_run:
            return EXIT_OK
    with open_storage(args) as storage:
        for _ in range(args.passes_max):
            if not storage.gc.run_once().progressed:
                break
        totals = storage.gc.statistics()
    emit(
        args,
        {
            "chunks_deleted": totals.chunks_deleted,
            "entries_kept": totals.entries_kept,
            "tombstones_finished": totals.tombstones_finished,
            "errors": totals.errors,
        },
        f"gc: {totals.chunks_deleted} chunks deleted, {totals.tombstones_finished} deleted segments finished,"
        f" {totals.errors} errors",
    )
    return EXIT_OK if not totals.errors else EXIT_CHUNK_STORAGE


def cmd_scrub(args: argparse.Namespace) -> int:
    """Re-read every chunk (of segments under PREFIX, from --from on) and check its length
    and CRC32C against the metadata, as the lowest traffic class of the limiter; exit 1 on
    any anomaly. With --max-chunks N it stops after the segment where N was reached and
    prints where to go on (--from NAME). Read-only: it fences nobody. With --spark the
    chunks are read and checked on Spark executors (the walk stays here)."""
    from slts.admin.scrub import scrub

    if not args.spark and (args.master is not None or args.partitions is not None):
        raise InvalidArgument("--master and --partitions go with --spark")
    quiet = args.json or not sys.stderr.isatty()
    with contextlib.ExitStack() as stack:
        storage = stack.enter_context(open_storage(args, read_only=True))
        checker = None
        if args.spark:
            from slts.tools.spark_scrub import spark_checker

            checker = stack.enter_context(spark_checker(args.master or "local[*]", args.partitions))
        bar = stack.enter_context(tqdm(desc="scrub", unit="chunk", disable=quiet))
        report = scrub(
            storage,
            prefix=args.prefix,
            start_at=args.start_at,
            max_chunks=args.max_chunks,
            progress=bar.update,
            checker=checker,
        )
    lines = [f"{a.segment} @{a.offset}: {a.kind}: chunk {a.chunk}: {a.detail}" for a in report.anomalies]
    lines.append(
        f"scrub: {report.segments} segments, {report.chunks} chunks, {report.bytes_read} bytes read,"
        f" {len(report.anomalies)} anomalies, {report.unverified_chunks} chunks without checksums"
        + (f"; go on with --from {report.next_segment!r}" if report.next_segment is not None else "")
    )
    emit(args, asdict(report), "\n".join(lines))
    return EXIT_ERROR if report.anomalies else EXIT_OK


def cmd_cost(args: argparse.Namespace) -> int:
    """Print the container's chunk storage requests by kind and traffic class, the bytes it
    moved and stores, priced at the configured rates (``[prices]``, docs/config.md).
    Read-only: it fences nobody."""
    from slts.cost import cost_report

    with open_storage(args, read_only=True) as storage:
        prices = resolve_config(args).price_list(storage.chunk_storage.url)  # GCS's rates on gs://
        report = cost_report(storage, prices)
    emit(args, report.as_json(), report.as_text())
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    """Check the invariants of every segment (lists, index, chunks present), that no chunk
    or metadata is leaked, and that the tier-2 copy of the metadata restores; exit 1 if
    anything is wrong. The walk runs in a child process: damage that would crash the
    process reading the metadata is reported (exit 10), not a crash of ``slts``."""
    import multiprocessing

    from slts.metadata.lmdb_file import DATA_FILE, walk_in_child

    url, metadata = store_locations(args.store, args.metadata)
    require_chunk_storage(url)
    if os.path.isfile(os.path.join(metadata, DATA_FILE)):
        walk_in_child(metadata)  # the whole file, whatever changed since it was known good (bit rot)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: LMDB is never forked
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(
        target=_verify_in_child,
        args=(sender, url, metadata, args.container, args.prefix, args.checksums),
        name="slts-verify",
    )
    child.start()
    sender.close()
    try:
        outcome = receiver.recv()
    except EOFError:  # the child died before it could answer
        outcome = None
    child.join()
    if outcome is None:
        death = (
            f"signal {-child.exitcode}" if child.exitcode and child.exitcode < 0 else f"exit {child.exitcode}"
        )
        raise MetadataCorrupted(
            f"the metadata at {metadata!r} could not be read: the verifying process died ({death}); "
            "rebuild it from tier-2 with `slts restore --to NEW_FOLDER`"
        )
    kind, value = outcome
    if kind == "error":
        raise value
    problems, segments, copy, leaks = value
    summary = f"verify: {segments} segments, {len(problems)} problems"
    if not args.prefix:
        summary += "; tier-2 copy " + (f"restores to sequence {copy}" if copy is not None else "absent")
        summary += (
            f"; leaks: {leaks['index_entries']} index entries, {leaks['chunk_records']} chunk records, "
        )
        summary += f"{leaks['gc_entries']} overdue GC entries"
    document = {"segments": segments, "problems": problems}
    if not args.prefix:
        document.update(copy_sequence=copy, leaks=leaks)
    emit(args, document, "\n".join([summary, *problems]))
    return EXIT_OK if not problems else EXIT_ERROR


def _verify_in_child(
    sender: Any, url: str, metadata: str, container: int, prefix: str, checksums: bool
) -> None:
    """``cmd_verify``'s walk, in the child: sends ("ok", (problems, segments, copy
    sequence, leak counts)) or ("error", SltsError) through ``sender``."""
    import slts
    from slts.admin.verify import verify_container, verify_segment

    try:
        with slts.open(url, metadata=metadata, container_id=container, read_only=True) as storage:
            if prefix:
                names = list(storage.list(prefix))
                problems = [
                    problem
                    for name in names
                    for problem in verify_segment(storage, name, checksums=checksums)
                ]
                sender.send(("ok", (problems, len(names), None, None)))
                return
            report = verify_container(storage, checksums=checksums)
            leaks = report.leaks
            assert leaks is not None
            counts = {
                "index_entries": leaks.index_entries,
                "chunk_records": leaks.chunk_records,
                "gc_entries": leaks.gc_entries,
            }
            sender.send(("ok", (report.problems, report.segments, report.copy_sequence, counts)))
    except SltsError as error:
        sender.send(("error", error))


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Take a metadata snapshot on tier-2 now (the metadata log is truncated after it)."""
    with open_storage(args) as storage:
        if storage.durable is None:
            raise InvalidArgument("this container keeps no copy on tier-2 (journal = false)")
        info = storage.durable.snapshot()
        stats = storage.durable.statistics()
    emit(
        args,
        {**asdict(info), "durable_sequence": stats.durable_sequence},
        f"snapshot: sequence {info.sequence}, {info.entries} entries, {info.end - info.start} bytes "
        f"on tier-2; tier-2 copy now reaches sequence {stats.durable_sequence}",
    )
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    """Rebuild the metadata from tier-2 alone (journal, latest metadata snapshot, metadata
    log after it) into a new LMDB folder, as after the loss of the machine."""
    from slts.bindings import from_url
    from slts.journal.restore import restore_to_folder

    source = args.source if args.source is not None else args.store
    url, _ = store_locations(source, "-") if "://" in source else store_locations(source, None)
    require_chunk_storage(url)
    with from_url(url) as binding:
        report = restore_to_folder(binding, args.container, os.path.abspath(args.target), record_seal(args))
    emit(
        args,
        {**asdict(report), "from": url, "to": args.target},
        f"restore: {args.target} rebuilt from {url} up to sequence {report.sequence} "
        f"(snapshot at {report.snapshot_sequence} with {report.snapshot_entries} entries, "
        f"{report.log_records} log records) in {report.seconds:.2f} s; next owner's epoch > {report.epoch}\n"
        f"start it with --store {url} --metadata {args.target}; chunks written after the restore "
        "point are orphans: `slts gc --orphans` collects them",
    )
    return EXIT_OK


def cmd_journal(args: argparse.Namespace) -> int:
    """Decode the system journal for an operator: checkpoints, the snapshot used, the
    journal files replayed, every system segment's layout (and with --records, every record)."""
    from slts.bindings import from_url
    from slts.journal.replay import replay

    url, _ = store_locations(args.store, args.metadata or "-")
    require_chunk_storage(url)
    records: list[dict[str, Any]] = []
    with from_url(url) as binding:
        found = replay(
            binding,
            args.container,
            on_record=(lambda file, record: records.append({"file": file, **record}))
            if args.records
            else None,
            seal=record_seal(args),
        )
    layouts = {name: layout.encode() for name, layout in sorted(found.layout.segments.items())}
    document: dict[str, Any] = {
        "checkpoint": found.checkpoint,
        "snapshot": found.snapshot,
        "covered": list(found.covered),
        "invalid_checkpoints": found.invalid_checkpoints,
        "files_replayed": found.files,
        "journal_files": len(found.all_files),
        "journal_snapshots": len(found.all_snapshots),
        "checkpoints": len(found.all_checkpoints),
        "records": found.records,
        "duplicates": found.duplicates,
        "inconsistent": found.inconsistent,
        "corrupt": found.corrupt,
        "torn": found.torn,
        "vanished": found.vanished,
        "newest_epoch": found.max_epoch,
        "layouts": layouts,
    }
    if args.records:
        document["record_list"] = [_printable(record) for record in records]
    lines = [
        f"journal of container {args.container} on {url}: newest epoch {found.max_epoch}",
        f"  base: {found.checkpoint or 'no valid checkpoint'} -> {found.snapshot or '-'} (covers "
        f"{found.covered})",
        f"  {len(found.all_files)} journal files, {len(found.all_snapshots)} snapshots, "
        f"{len(found.all_checkpoints)} checkpoints; replayed {found.records} records from {len(found.files)} "
        "files",
        f"  ignored: {found.duplicates} duplicates, {found.corrupt} corrupt, {found.torn} torn, "
        f"{found.inconsistent} inconsistent, {len(found.invalid_checkpoints)} invalid checkpoints",
    ]
    for name, layout in layouts.items():
        attrs = ", ".join(f"{k}={v}" for k, v in sorted(layout["attrs"].items()))
        lines.append(
            f"  {name}: [{layout['start']}, {layout['length']}) in {len(layout['chunks'])} chunks; {attrs}"
        )
    lines.extend(f"    {record['file'].rsplit('/', 1)[-1]} {_printable(record)}" for record in records)
    emit(args, document, "\n".join(lines))
    return EXIT_OK


def _printable(record: dict[str, Any]) -> dict[str, Any]:
    """A journal record without its bulky parts (a snapshot's layouts become a summary)."""
    shown = {key: value for key, value in record.items() if key not in ("file", "layouts")}
    if "layouts" in record:
        shown["layouts"] = {
            name: f"{raw['length'] - raw['start']} bytes" for name, raw in record["layouts"].items()
        }
    return shown


def cmd_export(args: argparse.Namespace) -> int:
    """Export a segment's metadata to FILE (or stdout), or with --format rolling write a
    Pravega RollingStorage header (NAME$header) next to its chunks."""
    if args.format == "rolling":
        from slts.admin.rolling import export_segment as export_header

        with open_storage(args) as storage:
            header = export_header(storage, args.name, replace=args.replace)
        emit(args, {"segment": args.name, "header": header}, f"{args.name}: wrote {header}")
        return EXIT_OK
    from slts.admin.backup import export_segment

    if args.file != "-" and not os.path.isdir(os.path.dirname(os.path.abspath(args.file))):
        raise FileNotFoundError(2, "no such folder", os.path.dirname(os.path.abspath(args.file)))
    with open_storage(args, read_only=True) as storage:
        document = export_segment(storage, args.name)
    if args.file == "-":
        sys.stdout.buffer.write(document)
        sys.stdout.flush()
    else:
        with open(args.file, "wb") as handle:
            handle.write(document)
        emit(
            args,
            {"segment": args.name, "file": args.file, "bytes": len(document)},
            f"{args.name}: metadata exported to {args.file} ({len(document)} bytes)",
        )
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    """Create a segment from an export FILE (or stdin), or with --format rolling from the
    RollingStorage header NAME$header on the chunk storage."""
    if args.format == "rolling" and not args.name:
        raise InvalidArgument("--format rolling needs --name SEGMENT")
    document = None
    if args.format != "rolling":
        with _input(args.file) as source:  # before the store: a missing file fences nobody
            document = source.read()
        _check_export(document, "stdin" if args.file == "-" else repr(args.file))
    with open_storage(args) as storage:
        if document is None:
            from slts.admin.rolling import import_segment as import_header

            info = import_header(storage, args.name)
        else:
            from slts.admin.backup import import_segment

            info = import_segment(storage, document, name=args.name)
    emit(args, asdict(info), f"{info.name}: imported, length {info.length}, {info.chunk_count} chunks")
    return EXIT_OK


def _check_export(document: bytes, where: str) -> None:
    """``InvalidArgument`` naming ``where`` and the problem unless ``document`` is a whole
    segment export: a bad input file is the operator's input error, not damaged metadata
    (``MetadataCorrupted`` would send them to restore a healthy store)."""
    from slts.admin.backup import parse_export

    if not document:
        raise InvalidArgument(f"cannot import {where}: it is empty, not an SLTS segment export")
    try:
        parse_export(document)
    except MetadataCorrupted as exc:
        raise InvalidArgument(
            f"cannot import {where} ({len(document)} bytes): {exc}; give a file `slts export` wrote"
        ) from None


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo on the embedded default, or with ``--store URL`` its chunks on that
    storage (see ``slts.tools.demo``)."""
    from slts.tools.demo import open_new_store, run_demo

    if args.kafka:
        from slts.tools.demo_kafka import format_kafka, run_alone

        kafka = run_alone(args.dir, open_new_store, args.keep)
        emit(args, kafka, "SLTS demo, the tiered Kafka log part:\n" + "\n".join(format_kafka(kafka)))
        return EXIT_OK if kafka["kafka_verified"] else EXIT_ERROR
    report = run_demo(
        args.dir,
        segments=args.segments,
        writes=args.writes,
        keep=args.keep,
        json_output=args.json,
        # ``--store URL`` (s3://, gs://, azure://...: an empty prefix) puts the chunks there; a
        # folder (the default store) does not apply: the demo keeps its own in --dir. (Not
        # ``set_defaults`` on this subparser: the option's action is shared by every command.)
        store=args.store if "://" in str(args.store) else None,
    )
    return EXIT_OK if report["verified"] else EXIT_ERROR


def cmd_bench(args: argparse.Namespace) -> int:
    """Measure SLTS against raw baselines in the same run (see ``slts.tools.bench``): a
    table of the figures, each with its goal's verdict (met, missed, or - for none);
    ``--json-file`` also writes them as JSON, ``--html`` as one self-contained page
    (bars with min-max whiskers and the goal line per figure). ``--from-json FILE --html
    OUT`` draws the page of a saved JSON report again, running nothing. Exit 1 when a
    benchmark failed, 5 for bad input (nothing is then written)."""
    from slts.tools import bench, bench_html, bench_report

    for flag, path in (("--html", args.html), ("--json-file", args.json_file)):
        if path is not None:
            _check_output_file(flag, path)
    if args.html and args.json_file and os.path.realpath(args.html) == os.path.realpath(args.json_file):
        raise InvalidArgument("--html and --json-file name the same file")
    if args.from_json is not None:
        report = _saved_report(args)
        code = EXIT_OK
    else:
        report = bench.run(
            args.only,
            quick=args.quick,
            directory=args.dir,
            store=args.store,
            out=(lambda _: None) if args.json else print,
        )
        code = EXIT_ERROR if report.failures else EXIT_OK
    document = bench_report.to_json(report)
    if args.json_file:
        with open(args.json_file, "w", encoding="utf-8") as handle:
            handle.write(document)
    if args.html:
        page = bench_html.render(report)
        with open(args.html, "w", encoding="utf-8") as handle:
            handle.write(page)
    if args.json:
        print(document)
    return code


def _saved_report(args: argparse.Namespace) -> Report:
    """The report ``--from-json`` names, its table printed unless ``--json``. Refused
    (``InvalidArgument``): the flags that only shape a run beside it, no ``--html``, an
    ``--html`` that would overwrite it, a file missing, unreadable or malformed."""
    from slts.tools import bench_report

    run_flags = (
        ("--only", args.only),
        ("--quick", args.quick),
        ("--dir", args.dir),
        ("--json-file", args.json_file),
    )
    given = [flag for flag, value in run_flags if value]
    if given:
        raise InvalidArgument(f"--from-json runs no benchmark: {' '.join(given)} has no meaning beside it")
    if args.html is None:
        raise InvalidArgument("--from-json needs --html OUT (the page to draw)")
    if os.path.realpath(args.html) == os.path.realpath(args.from_json):
        raise InvalidArgument(f"--html {args.html!r} would overwrite the report --from-json reads")
    report = bench_report.read_json(args.from_json)
    if not args.json:
        bench_report.print_table(report)
    return report


def _check_output_file(flag: str, path: str) -> None:
    """Refuse (``InvalidArgument``) an output file whose folder does not exist or that is
    a folder, before anything is run or written."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidArgument(f"{flag} {path!r}: the folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise InvalidArgument(f"{flag} {path!r} is a folder")


def cmd_simulate(args: argparse.Namespace) -> int:
    """Seeded, deterministic simulation under faults (see ``slts.tools.simulation``)."""
    from slts.tools.simulation import cli as simulation_cli

    return simulation_cli.main(args)


@contextlib.contextmanager
def _input(path: str) -> Iterator[BinaryIO]:
    if path == "-":
        yield sys.stdin.buffer
    else:
        with open(path, "rb") as handle:
            yield handle


# -- parser --------------------------------------------------------------------------------------------


class _VersionAction(argparse.Action):
    """``--version``: prints ``slts VERSION`` (the installed distribution's version, read
    only when asked) and exits 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("slts")
        except PackageNotFoundError:
            installed = "unknown (the slts distribution is not installed)"
        print(f"slts {installed}")
        parser.exit(EXIT_OK)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``slts``."""
    from slts.storage.batch_defrag import BATCH_BYTES_DEFAULT, BATCH_RUNS_DEFAULT

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        default=os.environ.get("SLTS_STORE", DEFAULT_STORE),
        help="store folder, or chunk storage URL (default: $SLTS_STORE or ./slts-data)",
    )
    common.add_argument("--metadata", default=None, help="LMDB metadata folder (default: STORE/metadata)")
    common.add_argument(
        "--key-ring",
        default=os.environ.get("SLTS_KEY_RING") or None,
        metavar="FOLDER",
        help="the key ring of an encrypted store (docs/security.md; default: $SLTS_KEY_RING)",
    )
    common.add_argument("--container", type=non_negative, default=0, help="container id (default 0)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="configuration file (default: $SLTS_CONFIG, else slts.toml in the store's folder)",
    )
    common.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a configuration field, over the file and $SLTS_<FIELD> (docs/config.md)",
    )
    common.add_argument(
        "--log-level", choices=LEVELS, default="warning", help="log records at this level and above (stderr)"
    )
    common.add_argument(
        "--log-format", choices=FORMATS, default="text", help="text lines, or one JSON object per line"
    )

    parser = argparse.ArgumentParser(prog="slts", description="SLTS: tier-2 storage for stream engines")
    parser.add_argument(
        "--version", action=_VersionAction, help="print the installed version of slts and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, parents=[common], help=help_text, description=func.__doc__)
        command.set_defaults(func=func)
        return command

    put = add("put", cmd_put, "append a file or stdin to a segment")
    put.add_argument("name")
    put.add_argument("file", nargs="?", default="-", help="input file, or - for stdin (default)")
    put.add_argument("--write-bytes", type=positive, default=IO_BYTES, help="bytes per write")

    cat = add("cat", cmd_cat, "write a segment to stdout")
    cat.add_argument("name")
    cat.add_argument("--offset", type=non_negative, default=None)
    cat.add_argument("--length", type=non_negative, default=None)

    ls = add("ls", cmd_ls, "list segments")
    ls.add_argument("prefix", nargs="?", default="")
    ls.add_argument("--long", "-l", action="store_true")

    for name, func, help_text in (
        ("info", cmd_info, "show a segment's metadata"),
        ("seal", cmd_seal, "seal a segment"),
        ("rm", cmd_rm, "delete a segment"),
    ):
        add(name, func, help_text).add_argument("name")

    concat = add("concat", cmd_concat, "append a sealed segment to another")
    concat.add_argument("target")
    concat.add_argument("source")
    concat.add_argument(
        "--offset", type=non_negative, default=None, help="expected target length (default: current)"
    )

    truncate = add("truncate", cmd_truncate, "drop a segment's bytes below an offset")
    truncate.add_argument("name")
    truncate.add_argument("offset", type=non_negative)

    defrag = add(
        "defrag", cmd_defrag, "merge small consecutive chunks (a batch beside the owner; --spark on Spark)"
    )
    defrag.add_argument("name", nargs="?", default=None)
    defrag.add_argument("--all", action="store_true", help="every segment (with --prefix: those under it)")
    defrag.add_argument("--prefix", default="", help="with --all: only segments starting with this")
    defrag.add_argument("--threads", type=positive, default=4, help="in process: builder threads (default 4)")
    defrag.add_argument(
        "--batch-runs",
        type=positive,
        default=BATCH_RUNS_DEFAULT,
        help=f"runs planned, built and committed per batch (default {BATCH_RUNS_DEFAULT})",
    )
    defrag.add_argument(
        "--batch-bytes",
        type=positive,
        default=BATCH_BYTES_DEFAULT,
        help=f"bytes of runs per batch (default {BATCH_BYTES_DEFAULT}); a batch's GC intents "
        "are leased for defrag_batch_lease_s (SLTS_DEFRAG_BATCH_LEASE_S), renewed "
        "while it builds",
    )
    defrag.add_argument("--spark", action="store_true", help="build the chunks on Spark executors")
    defrag.add_argument("--master", default=None, help="with --spark: the Spark master (default local[*])")
    defrag.add_argument(
        "--partitions",
        type=positive,
        default=None,
        help="with --spark: partitions per batch (default: 4 x the default parallelism)",
    )

    gc = add("gc", cmd_gc, "collect garbage chunks that are due")
    gc.add_argument("--passes-max", type=positive, default=1000, help="bound on passes (default 1000)")
    gc.add_argument("--orphans", action="store_true", help="first queue chunks nothing references")
    gc.add_argument("--dry-run", action="store_true", help="with --orphans: only list them")

    verify = add("verify", cmd_verify, "check every invariant of the stored segments")
    verify.add_argument("prefix", nargs="?", default="", help="only segments starting with this")
    verify.add_argument("--checksums", action="store_true", help="also read every chunk and check its CRC32C")

    scrub = add("scrub", cmd_scrub, "re-read every chunk and check it against the metadata")
    scrub.add_argument("prefix", nargs="?", default="", help="only segments starting with this")
    scrub.add_argument("--from", dest="start_at", default=None, metavar="NAME", help="start at this segment")
    scrub.add_argument("--max-chunks", type=positive, default=None, metavar="N", help="stop after about N")
    scrub.add_argument("--spark", action="store_true", help="read and check the chunks on Spark executors")
    scrub.add_argument("--master", default=None, help="with --spark: the Spark master (default local[*])")
    scrub.add_argument("--partitions", type=positive, default=None, help="with --spark: partitions per batch")

    add("cost", cmd_cost, "requests, bytes moved and stored, priced (defaults: the store's list prices)")

    add("snapshot", cmd_snapshot, "take a metadata snapshot on tier-2 now")

    restore = add("restore", cmd_restore, "rebuild the metadata from tier-2 alone into a new folder")
    restore.add_argument(
        "--from",
        dest="source",
        default=None,
        help="store folder or chunk storage URL to restore from (default: --store)",
    )
    restore.add_argument(
        "--to", dest="target", required=True, help="new LMDB metadata folder (absent or empty)"
    )

    journal = add("journal", cmd_journal, "inspect the system journal, snapshots and checkpoints")
    journal.add_argument("action", choices=("show",))
    journal.add_argument("--records", action="store_true", help="also list every replayed record")

    export = add("export", cmd_export, "export a segment's metadata (or a RollingStorage header)")
    export.add_argument("name")
    export.add_argument("file", nargs="?", default="-", help="output file, or - for stdout (default)")
    export.add_argument("--format", choices=("slts", "rolling"), default="slts")
    export.add_argument("--replace", action="store_true", help="with --format rolling: overwrite the header")

    import_ = add("import", cmd_import, "create a segment from an export (or a RollingStorage header)")
    import_.add_argument("file", nargs="?", default="-", help="export file, or - for stdin (default)")
    import_.add_argument("--name", default=None, help="segment name (default: the exported one)")
    import_.add_argument("--format", choices=("slts", "rolling"), default="slts")

    demo = add("demo", cmd_demo, "ingest, read back and verify many segments on the embedded default")
    demo.add_argument("--dir", default="slts-demo", help="demo folder (recreated; default ./slts-demo)")
    demo.add_argument("--segments", type=positive, default=64)
    demo.add_argument("--writes", type=positive, default=200, help="small writes per segment")
    demo.add_argument("--keep", action="store_true", help="keep the demo folder afterwards")
    demo.add_argument(
        "--kafka", action="store_true", help="only the tiered Kafka log part (KIP-405, slts.remote)"
    )
    bench = add(
        "bench", cmd_bench, "measure SLTS next to raw baselines of the same work (--store s3://...: on S3)"
    )
    bench.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    bench.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run only these benchmarks")
    bench.add_argument("--dir", default=None, help="scratch folder on the disk to measure (default: cwd)")
    bench.add_argument("--json-file", default=None, metavar="FILE", help="also write the figures as JSON")
    bench.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help="also write one self-contained HTML page: per figure SLTS and baseline bars with min-max "
        "whiskers, the ratio and the goal (met / missed)",
    )
    bench.add_argument(
        "--from-json",
        default=None,
        metavar="FILE",
        help="run nothing: read a report --json-file wrote and draw it again (with --html OUT)",
    )
    simulate = add(
        "simulate", cmd_simulate, "random programs under faults against a model (--seed N: replay one)"
    )
    simulate.add_argument("--seeds", type=positive, default=100, help="seeds to run (default 100)")
    simulate.add_argument(
        "--first-seed", type=non_negative, default=0, help="first seed of the soak (default 0)"
    )
    simulate.add_argument("--ops", type=positive, default=500, help="steps per seed (default 500)")
    simulate.add_argument(
        "--seed", type=non_negative, default=None, help="replay this seed, print its program"
    )
    simulate.add_argument("--no-shrink", action="store_true", help="with --seed: print the program unshrunk")
    simulate.add_argument("--by-kind", action="store_true", help="also list the seeds of each violation kind")
    simulate.add_argument("--ignore", nargs="+", default=[], metavar="KIND", help="count these kinds, go on")
    simulate.add_argument("--jobs", type=positive, default=1, help="seeds run side by side (default 1)")

    remote_cli.register(sub, common)
    offload_cli.register(sub, common)
    config_cli.register(sub, common)
    keys_cli.register(sub, common)
    metrics_cli.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``slts`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = configure_logging(args.log_level, args.log_format)
    try:
        return args.func(args)
    except SltsError as error:
        print(f"slts {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return exit_code(error)
    except BrokenPipeError:
        return EXIT_OK
    except OSError as error:  # a file named on the command line (SLTS's own I/O raises SltsError)
        where = f" {error.filename!r}" if error.filename else ""
        print(f"slts {args.command}: cannot use{where}: {error.strerror or error}", file=sys.stderr)
        return EXIT_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_FILE
    finally:  # called in process (tests, embedding): leave the logger tree as it was
        logging.getLogger(LOGGER_NAME).removeHandler(handler)
        logging.getLogger(LOGGER_NAME).setLevel(logging.NOTSET)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
