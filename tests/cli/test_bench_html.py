"""``slts bench --html`` and ``--from-json``: the page drawn from a report, the goals as data,
and the JSON read back with every field checked (no timing is asserted)."""

from __future__ import annotations

import dataclasses
import html.parser
import json
import re

import pytest
from slts.tools import bench, bench_html, bench_report, cli, command_line
from slts.tools.bench_report import Failure, Report, RunContext
from slts.tools.benchmarks import goals
from slts.tools.benchmarks.base import Figure

from slts.errors import InvalidArgument

#: Elements HTML closes itself (no end tag); everything else must be closed, in order.
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr", "area", "base", "source", "track"}


class Page(html.parser.HTMLParser):
    """The page parsed: balanced tags checked as they come, and what the tests look at."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.errors: list[str] = []
        self.rows: list[dict[str, str]] = []  # attributes of each <tr class="figure ...">
        self.references: list[tuple[str, str, str]] = []  # (tag, attribute, value) that load or link
        self.scripts = 0
        self.text: list[str] = []
        self.feed(text)
        self.close()
        if self.open:
            self.errors.append(f"left open: {self.open}")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._look_at(tag, attrs)
        if tag not in VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._look_at(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.open[-1:] or 'nothing'}")
            return
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def _look_at(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = {name: value or "" for name, value in attrs}
        if tag == "script":
            self.scripts += 1
        if tag == "tr" and "figure" in named.get("class", "").split():
            self.rows.append(named)
        for name, value in named.items():
            if name in ("src", "href", "xlink:href", "action", "data", "poster") or (
                name == "style" and "url(" in value
            ):
                self.references.append((tag, name, value))


def figure(name: str, subject: float, baseline: float, unit: str = "ops/s", work: str = "work") -> Figure:
    return Figure(
        name,
        unit,
        subject,
        subject * 0.9,
        subject * 1.1,
        baseline,
        baseline * 0.8,
        baseline * 1.2,
        subject / baseline,
        5,
        work,
    )


CONTEXT = RunContext(
    date="2026-11-28T10:00:00+00:00",
    commit="0123456789abcdef0123456789abcdef01234567",
    cpus=2,
    cpu_model="Test CPU <model>",
    platform="Linux-test",
    python="3.11.7",
    quick=False,
)


def made_report() -> Report:
    """A report whose verdicts are known: write_4k met, truncate missed, defrag without a
    goal, concat_100k met (at most 1.5x slower than a 10-chunk concat, same run),
    journal_boot missed on its absolute rate."""
    return Report(
        [
            figure("write_4k", 900.0, 1000.0, "writes/s"),  # 0.90 >= 0.45: met
            figure("truncate", 10.0, 1000.0, "chunks/s"),  # 0.01 < 0.20: missed
            figure("defrag", 400.0, 500.0, "MB/s"),  # no goal
            figure("concat_10", 1500.0, 2500.0),
            figure("concat_100k", 1500.0, 2000.0),  # 0.75 >= 1 / 1.5: met
            figure("journal_boot", 30.0, 2000.0, "boots/s"),  # 30 < 100 boots/s: missed
        ],
        [Failure("read_seq", "RuntimeError: it broke <badly>", "Traceback ...\nRuntimeError: it broke")],
        CONTEXT,
    )


def rows_by_name(text: str) -> dict[str, str]:
    """Each figure row's HTML, by the figure name it shows."""
    rows = re.findall(r'<tr class="figure [^"]*".*?</tr>', text, flags=re.S)
    return {re.search(r'<div class="name">(.*?)</div>', row).group(1): row for row in rows}


def test_the_page_parses_balanced_with_one_row_per_figure() -> None:
    report = made_report()
    text = bench_html.render(report)
    page = Page(text)
    assert page.errors == []
    assert len(page.rows) == len(report.figures)
    words = " ".join(page.text)
    for item in report.figures:
        assert item.name in words and item.work in words
    assert "read_seq" in words and "RuntimeError: it broke <badly>" in words, "failures listed"
    assert "2026-11-28T10:00:00+00:00" in words and "0123456789abcdef0123456789abcdef01234567" in words
    assert "2 CPUs (Test CPU <model>), Linux-test, Python 3.11.7" in words


