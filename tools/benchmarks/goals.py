"""Each benchmark's goal, as data: what a figure of ``slts bench`` must reach, and whether
it did (``verdict``).

Three kinds of goal, each judged on the figure's medians:

* ``Ratio``: the same-run ratio (subject median / baseline median) at least ``bound``;
  with ``at_most``, at most ``bound`` (a figure whose value is better lower, e.g. stored
  bytes over logical bytes).
* ``Subject``: the subject's median itself, in ``unit``, at least (or at most) ``bound``
  (``journal_boot`` >= 100 boots/s, whatever the baseline does).
* ``Relative``: the subject's median no worse than another figure's subject median
  divided by ``slower_max`` (e.g. at most 1.5x slower than another figure of the run;
  where one benchmark can time both sides alternately, a ``Ratio`` of them says it with
  less noise, as ``concat_100k`` does).

``GOALS`` holds the goals in force: issue 29's table, and for the other figures the most
recent goal docs/benchmarks.md states for them (its ``goal`` and ``target`` columns, and
the metrics scrape's "Goal: within 2x"); each names where it comes from.

Invariants (asserted when a goal is made, and by tests/cli/test_bench_html.py):

* every bound is a finite number > 0, every factor > 1;
* a ``Relative`` goal names a figure other than its own, of the same unit;
* every goal of ``GOALS`` names a benchmark of the registry (``slts.tools.bench``), and an
  ``at_most`` ratio only a benchmark that ``measures="value"`` (a rate is better higher).

A goal whose figure lacks what it needs (its reference figure did not run, or the figure's
unit is not the goal's) is ``UNJUDGED``, never met or missed by default.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slts.tools.benchmarks.base import Figure


class Verdict(enum.Enum):
    """How a figure stands against its goal (the value is its text mark)."""

    MET = "met"
    MISSED = "missed"
    UNJUDGED = "unjudged"  # the goal needs what this report lacks (a reference figure, the unit)
    NO_GOAL = "no goal"


def _reaches(value: float, bound: float, at_most: bool) -> Verdict:
    if not (math.isfinite(value) and math.isfinite(bound)):
        return Verdict.UNJUDGED
    return Verdict.MET if (value <= bound if at_most else value >= bound) else Verdict.MISSED


def _sign(at_most: bool) -> str:
    return "<=" if at_most else ">="


@dataclass(frozen=True, slots=True)
class Ratio:
    """Subject median / baseline median (the figure's ``ratio``) at least ``bound``, or at
    most with ``at_most``. ``note`` says what the bound means where the ratio alone does not."""

    bound: float
    source: str
    at_most: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        assert math.isfinite(self.bound) and self.bound > 0, self

    def describe(self) -> str:
        """The goal in one line, e.g. ``ratio >= 0.3 (issue 29)``."""
        note = f"; {self.note}" if self.note else ""
        return f"ratio {_sign(self.at_most)} {self.bound:.3g} ({self.source}{note})"

    def threshold(self, figure: Figure, figures: Mapping[str, Figure]) -> float | None:
        """The subject median that meets the goal exactly (where a chart draws the goal line)."""
        return figure.baseline_median * self.bound

    def judge(self, figure: Figure, figures: Mapping[str, Figure]) -> Verdict:
        """Met or missed by ``figure``'s ratio."""
        return _reaches(figure.ratio, self.bound, self.at_most)


@dataclass(frozen=True, slots=True)
class Subject:
    """The subject's median, in ``unit``, at least ``bound`` (at most with ``at_most``)."""

    bound: float
    unit: str
    source: str
    at_most: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        assert math.isfinite(self.bound) and self.bound > 0 and self.unit, self

    def describe(self) -> str:
        """The goal in one line, e.g. ``SLTS >= 100 boots/s (issue 29)``."""
        note = f"; {self.note}" if self.note else ""
        return f"SLTS {_sign(self.at_most)} {self.bound:g} {self.unit} ({self.source}{note})"

    def threshold(self, figure: Figure, figures: Mapping[str, Figure]) -> float | None:
        """``bound``, where the figure is in the goal's unit (else None: not comparable)."""
        return self.bound if figure.unit == self.unit else None

    def judge(self, figure: Figure, figures: Mapping[str, Figure]) -> Verdict:
        """Met or missed by the subject's median; ``UNJUDGED`` in another unit."""
        if figure.unit != self.unit:
            return Verdict.UNJUDGED
        return _reaches(figure.subject_median, self.bound, self.at_most)


@dataclass(frozen=True, slots=True)
class Relative:
    """The subject's median at least the ``reference`` figure's subject median divided by
    ``slower_max``: at most ``slower_max`` times slower than it (both rates, one unit)."""

    reference: str
    slower_max: float
    source: str
    note: str = ""

    def __post_init__(self) -> None:
        assert self.reference and math.isfinite(self.slower_max) and self.slower_max > 1, self

    def describe(self) -> str:
        """The goal in one line, e.g. ``<= 1.5x slower than concat_10 (issue 29)``."""
        note = f"; {self.note}" if self.note else ""
        return f"<= {self.slower_max:g}x slower than {self.reference} ({self.source}{note})"

    def threshold(self, figure: Figure, figures: Mapping[str, Figure]) -> float | None:
        """The reference's subject median / ``slower_max``; None without the reference
        (or in another unit)."""
        reference = figures.get(self.reference)
        if reference is None or reference.unit != figure.unit or reference.name == figure.name:
            return None
        return reference.subject_median / self.slower_max

    def judge(self, figure: Figure, figures: Mapping[str, Figure]) -> Verdict:
        """Met or missed against the reference of the same report; ``UNJUDGED`` without it."""
        threshold = self.threshold(figure, figures)
        if threshold is None:
            return Verdict.UNJUDGED
        return _reaches(figure.subject_median, threshold, at_most=False)


Goal = Ratio | Subject | Relative

_ISSUE_30 = "issue 30"
_ISSUE_29 = "issue 29"
_ISSUE_28 = "issue 28"
_ISSUE_27 = "issue 27"
_ISSUE_17 = "issue 17"

#: Benchmark name -> the goal in force. Issue 29 first; then, for the figures issue 29 does
#: not name, the most recent goal docs/benchmarks.md gives them (by issue, or by the date of
#: its section where it names none).
GOALS: dict[str, Goal] = {
    # Issue 29 (docs/benchmarks.md, "Full run, 2026-11-27": its rows are marked).
    "read_random_10": Ratio(0.30, _ISSUE_29),
    "read_random_1k": Ratio(0.30, _ISSUE_29),
    "read_random_100k": Ratio(0.30, _ISSUE_29),
    "truncate": Ratio(0.20, _ISSUE_29),
    "gc": Ratio(0.50, _ISSUE_29, note="vs. synced files unlinked on as many threads"),
    "restore_100k": Ratio(0.50, _ISSUE_29),
    "journal_boot": Subject(100.0, "boots/s", _ISSUE_29),
    "journal_replay": Ratio(0.20, _ISSUE_29),
    "remote_fetch_first": Ratio(0.30, _ISSUE_29),
    "read_seq_verified": Ratio(0.70, _ISSUE_29),
    "write_4k_x8": Ratio(0.35, _ISSUE_29),
    "concat_100k": Ratio(1 / 1.5, _ISSUE_29, note="at most 1.5x slower than a 10-chunk concat"),
    # Issue 29's chunk cache (only with --store s3://...).
    "s3_cache_reread": Ratio(0.80, _ISSUE_29, note="of pread from a local file"),
    "s3_cache_first_read": Ratio(1.0, _ISSUE_29, note="no slower than without the cache"),
    # The cache's scan resistance (docs/benchmarks.md, thirteenth session): a regression line.
    "s3_cache_reread_after_scan": Ratio(0.9, _ISSUE_29, note="a scan evicts none of the working set"),
    # Issue 30, the Azure and GCS bindings (only with --store azure://... or gs://...): each
    # at 0.85 of its raw client on the same server for 8 MiB writes and sequential reads.
    "azure_write_8m": Ratio(0.85, _ISSUE_30, note="of the raw client"),
    "azure_read_seq": Ratio(0.85, _ISSUE_30, note="of the raw client"),
    "gcs_write_8m": Ratio(0.85, _ISSUE_30, note="of the raw client"),
    "gcs_read_seq": Ratio(0.85, _ISSUE_30, note="of the raw client"),
    # Issue 28, client-side transforms.
    "encrypt_write_1m": Ratio(0.85, _ISSUE_28),
    "encrypt_read_seq": Ratio(0.80, _ISSUE_28),
    "encrypt_read_random_4k": Ratio(0.80, _ISSUE_28),
    "zstd_json": Ratio(0.35, _ISSUE_28, at_most=True, note="stored over logical bytes"),
    "encrypt_defrag_native": Ratio(1.0, _ISSUE_28, note="no byte through the client"),
    # Issue 27, the offload read handles and the streaming offloader.
    "offload_read_64k": Ratio(0.60, _ISSUE_27),
    "offload_read_1k": Ratio(0.30, _ISSUE_27),
    "offload_stream_1k": Ratio(0.80, _ISSUE_27),
    # Issue 26, the Kafka-exact copy task ("Tiered Kafka logs").
    "remote_copy": Ratio(0.85, "issue 26"),
    # Issue 25, the metrics scrape ("Metrics scrapes": "Goal: within 2x").
    "metrics_scrape_1m": Ratio(2.0, "issue 25", at_most=True, note="within 2x of 1,000 segments"),
    # Issue 17 (docs/benchmarks.md, "Latest full runs", 2026-11-26), not restated since.
    "write_4k": Ratio(0.45, _ISSUE_17),
    "write_1m": Ratio(0.85, _ISSUE_17),
    "write_8m": Ratio(0.95, _ISSUE_17),
    "write_flush_mix": Ratio(0.80, _ISSUE_17),
    "read_seq": Ratio(0.90, _ISSUE_17),
    "rss_1m": Subject(300.0, "MB (lower)", _ISSUE_17, at_most=True),
    "s3_write_64k": Ratio(0.90, _ISSUE_17),
    "s3_read_seq": Ratio(1.5, _ISSUE_17, note="vs. sequential GETs"),
    "s3_read_seq_parallel": Ratio(0.8, _ISSUE_17, note="vs. GETs on 8 threads"),
    # "The priority limiter" (2026-11-26): tail writes keep 0.9 of their rate alone.
    "limiter_tail": Ratio(0.90, "limiter, 2026-11-26", note="of the tail writes alone"),
    # "Tiered Kafka logs", the run before issue 26: 100,000 segments within 1.5x of 10.
    "remote_lookup_100k": Ratio(1 / 1.5, "tiered logs", note="within 1.5x of 10 segments"),
    # "Pulsar-style offload" (2026-11-25): the write goals, not restated by issue 27.
    "offload_write_64k": Ratio(0.90, "offload, 2026-11-25"),
    "offload_write_1k": Ratio(0.90, "offload, 2026-11-25"),
}


def verdict(figure: Figure, figures: Iterable[Figure], goals: Mapping[str, Goal] = GOALS) -> Verdict:
    """How ``figure`` stands against its goal in ``goals``, the other ``figures`` of its
    report at hand for a ``Relative`` goal; ``NO_GOAL`` for a figure without one."""
    goal = goals.get(figure.name)
    if goal is None:
        return Verdict.NO_GOAL
    return goal.judge(figure, by_name(figures))


def by_name(figures: Iterable[Figure]) -> dict[str, Figure]:
    """Figures by name (the first of a name wins: a report holds each name once)."""
    named: dict[str, Figure] = {}
    for figure in figures:
        named.setdefault(figure.name, figure)
    return named


def lower_is_better(goal: Goal) -> bool:
    """Whether ``goal`` asks the SLTS median to stay at or below its threshold."""
    return isinstance(goal, Ratio | Subject) and goal.at_most
