"""Child process of ``test_live_writer.py``: the container's live owner while a Spark
defrag batch runs beside it.

Run as ``python live_writer.py FOLDER STOP_FILE``. It starts the container in FOLDER
(filesystem binding + LMDB, the next epoch), with a background GC that deletes what
the batch replaced ``gc_delay_s`` after (so its reads meet a layout its cache has not
seen, and chunks that are gone). The delay must exceed a batch's duration: see
``test_findings.py``. Until STOP_FILE exists it appends ``pieces.piece`` writes to
every segment in turn, creates a new segment every ``CREATE_EVERY`` writes (which joins
the rotation), and every ``READ_EVERY`` writes reads one segment back whole. Then it
reads every segment back, compares, and exits 0.

Lines on stdout, one flushed line each:

* ``READY <epoch> <segments>`` once the instance has started;
* ``ACK create SEG`` and ``ACK write SEG END`` after the call returned;
* ``BADREAD SEG`` for a read that did not return what was written;
* ``GC <deleted>`` whenever its GC's count of deleted chunks grew;
* ``FENCED <error>`` (exit 3) or ``ERROR <type> <error>`` (exit 4) if a call raised;
* ``DONE <json>`` last: epochs at start and end, fenced, writes, creates, bad reads.
"""

from __future__ import annotations

import json
import os
import sys

from pieces import expected, piece

CREATE_EVERY = 40
READ_EVERY = 25
#: GC passes of a few entries, so that its count of deleted chunks moves often.
CONFIG = {"gc_delay_s": 5.0, "gc_interval_s": 0.5, "gc_batch_max": 20}


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def read_whole(storage, name: str, length: int) -> bool:
    info = storage.info(name)
    data = storage.read(storage.open_read(name), 0, length) if length else b""
    return info.length == length and data == expected(name, length)


def main(folder: str, stop_file: str) -> int:
    import slts
    from slts.errors import Fenced, SltsError

    storage = slts.open(f"file://{folder}/chunks", metadata=f"{folder}/metadata", **CONFIG)
    epoch = storage.epoch
    lengths = {name: storage.info(name).length for name in storage.list()}
    rotation = sorted(lengths)
    say(f"READY {epoch} {len(rotation)}")
    writes = creates = deleted = 0
    bad: list[str] = []
    try:
        while not os.path.exists(stop_file):
            if storage.gc.statistics().chunks_deleted != deleted:
                deleted = storage.gc.statistics().chunks_deleted
                say(f"GC {deleted}")
            name = rotation[writes % len(rotation)]
            data = piece(name, lengths[name])
            storage.write(storage.open_write(name), lengths[name], data)
            lengths[name] += len(data)
            writes += 1
            say(f"ACK write {name} {lengths[name]}")
            if writes % CREATE_EVERY == 0:
                created = f"live-new/{creates:04d}"
                storage.create(created)
                creates += 1
                lengths[created] = 0
                rotation.append(created)
                say(f"ACK create {created}")
            if writes % READ_EVERY == 0:
                probe = rotation[(writes * 7) % len(rotation)]
                if not read_whole(storage, probe, lengths[probe]):
                    bad.append(probe)
                    say(f"BADREAD {probe}")
        for name in sorted(lengths):  # every segment, after the batch: the owner's own reads
            if not read_whole(storage, name, lengths[name]):
                bad.append(name)
                say(f"BADREAD {name}")
    except Fenced as exc:
        say(f"FENCED {exc}")
        return 3
    except SltsError as exc:
        say(f"ERROR {type(exc).__name__} {exc}")
        return 4
    fenced = storage._ownership.fenced
    say(
        "DONE "
        + json.dumps(
            {
                "epoch": epoch,
                "epoch_end": storage.epoch,
                "fenced": fenced,
                "writes": writes,
                "creates": creates,
                "bad": bad,
                "segments": len(lengths),
                "gc_deleted": storage.gc.statistics().chunks_deleted,
            }
        )
    )
    storage.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