def test_met_and_missed_goals_differ_in_colour_and_in_words() -> None:
    rows = rows_by_name(bench_html.render(made_report()))
    assert 'class="figure met"' in rows["write_4k"] and "met</span>" in rows["write_4k"]
    assert 'class="figure missed"' in rows["truncate"] and "missed</span>" in rows["truncate"]
    assert 'class="figure no-goal"' in rows["defrag"] and "no goal</span>" in rows["defrag"]
    assert 'class="figure met"' in rows["concat_100k"]
    assert 'class="figure missed"' in rows["journal_boot"]
    # The goal line is drawn where a goal is, coloured by its verdict; none without one.
    assert '<line class="goal met"' in rows["write_4k"]
    assert '<line class="goal missed"' in rows["truncate"]
    assert '<line class="goal' not in rows["defrag"]
    style = re.search(r"<style>(.*?)</style>", bench_html.render(made_report()), flags=re.S).group(1)
    met = re.search(r"--met: (#[0-9a-f]{6})", style).group(1)
    missed = re.search(r"--missed: (#[0-9a-f]{6})", style).group(1)
    assert met != missed


def test_the_summary_counts_verdicts_and_links_the_missed_rows() -> None:
    text = bench_html.render(made_report())
    summary = re.search(r'<p class="summary">(.*?)</p>', text, flags=re.S).group(1)
    counts = dict(re.findall(r'<span class="count ([a-z-]+)">(\d+)</span>', summary))
    assert counts == {"met": "2", "missed": "2", "unjudged": "0", "no-goal": "2", "failed": "1"}
    missed_list = re.search(r'<ul class="missed-list">(.*?)</ul>', text, flags=re.S).group(1)
    assert re.findall(r'href="#(figure-\d+)">([a-z_0-9]+)<', missed_list) == [
        ("figure-1", "truncate"),
        ("figure-5", "journal_boot"),
    ]
    assert 'id="figure-1"' in rows_by_name(text)["truncate"]


def test_the_bars_share_one_scale_with_the_goal_line() -> None:
    """write_4k: SLTS 900, baseline 1,000 (max 1,200): the baseline's bar is the longer and
    the goal line (0.45 x 1,000 = 450) sits at half the SLTS bar."""
    row = rows_by_name(bench_html.render(made_report()))["write_4k"]
    subject = float(re.search(r'<rect class="bar subject" x="0" y="\d+" width="([\d.]+)"', row).group(1))
    baseline = float(re.search(r'<rect class="bar baseline" x="0" y="\d+" width="([\d.]+)"', row).group(1))
    goal = float(re.search(r'<line class="goal met" x1="([\d.]+)"', row).group(1))
    assert baseline > subject > goal > 0
    assert subject / baseline == pytest.approx(0.9, abs=0.01)
    assert goal / subject == pytest.approx(0.5, abs=0.01)
    assert max(subject, baseline) <= bench_html.CHART_WIDTH_PX


def test_the_page_references_nothing_outside_itself() -> None:
    page = Page(bench_html.render(made_report()))
    assert page.scripts == 0
    assert all(value.startswith("#") for _, _, value in page.references), page.references
    text = bench_html.render(made_report())
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in text and "@import" not in text and "url(" not in text


def test_names_work_units_errors_and_context_are_escaped() -> None:
    hostile = "<script>alert(1)</script>"
    report = Report(
        [figure(hostile, 1.0, 2.0, unit='"><img src=x>', work="a & b <b>bold</b>")],
        [Failure(hostile, hostile, f"Traceback\n{hostile}")],
        dataclasses.replace(CONTEXT, commit=hostile, platform=hostile),
    )
    text = bench_html.render(report)
    assert "<script" not in text and "<img" not in text and "<b>bold" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "a &amp; b &lt;b&gt;bold&lt;/b&gt;" in text
    page = Page(text)
    assert page.errors == [] and page.scripts == 0 and len(page.rows) == 1
    assert hostile in " ".join(page.text), "shown as text"


