"""Contact statistics: up/down events to intervals, durations, inter-contact times, degree.

Contacts are undirected: each pair is normalised to (a, b) with a < b. A link that is still
up when the log ends is closed at the run end (``until``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sim.analysis.batch import Pending, all_rows, combine, one_row, run
from sim.analysis.stats import ACCURACY, describe_many_later, time_bins


def contact_intervals(contacts: DataFrame, until: float) -> DataFrame:
    """(a, b, start, end, duration, open) for every contact, from up/down events.

    Each event sets the link state; repeated ups or downs change nothing. Events at the same
    time keep their order in the input.
    """
    ev = contacts.select(
        F.least("a", "b").alias("a"),
        F.greatest("a", "b").alias("b"),
        "time",
        "up",
        F.monotonically_increasing_id().alias("_seq"),
    ).where((F.col("a") != F.col("b")) & F.col("time").isNotNull() & F.col("up").isNotNull())
    w = Window.partitionBy("a", "b").orderBy("time", "_seq")
    prev = F.coalesce(F.lag("up").over(w), F.lit(False))
    changes = ev.withColumn("_prev", prev).where(F.col("up") != F.col("_prev"))
    nxt = F.lead("time").over(w)
    iv = changes.withColumn("_next", nxt).where(F.col("up"))
    end = F.greatest(F.col("time"), F.coalesce(F.col("_next"), F.lit(float(until))))
    return iv.select(
        "a",
        "b",
        F.col("time").alias("start"),
        end.alias("end"),
        (end - F.col("time")).alias("duration"),
        F.col("_next").isNull().alias("open"),
    )


def inter_contact_times(intervals: DataFrame) -> DataFrame:
    """(a, b, ict): time from the end of each contact to the start of the pair's next one."""
    w = Window.partitionBy("a", "b").orderBy("start", "end")
    return (
        intervals.withColumn("_next", F.lead("start").over(w))
        .where(F.col("_next").isNotNull())
        .select("a", "b", (F.col("_next") - F.col("end")).alias("ict"))
    )


def pair_table(intervals: DataFrame, icts: DataFrame) -> DataFrame:
    """Per pair: contacts, total/mean contact duration, mean/median inter-contact time."""
    per_contact = intervals.groupBy("a", "b").agg(
        F.count("*").alias("contacts"),
        F.sum("duration").alias("total_duration"),
        F.mean("duration").alias("mean_duration"),
        F.min("start").alias("first_contact"),
    )
    per_ict = icts.groupBy("a", "b").agg(
        F.mean("ict").alias("mean_ict"),
        F.percentile_approx("ict", 0.5, ACCURACY).alias("median_ict"),
    )
    return per_contact.join(per_ict, ["a", "b"], "left")


def degree_over_time(
    intervals: DataFrame, until: float, hosts: int, bins: int = 200
) -> list[dict[str, float]]:
    """Links up and mean degree (2 * links / hosts) at times k*w, k = 0..bins (w = until/bins).

    A link counts at time T when start <= T < end, and through the end of the run when it is
    still open then (its end is only the run's end, not a link going down: without this the
    last sample would drop to 0). One groupBy of +1/-1 steps per bin.
    """
    return run(_degree_steps(intervals, until, bins))(hosts)


def _degree_steps(
    intervals: DataFrame, until: float, bins: int = 200
) -> Pending[Callable[[int], list[dict[str, float]]]]:
    """:func:`degree_over_time` not collected yet: the steps, then a function of the host
    count."""
    w = time_bins(until, bins)
    starts = intervals.select(F.ceil(F.col("start") / w).alias("k"), F.lit(1).alias("d"))
    end_bin = F.when(F.col("open"), F.lit(bins + 1)).otherwise(F.ceil(F.col("end") / w))
    ends = intervals.select(end_bin.alias("k"), F.lit(-1).alias("d"))
    frame = starts.unionByName(ends).groupBy("k").agg(F.sum("d").alias("d"))

    def finish(rows: list[dict[str, Any]]) -> Callable[[int], list[dict[str, float]]]:
        steps = {int(r["k"]): int(r["d"]) for r in rows}

        def curve(hosts: int) -> list[dict[str, float]]:
            out, active = [], 0
            for k in range(bins + 1):
                active += steps.get(k, 0)
                out.append(
                    {
                        "time": k * w,
                        "links_up": float(active),
                        "mean_degree": 2.0 * active / hosts if hosts else 0.0,
                    }
                )
            return out

        return curve

    return all_rows(frame, finish)


