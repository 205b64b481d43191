"""Writing the results: metrics.json, CSV tables, Parquet per-pair tables, PNG plots and a
report.html that puts several runs side by side.

Only aggregates (already on the driver) are plotted or written as CSV; per-pair tables stay
DataFrames and are written by Spark as Parquet (``tables_out`` may be any Hadoop path).
"""

from __future__ import annotations

import csv
import html
import json
import math
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from sim.analysis.errors import AnalysisError
from sim.analysis.overhead import KINDS
from sim.analysis.pipeline import RunResult

SUMMARY_ROWS: tuple[tuple[str, str], ...] = (
    ("delivery_ratio", "delivery ratio"),
    ("oracle_delivery_ratio", "oracle delivery ratio"),
    ("efficiency", "efficiency (ratio ÷ oracle)"),
    ("target_pairs", "target pairs"),
    ("delivered", "delivered pairs"),
    ("late_deliveries", "late deliveries"),
    ("latency_avg", "delay mean (s)"),
    ("latency_med", "delay median (s)"),
    ("delay.p90", "delay p90 (s)"),
    ("delay.p99", "delay p99 (s)"),
    ("hopcount_avg", "hops mean"),
    ("overhead_ratio", "ONE overhead ratio"),
    ("overhead.bytes_per_delivered", "bytes sent / delivered pair"),
    ("overhead.bytes_per_delivered_byte", "bytes sent / delivered byte"),
    ("contacts.contacts", "contacts"),
    ("contacts.contacts_open_at_end", "contacts still open at the end (censored)"),
    ("contacts.contact_duration.median", "contact duration median (s)"),
    ("contacts.inter_contact_time.median", "inter-contact median (s)"),
)
"""Rows of the side-by-side summary (dotted paths into a run's metrics) and their labels."""

EXPLAIN: dict[str, str] = {
    "delivery_ratio": "target pairs delivered by their deadline ÷ target pairs",
    "oracle_delivery_ratio": "the best any protocol could deliver on these contacts "
    "(unlimited bandwidth and storage)",
    "efficiency": "delivery ratio ÷ oracle delivery ratio; 1 = as good as any protocol could "
    "be on these contacts",
    "target_pairs": "(message, interested host) pairs — The ONE's 'created'",
    "late_deliveries": "delivered after the deadline (not counted as delivered)",
    "overhead_ratio": "The ONE's (relayed − delivered) / delivered, relayed = complete copies "
    "received by hosts other than the origin; 0 = every copy made reached an interested host",
    "overhead.bytes_per_delivered": "every datagram byte sent, all kinds, ÷ delivered pairs",
    "contacts.contacts_open_at_end": "their duration is cut at the end of the run: a lower "
    "bound (right-censored)",
}
"""Short explanations shown next to the summary rows (full definitions: metrics.md)."""

PLOTS = (
    ("delivery_over_time", "Delivery over time"),
    ("delay_cdf", "Delay CDF"),
    ("achieved_vs_oracle", "Achieved vs oracle"),
    ("overhead_by_kind", "Overhead by kind"),
    ("ict_ccdf", "Inter-contact time CCDF"),
    ("contact_duration_cdf", "Contact duration CDF"),
    ("degree_over_time", "Mean degree over time"),
    ("cache_occupancy", "Cache occupancy"),
)