RELATIVE = {"concat_100k": goals.Relative("concat_10", 1.5, "a test")}


def test_a_relative_goal_without_its_reference_is_unjudged() -> None:
    report = Report([figure("concat_100k", 1200.0, 2000.0)], [], None)
    [verdict] = [goals.verdict(item, report.figures, RELATIVE) for item in report.figures]
    assert verdict is goals.Verdict.UNJUDGED
    text = bench_html.render(report, RELATIVE)
    assert 'class="figure unjudged"' in text and '<line class="goal' not in rows_by_name(text)["concat_100k"]
    assert "commit</dt><dd><code>unknown</code>" in text, "a report without its context"


@pytest.mark.parametrize(
    ("name", "subject", "baseline", "unit", "expected"),
    [
        ("write_4k_x8", 351.0, 1000.0, "writes/s", goals.Verdict.MET),  # ratio >= 0.35
        ("write_4k_x8", 349.0, 1000.0, "writes/s", goals.Verdict.MISSED),
        ("zstd_json", 3.0, 10.0, "MB", goals.Verdict.MET),  # a value: ratio <= 0.35
        ("zstd_json", 4.0, 10.0, "MB", goals.Verdict.MISSED),
        ("journal_boot", 100.0, 5000.0, "boots/s", goals.Verdict.MET),  # absolute, baseline aside
        ("journal_boot", 99.0, 99.0, "boots/s", goals.Verdict.MISSED),
        ("journal_boot", 500.0, 5000.0, "records/s", goals.Verdict.UNJUDGED),  # another unit
        ("rss_1m", 299.0, 15.0, "MB (lower)", goals.Verdict.MET),  # absolute, at most
        ("rss_1m", 301.0, 15.0, "MB (lower)", goals.Verdict.MISSED),
        ("defrag", 1.0, 1000.0, "MB/s", goals.Verdict.NO_GOAL),
    ],
)
def test_each_kind_of_goal_judges_its_figure(name, subject, baseline, unit, expected) -> None:
    item = figure(name, subject, baseline, unit)
    assert goals.verdict(item, [item]) is expected


def test_a_relative_goal_judges_against_the_other_figure() -> None:
    reference = figure("concat_10", 1500.0, 2500.0)
    assert goals.verdict(figure("concat_100k", 1000.0, 2000.0), [reference], RELATIVE) is goals.Verdict.MET
    assert goals.verdict(figure("concat_100k", 999.0, 2000.0), [reference], RELATIVE) is goals.Verdict.MISSED


def test_every_goal_names_a_real_benchmark_and_fits_its_kind() -> None:
    registry = {  # with the object stores' benchmarks (none is run; building them sends no request)
        **bench.registry("s3://bucket/prefix"),
        **bench.registry("gs://bucket/prefix"),
        **bench.registry("azure://container/prefix"),
    }
    assert not [name for name in goals.GOALS if name not in registry]
    for name, goal in goals.GOALS.items():
        if isinstance(goal, goals.Ratio) and goal.at_most:
            assert registry[name].measures == "value", f"{name}: a rate is better higher"
        if isinstance(goal, goals.Relative):
            assert goal.reference in registry and goal.reference != name, name
    lower_is_better = [
        name
        for name, benchmark in registry.items()
        if benchmark.measures == "value" and "lower" in benchmark.description
    ]
    assert "zstd_json" in lower_is_better
    for name in lower_is_better:
        goal = goals.GOALS.get(name)
        assert goal is None or goals.lower_is_better(goal), name


