"""The analysis of one run directory or one contact trace, as functions taking a SparkSession.

Each returns a :class:`RunResult`: JSON-ready figures, small aggregate tables for CSV, plot
series, and the per-pair / per-contact-pair DataFrames (left in Spark, written as Parquet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sim.analysis import contacts as contacts_mod
from sim.analysis import delivery, oracle, overhead
from sim.analysis.batch import Pending, combine, gather, none
from sim.analysis.errors import AnalysisError
from sim.analysis.load import load_run, read_contact_trace, run_name
from sim.analysis.one_summary import one_summary, relayed_and_created_later
from sim.analysis.session import tuned_for
from sim.analysis.stats import cumulative_by_time_many_later, describe_many_later

HEADLINE = (
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
)
"""Keys every analysed run carries at the top level of its metrics."""


@dataclass
class RunResult:
    """Everything computed for one input."""

    name: str
    """Name in metrics.json and the report."""
    source: str
    """The run directory or trace path."""
    kind: str
    """"run" (simulation run directory) or "contacts" (external contact trace)."""
    metrics: dict[str, Any]
    """JSON-ready figures (headline keys at top level, details nested)."""
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Small aggregate tables, written as CSV."""
    series: dict[str, Any] = field(default_factory=dict)
    """Curves for the plots (aggregates only)."""
    frames: dict[str, DataFrame] = field(default_factory=dict)
    """Per-pair DataFrames, written as Parquet by the report (never collected)."""


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _oracle_later(
    pairs: DataFrame, until: float
) -> Pending[tuple[dict[str, Any], dict[str, Any], list[float]]]:
    """The oracle's aggregates over the pairs with oracle columns, not collected yet:
    (delay stats, extra row with reach/beyond/cdf, oracle_over_time curve)."""
    beyond = (F.col("status") == "delivered") & F.col("oracle_arrival").isNull()
    described = describe_many_later(
        pairs,
        ["oracle_delay"],
        {
            "reach": F.count("oracle_arrival"),
            "beyond": F.sum(F.when(beyond, 1).otherwise(0)),
        },
        curves=["oracle_delay"],
    )
    curve = cumulative_by_time_many_later(
        pairs, {"oracle_over_time": F.col("oracle_arrival")}, until
    )
    return combine([described, curve], lambda r: (r[0][0], r[0][1], r[1]["oracle_over_time"]))


def _oracle_figures(
    found: tuple[dict[str, Any], dict[str, Any], list[float]],
    result: oracle.OracleResult,
    d_metrics: dict[str, Any],
    d_series: dict[str, Any],
) -> dict[str, Any]:
    """The oracle figures from its aggregates (and the oracle curves added to ``d_series``)."""
    stats, row, over_time = found
    reach = int(row["reach"])
    oracle_ratio = _ratio(reach, d_metrics["target_pairs"])
    d_series["oracle_delay_cdf"] = row["oracle_delay_cdf"]
    d_series["oracle_over_time"] = over_time
    return {
        "oracle_delivered_pairs": reach,
        "oracle_delivery_ratio": oracle_ratio,
        "efficiency": _ratio(d_metrics["delivery_ratio"], oracle_ratio),
        "oracle_delay": stats["oracle_delay"],
        "oracle_iterations": result.iterations,
        "oracle_converged": result.converged,
        "delivered_beyond_oracle": int(row["beyond"] or 0),
    }


def analyze_run(
    spark: SparkSession,
    run_dir: str,
    *,
    name: str | None = None,
    with_oracle: bool = True,
    max_oracle_iterations: int = oracle.DEFAULT_MAX_ITERATIONS,
) -> RunResult:
    """Analyse one simulation run directory (log schema v1)."""
    with tuned_for(spark, run_dir):
        return _analyze_run(spark, run_dir, name, with_oracle, max_oracle_iterations)


