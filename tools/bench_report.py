"""The report of a ``slts bench`` run and its formats: the figures, the failures and the
run's context (``Report``); the text table ``slts bench`` prints, each figure with its
goal's verdict (``table_row``); and the machine format, JSON (``to_json``), read back with
every field checked (``read_json``: what ``slts bench --from-json`` renders).

The JSON document: ``figures`` (each a ``Figure``: medians, min-max, ratio, the ratio's
range over the alternated pairs, repetitions, the work measured), ``failures`` (each
``name``, ``error`` in one line, ``detail`` with the traceback) and ``run`` (a
``RunContext``, or null). Readers ignore keys they do not know, and a figure's fields
added since a file was written (the pairs) read back as None.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

from slts.tools.benchmarks import goals
from slts.tools.benchmarks.base import Figure

from slts.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Failure:
    """A benchmark that raised: its name, the error in one line, and the traceback."""

    name: str
    error: str
    detail: str


@dataclass(frozen=True, slots=True)
class RunContext:
    """Where and when a run measured: its start (UTC, ISO 8601), the commit of the code
    (``git rev-parse HEAD``, ``-dirty`` added when tracked files differ from it; ``unknown``
    outside a git checkout), the machine (CPU count, CPU model, platform, Python) and
    whether it was a ``--quick`` run."""

    date: str
    commit: str
    cpus: int | None
    cpu_model: str
    platform: str
    python: str
    quick: bool


@dataclass(slots=True)
class Report:
    """What a run measured (``figures``) and which benchmarks failed (``failures``), in
    the order they ran (filled in as the run goes), and where it ran (``context``; None
    for a report read from a JSON file written before the context was recorded)."""

    figures: list[Figure]
    failures: list[Failure]
    context: RunContext | None = None


TABLE_HEADER = (
    f"{'benchmark':<17} {'unit':<9} {'SLTS median':>12} {'(min-max)':>21} {'baseline median':>16} "
    f"{'(min-max)':>21} {'ratio':>6} {'(pairs)':>11} goal"
)

#: The goal column's word for each verdict (docs/benchmarks.md).
_TABLE_VERDICT = {
    goals.Verdict.MET: "met",
    goals.Verdict.MISSED: "missed",
    goals.Verdict.UNJUDGED: "unjudged",
    goals.Verdict.NO_GOAL: "-",
}


def table_row(figure: Figure, verdict: goals.Verdict) -> str:
    """A figure's line of the text table (under ``TABLE_HEADER``), ending in its goal's
    verdict: ``met``, ``missed``, ``unjudged`` (its reference figure did not run) or ``-``."""
    return (
        f"{figure.name:<17} {figure.unit:<9} {figure.subject_median:>12.1f} "
        f"{f'({figure.subject_min:.1f}-{figure.subject_max:.1f})':>21} {figure.baseline_median:>16.1f} "
        f"{f'({figure.baseline_min:.1f}-{figure.baseline_max:.1f})':>21} {figure.ratio:>6.2f} "
        f"{_pairs(figure):>11} {_TABLE_VERDICT[verdict]}"
    )


def _pairs(figure: Figure) -> str:
    """The ratio's range over the run's alternated pairs, e.g. ``(0.72-0.86)``; ``-`` for a
    figure from a report that did not record it."""
    if figure.pair_ratio_min is None or figure.pair_ratio_max is None:
        return "-"
    return f"({figure.pair_ratio_min:.2f}-{figure.pair_ratio_max:.2f})"


def table_failure(failure: Failure) -> str:
    """A failed benchmark's line of the text table."""
    return f"{failure.name:<17} FAILED: {failure.error}"


def print_table(report: Report, out: Callable[[str], None] = print) -> None:
    """The text table of a finished ``report`` (as ``run`` prints it while it goes: the
    figures in order, then the failures)."""
    out(TABLE_HEADER)
    for figure in report.figures:
        out(table_row(figure, goals.verdict(figure, report.figures)))
    for failure in report.failures:
        out(table_failure(failure))


def run_context(quick: bool) -> RunContext:
    """The context of a run starting now (``RunContext``)."""
    return RunContext(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        commit=_commit(),
        cpus=os.cpu_count(),
        cpu_model=_cpu_model(),
        platform=platform.platform(),
        python=platform.python_version(),
        quick=quick,
    )


