"""Contact statistics and external contact traces (The ONE CONN lines, CSV) read by Spark."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from spark_fixtures import SPARK_GROUP, shared_spark

from sim.analysis import AnalysisError, analyze_contact_trace
from sim.analysis.cli import analyze
from sim.analysis.contacts import contact_intervals
from sim.analysis.load import read_contact_trace
from sim.mobility.trace import load_trace

pytestmark = SPARK_GROUP

ONE_TRACE = """\
# hosts 1..3
0 CONN 1 2 up
10 CONN 1 2 down
15 CONN 2 1 up
20 CONN 2 3 up
25 CONN 1 2 down
"""
# Intervals: 1-2 [0,10] and [15,25]; 2-3 [20, 25 = last event, still up].
CSV_TRACE = """\
time,a,b,up
0,1,2,true
10,1,2,0
15,2,1,up
20,2,3,1
25,1,2,down
"""


@pytest.fixture(scope="session")
def spark() -> Any:
    return shared_spark()


def test_intervals_from_events(spark: Any) -> None:
    events = [
        (1.0, "A", "B", True),
        (2.0, "B", "A", True),  # repeated up, other orientation: nothing changes
        (4.0, "A", "B", False),
        (5.0, "A", "B", False),  # repeated down
        (6.0, "A", "C", False),  # down without up
        (7.0, "A", "C", True),  # still up at the end: closed at until
        (9.0, "A", "A", True),  # self contact: ignored
    ]
    df = spark.createDataFrame(events, "time double, a string, b string, up boolean")
    rows = contact_intervals(df, 12.0).orderBy("a", "b", "start").collect()
    got = [(r["a"], r["b"], r["start"], r["end"], r["open"]) for r in rows]
    assert got == [("A", "B", 1.0, 4.0, False), ("A", "C", 7.0, 12.0, True)]


@pytest.mark.parametrize(("fmt", "text"), [("one", ONE_TRACE), ("csv", CSV_TRACE)])
def test_spark_reads_a_trace_as_the_simulator_replays_it(
    spark: Any, tmp_path: Path, fmt: str, text: str
) -> None:
    """The analysis reads traces with Spark, the simulator with its own parser: same events."""
    path = tmp_path / f"trace.{fmt}"
    path.write_text(text)
    rows = read_contact_trace(spark, str(path), fmt=fmt).collect()
    got = sorted((r["time"], r["a"], r["b"], r["up"]) for r in rows)
    assert got == sorted((e.time, e.a, e.b, e.up) for e in load_trace(path, fmt))
    assert len(got) == 5


def _figures(spark: Any, path: Path, fmt: str = "auto") -> dict[str, Any]:
    result = analyze_contact_trace(spark, str(path), fmt=fmt)
    assert result.kind == "contacts"
    return dict(result.metrics["contacts"])


def test_one_trace(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text(ONE_TRACE)
    m = _figures(spark, path)
    assert m["events"] == 5
    assert m["hosts"] == 3
    assert m["contacts"] == 3
    assert m["contact_pairs"] == 2
    assert m["contacts_open_at_end"] == 1
    assert m["contact_duration"]["mean"] == pytest.approx((10 + 10 + 5) / 3)
    assert m["inter_contact_time"]["mean"] == 15 - 10
    assert m["until"] == 25.0


def test_csv_trace_gives_the_same_figures(spark: Any, tmp_path: Path) -> None:
    one, csv_path = tmp_path / "trace.one", tmp_path / "trace.csv"
    one.write_text(ONE_TRACE)
    csv_path.write_text(CSV_TRACE)
    assert _figures(spark, csv_path) == _figures(spark, one, fmt="one")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.txt", "0 CONN 1 2 up\n5 CONN 1\n6 FOO 1 2 up\n", "2 malformed line(s)"),
        ("bad.csv", "time,a,b\n0,1,2\n", "missing up"),
        ("bad2.csv", "time,a,b,up\nx,1,2,true\n", "1 malformed line(s)"),
        ("empty.txt", "# nothing\n", "no contact events"),
    ],
)
def test_bad_traces_give_clear_errors(
    spark: Any, tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(AnalysisError, match=re.escape(message)):
        analyze_contact_trace(spark, str(path))


def test_cli_contacts_only(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text(ONE_TRACE)
    out = tmp_path / "report"
    result = CliRunner().invoke(analyze, ["--contacts", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["trace.txt"]["contacts"]["contacts"] == 3
    assert (out / "ict_ccdf.png").exists() and (out / "contact_duration_cdf.png").exists()
    assert not (out / "delay_cdf.png").exists()
    missing = CliRunner().invoke(analyze, ["--contacts", str(tmp_path / "no"), "--out", str(out)])
    assert missing.exit_code == 1 and "no such contact trace" in missing.output


# --- one format, two readers: the simulator's replay and the Spark analysis -----------------

_EVENTS = [(0.0, "1", "2", True), (5.0, "1", "2", False)]

TRACE_CORPUS: list[tuple[str, str, str, list[tuple[float, str, str, bool]] | str]] = [
    ("comment-after-a-line", "one", "0 CONN 1 2 up # first\n5 CONN 1 2 down#gone\n", _EVENTS),
    ("comment-lines-and-blanks", "one", "# hosts\n\n0 CONN 1 2 up\n  \n5 CONN 1 2 down\n", _EVENTS),
    ("lower-case-conn", "one", "0 conn 1 2 UP\n5 Conn 1 2 Down\n", _EVENTS),
    ("crlf-line-ends", "one", "0 CONN 1 2 up\r\n5 CONN 1 2 down\r\n", _EVENTS),
    ("headerless-csv", "csv", "0,1,2,true\n5,1,2,false\n", _EVENTS),
    ("csv-header", "csv", "time,a,b,up\n0,1,2,up\n5,1,2,0\n", _EVENTS),
    ("csv-header-any-order", "csv", "A,b,Time,up,note\n1,2,0,1,x\n1,2,5,0,y\n", _EVENTS),
    ("csv-comments", "csv", "# export\ntime,a,b,up\n0,1,2,up # first\n\n5,1,2,down\n", _EVENTS),
    (
        "csv-header-after-a-long-preamble",
        "csv",
        "# x\n\n" * 40 + "A,b,time,up\n1,2,0,1\n1,2,5,0\n",
        _EVENTS,
    ),
    ("self-contact", "one", "0 CONN 1 2 up\n3 CONN 4 4 up\n", "itself"),
    ("self-contact-csv", "csv", "0,3,3,up\n", "itself"),
    ("negative-time", "one", "-1 CONN 1 2 up\n", "finite number >= 0"),
    ("negative-time-csv", "csv", "time,a,b,up\n-2,1,2,up\n", "finite number >= 0"),
    ("nan-time", "one", "nan CONN 1 2 up\n", "finite number >= 0"),
    ("underscore-time", "one", "0 CONN 1 2 up\n1_0 CONN 1 2 down\n", "time '1_0' is not a number"),
    ("arabic-indic-time-csv", "csv", "time,a,b,up\n٣,1,2,up\n", "time '٣' is not a number"),
    ("plus-and-exponent-times", "one", "+0 CONN 1 2 up\n5e0 CONN 1 2 down\n", _EVENTS),
    ("bad-state", "one", "0 CONN 1 2 sideways\n", "not up or down"),
    ("bad-keyword", "one", "0 LINK 1 2 up\n", "expected '<time> CONN"),
    ("csv-header-missing-up", "csv", "time,a,b\n0,1,2\n", "missing up"),
    ("csv-short-row", "csv", "0,1,2\n", "expected 4 columns"),
    ("bom-at-the-start", "one", "\ufeff0 CONN 1 2 up\n5 CONN 1 2 down\n", _EVENTS),
    ("bom-at-the-start-csv", "csv", "\ufefftime,a,b,up\n0,1,2,up\n5,1,2,down\n", _EVENTS),
    ("bom-on-a-later-line", "one", "0 CONN 1 2 up\n\ufeff5 CONN 1 2 down\n", "byte order mark"),
    ("bom-in-a-field-csv", "csv", "time,a,b,up\n0,1,2,up\n5,1\ufeff,2,down\n", "byte order mark"),
    ("bom-before-a-csv-header", "csv", "# x\n\ufefftime,a,b,up\n0,1,2,up\n", "byte order mark"),
]
"""Edge cases of the contact-trace formats: the events both readers must give, or a piece of
the error both must raise."""


@pytest.mark.parametrize(
    ("fmt", "text", "expected"),
    [c[1:] for c in TRACE_CORPUS],
    ids=[c[0] for c in TRACE_CORPUS],
)
def test_both_trace_readers_agree_on_the_corpus(
    spark: Any, tmp_path: Path, fmt: str, text: str, expected: Any
) -> None:
    from sim.mobility.trace import TraceError

    path = tmp_path / f"trace.{fmt}"
    path.write_bytes(text.encode())
    if isinstance(expected, str):
        with pytest.raises(TraceError, match=re.escape(expected)):
            load_trace(path, fmt)
        with pytest.raises(AnalysisError, match=re.escape(expected)):
            read_contact_trace(spark, str(path), fmt=fmt).collect()
        return
    sim_events = [(e.time, e.a, e.b, e.up) for e in load_trace(path, fmt)]
    rows = read_contact_trace(spark, str(path), fmt=fmt).collect()
    spark_events = sorted((r["time"], r["a"], r["b"], r["up"]) for r in rows)
    assert sim_events == expected
    assert spark_events == expected


@pytest.mark.parametrize(
    ("fmt", "text"),
    [("one", "# gz\n0 CONN 1 2 up\n5 CONN 1 2 down\n"), ("csv", "time,a,b,up\n0,1,2,1\n5,1,2,0\n")],
)
def test_both_trace_readers_read_gzip_traces_alike(
    spark: Any, tmp_path: Path, fmt: str, text: str
) -> None:
    """``dodwan-sim contacts`` writes .gz traces (and scenarios ship one): both readers
    decompress them and give the same events."""
    import gzip

    path = tmp_path / f"trace.{fmt}.gz"
    path.write_bytes(gzip.compress(text.encode()))
    sim_events = [(e.time, e.a, e.b, e.up) for e in load_trace(path, fmt)]
    rows = read_contact_trace(spark, str(path), fmt=fmt).collect()
    assert sim_events == _EVENTS
    assert sorted((r["time"], r["a"], r["b"], r["up"]) for r in rows) == _EVENTS


def test_both_tools_guess_a_trace_format_from_its_name_alike() -> None:
    """``run --contacts`` / ``[contacts] trace`` and ``analyze --contacts`` take the same
    format for the same file name (a gzip CSV trace was The ONE's format to the simulator)."""
    from sim.analysis.load import _guess_format
    from sim.scenario import guess_trace_format

    names = {
        "t.csv": "csv",
        "T.CSV": "csv",
        "t.csv.gz": "csv",
        "t.one.txt": "one",
        "t.one.txt.gz": "one",
        "trace": "one",
    }
    for name, fmt in names.items():
        assert (guess_trace_format(Path(name)), _guess_format(name)) == (fmt, fmt), name
    assert _guess_format("contacts.parquet") == "parquet"  # the analysis reads Parquet too


STATIC_SIX = """\
name = "six"
duration = 10.0
[world]
width = 1000.0
height = 1000.0
[radio]
range = 60.0
[[groups]]
name = "s"
count = 6
[groups.mobility]
model = "static"
positions = {positions}
"""


@pytest.mark.parametrize(
    ("positions", "count", "mean", "pairs"),
    [
        # s-0/s-1 and s-2/s-3 in range, s-4 and s-5 alone: (1 + 1 + 1 + 1 + 0 + 0) / 6
        ("[[0,0],[59.9,0],[500,0],[560,0],[900,900],[900,960.1]]", 6, 4 / 6, 2),
        # nobody meets anybody: every host counts, with 0
        ("[[0,0],[100,0],[200,0],[300,0],[400,0],[500,0]]", 6, 0.0, 0),
    ],
)
def test_distinct_neighbours_counts_the_hosts_that_met_no_one(
    spark: Any, tmp_path: Path, positions: str, count: int, mean: float, pairs: int
) -> None:
    """distinct_neighbours summarises over every host (the hosts table ∪ contact ends): a
    host that met no one had 0 neighbours; leaving it out biased the mean up."""
    from sim.analysis.pipeline import analyze_run
    from sim.runner import simulate
    from sim.scenario import loads

    sc = loads(STATIC_SIX.format(positions=positions), tmp_path / "six.toml")
    simulate(sc, tmp_path / "run")
    c = analyze_run(spark, str(tmp_path / "run"), with_oracle=False).metrics["contacts"]
    assert c["hosts"] == 6 and c["contact_pairs"] == pairs
    nb = c["distinct_neighbours"]
    assert nb["count"] == count
    assert nb["mean"] == pytest.approx(mean)
    assert nb["min"] == 0 and nb["max"] == (1 if pairs else 0)