def test_issue_29s_goals_are_in_force() -> None:
    """The table of issue 29, as data."""
    table = goals.GOALS
    for name in ("read_random_10", "read_random_1k", "read_random_100k", "remote_fetch_first"):
        assert table[name] == goals.Ratio(0.30, "issue 29")
    assert table["truncate"] == goals.Ratio(0.20, "issue 29")
    assert dataclasses.replace(table["gc"], note="") == goals.Ratio(0.50, "issue 29")
    assert table["restore_100k"] == goals.Ratio(0.50, "issue 29")
    assert table["journal_boot"] == goals.Subject(100.0, "boots/s", "issue 29")
    assert table["journal_replay"] == goals.Ratio(0.20, "issue 29")
    assert table["read_seq_verified"] == goals.Ratio(0.70, "issue 29")
    assert table["write_4k_x8"] == goals.Ratio(0.35, "issue 29")
    assert table["concat_100k"].bound == 1 / 1.5, "a concat at most 1.5x slower for 100,000 chunks"


def test_a_report_survives_json_and_back() -> None:
    report = made_report()
    again = bench_report.from_json(bench_report.to_json(report))
    assert again == report
    old = json.loads(bench_report.to_json(report))
    del old["run"]  # a file from before the context was recorded
    assert bench_report.from_json(json.dumps(old)).context is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("figures"), "'figures' is missing"),
        (lambda d: d.update(figures={}), "figures: expected a list"),
        (lambda d: d["figures"][1].pop("ratio"), "figures[1]: the field 'ratio' is missing"),
        (lambda d: d["figures"][0].update(ratio="0.5"), "figures[0].ratio: expected a finite number"),
        (lambda d: d["figures"][0].update(ratio=True), "figures[0].ratio: expected a finite number"),
        (lambda d: d["figures"][0].update(subject_max=-1), "figures[0].subject_max: expected a finite"),
        (lambda d: d["figures"][0].update(ratio=float("inf")), "figures[0].ratio: expected a finite number"),
        (lambda d: d["figures"][0].update(ratio=float("nan")), "figures[0].ratio: expected a finite number"),
        (lambda d: d["figures"][0].update(ratio=10**400), "figures[0].ratio: expected a finite number"),
        (lambda d: d["figures"][0].update(name=7), "figures[0].name: expected a string"),
        (lambda d: d["figures"][0].update(repetitions=2.5), "figures[0].repetitions: expected an integer"),
        (lambda d: d["figures"][0].update(repetitions=0), "figures[0].repetitions: expected >= 1"),
        (lambda d: d["failures"].append("x"), "failures[1]: expected an object"),
        (lambda d: d["run"].update(quick="no"), "run.quick: expected true or false"),
    ],
)
def test_a_malformed_report_is_refused_naming_what_is_wrong(mutate, message) -> None:
    document = json.loads(bench_report.to_json(made_report()))
    mutate(document)
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        bench_report.from_json(json.dumps(document))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"figures": [], "failures": [], "x": NaN}', None),  # unknown keys are ignored
        ('{"figures": [{"ratio": Infinity}], "failures": []}', "figures[0]: the field"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
    ],
)
def test_text_that_is_no_report_is_refused(text, message) -> None:
    if message is None:
        assert bench_report.from_json(text) == Report([], [], None)
        return
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        bench_report.from_json(text)