def lookup(metrics: dict[str, Any], path: str) -> Any:
    """The value at a dotted path in a run's metrics, or None."""
    cur: Any = metrics
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def fmt(value: Any) -> str:
    """A figure as shown in tables: 4 significant digits, '-' for missing."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def clean_json(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "run"


BREAKDOWN_COLUMNS = ("pairs", "delivered", "late", "delivery_ratio", "delay_median")
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    **{
        f"delivery_by_{key}": ("run", key, *BREAKDOWN_COLUMNS) for key in ("topic", "group", "host")
    },
    "hop_histogram": ("run", "hops", "pairs"),
    "quantiles": ("run", "distribution", "p", "value"),
}
"""The columns of the tables that may have no row (nothing delivered, no target): their
CSV files still have a header."""


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str] = ()) -> None:
    """``rows`` as CSV: the ``columns`` first, then any other key of the rows."""
    fields: list[str] = list(columns)
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in fields})


def write_tables(results: Sequence[RunResult], out: Path) -> list[str]:
    """CSV files: summary.csv (one column per run) and one file per aggregate table."""
    summary = [
        {"metric": path, **{r.name: lookup(r.metrics, path) for r in results}}
        for path, _ in SUMMARY_ROWS
    ]
    write_csv(out / "summary.csv", summary)
    written = ["summary.csv"]
    table_names = sorted({t for r in results for t in r.tables})
    for table in table_names:
        rows = [{"run": r.name, **row} for r in results for row in r.tables.get(table, [])]
        write_csv(out / f"{table}.csv", rows, TABLE_COLUMNS.get(table, ()))
        written.append(f"{table}.csv")
    curves = []
    for r in results:
        for t, delivered, published, oracle in _delivery_curve(r):
            row = {
                "run": r.name,
                "time": t,
                "published_pairs": published,
                "delivered_fraction": delivered / published if published else None,
            }
            if oracle is not None:
                row["oracle_fraction"] = oracle / published if published else None
            curves.append(row)
    if curves:
        write_csv(out / "delivery_over_time.csv", curves)
        written.append("delivery_over_time.csv")
    quantiles = []
    for r in results:
        for key in ("delay_cdf", "oracle_delay_cdf", "contact_duration_cdf", "ict_cdf"):
            for value, p in r.series.get(key) or []:
                quantiles.append({"run": r.name, "distribution": key[:-4], "p": p, "value": value})
    write_csv(out / "quantiles.csv", quantiles, TABLE_COLUMNS["quantiles"])
    written.append("quantiles.csv")
    return written


# --- plots -------------------------------------------------------------------------------

DPI = 100
"""PNG pixels per inch; the HTML shows every PNG at exactly its pixel size."""
SIZE = (6.4, 4.0)
"""Inches of a normal figure (640 x 400 px); wide figures span the two grid columns."""
WIDE = (12.8, 4.0)
WIDE_PLOTS = ("achieved_vs_oracle",)


def _delivery_curve(r: RunResult) -> list[tuple[float, float, float, float | None]]:
    """(time, delivered pairs, pairs published so far, oracle pairs) at the curve's samples.

    The denominator counts only the target pairs of messages already published at that time
    (runs analysed before that series existed fall back to all target pairs)."""
    until = r.series.get("until") or 0.0
    delivered = r.series.get("delivered_over_time") or []
    published = r.series.get("published_over_time")
    oracle = r.series.get("oracle_over_time") or []
    pairs = float(r.metrics.get("target_pairs") or 0)
    w = until / max(len(delivered) - 1, 1)
    return [
        (
            k * w,
            float(n),
            float(published[k]) if published else pairs,
            float(oracle[k]) if oracle else None,
        )
        for k, n in enumerate(delivered)
    ]


def _time_unit(runs: Sequence[RunResult]) -> tuple[float, str]:
    """Seconds per unit and unit name for a time axis: s, min or h by the longest run."""
    until = max((float(r.series.get("until") or 0.0) for r in runs), default=0.0)
    if until > 3 * 3600:
        return 3600.0, "h"
    if until > 30 * 60:
        return 60.0, "min"
    return 1.0, "s"


def _fig(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Any]:
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _tidy_log_axis(axis: Any) -> None:
    """Label a log axis with a few plain numbers and never the minor ticks (whose labels
    overlap when the axis spans one or two decades)."""
    lo, hi = sorted(axis.get_view_interval())
    if lo <= 0 or hi <= 0:
        return
    decades = math.log10(hi / lo)
    subs = (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def save_figure(fig: Figure, ax: Any, path: Path, legend: bool = True) -> None:
    """Write the figure as PNG (for the page) and SVG (for papers)."""
    if legend and ax is not None and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    for a in fig.axes:
        if a.get_xscale() == "log":
            _tidy_log_axis(a.xaxis)
        if a.get_yscale() == "log":
            _tidy_log_axis(a.yaxis)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    fig.savefig(path.with_suffix(".svg"))
    plt.close(fig)


def _plot_delivery_over_time(runs: Sequence[RunResult], path: Path) -> None:
    scale, unit = _time_unit(runs)
    fig, ax = _fig(
        "Delivery over time", f"simulated time ({unit})", "delivered ÷ pairs published so far"
    )
    for i, r in enumerate(runs):
        curve = _delivery_curve(r)
        pts = [(t / scale, d / p, o / p if o is not None else None) for t, d, p, o in curve if p]
        if not pts:
            continue
        xs = [x for x, _, _ in pts]
        ax.plot(xs, [y for _, y, _ in pts], "-", color=f"C{i}", label=r.name)
        if pts[0][2] is not None:
            ax.plot(xs, [o for _, _, o in pts], "--", color=f"C{i}", label=f"{r.name} (oracle)")
    ax.set_ylim(0, 1.02)
    save_figure(fig, ax, path)


def _censored(r: RunResult) -> int:
    return int(lookup(r.metrics, "contacts.contacts_open_at_end") or 0)


def _plot_cdf(
    runs: Sequence[RunResult],
    key: str,
    path: Path,
    title: str,
    xlabel: str,
    logx: bool = False,
    censored: bool = False,
) -> None:
    fig, ax = _fig(title, xlabel, "P(X ≤ x)")
    for i, r in enumerate(runs):
        pts = [(v, p) for v, p in r.series.get(key) or [] if not logx or v > 0]
        label = r.name
        if censored and _censored(r):
            label += f" ({_censored(r)} censored: still open at the end)"
        if pts:
            ax.step(
                [v for v, _ in pts], [p for _, p in pts], where="post", color=f"C{i}", label=label
            )
    if logx and ax.get_lines():
        ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    save_figure(fig, ax, path)


def _plot_ccdf_loglog(runs: Sequence[RunResult], key: str, path: Path) -> None:
    fig, ax = _fig("Inter-contact time CCDF", "inter-contact time (s)", "P(X > x)")
    for i, r in enumerate(runs):
        pts = [(v, 1 - p) for v, p in r.series.get(key) or [] if v > 0 and p < 1]
        if pts:
            ax.plot([v for v, _ in pts], [q for _, q in pts], "-", color=f"C{i}", label=r.name)
    if ax.get_lines():
        ax.set_xscale("log")
        ax.set_yscale("log")
    save_figure(fig, ax, path)


def _plot_achieved_vs_oracle(runs: Sequence[RunResult], path: Path) -> None:
    fig, (bars, cdf) = plt.subplots(1, 2, figsize=WIDE, dpi=DPI)
    names = [r.name for r in runs]
    xs = range(len(runs))
    got = [r.metrics.get("delivery_ratio") or 0.0 for r in runs]
    best = [r.metrics.get("oracle_delivery_ratio") or 0.0 for r in runs]
    bars.bar([x - 0.2 for x in xs], got, width=0.4, label="achieved")
    bars.bar([x + 0.2 for x in xs], best, width=0.4, label="oracle", alpha=0.6)
    bars.set_xticks(list(xs), names, rotation=20, fontsize=8)
    bars.set_ylim(0, 1.05)
    bars.set_ylabel("delivery ratio")
    bars.set_title("Delivery ratio: achieved vs oracle")
    bars.legend(fontsize=8)
    cdf.set_title("Pairs delivered within a delay")
    cdf.set_xlabel("delay since creation (s)")
    cdf.set_ylabel("fraction of target pairs")
    cdf.grid(True, alpha=0.3)
    for i, r in enumerate(runs):
        pairs = r.metrics.get("target_pairs") or 0
        for key, count_key, style, label in (
            ("delay_cdf", "delivered_pairs", "-", r.name),
            ("oracle_delay_cdf", "oracle_delivered_pairs", "--", f"{r.name} (oracle)"),
        ):
            pts = r.series.get(key) or []
            n = r.metrics.get(count_key) or 0
            if pts and pairs:
                cdf.step(
                    [v for v, _ in pts],
                    [p * n / pairs for _, p in pts],
                    style,
                    where="post",
                    color=f"C{i}",
                    label=label,
                )
    cdf.set_ylim(0, 1.02)
    save_figure(fig, cdf, path)


def _plot_overhead(runs: Sequence[RunResult], path: Path) -> None:
    fig, ax = _fig("Overhead by kind", "datagram kind", "bytes sent per delivered pair")
    kinds = list(KINDS)
    width = 0.8 / max(len(runs), 1)
    for i, r in enumerate(runs):
        table = {row["kind"]: row for row in r.tables.get("overhead_by_kind", [])}
        ys = [(table.get(k) or {}).get("bytes_per_delivered") or 0.0 for k in kinds]
        ax.bar(
            [j + (i - (len(runs) - 1) / 2) * width for j in range(len(kinds))],
            ys,
            width=width,
            color=f"C{i}",
            label=r.name,
        )
    ax.set_xticks(range(len(kinds)), kinds)
    save_figure(fig, ax, path)


def _plot_table_series(
    runs: Sequence[RunResult], table: str, col: str, path: Path, title: str, ylabel: str
) -> None:
    scale, unit = _time_unit(runs)
    fig, ax = _fig(title, f"simulated time ({unit})", ylabel)
    for i, r in enumerate(runs):
        rows = r.tables.get(table) or []
        if rows:
            ax.plot(
                [row["time"] / scale for row in rows],
                [row[col] for row in rows],
                color=f"C{i}",
                label=r.name,
            )
    save_figure(fig, ax, path)


def write_plots(results: Sequence[RunResult], out: Path) -> list[str]:
    """One PNG (and SVG) per plot in PLOTS; runs without delivery data appear only in contact
    plots."""
    sims = [r for r in results if r.kind == "run"]
    files = []
    if sims:
        _plot_delivery_over_time(sims, out / "delivery_over_time.png")
        _plot_cdf(
            sims,
            "delay_cdf",
            out / "delay_cdf.png",
            "Delay CDF (delivered pairs)",
            "delay since creation (s)",
        )
        _plot_achieved_vs_oracle(sims, out / "achieved_vs_oracle.png")
        _plot_overhead(sims, out / "overhead_by_kind.png")
        _plot_table_series(
            sims,
            "cache_occupancy",
            "mean_bytes",
            out / "cache_occupancy.png",
            "Cache occupancy",
            "mean bytes per host",
        )
        files += [
            "delivery_over_time",
            "delay_cdf",
            "achieved_vs_oracle",
            "overhead_by_kind",
            "cache_occupancy",
        ]
    _plot_ccdf_loglog(results, "ict_cdf", out / "ict_ccdf.png")
    _plot_cdf(
        results,
        "contact_duration_cdf",
        out / "contact_duration_cdf.png",
        "Contact duration CDF",
        "contact duration (s)",
        logx=True,
        censored=True,
    )
    _plot_table_series(
        results,
        "degree_over_time",
        "mean_degree",
        out / "degree_over_time.png",
        "Mean degree over time",
        "mean neighbours per host",
    )
    files += ["ict_ccdf", "contact_duration_cdf", "degree_over_time"]
    return [f"{f}.png" for f in files]


# --- The ONE -----------------------------------------------------------------------------


def one_message_stats(r: RunResult) -> str:
    """The run in the text format of The ONE's MessageStatsReport (same keys, same order,
    doubles with 4 decimals). Figures this simulator does not have (transfers started or
    aborted, drops, buffer times, round trips) are NaN, as The ONE writes undefined values."""

    def dbl(v: Any) -> str:
        return "NaN" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"

    def count(v: Any) -> str:
        return "NaN" if v is None else str(int(v))

    m = r.metrics
    hops_med = lookup(m, "hops.median")
    lines = [
        f"Message stats for scenario {lookup(m, 'run.scenario') or r.name}",
        f"sim_time: {dbl(r.series.get('until'))}",
        f"created: {count(m.get('created'))}",
        "started: NaN",
        f"relayed: {count(m.get('relayed'))}",
        "aborted: NaN",
        "dropped: NaN",
        "removed: NaN",
        f"delivered: {count(m.get('delivered'))}",
        f"delivery_prob: {dbl(m.get('delivery_prob'))}",
        "response_prob: NaN",
        f"overhead_ratio: {dbl(m.get('overhead_ratio'))}",
        f"latency_avg: {dbl(m.get('latency_avg'))}",
        f"latency_med: {dbl(m.get('latency_med'))}",
        f"hopcount_avg: {dbl(m.get('hopcount_avg'))}",
        f"hopcount_med: {int(hops_med) if hops_med is not None else 0}",
        "buffertime_avg: NaN",
        "buffertime_med: NaN",
        "rtt_avg: NaN",
        "rtt_med: NaN",
    ]
    return "\n".join(lines) + "\n"


def write_one_reports(results: Sequence[RunResult], out: Path) -> list[str]:
    files = []
    for r in results:
        if r.kind != "run":
            continue
        name = f"{safe_name(r.name)}.MessageStatsReport.txt"
        (out / name).write_text(one_message_stats(r), encoding="utf-8")
        files.append(name)
    return files


# --- html --------------------------------------------------------------------------------


METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

REPORT_FILES = (
    "*.csv", "*.png", "*.svg", "*.MessageStatsReport.txt",
    "report.html", "metrics.json", "metrics.md", "aggregate.json",
)  # fmt: skip
"""What a report writes into its folder (besides ``tables/``)."""


def prepare_report_dir(out: Path) -> None:
    """Make ``out`` ready for a new report: a new or empty folder as it is; the folder of an
    earlier report (it has ``metrics.json``) without that report's files and ``tables/``
    (so no figure of a former analysis sits among the new ones; other files stay); any
    other non-empty folder refused."""
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / "metrics.json").is_file():
        raise AnalysisError(
            f"{out}: not empty and holds no earlier report (no metrics.json): give a new or "
            "empty folder, or the folder of an earlier report to replace it"
        )
    for pattern in REPORT_FILES:
        for path in out.glob(pattern):
            if path.is_file():
                path.unlink()
    if (out / "tables").is_dir():
        shutil.rmtree(out / "tables")


"""Definitions of every figure; copied next to report.html so the link works offline."""

STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
tbody th { text-align: left; font-weight: normal; }
td.note { text-align: left; color: #555; font-size: 0.85em; max-width: 36em; }
p.note { color: #555; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(660px, 1fr));
         gap: 1em; }
.plots figure { margin: 0; }
.plots figure.wide { grid-column: 1 / -1; }
img { max-width: 100%; height: auto; }
.warn { color: #a40; }
"""


