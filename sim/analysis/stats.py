"""Distribution summaries computed in Spark: only aggregates (a few numbers) reach the driver."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sim.analysis.batch import Pending, all_rows, one_row, run

ACCURACY = 100_000
"""percentile_approx accuracy: relative rank error at most 1/ACCURACY (exact on small data)."""

SUMMARY_PROBS = (0.5, 0.9, 0.99)


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def doubles(values: Sequence[float]) -> Column:
    """An array<double> literal made by one call to the JVM. ``F.lit`` of a list makes one
    Py4J round trip per element: about 1,900 for the curves of a small run's analysis. The
    SQL text holds each value's shortest round-trip decimal, parsed back to the same double."""
    return F.expr("array(" + ", ".join(f"{float(v)!r}D" for v in values) + ")")


Described = tuple[dict[str, dict[str, float | int | None]], dict[str, Any]]


def describe_many(
    df: DataFrame,
    cols: Sequence[str],
    extra: Mapping[str, Column] | None = None,
    curves: Sequence[str] = (),
) -> Described:
    """:func:`describe` for several columns plus ``extra`` named aggregates, in one job.

    For each column in ``curves`` (one of ``cols``) the extra dict also holds
    ``"<col>_cdf"``: the :func:`quantile_curve` of that column, from the same job.
    """
    return run(describe_many_later(df, cols, extra, curves))


def describe_many_later(
    df: DataFrame,
    cols: Sequence[str],
    extra: Mapping[str, Column] | None = None,
    curves: Sequence[str] = (),
) -> Pending[Described]:
    """:func:`describe_many`, not collected yet (see :mod:`sim.analysis.batch`)."""
    probs = curve_probs()
    aggs: list[Column] = []
    for i, col in enumerate(cols):
        c = F.col(col)
        aggs += [
            F.count(c).alias(f"n{i}"),
            F.mean(c).alias(f"mean{i}"),
            F.min(c).alias(f"min{i}"),
            F.max(c).alias(f"max{i}"),
            F.percentile_approx(c, doubles(SUMMARY_PROBS), ACCURACY).alias(f"q{i}"),
        ]
    extra = dict(extra or {})
    aggs += [agg.alias(f"x_{name}") for name, agg in extra.items()]
    aggs += [
        F.percentile_approx(F.col(name), doubles(probs), ACCURACY).alias(f"c{cols.index(name)}")
        for name in curves
    ]

    def finish(row: dict[str, Any]) -> Described:
        out: dict[str, dict[str, float | int | None]] = {}
        for i, col in enumerate(cols):
            q = row[f"q{i}"] or [None] * len(SUMMARY_PROBS)
            out[col] = {
                "count": int(row[f"n{i}"]),
                "mean": _num(row[f"mean{i}"]),
                "min": _num(row[f"min{i}"]),
                "max": _num(row[f"max{i}"]),
                "median": _num(q[0]),
                "p90": _num(q[1]),
                "p99": _num(q[2]),
            }
        more = {name: row[f"x_{name}"] for name in extra}
        for c in curves:
            i = cols.index(c)
            more[f"{c}_cdf"] = _curve(row[f"c{i}"], int(row[f"n{i}"]), probs)
        return out, more

    return one_row(df.agg(*aggs), finish)


def describe(df: DataFrame, col: str) -> dict[str, float | int | None]:
    """count, mean, min, max, median, p90, p99 of the non-null values of ``col``.

    Percentiles are percentile_approx values: the smallest value v of the column such that at
    least a fraction p of the values are <= v (an observed value, never interpolated).
    """
    return describe_many(df, [col])[0][col]


def curve_probs(points: int = 100) -> list[float]:
    """Probabilities for plotting a CDF/CCDF: evenly spaced plus a log-spaced upper tail."""
    probs = {round(i / points, 6) for i in range(points + 1)}
    probs |= {round(1 - 10 ** (-k / 4), 6) for k in range(4, 21)}  # 0.9 .. 0.99999
    return sorted(probs)


def quantile_curve(df: DataFrame, col: str, points: int = 100) -> list[tuple[float, float]]:
    """Empirical CDF as (value, p) points from one percentile_approx aggregate.

    Tail probabilities finer than the sample allows (1 - p < 1/count) are left out, except
    p = 1 (the maximum).
    """
    probs = curve_probs(points)
    row = (
        df.where(F.col(col).isNotNull())
        .agg(F.percentile_approx(col, doubles(probs), ACCURACY).alias("q"), F.count("*").alias("n"))
        .first()
    )
    if row is None:
        return []
    return _curve(row["q"], int(row["n"]), probs)


def _curve(q: Sequence[Any] | None, n: int, probs: Sequence[float]) -> list[tuple[float, float]]:
    if not q:
        return []
    return [
        (float(v), p) for v, p in zip(q, probs, strict=True) if p == 1.0 or (1 - p) * n >= 1 - 1e-9
    ]


def time_bins(until: float, bins: int = 200) -> float:
    """Width of the time bins used for curves over a run of length ``until``."""
    return until / bins if until > 0 else 1.0


def cumulative_by_time(df: DataFrame, col: str, until: float, bins: int = 200) -> list[float]:
    """Number of rows with ``col`` <= k*w for k = 0..bins (w = until/bins), via one groupBy."""
    return run(cumulative_by_time_many_later(df, {col: F.col(col)}, until, bins))[col]


def cumulative_by_time_many(
    df: DataFrame, curves: Mapping[str, Column], until: float, bins: int = 200
) -> dict[str, list[float]]:
    """:func:`cumulative_by_time` of several time columns (null = not counted) in one job."""
    return run(cumulative_by_time_many_later(df, curves, until, bins))


def cumulative_by_time_many_later(
    df: DataFrame, curves: Mapping[str, Column], until: float, bins: int = 200
) -> Pending[dict[str, list[float]]]:
    """:func:`cumulative_by_time_many`, not collected yet (see :mod:`sim.analysis.batch`)."""
    w = time_bins(until, bins)
    parts = []
    for name, col in curves.items():
        idx = F.greatest(F.lit(0), F.least(F.lit(bins + 1), F.ceil(col / w))).cast("int")
        parts.append(df.where(col.isNotNull()).select(F.lit(name).alias("s"), idx.alias("k")))
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)

    def finish(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
        counts: dict[str, dict[int, int]] = {name: {} for name in curves}
        for r in rows:
            counts[r["s"]][int(r["k"])] = int(r["n"])
        out = {}
        for name, per_bin in counts.items():
            total, curve = 0, []
            for k in range(bins + 1):
                total += per_bin.get(k, 0)
                curve.append(float(total))
            out[name] = curve
        return out

    return all_rows(union.groupBy("s", "k").agg(F.count("*").alias("n")), finish)
