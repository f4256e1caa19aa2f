"""``slts bench --html FILE``: a run's report drawn as one self-contained HTML page, so that
a missed goal is seen at a glance.

The page, top to bottom: a header (the run's date, commit and machine); a summary (how
many goals were met, missed, could not be judged, how many figures have none, how many
benchmarks failed, and the missed ones linked to their rows); a legend; one table row per
figure, in the report's order: its name and the work measured, its unit, a chart, the
medians in figures, the ratio (and under it, its range over the run's alternated pairs of
repetitions), and its goal with the verdict; then the failures, each
with its traceback folded.

A figure's chart: two horizontal bars on one scale from 0 (the row's own: figures have
different units), the SLTS median above the baseline median, each with a whisker from
its min to its max, and a vertical line where the goal puts the SLTS median (for a ratio
goal: the baseline median times the bound). The verdict is a colour (the row's edge, the
goal line, the mark) and a word with a sign (met, missed, unjudged, no goal), so that it
does not rest on colour alone.

Invariants:

* self-contained: no script, no external reference (stylesheet, font, image, link); the
  style is one inline ``<style>``, the charts inline SVG; the page works offline;
* every string from the report (names, units, work, errors, tracebacks, the context) is
  escaped (``html.escape``) before it reaches the page;
* one ``<tr class="figure ...">`` per figure, in the report's order.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping

from slts.tools.bench_report import Failure, Report, RunContext
from slts.tools.benchmarks import goals
from slts.tools.benchmarks.base import Figure

CHART_WIDTH_PX = 360
_BAR_HEIGHT_PX = 14
_SUBJECT_Y_PX = 6
_BASELINE_Y_PX = 26
_CHART_HEIGHT_PX = 46
_HEADROOM = 1.08  # the scale's end past the largest value drawn

#: The text mark of each verdict: a sign and a word (the colour is the style's).
_MARKS: Mapping[goals.Verdict, str] = {
    goals.Verdict.MET: "&#10003; met",
    goals.Verdict.MISSED: "&#10007; missed",
    goals.Verdict.UNJUDGED: "? unjudged",
    goals.Verdict.NO_GOAL: "&#8211; no goal",
}

#: The row class of each verdict (the style colours by it).
_CLASSES: Mapping[goals.Verdict, str] = {
    goals.Verdict.MET: "met",
    goals.Verdict.MISSED: "missed",
    goals.Verdict.UNJUDGED: "unjudged",
    goals.Verdict.NO_GOAL: "no-goal",
}

_STYLE = """
:root { --met: #1a7f37; --missed: #cf222e; --unjudged: #9a6700; --no-goal: #6e7781;
  --subject: #0969da; --baseline: #8c959f; --ink: #1f2328; --faint: #59636e; --rule: #d1d9e0; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  margin: 1.5rem; }
h1 { font-size: 1.5rem; margin: 0 0 .5rem; }
h2 { font-size: 1.15rem; margin: 1.5rem 0 .5rem; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
dl.context { display: grid; grid-template-columns: max-content auto; gap: .1rem 1rem; margin: 0 0 1rem; }
dl.context dt { color: var(--faint); }
dl.context dd { margin: 0; }
.summary { font-size: 1.05rem; margin: .5rem 0; }
.summary .count { font-weight: 600; padding: 0 .2rem; }
.count.met, .mark.met { color: var(--met); }
.count.missed, .mark.missed { color: var(--missed); }
.count.unjudged, .mark.unjudged { color: var(--unjudged); }
.count.no-goal, .mark.no-goal { color: var(--no-goal); }
.count.failed { color: var(--missed); }
ul.missed-list { margin: .25rem 0 1rem; columns: 2 32rem; }
.legend { display: flex; flex-wrap: wrap; gap: 1.25rem; align-items: center; color: var(--faint);
  margin: .5rem 0 1rem; }
.legend svg { vertical-align: middle; margin-right: .3rem; }
table { border-collapse: collapse; }
th, td { text-align: left; vertical-align: top; padding: .4rem .6rem; border-bottom: 1px solid var(--rule); }
thead th { border-bottom: 2px solid var(--ink); white-space: nowrap; }
tr.figure > td:first-child { border-left: 6px solid var(--no-goal); }
tr.figure.met > td:first-child { border-left-color: var(--met); }
tr.figure.missed > td:first-child { border-left-color: var(--missed); }
tr.figure.unjudged > td:first-child { border-left-color: var(--unjudged); }
tr.figure.missed { background: #fff5f5; }
.name { font-weight: 600; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.work { color: var(--faint); font-size: 12px; max-width: 26rem; }
.values { font-size: 12px; white-space: nowrap; }
.values .subject { color: var(--subject); }
.values .baseline { color: var(--faint); }
td.ratio { font-variant-numeric: tabular-nums; font-weight: 600; white-space: nowrap; }
div.pairs { font-weight: 400; font-size: 0.85em; }
.mark { font-weight: 700; white-space: nowrap; }
.goal-text { color: var(--faint); font-size: 12px; min-width: 11rem; max-width: 16rem; }
.scroll { overflow-x: auto; }
svg .bar.subject { fill: var(--subject); }
svg .bar.baseline { fill: var(--baseline); }
svg .whisker { stroke: var(--ink); stroke-width: 1.5; }
svg .goal { stroke-width: 2.5; stroke-dasharray: 4 2; stroke: var(--no-goal); }
svg .goal.met { stroke: var(--met); }
svg .goal.missed { stroke: var(--missed); }
svg .goal.unjudged { stroke: var(--unjudged); }
svg .axis { stroke: var(--rule); stroke-width: 1; }
pre { white-space: pre-wrap; background: #f6f8fa; padding: .5rem; max-width: 60rem; }
"""


def render(report: Report, goal_map: Mapping[str, goals.Goal] = goals.GOALS) -> str:
    """The page of ``report`` (the module's docstring), each figure judged against its
    goal in ``goal_map``. A pure function of its arguments: nothing is read or written."""
    figures = goals.by_name(report.figures)
    verdicts = [_verdict(figure, figures, goal_map) for figure in report.figures]
    title = "slts bench"
    if report.context is not None:
        title += f" {report.context.date} {_short(report.context.commit)}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_text(title)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        "<header>",
        "<h1>slts bench: SLTS next to its baselines, same run</h1>",
        _context(report.context, report.figures),
        "</header>",
        "<main>",
        _summary(report, verdicts, goal_map),
        _legend(),
        _figures(report.figures, verdicts, figures, goal_map),
        _failures(report.failures),
        "</main>",
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)


def _verdict(
    figure: Figure, figures: Mapping[str, Figure], goal_map: Mapping[str, goals.Goal]
) -> goals.Verdict:
    goal = goal_map.get(figure.name)
    return goals.Verdict.NO_GOAL if goal is None else goal.judge(figure, figures)


def _context(context: RunContext | None, figures: Iterable[Figure]) -> str:
    """The header's list: date, commit, machine, and what kind of run it was."""
    repetitions = sorted({figure.repetitions for figure in figures})
    counted = ", ".join(str(n) for n in repetitions) or "no"
    if context is None:
        rows = [("date", "unknown"), ("commit", "unknown"), ("machine", "unknown")]
        run = f"{counted} repetitions"
    else:
        cpus = "unknown" if context.cpus is None else str(context.cpus)
        machine = f"{cpus} CPUs ({context.cpu_model}), {context.platform}, Python {context.python}"
        rows = [("date", context.date), ("commit", context.commit), ("machine", machine)]
        run = f"{'--quick, ' if context.quick else ''}{counted} repetitions, subject and baseline alternating"
    rows.append(("run", run))
    items = "".join(
        f"<dt>{name}</dt><dd>{f'<code>{_text(value)}</code>' if name == 'commit' else _text(value)}</dd>"
        for name, value in rows
    )
    return f'<dl class="context">{items}</dl>'


def _summary(report: Report, verdicts: list[goals.Verdict], goal_map: Mapping[str, goals.Goal]) -> str:
    """The counts by verdict and failures, and the missed figures linked to their rows."""
    counts = {verdict: verdicts.count(verdict) for verdict in goals.Verdict}
    pieces = [
        f"{len(report.figures)} figures:",
        f'<span class="count met">{counts[goals.Verdict.MET]}</span> goals met,',
        f'<span class="count missed">{counts[goals.Verdict.MISSED]}</span> missed,',
        f'<span class="count unjudged">{counts[goals.Verdict.UNJUDGED]}</span> unjudged,',
        f'<span class="count no-goal">{counts[goals.Verdict.NO_GOAL]}</span> without a goal;',
        f'<span class="count failed">{len(report.failures)}</span> '
        f"benchmark{'' if len(report.failures) == 1 else 's'} failed.",
    ]
    summary = f'<p class="summary">{" ".join(pieces)}</p>'
    missed = [
        (index, figure)
        for index, (figure, verdict) in enumerate(zip(report.figures, verdicts, strict=True))
        if verdict is goals.Verdict.MISSED
    ]
    if missed:
        items = "".join(
            f'<li><a href="#figure-{index}">{_text(figure.name)}</a>: ratio {_ratio(figure.ratio)}, '
            f"goal {_text(goal_map[figure.name].describe())}</li>"
            for index, figure in missed
        )
        summary += f'<p class="mark missed">&#10007; Missed goals</p><ul class="missed-list">{items}</ul>'
    return summary


def _legend() -> str:
    def swatch(body: str) -> str:
        return f'<svg width="28" height="14" viewBox="0 0 28 14" aria-hidden="true">{body}</svg>'

    items = [
        (swatch('<rect class="bar subject" x="0" y="2" width="28" height="10"/>'), "SLTS median"),
        (swatch('<rect class="bar baseline" x="0" y="2" width="28" height="10"/>'), "baseline median"),
        (
            swatch(
                '<line class="whisker" x1="2" y1="7" x2="26" y2="7"/>'
                '<line class="whisker" x1="2" y1="3" x2="2" y2="11"/>'
                '<line class="whisker" x1="26" y1="3" x2="26" y2="11"/>'
            ),
            "min-max of the repetitions",
        ),
        (
            swatch('<line class="goal" x1="14" y1="0" x2="14" y2="14"/>'),
            "goal: where the SLTS median meets it (its colour: the verdict)",
        ),
    ]
    body = "".join(f"<span>{icon}{text}</span>" for icon, text in items)
    return f'<div class="legend">{body}</div>'


def _figures(
    report_figures: list[Figure],
    verdicts: list[goals.Verdict],
    figures: Mapping[str, Figure],
    goal_map: Mapping[str, goals.Goal],
) -> str:
    """The table: one row per figure."""
    head = (
        "<thead><tr><th>benchmark</th><th>unit</th><th>SLTS and baseline (median, min-max)</th>"
        "<th>ratio</th><th>goal</th></tr></thead>"
    )
    rows = "\n".join(
        _row(index, figure, verdict, figures, goal_map.get(figure.name))
        for index, (figure, verdict) in enumerate(zip(report_figures, verdicts, strict=True))
    )
    if not report_figures:
        rows = '<tr><td colspan="5">No figure: no benchmark ran to the end.</td></tr>'
    table = f'<table class="figures">{head}<tbody>\n{rows}\n</tbody></table>'
    return f'<h2>Figures</h2>\n<div class="scroll">{table}</div>'


def _row(
    index: int,
    figure: Figure,
    verdict: goals.Verdict,
    figures: Mapping[str, Figure],
    goal: goals.Goal | None,
) -> str:
    threshold = goal.threshold(figure, figures) if goal is not None else None
    css = _CLASSES[verdict]
    if goal is None:
        goal_cell = f'<span class="mark {css}">{_MARKS[verdict]}</span>'
    else:
        where = ""
        if threshold is not None and not isinstance(goal, goals.Subject):  # a Subject's says it
            sign = "&lt;=" if goals.lower_is_better(goal) else "&gt;="
            where = f"<br>SLTS median {sign} {_text(_number(threshold))}"
        goal_cell = (
            f'<span class="mark {css}">{_MARKS[verdict]}</span>'
            f'<div class="goal-text">{_text(goal.describe())}{where}</div>'
        )
    subject = _spread(figure.subject_median, figure.subject_min, figure.subject_max)
    baseline = _spread(figure.baseline_median, figure.baseline_min, figure.baseline_max)
    values = (
        f'<div class="values"><span class="subject">SLTS {_text(subject)}</span><br>'
        f'<span class="baseline">baseline {_text(baseline)}</span></div>'
    )
    return (
        f'<tr class="figure {css}" id="figure-{index}">'
        f'<td><div class="name">{_text(figure.name)}</div><div class="work">{_text(figure.work)}</div></td>'
        f"<td>{_text(figure.unit)}</td>"
        f"<td>{_chart(figure, verdict, threshold)}{values}</td>"
        f'<td class="ratio">{_ratio(figure.ratio)}{_pairs(figure)}</td>'
        f"<td>{goal_cell}</td>"
        "</tr>"
    )


def _chart(figure: Figure, verdict: goals.Verdict, threshold: float | None) -> str:
    """The row's SVG: the two bars with their whiskers on one scale, and the goal line."""
    drawn = [
        figure.subject_median,
        figure.subject_min,
        figure.subject_max,
        figure.baseline_median,
        figure.baseline_min,
        figure.baseline_max,
    ]
    if threshold is not None:
        drawn.append(threshold)
    top = max((value for value in drawn if math.isfinite(value)), default=0.0)
    scale = CHART_WIDTH_PX / (top * _HEADROOM) if top > 0 else 0.0

    def x(value: float) -> float:
        if not math.isfinite(value):
            return 0.0
        return round(min(max(value * scale, 0.0), CHART_WIDTH_PX), 1)

    parts = [f'<line class="axis" x1="0" y1="0" x2="0" y2="{_CHART_HEIGHT_PX}"/>']
    for kind, y, median, low, high in (
        ("subject", _SUBJECT_Y_PX, figure.subject_median, figure.subject_min, figure.subject_max),
        ("baseline", _BASELINE_Y_PX, figure.baseline_median, figure.baseline_min, figure.baseline_max),
    ):
        middle = y + _BAR_HEIGHT_PX / 2
        parts.append(
            f'<rect class="bar {kind}" x="0" y="{y}" width="{x(median)}" height="{_BAR_HEIGHT_PX}"/>'
            f'<line class="whisker" x1="{x(low)}" y1="{middle}" x2="{x(high)}" y2="{middle}"/>'
            f'<line class="whisker" x1="{x(low)}" y1="{middle - 4}" x2="{x(low)}" y2="{middle + 4}"/>'
            f'<line class="whisker" x1="{x(high)}" y1="{middle - 4}" x2="{x(high)}" y2="{middle + 4}"/>'
        )
    if threshold is not None:
        parts.append(
            f'<line class="goal {_CLASSES[verdict]}" x1="{x(threshold)}" y1="1" '
            f'x2="{x(threshold)}" y2="{_CHART_HEIGHT_PX - 1}"/>'
        )
    label = (
        f"SLTS {_spread(figure.subject_median, figure.subject_min, figure.subject_max)}, "
        f"baseline {_spread(figure.baseline_median, figure.baseline_min, figure.baseline_max)} {figure.unit}"
    )
    if threshold is not None:
        label += f"; goal line at {_number(threshold)}"
    return (
        f'<svg class="chart" width="{CHART_WIDTH_PX}" height="{_CHART_HEIGHT_PX}" '
        f'viewBox="0 0 {CHART_WIDTH_PX} {_CHART_HEIGHT_PX}" role="img" aria-label="{_text(label)}">'
        f"<title>{_text(label)}</title>{''.join(parts)}</svg>"
    )


def _failures(failures: list[Failure]) -> str:
    """The failed benchmarks: name, error in one line, the traceback folded."""
    if not failures:
        return '<h2 id="failures">Failures</h2><p>No benchmark failed.</p>'
    rows = "\n".join(
        f'<tr class="failure"><td><div class="name">{_text(failure.name)}</div></td>'
        f'<td><span class="mark missed">&#10007; failed</span> {_text(failure.error)}'
        f"<details><summary>traceback</summary><pre>{_text(failure.detail)}</pre></details></td></tr>"
        for failure in failures
    )
    return (
        f'<h2 id="failures">Failures ({len(failures)})</h2>'
        f'<table class="failures"><thead><tr><th>benchmark</th><th>error</th></tr></thead>'
        f"<tbody>\n{rows}\n</tbody></table>"
    )


def _text(value: str) -> str:
    """``value`` escaped for the page, in text and in quoted attributes."""
    return html.escape(value, quote=True)


def _short(commit: str) -> str:
    head, _, dirty = commit.partition("-")
    return head[:12] + (f"-{dirty}" if dirty else "") if len(head) == 40 else commit


def _number(value: float) -> str:
    """A figure's value to about three significant digits, thousands separated."""
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _spread(median: float, low: float, high: float) -> str:
    return f"{_number(median)} ({_number(low)}-{_number(high)})"


def _pairs(figure: Figure) -> str:
    """Under the ratio, its range over the run's alternated pairs (where recorded)."""
    if figure.pair_ratio_min is None or figure.pair_ratio_max is None:
        return ""
    return f'<div class="pairs">pairs {_ratio(figure.pair_ratio_min)}-{_ratio(figure.pair_ratio_max)}</div>'


def _ratio(ratio: float) -> str:
    return f"{ratio:.2f}" if abs(ratio) >= 0.1 or not math.isfinite(ratio) else f"{ratio:.3f}"