def mean_column(results: Sequence[RunResult]) -> str | None:
    """The header of a mean ± CI column when ``results`` are several runs of the same
    settings and input files, simulated for the same time, with distinct seeds (seeds run by
    hand); None otherwise (:func:`mean_column_note` says why)."""
    return _mean_verdict(results)[0]


def mean_column_note(results: Sequence[RunResult]) -> str | None:
    """One line saying why several runs get no mean ± CI column; None when they get one (or
    there is a single input)."""
    return _mean_verdict(results)[1]


def _mean_verdict(results: Sequence[RunResult]) -> tuple[str | None, str | None]:
    if len(results) < 2:
        return None, None
    if any(r.kind != "run" for r in results):
        return None, "no mean column: not every input is a simulation run"
    runs = [r.metrics.get("run") or {} for r in results]
    old = [r.name for r, run in zip(results, runs, strict=True) if not run.get("settings_sha256")]
    if old:
        return None, (
            f"no mean column: {', '.join(old)} predate(s) settings digests (run.json has no "
            "settings_sha256), so nothing tells whether the runs share settings"
        )
    if len({run["settings_sha256"] for run in runs}) > 1:
        return None, "no mean column: runs differ in settings or input files"
    ends = [run.get("analysed_until", run.get("until")) for run in runs]
    if len(set(ends)) > 1:
        return None, (
            "no mean column: runs differ in simulated time (until "
            + ", ".join(dict.fromkeys(f"{fmt(e)} s" for e in ends))
            + ")"
        )
    seeds = [run.get("seed") for run in runs]
    shared = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
    if shared:
        return None, f"no mean column: runs share seed {', '.join(map(str, shared))}"
    return f"mean ± 95 % CI ({len(results)} runs)", None