ContactFigures = tuple[dict[str, Any], dict[str, Any]]


def contact_metrics(
    contacts: DataFrame, until: float, hosts: DataFrame | None = None
) -> tuple[dict[str, Any], dict[str, Any], DataFrame, DataFrame]:
    """Contact figures for one log: (metrics, plot series and tables, intervals, pair table).

    The returned intervals are cached: the oracle reuses them.
    """
    pending, intervals, pairs = contact_metrics_later(contacts, until, hosts)
    metrics, series = run(pending)
    return metrics, series, intervals, pairs


def contact_metrics_later(
    contacts: DataFrame, until: float, hosts: DataFrame | None = None
) -> tuple[Pending[ContactFigures], DataFrame, DataFrame]:
    """:func:`contact_metrics` with the figures not collected yet (see
    :mod:`sim.analysis.batch`): (pending (metrics, series), intervals, pair table)."""
    intervals = contact_intervals(contacts, until).cache()
    icts = inter_contact_times(intervals).cache()
    ends = intervals.select(F.col("a").alias("h"), F.col("b").alias("n"))
    ends = ends.unionByName(intervals.select(F.col("b").alias("h"), F.col("a").alias("n")))
    met = ends.distinct().groupBy("h").agg(F.count("*").alias("neighbours"))
    if hosts is not None:
        all_hosts = hosts.select(F.col("host").alias("h")).unionByName(ends.select("h"))
    else:
        all_hosts = ends.select("h")
    # over every host: one that never met anyone had 0 neighbours, it is not left out
    neighbours = (
        all_hosts.distinct()
        .join(met, "h", "left")
        .select("h", F.coalesce(F.col("neighbours"), F.lit(0)).alias("neighbours"))
    )
    parts = (
        one_row(all_hosts.distinct().agg(F.count("*").alias("n")), lambda r: int(r["n"])),
        describe_many_later(
            intervals,
            ["duration"],
            {"open": F.sum(F.when(F.col("open"), 1).otherwise(0))},
            curves=["duration"],
        ),
        describe_many_later(icts, ["ict"], curves=["ict"]),
        describe_many_later(neighbours, ["neighbours"], {"sum": F.sum("neighbours")}),
        _degree_steps(intervals, until),
    )

    def finish(results: list[Any]) -> ContactFigures:
        n_hosts, (stats, extra), (ict_stats, ict_extra), (nb_stats, nb_extra), degree_of = results
        duration, ict, nb = stats["duration"], ict_stats["ict"], nb_stats["neighbours"]
        degree = degree_of(n_hosts)
        metrics: dict[str, Any] = {
            "hosts": n_hosts,
            "contacts": duration["count"],
            "contact_pairs": int(nb_extra["sum"] or 0) // 2,  # each pair seen from both ends
            "contacts_open_at_end": int(extra["open"] or 0),
            "contact_duration": duration,
            "inter_contact_time": ict,
            "distinct_neighbours": nb,
            "mean_degree_avg": (
                sum(d["mean_degree"] for d in degree) / len(degree) if degree else None
            ),
            "until": until,
        }
        series: dict[str, Any] = {
            "contact_duration_cdf": extra["duration_cdf"],
            "ict_cdf": ict_extra["ict_cdf"],
            "degree_over_time": degree,
        }
        return metrics, series

    return combine(parts, finish), intervals, pair_table(intervals, icts)
