"""The oracle: earliest arrival of each message at each host over time-respecting paths.

Model: contacts are undirected intervals [start, end]; bandwidth and storage are unbounded,
so a host holding a message at time t hands it to a neighbour at max(t, start) over any
contact with end >= t. A message starts at its origin at its creation time, and an arrival
counts only at or before its deadline. The result is the best delivery any protocol could
reach on those contacts.

Computed in Spark by semi-naive relaxation: the states that improved in the last round
(the frontier) are joined with the contacts of their host; a candidate that beats the best
known arrival joins the next frontier; stop when nothing improves. To keep the join small,
contacts and frontier states are keyed by time bucket as well as by host; each round is
checkpointed so the lineage stays short. Nothing is collected to the driver but counts.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sim.analysis.batch import gather, one_row

DEFAULT_MAX_ITERATIONS = 200
"""Relaxation rounds before giving up (each round extends paths by at least one hop)."""

log = logging.getLogger(__name__)


class OracleNotConverged(UserWarning):
    """The oracle hit its iteration cap: its figures are lower bounds."""


@dataclass
class OracleResult:
    """Earliest arrivals of target messages, per (msg_id, host)."""

    arrivals: DataFrame
    """(msg_id, host, oracle_arrival) for every host reached by the deadline."""
    iterations: int
    """Relaxation rounds run."""
    converged: bool
    """False when the iteration cap stopped the relaxation early (figures are lower bounds)."""
    bucket: float
    """Width of the time buckets used to key the join (seconds)."""


def _choose_bucket(messages: DataFrame, intervals: DataFrame, until: float) -> float:
    """A bucket about as wide as a typical message lifetime or a long contact."""
    life = one_row(
        messages.agg(F.percentile_approx(F.col("limit") - F.col("created"), 0.5, 1000).alias("x")),
        lambda row: row["x"],
    )
    dur = one_row(
        intervals.agg(F.percentile_approx(F.col("end") - F.col("start"), 0.9, 1000).alias("x")),
        lambda row: row["x"],
    )
    candidates = [until / 100_000 if until > 0 else 1.0]
    candidates += [float(v) for v in gather(life, dur) if v is not None]  # one job
    return max(max(candidates), 1e-6)


def _bucket_range(lo: Column, hi: Column, width: float) -> Column:
    return F.explode(F.sequence(F.floor(lo / width).cast("long"), F.floor(hi / width).cast("long")))


def oracle_arrivals(
    pairs: DataFrame,
    intervals: DataFrame,
    until: float,
    *,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    bucket: float | None = None,
) -> OracleResult:
    """Earliest arrivals for the messages of ``pairs`` (msg_id, origin, created, deadline)
    over ``intervals`` (a, b, start, end), none later than the deadline or ``until``."""
    if max_iterations < 1:
        raise ValueError("max_iterations must be >= 1")
    limit = F.least(F.col("deadline"), F.lit(float(until)))
    messages = (
        pairs.groupBy("msg_id")
        .agg(
            F.min("origin").alias("origin"),
            F.min("created").alias("created"),
            F.max("deadline").alias("deadline"),
        )
        .select("msg_id", "origin", "created", limit.alias("limit"))
        .where(F.col("created") <= F.col("limit"))
    )
    width = bucket if bucket and bucket > 0 else _choose_bucket(messages, intervals, until)

    ends = intervals.select("a", "b", "start", "end")
    edges = ends.select(F.col("a").alias("u"), F.col("b").alias("v"), "start", "end").unionByName(
        ends.select(F.col("b").alias("u"), F.col("a").alias("v"), "start", "end")
    )
    edges = edges.select("*", _bucket_range(F.col("start"), F.col("end"), width).alias("ek"))
    # Partitioned (and sorted) once by the join key, checkpointed with that layout: the rounds
    # then shuffle only the frontier, never the contacts.
    parts = int(edges.sparkSession.conf.get("spark.sql.shuffle.partitions") or 8)
    edges = (
        edges.repartition(parts, "u", "ek")
        .sortWithinPartitions("u", "ek")
        .localCheckpoint(eager=False)
    )

    best = messages.select(
        "msg_id", F.col("origin").alias("node"), F.col("created").alias("t"), "limit"
    ).localCheckpoint(eager=False)
    frontier = best
    iterations, converged = 0, False
    while iterations < max_iterations:
        iterations += 1
        states = frontier.select("*", _bucket_range(F.col("t"), F.col("limit"), width).alias("k"))
        hops = states.join(
            edges, (F.col("node") == F.col("u")) & (F.col("k") == F.col("ek"))
        ).where((F.col("end") >= F.col("t")) & (F.col("start") <= F.col("limit")))
        cand = hops.groupBy("msg_id", F.col("v").alias("node")).agg(
            F.min(F.greatest(F.col("t"), F.col("start"))).alias("t"),
            F.first("limit").alias("limit"),
        )
        old = best.select("msg_id", "node", F.col("t").alias("old_t"))
        improved = (
            cand.join(old, ["msg_id", "node"], "left")
            .where(F.col("old_t").isNull() | (F.col("t") < F.col("old_t")))
            .select("msg_id", "node", "t", "limit")
            .localCheckpoint(eager=False)
        )
        if improved.count() == 0:  # the one action per round; it also fills the checkpoint
            converged = True
            break
        best = (
            best.unionByName(improved)
            .groupBy("msg_id", "node")
            .agg(F.min("t").alias("t"), F.first("limit").alias("limit"))
            .localCheckpoint(eager=False)  # filled by the next round's action
        )
        frontier = improved
    if not converged:
        msg = (
            f"oracle stopped after {max_iterations} iterations without converging; "
            "its delivery ratio is a lower bound"
        )
        warnings.warn(msg, OracleNotConverged, stacklevel=2)
        log.warning(msg)
    arrivals = best.select(
        "msg_id", F.col("node").alias("host"), F.col("t").alias("oracle_arrival")
    )
    return OracleResult(arrivals, iterations, converged, width)


def with_oracle(pairs: DataFrame, result: OracleResult) -> DataFrame:
    """The pair outcomes plus oracle_arrival / oracle_delay (null when no path in time)."""
    arr = result.arrivals.withColumnRenamed("oracle_arrival", "_arrival")
    joined = pairs.join(arr, ["msg_id", "host"], "left")
    ok = F.col("_arrival").isNotNull() & (F.col("_arrival") <= F.col("deadline"))
    ok = ok & (F.col("host") != F.col("origin"))
    arrival = F.when(ok, F.col("_arrival"))
    return joined.select(
        *pairs.columns,
        arrival.alias("oracle_arrival"),
        (arrival - F.col("created")).alias("oracle_delay"),
    )
