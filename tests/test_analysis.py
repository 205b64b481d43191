"""End-to-end tests of the Spark analysis: the `analyze` command on hand-made runs whose
figures were worked out by hand (see the run described in spark_fixtures.py)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyspark.sql import functions as F
from spark_fixtures import (
    HAND_CONTACTS,
    HAND_MESSAGES,
    SPARK_GROUP,
    shared_spark,
    write_hand_run,
    write_run,
)

from sim.analysis.cli import analyze
from sim.analysis.pipeline import analyze_run

pytestmark = SPARK_GROUP
SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@pytest.fixture(scope="session")
def spark() -> Any:
    return shared_spark()


def _write_run_b(run_dir: Path) -> Path:
    """runB: runA plus a late-but-in-time delivery of m3 to D at 92 (deadline 100)."""
    from spark_fixtures import (
        HAND_CACHE,
        HAND_CONTACTS,
        HAND_DATAGRAMS,
        HAND_HOSTS,
        HAND_TARGETS,
    )

    extra = [(92.0, "D", "m3", "complete", 300, 3), (92.0, "D", "m3", "delivered", 300, 3)]
    return write_run(
        run_dir,
        until=100.0,
        contacts=HAND_CONTACTS,
        messages=HAND_MESSAGES + extra,
        targets=HAND_TARGETS,
        datagrams=HAND_DATAGRAMS,
        cache=HAND_CACHE,
        hosts=HAND_HOSTS,
    )


@pytest.fixture(scope="session")
def report(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("analysis")
    run_a = write_hand_run(base / "runA")
    run_b = _write_run_b(base / "runB")
    out = base / "report"
    result = CliRunner().invoke(analyze, [str(run_a), str(run_b), "--out", str(out)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    return {"out": out, "output": result.output, "metrics": metrics, "spark": spark}


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_metrics_json_has_one_entry_per_run_with_headline_keys(report: dict[str, Any]) -> None:
    metrics = report["metrics"]
    assert list(metrics) == ["runA", "runB"]
    for key in (
        "delivery_ratio",
        "oracle_delivery_ratio",
        "efficiency",
        "latency_med",
        "overhead_ratio",
        "created",
        "delivered",
        "delivery_prob",
        "latency_avg",
        "hopcount_avg",
    ):
        assert key in metrics["runA"], key


def test_delivery_counts_on_time_pairs_once_and_late_ones_apart(report: dict[str, Any]) -> None:
    m = report["metrics"]["runA"]
    # 6 target pairs; on time: (m1,C) at 35, (m3,A) at 15 (its duplicate at 16 counts once),
    # (m3,C) at 38. (m2,E) arrives at 75 after its deadline 60: late, not delivered.
    assert m["target_pairs"] == 6
    assert m["delivered_pairs"] == 3
    assert m["delivery_ratio"] == pytest.approx(3 / 6)
    assert m["late_deliveries"] == 1
    assert m["duplicate_deliveries"] == 1
    assert m["delivered_bytes"] == 100 + 300 + 300
    assert m["origin_deliveries"] == 1  # m1 delivered on its origin A: not a target pair
    assert m["unexpected_deliveries"] == 0


def test_delay_and_hops(report: dict[str, Any]) -> None:
    m = report["metrics"]["runA"]
    delays = sorted([35.0 - 0.0, 15.0 - 12.0, 38.0 - 12.0])  # 3, 26, 35
    assert m["latency_avg"] == pytest.approx(sum(delays) / 3)
    assert m["latency_med"] == delays[1]
    assert m["delay"]["p90"] == delays[2]
    assert m["delay"]["min"] == delays[0]
    assert m["hopcount_avg"] == pytest.approx((2 + 1 + 1) / 3)


def test_oracle_and_efficiency(report: dict[str, Any]) -> None:
    m = report["metrics"]["runA"]
    # Oracle reaches (m1,C) at 30 (A-B at 10, B-C at 30), (m3,A) at 12, (m3,C) at 30 and
    # (m3,D) at 90 (B-A at 12, A-E at 70, E-D at 90); not (m1,D) (C-D only at 5..8, before C
    # holds m1) nor (m2,E) (A-E only from 70, after the deadline 60).
    assert m["oracle_delivered_pairs"] == 4
    assert m["oracle_delivery_ratio"] == pytest.approx(4 / 6)
    assert m["efficiency"] == pytest.approx((3 / 6) / (4 / 6))
    assert m["oracle_converged"] is True
    assert m["delivered_beyond_oracle"] == 0
    b = report["metrics"]["runB"]
    assert b["delivery_ratio"] == pytest.approx(4 / 6)
    assert b["efficiency"] == pytest.approx(1.0)


def test_pair_table_holds_status_and_oracle_arrival(report: dict[str, Any]) -> None:
    spark = report["spark"]
    rows = spark.read.parquet(str(report["out"] / "tables" / "runA" / "pairs.parquet")).collect()
    got = {(r["msg_id"], r["host"]): (r["status"], r["oracle_arrival"]) for r in rows}
    assert got == {
        ("m1", "C"): ("delivered", 30.0),
        ("m1", "D"): ("undelivered", None),
        ("m2", "E"): ("late", None),
        ("m3", "A"): ("delivered", 12.0),
        ("m3", "C"): ("delivered", 30.0),
        ("m3", "D"): ("undelivered", 90.0),
    }


def test_one_summary(report: dict[str, Any]) -> None:
    m = report["metrics"]["runA"]
    relayed = sum(1 for e in HAND_MESSAGES if e[3] == "complete")  # none at an origin
    assert m["created"] == 6
    assert m["delivered"] == 3
    assert m["delivery_prob"] == pytest.approx(3 / 6)
    assert m["relayed"] == relayed == 5
    assert m["overhead_ratio"] == pytest.approx((relayed - 3) / 3)
    assert m["messages_created"] == 3


def test_overhead_by_kind(report: dict[str, Any]) -> None:
    m = report["metrics"]["runA"]["overhead"]
    sent_bytes = 600 + 400 + 400 + 150 + 1200  # received fragments do not count
    assert m["bytes_sent"] == sent_bytes
    assert m["datagrams_sent"] == 6 + 4 + 2 + 3 + 6
    assert m["bytes_per_delivered"] == pytest.approx(sent_bytes / 3)
    assert m["bytes_per_delivered_byte"] == pytest.approx(sent_bytes / 700)
    rows = {
        r["kind"]: r for r in _csv(report["out"] / "overhead_by_kind.csv") if r["run"] == "runA"
    }
    assert int(rows["announce"]["bytes"]) == 1000
    assert float(rows["fragment"]["bytes_per_delivered"]) == pytest.approx(1200 / 3)


def test_breakdowns_by_topic_and_group(report: dict[str, Any]) -> None:
    topics = {
        r["topic"]: r for r in _csv(report["out"] / "delivery_by_topic.csv") if r["run"] == "runA"
    }
    assert float(topics["t1"]["delivery_ratio"]) == pytest.approx(3 / 5)
    assert float(topics["t1"]["oracle_delivery_ratio"]) == pytest.approx(4 / 5)
    assert int(topics["t2"]["late"]) == 1
    assert float(topics["t2"]["delivery_ratio"]) == 0.0
    groups = {
        r["group"]: r for r in _csv(report["out"] / "delivery_by_group.csv") if r["run"] == "runA"
    }
    assert int(groups["g1"]["delivered"]) == 3
    assert int(groups["g2"]["pairs"]) == 3


def test_contact_statistics(report: dict[str, Any]) -> None:
    c = report["metrics"]["runA"]["contacts"]
    # A-B [10,20] (the repeated up changes nothing), B-C [5,8] and [30,40], C-D [5,8],
    # A-E [70,100] (still up at the end), D-E [90,95].
    durations = sorted([10.0, 3.0, 10.0, 3.0, 30.0, 5.0])
    assert c["contacts"] == 6
    assert c["contact_pairs"] == 5
    assert c["contacts_open_at_end"] == 1
    assert c["contact_duration"]["mean"] == pytest.approx(sum(durations) / 6)
    assert c["contact_duration"]["median"] == durations[2]
    assert c["inter_contact_time"]["count"] == 1
    assert c["inter_contact_time"]["mean"] == 30.0 - 8.0
    degree = {
        float(r["time"]): r
        for r in _csv(report["out"] / "degree_over_time.csv")
        if r["run"] == "runA"
    }
    assert float(degree[35.0]["links_up"]) == 1  # B-C
    assert float(degree[92.0]["mean_degree"]) == pytest.approx(2 * 2 / 5)  # A-E, D-E


def test_cache_occupancy(report: dict[str, Any]) -> None:
    rows = [r for r in _csv(report["out"] / "cache_occupancy.csv") if r["run"] == "runA"]
    assert [float(r["total_bytes"]) for r in rows] == [100 + 0, 300 + 500]
    assert report["metrics"]["runA"]["cache_peak_host_bytes"] == 500


def test_report_files_and_terminal_summary(report: dict[str, Any]) -> None:
    out: Path = report["out"]
    html = (out / "report.html").read_text()
    for png in (
        "delivery_over_time",
        "delay_cdf",
        "overhead_by_kind",
        "ict_ccdf",
        "contact_duration_cdf",
        "achieved_vs_oracle",
    ):
        assert (out / f"{png}.png").stat().st_size > 1000
        assert f'src="{png}.png"' in html
    assert "<th>runA</th><th>runB</th>" in html
    summary = _csv(out / "summary.csv")
    assert {r["metric"]: r["runB"] for r in summary}["delivery_ratio"] == str(4 / 6)
    assert "runA" in report["output"] and "runB" in report["output"]
    assert "report.html" in report["output"]


# --- bad inputs --------------------------------------------------------------------------


def _invoke(args: list[str]) -> Any:
    return CliRunner().invoke(analyze, args)


def _assert_clean_error(result: Any, text: str) -> None:
    assert result.exit_code == 1, result.output
    assert text in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 3


def test_missing_run_dir(tmp_path: Path) -> None:
    result = _invoke([str(tmp_path / "nope"), "--out", str(tmp_path / "r")])
    _assert_clean_error(result, "no such directory")


def test_no_input_is_a_usage_error(tmp_path: Path) -> None:
    result = _invoke(["--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "RUN_DIR" in result.output


def test_missing_table(spark: Any, tmp_path: Path) -> None:
    run = write_hand_run(tmp_path / "run")
    (run / "targets.parquet").unlink()
    _assert_clean_error(_invoke([str(run), "--out", str(tmp_path / "r")]), "targets.parquet")


def test_unsupported_schema_version(spark: Any, tmp_path: Path) -> None:
    run = write_hand_run(tmp_path / "run")
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "schema_version": 2}))
    _assert_clean_error(_invoke([str(run), "--out", str(tmp_path / "r")]), "schema_version")


def test_wrong_column_type(spark: Any, tmp_path: Path) -> None:
    run = write_hand_run(tmp_path / "run")
    bad = pa.table({"time": ["x"], "a": ["A"], "b": ["B"], "up": [True]})
    pq.write_table(bad, run / "contacts.parquet")
    result = _invoke([str(run), "--out", str(tmp_path / "r")])
    _assert_clean_error(result, "column 'time' is string, expected double")


def test_corrupt_parquet(spark: Any, tmp_path: Path) -> None:
    run = write_hand_run(tmp_path / "run")
    (run / "messages.parquet").write_bytes(b"this is not parquet")
    result = _invoke([str(run), "--out", str(tmp_path / "r")])
    _assert_clean_error(result, "cannot read Parquet table")


def test_folder_dataset_is_accepted(spark: Any, tmp_path: Path) -> None:
    from sim.analysis.load import load_run

    run = write_hand_run(tmp_path / "run")
    folder = run / "messages.parquet"
    data = pq.read_table(folder)
    folder.unlink()
    folder.mkdir()
    pq.write_table(data.slice(0, 5), folder / "part-0.parquet")
    pq.write_table(data.slice(5), folder / "part-1.parquet")
    assert load_run(spark, str(run)).messages.count() == len(HAND_MESSAGES)
    shutil.rmtree(folder)


def test_help_names_the_inputs_and_options() -> None:
    result = CliRunner().invoke(analyze, ["--help"])
    assert result.exit_code == 0
    for word in ("[RUN_DIR | SWEEP_DIR]...", "--out", "--contacts", "--master", "--no-oracle"):
        assert word in result.output


def test_run_names_are_made_unique() -> None:
    from sim.analysis.cli import unique_names

    assert unique_names(["a/run", "b/run/", "c/other", "d/run"]) == [
        "run",
        "run-2",
        "other",
        "run-3",
    ]


def test_missing_inputs_fail_before_spark_starts(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    _assert_clean_error(_invoke([str(empty), "--out", str(tmp_path / "r")]), "missing run.json")
    result = _invoke(["--contacts", str(tmp_path / "none.txt"), "--out", str(tmp_path / "r")])
    _assert_clean_error(result, "no such contact trace")


# --- the report as a researcher publishes it -------------------------------------------------


def _img_tags(html: str) -> list[dict[str, str]]:
    import re

    return [dict(re.findall(r'(\w+)="([^"]*)"', tag)) for tag in re.findall(r"<img [^>]*>", html)]


def _css_rule(html: str, selector: str) -> str:
    import re

    m = re.search(r"(?:^|[}\s])" + re.escape(selector) + r"\s*\{([^}]*)\}", html)
    return m.group(1) if m else ""


def test_report_figures_are_shown_at_their_own_size(report: dict[str, Any]) -> None:
    """Every PNG is displayed at its native width (no image squeezed by a CSS cap)."""
    import re

    from PIL import Image

    out: Path = report["out"]
    html = (out / "report.html").read_text()
    cap = re.search(r"max-width:\s*(\d+)px", _css_rule(html, "img"))
    imgs = _img_tags(html)
    assert imgs
    for img in imgs:
        with Image.open(out / img["src"]) as im:
            width = im.size[0]
        if cap:
            assert width <= int(cap.group(1)), f"{img['src']}: {width} px shown at {cap.group(1)}"
        assert img.get("width") == str(width), f"{img['src']}: {width} px, shown at {img}"


def test_report_lays_figures_out_in_a_grid(report: dict[str, Any]) -> None:
    html = (report["out"] / "report.html").read_text()
    assert "display: grid" in _css_rule(html, ".plots")
    start = html.index('<div class="plots">')
    assert html.count("<figure", start) == html.count("<figure")


def test_report_writes_svg_next_to_every_png(report: dict[str, Any]) -> None:
    out: Path = report["out"]
    pngs = sorted(out.glob("*.png"))
    assert pngs
    for png in pngs:
        svg = png.with_suffix(".svg")
        assert svg.is_file() and svg.read_text().lstrip().startswith("<?xml"), svg


def test_report_names_scenario_seed_and_links_metrics_doc(report: dict[str, Any]) -> None:
    out: Path = report["out"]
    html = (out / "report.html").read_text()
    assert "scenario <b>runA</b>" in html and "seed 1" in html
    assert '<a href="metrics.md">' in html
    assert (out / "metrics.md").read_text().startswith("#")


def test_report_explains_efficiency_and_one_overhead(report: dict[str, Any]) -> None:
    html = (report["out"] / "report.html").read_text()
    row = html[html.index("efficiency (ratio ÷ oracle)") :].split("</tr>", 1)[0]
    assert "1 = as good as any protocol could be on these contacts" in row
    row = html[html.index("ONE overhead ratio") :].split("</tr>", 1)[0]
    assert "(relayed − delivered) / delivered" in row


def test_report_shows_per_topic_and_per_group_tables(report: dict[str, Any]) -> None:
    html = (report["out"] / "report.html").read_text()
    for key, values in (("topic", ("t1", "t2")), ("group", ("g1", "g2"))):
        section = html[html.index(f"<h3>Delivery by {key}</h3>") :].split("</table>", 1)[0]
        for v in values:
            assert f"<th>{v}</th>" in section
    section = html[html.index("<h3>Delivery by topic</h3>") :].split("</table>", 1)[0]
    assert "<td>0.6</td>" in section  # runA: t1 3 of 5 pairs delivered


def test_degree_over_time_keeps_open_contacts_at_the_last_sample(report: dict[str, Any]) -> None:
    rows = [r for r in _csv(report["out"] / "degree_over_time.csv") if r["run"] == "runA"]
    last = rows[-1]
    assert float(last["time"]) == 100.0
    assert float(last["links_up"]) == 1  # A-E is still up when the run ends


def test_delivery_over_time_divides_by_pairs_published_so_far(report: dict[str, Any]) -> None:
    rows = [r for r in _csv(report["out"] / "delivery_over_time.csv") if r["run"] == "runA"]
    at = {float(r["time"]): r for r in rows}
    # at 40 s: m1 (2 pairs, t=0) and m3 (3 pairs, t=12) published, m2 not yet (t=50);
    # delivered on time by then: m3->A (15), m1->C (35), m3->C (38)
    assert float(at[40.0]["delivered_fraction"]) == pytest.approx(3 / 5)
    assert float(at[40.0]["published_pairs"]) == 5
    assert float(at[100.0]["delivered_fraction"]) == pytest.approx(3 / 6)


def test_one_message_stats_report_per_run(report: dict[str, Any]) -> None:
    text = (report["out"] / "runA.MessageStatsReport.txt").read_text().splitlines()
    assert text[0] == "Message stats for scenario runA"
    fields = dict(line.split(": ", 1) for line in text[1:])
    assert list(fields)[:8] == [
        "sim_time", "created", "started", "relayed", "aborted", "dropped", "removed", "delivered",
    ]  # fmt: skip
    assert fields["sim_time"] == "100.0000"
    assert fields["created"] == "6" and fields["delivered"] == "3"
    assert fields["delivery_prob"] == "0.5000"
    assert fields["latency_avg"] == f"{(3 + 35 + 26) / 3:.4f}"


def _fake_run(name: str, until: float, durations: list[float]) -> Any:
    """A RunResult built by hand: the plots only read its figures, series and tables."""
    from sim.analysis.pipeline import RunResult

    n = len(durations)
    cdf = [(d, (i + 1) / n) for i, d in enumerate(sorted(durations))]
    degree = [
        {"time": k * until / 200, "links_up": 1.0, "mean_degree": 0.5, "mean_bytes": 9.0}
        for k in range(201)
    ]
    metrics = {
        "target_pairs": 4,
        "delivered_pairs": 2,
        "delivery_ratio": 0.5,
        "contacts": {"contacts": n, "contacts_open_at_end": 2},
        "run": {"scenario": "long", "seed": 3, "until": until, "settings_sha256": "s1"},
    }
    series = {
        "until": until,
        "delivered_over_time": [min(k // 50, 2) for k in range(201)],
        "published_over_time": [4.0] * 201,
        "delay_cdf": [(10.0, 0.5), (20.0, 1.0)],
        "contact_duration_cdf": cdf,
        "ict_cdf": cdf,
        "degree_over_time": degree,
    }
    tables = {"degree_over_time": degree, "cache_occupancy": degree}
    return RunResult(name, "/nowhere", "run", metrics, tables, series, {})


@pytest.fixture()
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Figures as they are saved, by file name (drawn, so tick labels are laid out)."""
    from matplotlib.figure import Figure

    seen: dict[str, Any] = {}
    original = Figure.savefig

    def spy(self: Any, fname: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, fname, *args, **kwargs)
        seen[Path(str(fname)).name] = self
        return result

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def _overlapping_tick_labels(fig: Any) -> list[tuple[str, str]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # a closed figure lost its canvas
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    bad = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            boxes = [
                (t.label1.get_text(), t.label1.get_window_extent(renderer))
                for t in axis.get_major_ticks() + axis.get_minor_ticks()
                if t.label1.get_visible()
                and t.label1.get_text()
                and lo * 0.999 <= t.get_loc() <= hi * 1.001
            ]
            for i, (ta, ba) in enumerate(boxes):
                bad += [(ta, tb) for tb, bb in boxes[i + 1 :] if ba.overlaps(bb)]
    return bad


def test_log_axes_have_no_overlapping_tick_labels(
    saved_figures: dict[str, Any], tmp_path: Path
) -> None:
    from sim.analysis.report import write_report

    write_report([_fake_run("r", 600.0, [3.0, 4.0, 6.0, 9.0, 20.0, 35.0, 60.0])], tmp_path)
    for name in ("contact_duration_cdf.png", "ict_ccdf.png"):
        fig = saved_figures[name]
        assert any(ax.get_xscale() == "log" for ax in fig.axes), name
        assert _overlapping_tick_labels(fig) == [], name


def test_long_runs_have_hours_on_the_time_axis(
    saved_figures: dict[str, Any], tmp_path: Path
) -> None:
    from sim.analysis.report import write_report

    write_report([_fake_run("r", 12 * 3600.0, [30.0, 60.0, 90.0])], tmp_path)
    for name in ("delivery_over_time.png", "degree_over_time.png", "cache_occupancy.png"):
        ax = saved_figures[name].axes[0]
        assert "(h)" in ax.get_xlabel(), (name, ax.get_xlabel())
        assert ax.get_xlim()[1] == pytest.approx(12, rel=0.1)
    write_report([_fake_run("r", 300.0, [30.0, 60.0, 90.0])], tmp_path)
    assert "(s)" in saved_figures["delivery_over_time.png"].axes[0].get_xlabel()


def test_report_names_a_sweep_runs_setting_as_the_sweep_writes_it(tmp_path: Path) -> None:
    """Values read as in the scenario file (true, [1,2]), not as Python prints them."""
    from sim.analysis.report import write_report

    run = _fake_run("r", 600.0, [30.0, 60.0, 90.0])
    run.metrics["sweep"] = {
        "setting": {"protocol.altruistic": True, "groups[0].mobility.speed": [1.0, 2.5]},
        "label": "protocol.altruistic=true, groups[0].mobility.speed=[1.0,2.5]",
    }
    write_report([run], tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert "scenario <b>long</b>; seed 3; settings protocol.altruistic=true, " in html
    assert "groups[0].mobility.speed=[1.0,2.5];" in html


def test_runs_of_one_scenario_by_hand_get_a_mean_and_ci_column(tmp_path: Path) -> None:
    """`analyze out/qs out/qs-s2` (one scenario, two seeds, no sweep): besides a column per
    run, the summary has mean ± 95 % CI over them (the issue's first complaint)."""
    import math

    from sim.analysis.cli import summary_table
    from sim.analysis.report import summary_rows, write_report

    a, b = _fake_run("qs", 600.0, [30.0, 60.0]), _fake_run("qs-s2", 600.0, [30.0, 90.0])
    b.metrics["run"] = {**a.metrics["run"], "seed": 4}
    b.metrics["delivery_ratio"] = 0.7
    write_report([a, b], tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert "<th>qs</th><th>qs-s2</th><th>mean ± 95 % CI (2 runs)</th>" in html
    ci = 12.7062047 * math.sqrt(0.02) / math.sqrt(2)  # t(0.975, 1) · s / √n, s² = 0.02
    row = html[html.index("<th>delivery ratio</th>") :].split("</tr>", 1)[0]
    assert f"<td>0.5</td><td>0.7</td><td>0.6 ± {ci:.4g}</td>" in row
    assert ("delivery ratio", ["0.5", "0.7", f"0.6 ± {ci:.4g}"]) in summary_rows([a, b])
    assert summary_table([a, b]).columns[-1].header == "mean ± 95 % CI (2 runs)"
    # runs of different scenarios (or settings) are not averaged
    b.metrics["run"] = {**a.metrics["run"], "seed": 4, "settings_sha256": "s2"}
    write_report([a, b], tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert "mean ± 95 % CI" not in html
    assert "no mean column: runs differ in settings or input files" in html
    assert len(summary_rows([a, b])[0][1]) == 2


def test_a_mean_column_needs_the_same_settings_and_end_and_distinct_seeds(
    spark: Any, tmp_path: Path
) -> None:
    """`analyze q1 q80 qcut`: runs of the same scenario name but another radio range, another
    --until, or the same seed are not seeds of one experiment; their mean ± CI would be a
    wrong statistic. Real runs: what decides is what run.json records."""
    from sim.analysis.cli import summary_table
    from sim.analysis.report import mean_column, write_report
    from sim.runner import simulate
    from sim.scenario import load

    text = (
        (SCENARIOS / "quickstart.toml").read_text().replace("duration = 600.0", "duration = 120.0")
    )
    (tmp_path / "q.toml").write_text(text)
    (tmp_path / "q80.toml").write_text(text.replace("range = 60.0", "range = 80.0"))
    q, q80 = load(tmp_path / "q.toml"), load(tmp_path / "q80.toml")
    assert q.name == q80.name  # only the settings tell them apart
    made = {
        "q1": (q, 1, None),
        "q2": (q, 2, None),
        "q80": (q80, 3, None),
        "qcut": (q, 4, 60.0),
    }
    runs = {}
    for name, (sc, seed, until) in made.items():
        simulate(sc, tmp_path / name, seed=seed, until=until)
        runs[name] = analyze_run(spark, str(tmp_path / name), with_oracle=False)
    q1, q2 = runs["q1"], runs["q2"]
    assert mean_column([q1, q2]) == "mean ± 95 % CI (2 runs)"
    notes = {
        ("q1", "q80", "qcut"): "runs differ in settings or input files",
        ("q1", "q80"): "runs differ in settings or input files",
        ("q1", "qcut"): "runs differ in simulated time (until 120 s, 60 s)",
        ("q1", "q1"): "runs share seed 1",
    }
    for names in notes:
        assert mean_column([runs[n] for n in names]) is None, names
    from sim.analysis.report import mean_column_note

    assert mean_column_note([q1, q2]) is None
    for names, why in notes.items():
        chosen = [runs[n] for n in names]
        assert mean_column_note(chosen) == f"no mean column: {why}"
        assert summary_table(chosen).caption == f"no mean column: {why}"
    out = tmp_path / "rep"
    write_report([runs[n] for n in ("q1", "q80", "qcut")], out)
    html = (out / "report.html").read_text()
    assert "mean ± 95 % CI" not in html and "runs differ in settings" in html


def test_censored_contacts_are_marked(saved_figures: dict[str, Any], tmp_path: Path) -> None:
    from sim.analysis.report import write_report

    write_report([_fake_run("r", 600.0, [30.0, 60.0, 90.0])], tmp_path)
    ax = saved_figures["contact_duration_cdf.png"].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()] + [t.get_text() for t in ax.texts]
    assert any("2 censored" in t for t in labels), labels
    html = (tmp_path / "report.html").read_text()
    row = html[html.index("contacts still open at the end") :].split("</tr>", 1)[0]
    assert "<td>2</td>" in row and "censored" in row


def test_small_inputs_get_small_settings_and_the_session_gets_its_own_back(
    spark: Any, tmp_path: Path
) -> None:
    """Small local runs are analysed without adaptive execution and with 2 shuffle
    partitions; afterwards the session has its own settings again. Remote inputs (size
    unknown) are left alone."""
    from sim.analysis.session import SMALL_SETTINGS, local_size, tuned_for

    run = write_hand_run(tmp_path / "run")
    size = local_size(str(run))
    assert size is not None and 0 < size < 1 << 20
    spark.conf.set("spark.sql.shuffle.partitions", "5")
    before = spark.conf.get("spark.sql.adaptive.enabled")
    assert before == "true"
    with tuned_for(spark, str(run)):
        for k, v in SMALL_SETTINGS.items():
            assert spark.conf.get(k) == v
    assert spark.conf.get("spark.sql.adaptive.enabled") == before
    assert spark.conf.get("spark.sql.shuffle.partitions") == "5"
    with tuned_for(spark, "hdfs://nowhere/run"):
        assert spark.conf.get("spark.sql.shuffle.partitions") == "5"
    spark.conf.set("spark.sql.shuffle.partitions", "2")


def test_only_small_local_inputs_get_a_jvm_tuned_for_a_short_life(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM options of small inputs (C1 only) are chosen on the inputs' total size, and
    never for an input whose size is unknown (remote)."""
    from sim.analysis import session

    a, b = write_hand_run(tmp_path / "a"), write_hand_run(tmp_path / "b")
    size = session.local_size(str(a))
    assert size is not None and size > 0
    assert session.small_local_inputs([str(a), str(b)])
    assert not session.small_local_inputs([str(a), "hdfs://nowhere/run"])
    monkeypatch.setattr(session, "SMALL_INPUT_BYTES", size + 1)  # a fits, a + b does not
    assert session.small_local_inputs([str(a)])
    assert not session.small_local_inputs([str(a), str(b)])
    assert "TieredStopAtLevel=1" in session.QUICK_JVM_OPTIONS


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on the PATH")
def test_a_jvm_for_small_inputs_keeps_room_for_compiled_code() -> None:
    """With C1 alone the JVM reserves 48 MB for compiled code by default: one JVM analysing a
    few small runs in turn (a sweep) filled it, and the JVM then stopped compiling (measured:
    docs/performance.md). The options must give it the room a tiered JVM has."""
    from sim.analysis import session

    flags = subprocess.run(
        ["java", *session.QUICK_JVM_OPTIONS.split(), "-XX:+PrintFlagsFinal", "-version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert flags.returncode == 0, flags.stderr
    sizes = [
        line.split()[3] for line in flags.stdout.splitlines() if " ReservedCodeCacheSize " in line
    ]
    assert sizes and int(sizes[0]) >= 200 << 20


def test_a_run_stopped_part_way_is_analysed_up_to_where_it_got(spark: Any, tmp_path: Path) -> None:
    """run.json says complete: false and reached 50 of 100 s: every table is cut at 50 s
    (contacts still up end there, not at 100 s), and the user is told."""
    from sim.analysis.load import IncompleteRun, load_run

    run = write_hand_run(tmp_path / "run")
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "complete": False, "reached": 50.0}))
    with pytest.warns(IncompleteRun, match="analysed up to 50 s of 100 s"):
        tables = load_run(spark, str(run))
    assert tables.until == 50.0
    for frame, column in ((tables.contacts, "time"), (tables.messages, "time"),
                          (tables.targets, "created")):  # fmt: skip
        assert frame.agg(F.max(column)).first()[0] <= 50.0
    assert tables.contacts.count() == sum(1 for c in HAND_CONTACTS if c[0] <= 50.0)
    out = tmp_path / "r"
    result = _invoke([str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # as the console wrapped it
    assert "warning run: the run stopped part-way" in said and "analysed up to 50 s" in said
    info = json.loads((out / "metrics.json").read_text())["run"]["run"]
    assert info["complete"] is False and info["analysed_until"] == 50.0
    assert "stopped part-way" in (out / "report.html").read_text()


def test_a_report_folder_used_again_holds_only_the_new_report(spark: Any, tmp_path: Path) -> None:
    """Analysing into the folder of an earlier report replaces what that report wrote (a
    sweep's files would otherwise sit among the new run's); files it did not write stay; a
    non-empty folder that holds no report is refused before Spark starts."""
    run = write_hand_run(tmp_path / "run")
    out = tmp_path / "r"
    out.mkdir()
    (out / "metrics.json").write_text("{}")  # an earlier report...
    for stale in ("sweep_summary.csv", "aggregate.json", "x_seed-1.MessageStatsReport.txt",
                  "sweep_protocol.horizon.png", "sweep_protocol.horizon.svg"):  # fmt: skip
        (out / stale).write_text("old")
    (out / "tables" / "old_run").mkdir(parents=True)
    (out / "my-notes.md").write_text("mine")  # ...and the user's own file
    result = _invoke([str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    left = {p.name for p in out.iterdir()}
    assert not left & {"sweep_summary.csv", "aggregate.json", "x_seed-1.MessageStatsReport.txt",
                       "sweep_protocol.horizon.png", "sweep_protocol.horizon.svg"}  # fmt: skip
    assert not (out / "tables" / "old_run").exists() and "my-notes.md" in left
    assert list(json.loads((out / "metrics.json").read_text())) == ["run"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("precious")
    _assert_clean_error(_invoke([str(run), "--out", str(other)]), "holds no earlier report")
    assert (other / "data.csv").read_text() == "precious"


def test_tables_with_no_row_still_have_their_header(spark: Any, tmp_path: Path) -> None:
    """A run in which nothing was delivered (no contact at all) wrote hop_histogram.csv and
    quantiles.csv as a bare line ending, and a run with no target the delivery_by_*.csv
    files: ``csv.DictReader``/pandas found no columns. Every table has its header."""
    run = write_run(
        tmp_path / "lonely",
        until=100.0,
        contacts=[],
        messages=[(0.0, "A", "m1", "created", 100, 0)],
        targets=[("m1", "B", "A", 0.0, 80.0, "t1", "g1")],
        datagrams=[("A", "announce", "sent", 6, 600)],
        hosts=[("A", "g1"), ("B", "g1")],
    )
    out = tmp_path / "report"
    result = CliRunner().invoke(analyze, [str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    headers = {
        "hop_histogram.csv": "run,hops,pairs",
        "quantiles.csv": "run,distribution,p,value",
    }
    for name, header in headers.items():
        lines = (out / name).read_text().splitlines()
        assert lines and lines[0] == header, (name, lines)
    by_topic = (out / "delivery_by_topic.csv").read_text().splitlines()
    assert by_topic[0].startswith("run,topic,pairs,delivered,late,delivery_ratio,delay_median")
    alone = write_run(
        tmp_path / "alone",
        until=100.0,
        contacts=[],
        messages=[(0.0, "A", "m1", "created", 100, 0)],
        targets=[],
        datagrams=[("A", "announce", "sent", 6, 600)],
        hosts=[("A", "g1")],
    )
    out = tmp_path / "report-alone"
    result = CliRunner().invoke(analyze, [str(alone), "--out", str(out)])
    assert result.exit_code == 0, result.output
    for key in ("topic", "group", "host"):
        lines = (out / f"delivery_by_{key}.csv").read_text().splitlines()
        assert lines and lines[0].startswith(f"run,{key},pairs,delivered"), (key, lines)
