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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

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
    ("contacts.contact_duration.median", "contact duration median (s)"),
    ("contacts.inter_contact_time.median", "inter-contact median (s)"),
)
"""Rows of the side-by-side summary (dotted paths into a run's metrics) and their labels."""

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


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "run"


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    fields: list[str] = []
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
    _write_csv(out / "summary.csv", summary)
    written = ["summary.csv"]
    table_names = sorted({t for r in results for t in r.tables})
    for table in table_names:
        rows = [{"run": r.name, **row} for r in results for row in r.tables.get(table, [])]
        _write_csv(out / f"{table}.csv", rows)
        written.append(f"{table}.csv")
    curves = []
    for r in results:
        pairs = r.metrics.get("target_pairs") or 0
        w = (r.series.get("until") or 0.0) / 200
        delivered = r.series.get("delivered_over_time") or []
        oracle = r.series.get("oracle_over_time") or []
        for k, n in enumerate(delivered):
            row = {"run": r.name, "time": k * w, "delivered_fraction": n / pairs if pairs else None}
            if oracle:
                row["oracle_fraction"] = oracle[k] / pairs if pairs else None
            curves.append(row)
    if curves:
        _write_csv(out / "delivery_over_time.csv", curves)
        written.append("delivery_over_time.csv")
    quantiles = []
    for r in results:
        for key in ("delay_cdf", "oracle_delay_cdf", "contact_duration_cdf", "ict_cdf"):
            for value, p in r.series.get(key) or []:
                quantiles.append({"run": r.name, "distribution": key[:-4], "p": p, "value": value})
    _write_csv(out / "quantiles.csv", quantiles)
    written.append("quantiles.csv")
    return written


# --- plots -------------------------------------------------------------------------------


def _fig(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Any]:
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Figure, ax: Any, path: Path, legend: bool = True) -> None:
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_delivery_over_time(runs: Sequence[RunResult], path: Path) -> None:
    fig, ax = _fig("Delivery over time", "simulated time (s)", "fraction of target pairs")
    for i, r in enumerate(runs):
        pairs = r.metrics.get("target_pairs") or 0
        w = (r.series.get("until") or 0.0) / 200
        color = f"C{i}"
        for key, style, label in (
            ("delivered_over_time", "-", r.name),
            ("oracle_over_time", "--", f"{r.name} (oracle)"),
        ):
            ys = r.series.get(key) or []
            if ys and pairs:
                xs = [k * w for k in range(len(ys))]
                ax.plot(xs, [y / pairs for y in ys], style, color=color, label=label)
    ax.set_ylim(0, 1.02)
    _save(fig, ax, path)


def _plot_cdf(
    runs: Sequence[RunResult], key: str, path: Path, title: str, xlabel: str, logx: bool = False
) -> None:
    fig, ax = _fig(title, xlabel, "P(X ≤ x)")
    for i, r in enumerate(runs):
        pts = [(v, p) for v, p in r.series.get(key) or [] if not logx or v > 0]
        if pts:
            ax.step(
                [v for v, _ in pts], [p for _, p in pts], where="post", color=f"C{i}", label=r.name
            )
    if logx and ax.get_lines():
        ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    _save(fig, ax, path)


def _plot_ccdf_loglog(runs: Sequence[RunResult], key: str, path: Path) -> None:
    fig, ax = _fig("Inter-contact time CCDF", "inter-contact time (s)", "P(X > x)")
    for i, r in enumerate(runs):
        pts = [(v, 1 - p) for v, p in r.series.get(key) or [] if v > 0 and p < 1]
        if pts:
            ax.plot([v for v, _ in pts], [q for _, q in pts], "-", color=f"C{i}", label=r.name)
    if ax.get_lines():
        ax.set_xscale("log")
        ax.set_yscale("log")
    _save(fig, ax, path)


def _plot_achieved_vs_oracle(runs: Sequence[RunResult], path: Path) -> None:
    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(10, 4.0), dpi=100)
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
    if cdf.get_lines():
        cdf.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
    _save(fig, ax, path)


def _plot_table_series(
    runs: Sequence[RunResult], table: str, col: str, path: Path, title: str, ylabel: str
) -> None:
    fig, ax = _fig(title, "simulated time (s)", ylabel)
    for i, r in enumerate(runs):
        rows = r.tables.get(table) or []
        if rows:
            ax.plot(
                [row["time"] for row in rows],
                [row[col] for row in rows],
                color=f"C{i}",
                label=r.name,
            )
    _save(fig, ax, path)


def write_plots(results: Sequence[RunResult], out: Path) -> list[str]:
    """One PNG per plot in PLOTS; runs without delivery data appear only in contact plots."""
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


# --- html --------------------------------------------------------------------------------


def summary_rows(results: Sequence[RunResult]) -> list[tuple[str, list[str]]]:
    """(label, one formatted value per run) for every summary row some run has."""
    rows = []
    for path, label in SUMMARY_ROWS:
        values = [lookup(r.metrics, path) for r in results]
        if any(v is not None for v in values):
            rows.append((label, [fmt(v) for v in values]))
    return rows


def write_html(
    results: Sequence[RunResult], out: Path, pngs: Sequence[str], csvs: Sequence[str]
) -> Path:
    e = html.escape
    head = "".join(f"<th>{e(r.name)}</th>" for r in results)
    body = "".join(
        f"<tr><th>{e(label)}</th>{''.join(f'<td>{e(v)}</td>' for v in values)}</tr>"
        for label, values in summary_rows(results)
    )
    sources = "".join(f"<li><b>{e(r.name)}</b>: {e(r.source)} ({e(r.kind)})</li>" for r in results)
    titles = dict(PLOTS)
    figs = "".join(
        f'<figure><img src="{e(p)}" alt="{e(titles.get(p[:-4], p))}">'
        f"<figcaption>{e(titles.get(p[:-4], p))}</figcaption></figure>"
        for p in pngs
    )
    links = " · ".join(f'<a href="{e(c)}">{e(c)}</a>' for c in csvs)
    warnings = "".join(
        f"<li>{e(r.name)}: oracle did not converge; its figures are lower bounds</li>"
        for r in results
        if r.metrics.get("oracle_converged") is False
    )
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>DoDWAN simulation analysis</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
tbody th {{ text-align: left; font-weight: normal; }}
figure {{ display: inline-block; margin: 1em; }}
img {{ max-width: 640px; }}
</style></head><body>
<h1>DoDWAN simulation analysis</h1>
<ul>{sources}</ul>
{f"<ul class='warn'>{warnings}</ul>" if warnings else ""}
<h2>Summary</h2>
<table><thead><tr><th>metric</th>{head}</tr></thead><tbody>{body}</tbody></table>
<p>Definitions: docs/metrics.md. Full figures: <a href="metrics.json">metrics.json</a>.
Tables: {links}</p>
<h2>Plots</h2>
{figs}
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
            df.write.mode("overwrite").parquet(f"{base}/{_safe(r.name)}/{name}.parquet")


def write_report(
    results: Sequence[RunResult], out_dir: str | Path, *, tables_out: str | None = None
) -> Path:
    """Write everything for ``results`` into ``out_dir``; return the path of report.html."""
    names = [r.name for r in results]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must be unique, got {names}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    metrics = {r.name: _clean(r.metrics) for r in results}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=False) + "\n")
    csvs = write_tables(results, out)
    pngs = write_plots(results, out)
    write_frames(results, tables_out or str(out.resolve() / "tables"))
    return write_html(results, out, pngs, csvs)