def _commit() -> str:
    """``git rev-parse HEAD`` of the checkout this module runs from, ``-dirty`` added when
    tracked files differ from it; ``unknown`` where git or the checkout is not there."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--"], cwd=here, capture_output=True, timeout=10, check=False
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return f"{head}-dirty" if changed == 1 else head


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows, else
    ``unknown``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass  # not Linux: what the platform module says
    return platform.processor() or "unknown"


def to_json(report: Report) -> str:
    """The report as a JSON document (``--json-file FILE``): ``figures``, ``failures`` and
    ``run`` (the ``RunContext``, or null)."""
    return json.dumps(
        {
            "figures": [asdict(figure) for figure in report.figures],
            "failures": [asdict(failure) for failure in report.failures],
            "run": asdict(report.context) if report.context is not None else None,
        },
        indent=2,
        sort_keys=True,
    )


def read_json(path: str) -> Report:
    """The report a JSON file written by ``to_json`` holds. ``InvalidArgument`` naming the
    file and what is wrong for a file that is missing, unreadable, not UTF-8 JSON, or not
    of that shape (a missing or mistyped field, a number that is not finite); keys it does
    not know are ignored, and ``run`` may be absent (files from before it existed)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise InvalidArgument(f"cannot read the JSON report {path!r}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"the JSON report {path!r} is not UTF-8 text: {exc.reason}") from exc
    try:
        return from_json(text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"the JSON report {path!r} is malformed: {exc}") from exc


def from_json(text: str) -> Report:
    """The report ``text`` (a ``to_json`` document) holds; ``InvalidArgument`` naming the
    first thing wrong with it (``read_json``)."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from exc
    except (ValueError, RecursionError) as exc:  # an integer of too many digits; nesting too deep
        raise InvalidArgument(f"not JSON this tool reads: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidArgument(f"expected a JSON object at the top, got {_kind(document)}")
    figures = [_record(Figure, item, f"figures[{i}]") for i, item in enumerate(_list(document, "figures"))]
    failures = [
        _record(Failure, item, f"failures[{i}]") for i, item in enumerate(_list(document, "failures"))
    ]
    run = document.get("run")
    context = None if run is None else _record(RunContext, run, "run")
    for i, figure in enumerate(figures):
        if figure.repetitions < 1:
            raise InvalidArgument(f"figures[{i}].repetitions: expected >= 1, got {figure.repetitions}")
    return Report(figures, failures, context)


_Record = typing.TypeVar("_Record", Figure, Failure, RunContext)


def _record(kind: type[_Record], value: object, where: str) -> _Record:
    """``kind`` built from the JSON object ``value`` (at ``where`` in the document), each
    field checked against its annotation (str, int, float, bool, or one of them | None)."""
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where}: expected an object, got {_kind(value)}")
    hints = typing.get_type_hints(kind)
    values: dict[str, Any] = {}
    for field in fields(kind):
        if field.name not in value:
            if field.default is not MISSING:  # a field added since the file was written
                continue
            raise InvalidArgument(f"{where}: the field {field.name!r} is missing")
        values[field.name] = _typed(value[field.name], hints[field.name], f"{where}.{field.name}")
    return kind(**values)


def _typed(value: object, hint: object, where: str) -> object:
    """``value`` if it is of type ``hint`` (a float: a finite number >= 0, as every figure
    is), else ``InvalidArgument`` naming ``where``."""
    if isinstance(hint, types.UnionType):
        if value is None and type(None) in hint.__args__:
            return None
        (hint,) = [arg for arg in hint.__args__ if arg is not type(None)]
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float
            number = math.inf
        if not (math.isfinite(number) and number >= 0):
            raise InvalidArgument(f"{where}: expected a finite number >= 0, got {value}")
        return number
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        assert hint in (str, float), (where, hint)
        ok = isinstance(value, str) and hint is str
    if not ok:
        raise InvalidArgument(f"{where}: expected {_KIND_NAMES[hint]}, got {_kind(value)}")
    return value


_KIND_NAMES: Mapping[object, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a finite number >= 0",
    str: "a string",
}


def _list(document: Mapping[str, Any], key: str) -> list[Any]:
    if key not in document:
        raise InvalidArgument(f"the key {key!r} is missing")
    value = document[key]
    if not isinstance(value, list):
        raise InvalidArgument(f"{key}: expected a list, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