def _analyze_run(
    spark: SparkSession,
    run_dir: str,
    name: str | None,
    with_oracle: bool,
    max_oracle_iterations: int,
) -> RunResult:
    run = load_run(spark, run_dir, name)
    until = run.until
    c_pending, intervals, contact_pairs = contacts_mod.contact_metrics_later(
        run.contacts, until, run.hosts
    )
    # The events the figures use, read from the (large) messages table once.
    events = run.messages.where(F.col("event").isin("created", "complete", "delivered")).cache()
    pairs = delivery.pair_outcomes(run.targets, events).cache()
    result = None
    if with_oracle:  # the rounds are Spark jobs of their own; every other figure waits
        result = oracle.oracle_arrivals(
            pairs, intervals, until, max_iterations=max_oracle_iterations
        )
        pairs = oracle.with_oracle(pairs, result).cache()
    cache_pending = None
    if run.cache is not None:
        period = run.run.get("cache_sample_period")
        period_f = float(period) if isinstance(period, int | float) else None
        cache_pending = overhead.cache_occupancy_later(run.cache, until, period_f)
    # Every other aggregate of the run, collected in one Spark job.
    found = gather(
        c_pending,
        delivery.delivery_metrics_later(pairs, until),
        _oracle_later(pairs, until) if result is not None else none(),
        relayed_and_created_later(events),
        delivery.extra_deliveries_later(run.targets, events),
        overhead.sent_by_kind_later(run.datagrams),
        cache_pending if cache_pending is not None else none(),
        delivery.breakdowns_later(pairs, ("topic", "group", "host")),
    )
    (c_metrics, c_series), (d_metrics, d_series), oracle_found = found[:3]
    relayed_created, (own, unexpected), by_kind, cache_found, breakdowns = found[3:]
    if result is not None:
        o_metrics = _oracle_figures(oracle_found, result, d_metrics, d_series)
    else:
        o_metrics = {"oracle_delivery_ratio": None, "efficiency": None}
    one = one_summary(d_metrics, relayed_created)
    ov_metrics, ov_table = overhead.overhead_figures(
        by_kind, d_metrics["delivered_pairs"], d_metrics["delivered_bytes"]
    )
    tables: dict[str, list[dict[str, Any]]] = {"overhead_by_kind": ov_table}
    cache_summary: dict[str, Any] = {}
    if cache_found is not None:
        cache_summary, tables["cache_occupancy"] = cache_found
    tables.update(breakdowns)
    tables["hop_histogram"] = d_series.pop("hop_histogram")
    tables["degree_over_time"] = c_series["degree_over_time"]
    metrics: dict[str, Any] = {
        "delivery_ratio": d_metrics["delivery_ratio"],
        **o_metrics,
        "latency_med": one["latency_med"],
        "overhead_ratio": one["overhead_ratio"],
        **{k: v for k, v in one.items() if k not in ("latency_med", "overhead_ratio")},
        **{k: v for k, v in d_metrics.items() if k != "delivery_ratio"},
        "origin_deliveries": own,
        "unexpected_deliveries": unexpected,
        "overhead": ov_metrics,
        **cache_summary,
        "contacts": c_metrics,
        "run": {
            **{
                k: run.run.get(k)
                for k in ("scenario", "seed", "until", "version", "settings_sha256")
            },
            "complete": run.run.get("complete", True) is not False,
            "analysed_until": until,
        },
    }
    if isinstance(run.run.get("sweep"), dict):  # a run of a sweep: its setting
        metrics["sweep"] = run.run["sweep"]
    series = {**d_series, **c_series, "until": until}
    frames = {"pairs": pairs, "contact_pairs": contact_pairs}
    return RunResult(run.name, run_dir, "run", metrics, tables, series, frames)


def analyze_contact_trace(
    spark: SparkSession,
    path: str,
    *,
    fmt: str = "auto",
    until: float | None = None,
    name: str | None = None,
) -> RunResult:
    """Contact statistics of an external trace; contacts still up end at ``until`` (default:
    the last event time of the trace)."""
    with tuned_for(spark, path):
        return _analyze_contact_trace(spark, path, fmt, until, name)


def _analyze_contact_trace(
    spark: SparkSession, path: str, fmt: str, until: float | None, name: str | None
) -> RunResult:
    contacts = read_contact_trace(spark, path, fmt).cache()
    row = contacts.agg(F.count("*").alias("n"), F.max("time").alias("last")).first()
    if row is None or not row["n"]:
        raise AnalysisError(f"{path}: the contact trace holds no contact events")
    end = float(until) if until is not None else float(row["last"])
    metrics, series, _, contact_pairs = contacts_mod.contact_metrics(contacts, end)  # one job
    metrics["events"] = int(row["n"])
    tables = {"degree_over_time": series["degree_over_time"]}
    return RunResult(
        name or run_name(path),
        path,
        "contacts",
        {"contacts": metrics},
        tables,
        {**series, "until": end},
        {"contact_pairs": contact_pairs},
    )