def _mean_ci(values: Sequence[Any]) -> str:
    """Mean ± Student-t 95 % CI half width of the values, '-' unless all are numbers."""
    from sim.analysis.aggregate import summarise

    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(nums) != len(values) or not all(math.isfinite(v) for v in nums):
        return "-"
    m = summarise(nums)
    return fmt(m.mean) if m.ci is None else f"{fmt(m.mean)} ± {fmt(m.ci)}"


def summary_rows(results: Sequence[RunResult]) -> list[tuple[str, list[str]]]:
    """(label, one formatted value per run, then the mean ± CI when :func:`mean_column`)
    for every summary row some run has."""
    return [(label, values) for _, label, values in _summary_rows(results)]


def _summary_rows(results: Sequence[RunResult]) -> list[tuple[str, str, list[str]]]:
    rows = []
    with_mean = mean_column(results) is not None
    for path, label in SUMMARY_ROWS:
        values = [lookup(r.metrics, path) for r in results]
        if any(v is not None for v in values):
            texts = [fmt(v) for v in values] + ([_mean_ci(values)] if with_mean else [])
            rows.append((path, label, texts))
    return rows


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, from its IHDR chunk."""
    head = path.read_bytes()[:24]
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _describe_source(r: RunResult) -> str:
    e = html.escape
    run = r.metrics.get("run") or {}
    parts = []
    if run.get("scenario"):
        parts.append(f"scenario <b>{e(str(run['scenario']))}</b>")
    if run.get("seed") is not None:
        parts.append(f"seed {e(str(run['seed']))}")
    sweep = r.metrics.get("sweep") or {}
    if sweep.get("setting"):  # the sweep's own label: values as in the scenario file
        label = sweep.get("label") or ", ".join(
            f"{k}={v if isinstance(v, str) else json.dumps(v, separators=(',', ':'))}"
            for k, v in sweep["setting"].items()
        )
        parts.append("settings " + e(str(label)))
    if run.get("complete") is False:  # stopped part-way: analysed up to where it got
        parts.append(
            f"<b>stopped part-way</b>: analysed up to {fmt(run.get('analysed_until'))} s of "
            f"{fmt(run.get('until'))} s"
        )
    elif run.get("until") is not None:
        parts.append(f"{fmt(run['until'])} s simulated")
    what = "; ".join(parts)
    return f"<li><b>{e(r.name)}</b>: {what + '; ' if what else ''}{e(r.source)} ({e(r.kind)})</li>"


def _breakdown_html(results: Sequence[RunResult], key: str) -> str:
    """One table per breakdown: rows = values of ``key``, per run delivery ratio (and oracle)."""
    e = html.escape
    table = f"delivery_by_{key}"
    runs = [r for r in results if r.tables.get(table)]
    if not runs:
        return ""
    values = sorted({str(row[key]) for r in runs for row in r.tables[table]})
    cols = ("pairs", "delivery_ratio", "oracle_delivery_ratio", "delay_median")
    head = "".join(f"<th colspan='{len(cols)}'>{e(r.name)}</th>" for r in runs)
    sub = "".join(f"<th>{e(c.replace('_', ' '))}</th>" for _ in runs for c in cols)
    body = []
    for v in values:
        cells = []
        for r in runs:
            row = next((x for x in r.tables[table] if str(x[key]) == v), {})
            cells += [f"<td>{e(fmt(row.get(c)))}</td>" for c in cols]
        body.append(f"<tr><th>{e(v)}</th>{''.join(cells)}</tr>")
    return (
        f"<h3>Delivery by {e(key)}</h3><table><thead><tr><th rowspan='2'>{e(key)}</th>{head}"
        f"</tr><tr>{sub}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def write_html(
    results: Sequence[RunResult],
    out: Path,
    pngs: Sequence[str],
    csvs: Sequence[str],
    extra: str = "",
    title: str = "DoDWAN simulation analysis",
) -> Path:
    e = html.escape
    head = "".join(f"<th>{e(r.name)}</th>" for r in results)
    mean_head = mean_column(results)
    if mean_head is not None:
        head += f"<th>{e(mean_head)}</th>"
    body = "".join(
        f"<tr><th>{e(label)}</th>{''.join(f'<td>{e(v)}</td>' for v in values)}"
        f"<td class='note'>{e(EXPLAIN.get(path, ''))}</td></tr>"
        for path, label, values in _summary_rows(results)
    )
    sources = "".join(_describe_source(r) for r in results)
    titles = dict(PLOTS)
    figs = []
    for p in pngs:
        w, h = _png_size(out / p)
        name = p[:-4]
        caption = e(titles.get(name, name))
        wide = " class='wide'" if name in WIDE_PLOTS or name.startswith("sweep_") else ""
        figs.append(
            f'<figure{wide}><img src="{e(p)}" width="{w}" height="{h}" alt="{caption}">'
            f'<figcaption>{caption} (<a href="{e(name)}.svg">SVG</a>)</figcaption></figure>'
        )
    links = " · ".join(f'<a href="{e(c)}">{e(c)}</a>' for c in csvs)
    warnings = "".join(
        f"<li>{e(r.name)}: oracle did not converge; its figures are lower bounds</li>"
        for r in results
        if r.metrics.get("oracle_converged") is False
    )
    doc_link = (
        '<a href="metrics.md">metrics.md</a>'
        if (out / "metrics.md").exists()
        else ("docs/metrics.md in the source tree")
    )
    breakdowns = "".join(_breakdown_html(results, k) for k in ("topic", "group"))
    note = mean_column_note(results)
    summary = (
        f"<h2>Summary</h2><table><thead><tr><th>metric</th>{head}<th>meaning</th></tr></thead>"
        f"<tbody>{body}</tbody></table>" + (f"<p class='note'>{e(note)}</p>" if note else "")
        if results
        else ""
    )
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>{STYLE}</style></head><body>
<h1>{e(title)}</h1>
<ul>{sources}</ul>
{f"<ul class='warn'>{warnings}</ul>" if warnings else ""}
{extra}
{summary}
<p>Definitions of every figure: {doc_link}. Full figures: <a href="metrics.json">metrics.json</a>.
Tables: {links}</p>
{breakdowns}
<h2>Plots</h2>
<div class="plots">{"".join(figs)}</div>
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc, encoding="utf-8")
    return path


def write_frames(results: Sequence[RunResult], tables_out: str) -> None:
    """Per-pair DataFrames as Parquet under ``tables_out/<run>/<table>.parquet`` (by Spark)."""
    base = tables_out.rstrip("/")
    for r in results:
        for name, df in r.frames.items():
            df.write.mode("overwrite").parquet(f"{base}/{safe_name(r.name)}/{name}.parquet")


def write_report(
    results: Sequence[RunResult],
    out_dir: str | Path,
    *,
    tables_out: str | None = None,
    sweep: Any = None,
) -> Path:
    """Write everything for ``results`` into ``out_dir``; return the path of report.html.

    With ``sweep`` (a ``(SweepInput, [SettingResult])`` pair) the page shows the per-setting
    aggregates and their plots instead of one column and one curve per run.
    """
    names = [r.name for r in results]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must be unique, got {names}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = {r.name: clean_json(r.metrics) for r in results}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=False) + "\n")
    csvs = write_tables(results, out)
    copy_metrics_doc(out)
    write_frames(results, tables_out or str(out.resolve() / "tables"))
    if sweep is not None:
        from sim.analysis.sweep_report import write_sweep

        pngs, more, section = write_sweep(sweep[0], sweep[1], out)
        csvs = more + csvs + write_one_reports(results, out)
        return write_html([], out, pngs, csvs, extra=section, title="DoDWAN sweep analysis")
    pngs = write_plots(results, out)
    csvs += write_one_reports(results, out)
    return write_html(results, out, pngs, csvs)


def copy_metrics_doc(out: Path) -> None:
    """Put the metric definitions next to the report (when the docs are at hand)."""
    if METRICS_DOC.is_file():
        shutil.copyfile(METRICS_DOC, out / "metrics.md")
