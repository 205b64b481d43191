"""A sweep folder in (``dodwan-sim sweep`` output), per-setting aggregates out: the runs to
analyse, then mean ± 95 % CI tables, metric-vs-parameter plots with error bars, a CSV and
``aggregate.json``."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sim.analysis.aggregate import SettingResult, aggregate
from sim.analysis.errors import AnalysisError
from sim.analysis.pipeline import RunResult
from sim.analysis.report import DPI, EXPLAIN, clean_json, fmt, safe_name, save_figure, write_csv

SWEEP_METRICS: tuple[tuple[str, str], ...] = (
    ("delivery_ratio", "delivery ratio"),
    ("oracle_delivery_ratio", "oracle delivery ratio"),
    ("efficiency", "efficiency"),
    ("latency_med", "delay median (s)"),
    ("latency_avg", "delay mean (s)"),
    ("hopcount_avg", "hops mean"),
    ("overhead_ratio", "ONE overhead ratio"),
    ("overhead.bytes_per_delivered", "bytes sent / delivered pair"),
)
"""The metrics shown in the sweep's HTML table and plots (every metric is in the CSV)."""


@dataclass
class SweepRun:
    name: str
    path: str
    setting: dict[str, Any]
    label: str
    seed: int


@dataclass
class SweepInput:
    root: str
    manifest: dict[str, Any]
    runs: list[SweepRun]
    missing: list[str]
    """Runs of the plan that have not finished (no _SUCCESS marker)."""


def is_sweep(path: str) -> bool:
    from sim.sweep import MANIFEST, Store

    try:
        return Store(path).exists(MANIFEST)
    except (OSError, ValueError):
        return False


MISSING_SHOWN = 10
"""Unfinished runs named on the terminal (the page and aggregate.json name them all)."""


def missing_text(missing: list[str]) -> str:
    """The unfinished runs of a sweep, for the terminal: how many, and which."""
    shown = ", ".join(missing[:MISSING_SHOWN])
    more = f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else ""
    return f"{len(missing)} not finished (left out): {shown}{more}"


def read_sweep(path: str) -> SweepInput:
    """The finished runs of the sweep at ``path`` (local folder or URI)."""
    from sim.sweep import MANIFEST, MARKER, Store

    store = Store(path)
    try:
        manifest = json.loads(store.read_text(MANIFEST))
        runs_raw = manifest["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AnalysisError(f"{path}/{MANIFEST}: not a usable sweep manifest ({e})") from e
    runs, missing = [], []
    try:  # every entry as ``dodwan-sim sweep`` writes it: dir, seed, setting
        entries = [(str(r["dir"]), dict(r.get("setting") or {}), int(r["seed"])) for r in runs_raw]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise AnalysisError(
            f"{path}/{MANIFEST}: not a usable sweep manifest (a run entry: {e!r})"
        ) from e
    for rel, setting, seed in entries:
        if not store.exists(f"{rel}/{MARKER}"):
            missing.append(rel)
            continue
        label = ", ".join(f"{k}={json.dumps(v)}" for k, v in setting.items()) or "(base)"
        name = rel.removeprefix("runs/")
        runs.append(SweepRun(name, store.uri(rel), setting, label, seed))
    if not runs:
        raise AnalysisError(f"{path}: no finished run in this sweep (run dodwan-sim sweep first)")
    return SweepInput(store.root, manifest, runs, missing)


def aggregate_results(sweep: SweepInput, results: Sequence[RunResult]) -> list[SettingResult]:
    by_name = {r.name: r for r in results}
    return aggregate(
        [(r.name, r.setting, r.label, r.seed, by_name[r.name].metrics) for r in sweep.runs]
    )


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return json.dumps(v) if isinstance(v, list | dict) else str(v)


def mean_ci(s: SettingResult, path: str, sd: bool = False) -> str:
    """``mean ± CI half width`` of a metric (``(sd s)`` appended with ``sd``)."""
    m = s.metrics.get(path)
    if m is None:
        return "-"
    if m.ci is None:
        return fmt(m.mean)
    return f"{fmt(m.mean)} ± {fmt(m.ci)}" + (f" (sd {fmt(m.std)})" if sd else "")


def summary_csv_rows(
    keys: Sequence[str], settings: Sequence[SettingResult]
) -> list[dict[str, Any]]:
    rows = []
    for s in settings:
        for path, summary in sorted(s.metrics.items()):
            rows.append(
                {
                    **{k: _value_text(s.setting.get(k)) for k in keys},
                    "metric": path,
                    **summary.as_dict(),
                }
            )
    return rows


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def plot_key(key: str, keys: Sequence[str], settings: Sequence[SettingResult], path: Path) -> None:
    """Headline metrics vs ``key`` with 95 % CI error bars; one line per combination of the
    other keys."""
    metrics = [(p, label) for p, label in SWEEP_METRICS if any(p in s.metrics for s in settings)]
    cols = 2
    rows = max(1, (len(metrics) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12.8, 3.2 * rows), dpi=DPI, squeeze=False)
    xs_all = list(dict.fromkeys(_value_text(s.setting.get(key)) for s in settings))
    raw = {_value_text(s.setting.get(key)): s.setting.get(key) for s in settings}
    numeric = _numeric(list(raw.values()))
    others = [k for k in keys if k != key]
    lines: dict[str, list[SettingResult]] = {}
    for s in settings:
        label = ", ".join(f"{k}={_value_text(s.setting.get(k))}" for k in others)
        lines.setdefault(label, []).append(s)
    for ax, (mpath, mlabel) in zip(axes.flat, metrics, strict=False):
        for i, (label, group) in enumerate(lines.items()):
            pts = []
            for s in group:
                m = s.metrics.get(mpath)
                if m is None:
                    continue
                xv = _value_text(s.setting.get(key))
                x = float(raw[xv]) if numeric else float(xs_all.index(xv))
                pts.append((x, m.mean, m.ci or 0.0))
            pts.sort()
            if pts:
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    yerr=[p[2] for p in pts],
                    fmt="o-",
                    capsize=4,
                    color=f"C{i}",
                    label=label or None,
                )
        ax.set_title(mlabel, fontsize=10)
        ax.set_xlabel(key)
        ax.grid(True, alpha=0.3)
        if not numeric:
            ax.set_xticks(range(len(xs_all)), xs_all)
        elif len(raw) <= 12:  # the swept values themselves, not 1.25, 1.5, ...
            ax.set_xticks(sorted(float(v) for v in raw.values()), sorted(raw, key=float))
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper right", fontsize=8)
    fig.suptitle(f"mean ± 95 % CI over seeds vs {key}", fontsize=11)
    save_figure(fig, None, path, legend=False)


