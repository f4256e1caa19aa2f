"""Regression tests: damage anywhere in the metadata file (``data.mdb``), not only a
truncation, never kills ``slts`` or a library process (issue 25). Each damaged store is
looked at by ``slts ls``, ``slts info``, ``slts cat`` (the installed script, in a process
of its own) and by ``slts.open`` in a child process: each must end with the documented
damaged-metadata exit code (10) or ``MetadataCorrupted``, never by a signal."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from slts.tools import command_line

from slts.errors import MetadataCorrupted
from slts.metadata.lmdb_file import walk_in_child
from tests.metadata import lmdb_damage

SCRIPT = os.path.join(os.path.dirname(sys.executable), "slts")
#: ``slts.open`` in a child: exit 3 and the message on ``MetadataCorrupted``, 0 if it opened.
OPEN = (
    "import sys, slts\n"
    "from slts.errors import MetadataCorrupted\n"
    "try:\n"
    "    slts.open('file://' + sys.argv[1] + '/chunks', metadata=sys.argv[1] + '/metadata').close()\n"
    "except MetadataCorrupted as exc:\n"
    "    print(exc); sys.exit(3)\n"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("engine")
    lmdb_damage.engine_store(root)
    return root


def looks(root: Path, segment: str) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every way of looking at the store, each in a process of its own."""
    store = ["--store", str(root)]
    runs = {
        " ".join(argv): subprocess.run(
            [SCRIPT, *argv, *store], capture_output=True, text=True, errors="replace", timeout=300
        )
        for argv in (["ls", "-l"], ["info", segment], ["cat", segment])
    }
    runs["slts.open"] = subprocess.run(
        [sys.executable, "-c", OPEN, str(root)], capture_output=True, text=True, timeout=300
    )
    return runs


def assert_refused(runs: dict[str, subprocess.CompletedProcess[str]]) -> None:
    for name, run in runs.items():
        assert run.returncode >= 0, f"{name} died of signal {-run.returncode}: {run.stderr[-500:]}"
    for name, run in runs.items():
        if name == "slts.open":
            assert run.returncode == 3 and "slts restore" in run.stdout, (run.returncode, run.stderr[-2000:])
        else:
            assert run.returncode == command_line.EXIT_CORRUPT, (name, run.returncode, run.stderr[-2000:])
            assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
            assert "MetadataCorrupted" in run.stderr and "slts restore" in run.stderr, run.stderr


def _leaf_past_the_file(root: Path) -> str:
    lmdb_damage.compact(root)  # the segments table's pages end the file
    return lmdb_damage.break_last_leaf(root, b"segments")[-1]


def _branch_past_the_last_page(root: Path) -> str:
    lmdb_damage.break_branch(root, b"segments")
    return "s7"


def _free_list(root: Path) -> str:
    lmdb_damage.break_free_list(root)
    return "s7"


DAMAGE: dict[str, Callable[[Path], str]] = {
    "leaf-nodes-past-the-end-of-the-file": _leaf_past_the_file,  # SIGBUS before the check
    "branch-past-the-last-page": _branch_past_the_last_page,
    "free-page-list": _free_list,
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_metadata_is_refused_never_a_crash(engine: Path, tmp_path: Path, kind: str) -> None:
    root = tmp_path / "store"
    shutil.copytree(engine, root)
    segment = DAMAGE[kind](root)
    assert_refused(looks(root, segment))


def test_flipped_bytes_in_later_pages_never_kill_a_command(engine: Path, tmp_path: Path) -> None:
    """Random bytes of a later leaf page flipped (page and positions by seed; odd seeds
    in its header and node pointers): what the check finds is refused by every command;
    what it cannot see (bytes inside keys or values: LMDB keeps no checksum) leaves every
    command standing: exit 0, 10 when a record's own codec objects, 3 when a key changed."""
    found = 0
    for seed in range(1, 7):
        root = tmp_path / f"store-{seed}"
        shutil.copytree(engine, root)
        lmdb_damage.flip_later_pages(root, seed)
        try:
            walk_in_child(str(root / "metadata"))
        except MetadataCorrupted:
            found += 1
            assert_refused(looks(root, "s7"))
            continue
        for name, run in looks(root, "s7").items():
            assert run.returncode >= 0, f"seed {seed}: {name} died of signal {-run.returncode}"
            assert run.returncode in (0, command_line.EXIT_CORRUPT, 3), (
                seed,
                name,
                run.returncode,
                run.stderr[-2000:],
            )
    assert found >= 3, "flipped page headers are damage the check finds"


def test_verify_walks_the_whole_file_even_when_the_record_trusts_it(engine: Path, tmp_path: Path) -> None:
    """Bit rot: the free-page list damaged in place, size and modification time kept.
    Opens trust the recorded state (restart time stays independent of the file's size);
    ``slts verify`` walks the whole file all the same and reports the damage."""
    root = tmp_path / "store"
    shutil.copytree(engine, root)
    assert subprocess.run([SCRIPT, "ls", "--store", str(root)], capture_output=True).returncode == 0
    data = lmdb_damage.data_file(root)
    before = data.stat()
    lmdb_damage.break_free_list(root)
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    result = subprocess.run(
        [SCRIPT, "verify", "--store", str(root)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == command_line.EXIT_CORRUPT, result.stderr[-2000:]
    assert "free-list record frees a page outside" in result.stderr and "slts restore" in result.stderr