def test_cli_from_json_redraws_the_page_and_runs_nothing(tmp_path, capsys, monkeypatch) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(bench_report.to_json(made_report()))
    out = tmp_path / "page.html"
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("--from-json ran benchmarks"))
    assert cli.main(["bench", "--from-json", str(saved), "--html", str(out)]) == command_line.EXIT_OK
    assert out.read_text(encoding="utf-8") == bench_html.render(made_report())
    table = capsys.readouterr().out.splitlines()
    assert table[0] == bench_report.TABLE_HEADER
    assert table[1].startswith("write_4k ") and table[1].endswith(" met")
    assert table[2].startswith("truncate ") and table[2].endswith(" missed")
    assert table[3].startswith("defrag ") and table[3].endswith(" -")
    assert table[-1] == "read_seq          FAILED: RuntimeError: it broke <badly>"


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (None, "cannot read"),  # no such file
        (b"{not json", "is malformed: not JSON"),
        (b'{"figures": [{"name": "x"}], "failures": []}', "figures[0]: the field 'unit' is missing"),
        (b"\xff\xfe\x00", "is not UTF-8"),
    ],
)
def test_cli_from_bad_json_exits_invalid_and_writes_nothing(tmp_path, capsys, content, what) -> None:
    saved = tmp_path / "run.json"
    if content is not None:
        saved.write_bytes(content)
    out = tmp_path / "page.html"
    code = cli.main(["bench", "--from-json", str(saved), "--html", str(out)])
    assert code == command_line.EXIT_INVALID
    err = capsys.readouterr().err
    assert "InvalidArgument" in err and what in err and str(saved) in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "what"),
    [
        (["--only", "write_4k"], "--only has no meaning"),
        (["--quick"], "--quick has no meaning"),
        ([], "needs --html"),
    ],
)
def test_cli_from_json_refuses_flags_of_a_run(tmp_path, capsys, flags, what) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(bench_report.to_json(made_report()))
    html_flags = [] if what == "needs --html" else ["--html", str(tmp_path / "page.html")]
    assert cli.main(["bench", "--from-json", str(saved), *html_flags, *flags]) == command_line.EXIT_INVALID
    assert what in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_cli_refuses_an_html_that_would_overwrite_its_input_or_has_no_folder(tmp_path, capsys) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(bench_report.to_json(made_report()))
    before = saved.read_text()
    assert cli.main(["bench", "--from-json", str(saved), "--html", str(saved)]) == command_line.EXIT_INVALID
    assert saved.read_text() == before
    missing = tmp_path / "no" / "page.html"
    assert cli.main(["bench", "--from-json", str(saved), "--html", str(missing)]) == command_line.EXIT_INVALID
    assert "does not exist" in capsys.readouterr().err and not missing.parent.exists()


def test_cli_bench_writes_the_page_of_its_run(tmp_path, capsys) -> None:
    """A real (quick) run of one benchmark: the page, the JSON, and the page drawn again
    from that JSON are the same."""
    page, saved = tmp_path / "page.html", tmp_path / "run.json"
    code = cli.main(
        [
            "bench",
            "--quick",
            "--only",
            "write_4k",
            "--dir",
            str(tmp_path),
            "--html",
            str(page),
            "--json-file",
            str(saved),
        ]
    )
    assert code == command_line.EXIT_OK
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == bench_report.TABLE_HEADER and printed[0].endswith(" goal")
    assert printed[1].startswith("write_4k ") and printed[1].split()[-1] in ("met", "missed")
    text = page.read_text(encoding="utf-8")
    parsed = Page(text)
    assert parsed.errors == [] and len(parsed.rows) == 1 and "write_4k" in " ".join(parsed.text)
    context = json.loads(saved.read_text())["run"]
    assert context["quick"] is True and context["cpus"] >= 1 and context["commit"]
    again = tmp_path / "again.html"
    assert cli.main(["bench", "--from-json", str(saved), "--html", str(again)]) == command_line.EXIT_OK
    assert again.read_text(encoding="utf-8") == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.html", "page.html", "run.json"]


def test_issue_30s_goals_are_in_force() -> None:
    """Each new binding at 0.85 of its raw client for 8 MiB writes and sequential reads."""
    for name in ("azure_write_8m", "azure_read_seq", "gcs_write_8m", "gcs_read_seq"):
        assert dataclasses.replace(goals.GOALS[name], note="") == goals.Ratio(0.85, "issue 30"), name


def test_a_ratios_range_over_the_pairs_is_drawn_under_it_where_recorded() -> None:
    """A figure with ``pair_ratio_min``/``max`` shows them under its ratio; one from a
    report written before they existed shows the ratio alone."""
    paired = dataclasses.replace(
        figure("write_4k", 900.0, 1000.0, "writes/s"), pair_ratio_min=0.5, pair_ratio_max=2.0
    )
    rows = rows_by_name(
        bench_html.render(Report([paired, figure("defrag", 400.0, 500.0, "MB/s")], [], CONTEXT))
    )
    assert '<div class="pairs">pairs 0.50-2.00</div>' in rows["write_4k"]
    assert "pairs" not in rows["defrag"]