def write_sweep(
    sweep: SweepInput, settings: Sequence[SettingResult], out: Path
) -> tuple[list[str], list[str], str]:
    """Write aggregate.json, sweep_summary.csv and one plot per swept key; return (pngs,
    csvs, HTML section)."""
    e = html.escape
    keys = list(sweep.manifest.get("keys") or [])
    seeds = sweep.manifest.get("seeds") or []
    agg = {
        "scenario": sweep.manifest.get("scenario"),
        "scenario_file": sweep.manifest.get("scenario_file"),
        "keys": keys,
        "seeds": seeds,
        "confidence": 0.95,
        "missing_runs": sweep.missing,
        "settings": [s.as_dict() for s in settings],
    }
    (out / "aggregate.json").write_text(json.dumps(clean_json(agg), indent=2) + "\n")
    write_csv(out / "sweep_summary.csv", summary_csv_rows(keys, settings))
    pngs = []
    for key in keys or []:
        name = f"sweep_{safe_name(key)}.png"
        plot_key(key, keys, settings, out / name)
        pngs.append(name)
    metrics = [(p, label) for p, label in SWEEP_METRICS if any(p in s.metrics for s in settings)]
    head = "".join(f"<th>{e(k)}</th>" for k in keys) + "<th>seeds</th>"
    head += "".join(f"<th>{e(label)}</th>" for _, label in metrics)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{e(_value_text(s.setting.get(k)))}</td>" for k in keys)
        + f"<td>{len(s.seeds)}</td>"
        + "".join(f"<td>{e(mean_ci(s, p, sd=True))}</td>" for p, _ in metrics)
        + "</tr>"
        for s in settings
    )
    notes = "".join(f"<li>{e(label)}: {e(EXPLAIN[p])}</li>" for p, label in metrics if p in EXPLAIN)
    missing = (
        f"<p class='warn'>{len(sweep.missing)} run(s) of the sweep have not finished and are "
        f"left out: {e(', '.join(sweep.missing))}.</p>"
        if sweep.missing
        else ""
    )
    section = (
        f"<h2>Sweep: {e(str(sweep.manifest.get('scenario')))}</h2>"
        f"<p>{len(settings)} setting(s) × seeds {e(', '.join(map(str, seeds)))} "
        f"({len(sweep.runs)} runs) from {e(str(sweep.manifest.get('scenario_file')))}. "
        "Each cell: mean ± half width of the 95 % confidence interval of the mean over seeds "
        "(Student t, n − 1 degrees of freedom), sd = standard deviation over seeds. "
        "Every metric: "
        '<a href="sweep_summary.csv">sweep_summary.csv</a>, '
        '<a href="aggregate.json">aggregate.json</a>.</p>'
        f"{missing}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        f"<ul class='note'>{notes}</ul>"
    )
    return pngs, ["sweep_summary.csv"], section
