"""The oracle: earliest arrival of each message at each host over time-respecting paths.

Model: contacts are undirected intervals [start, end]; bandwidth and storage are unbounded,
so a host holding a message at time t hands it to a neighbour at max(t, start) over any
contact with end >= t. A message starts at its origin at its creation time, and an arrival
counts only at or before its deadline. The result is the best delivery any protocol could
reach on those contacts.

Computed by semi-naive relaxation: the states that improved in the last round (the
frontier) are joined with the contacts of their host; a candidate that beats the best known
arrival joins the next frontier; stop when nothing improves.

Two implementations of the same rounds, with identical results (arrivals, rounds, converged):

* in Spark, for large inputs: contacts and frontier states are keyed by time bucket as well as
  by host to keep the join small, and each round is checkpointed so the lineage stays short;
  one Spark job per round, nothing collected but counts;
* on the driver, for small inputs (at most DRIVER_ROWS messages and as many contact
  intervals, DRIVER_WORK for their product; collected in one Spark job): the same rounds in
  plain Python, each host's contacts sorted by start. On a small run the Spark rounds cost
  far more in per-job and per-task overhead than the relaxation itself (quickstart: 7 jobs,
  about 45 % of the analysis' JVM time, for 12 hosts).
"""

from __future__ import annotations

import logging
import math
import warnings
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sim.analysis.batch import gather, one_row

DEFAULT_MAX_ITERATIONS = 200
"""Relaxation rounds before giving up (each round extends paths by at least one hop)."""

DRIVER_ROWS = 20_000
"""The oracle's rounds run on the driver for at most this many messages and as many contact
intervals (see the module docstring), if DRIVER_WORK allows."""

DRIVER_WORK = 2_000_000
"""Largest product messages × contact intervals for the driver's rounds: a bound on their
work (each improved state looks at its host's contacts within the message's life). At the
bound, random logs took 0.02-1.0 s of Python CPU (docs/performance.md), where one Spark
round of a small input costs about 0.7 s of JVM CPU."""

INF = float("inf")

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
    bucket: float | None
    """Width of the time buckets used to key the join in Spark (seconds); None when the
    rounds ran on the driver."""


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
    driver_rows: int | None = None,
) -> OracleResult:
    """Earliest arrivals for the messages of ``pairs`` (msg_id, origin, created, deadline)
    over ``intervals`` (a, b, start, end), none later than the deadline or ``until``.

    With at most ``driver_rows`` (default DRIVER_ROWS) messages and as many intervals the
    rounds run on the driver (0: always in Spark); the result is the same either way."""
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
    ends = intervals.select("a", "b", "start", "end")
    most = DRIVER_ROWS if driver_rows is None else driver_rows
    small = _collect_small(messages, ends, most) if most > 0 else None
    if small is not None:
        arrivals, iterations, converged = _relax_on_driver(*small, max_iterations)
        result = OracleResult(_arrivals_frame(messages, arrivals), iterations, converged, None)
    else:
        width = bucket if bucket and bucket > 0 else _choose_bucket(messages, intervals, until)
        result = _relax_in_spark(messages, ends, width, max_iterations)
    if not result.converged:
        msg = (
            f"oracle stopped after {max_iterations} iterations without converging; "
            "its delivery ratio is a lower bound"
        )
        warnings.warn(msg, OracleNotConverged, stacklevel=2)
        log.warning(msg)
    return result


Message = tuple[str, str, float, float]
"""(msg_id, origin, created, limit)"""
Interval = tuple[str, str, float, float]
"""(a, b, start, end)"""


def _collect_small(
    messages: DataFrame, ends: DataFrame, most: int
) -> tuple[list[Message], list[Interval]] | None:
    """Messages and intervals as rows on the driver, collected in one Spark job, if there are
    at most ``most`` of each, their product is at most DRIVER_WORK and every value is one the
    driver compares as Spark does (no null, no NaN); None otherwise (the oracle then runs in
    Spark, on the inputs this job has cached)."""
    keys = [messages.schema[c].dataType for c in ("msg_id", "origin")]
    keys += [ends.schema[c].dataType for c in ("a", "b")]
    times = [messages.schema[c].dataType for c in ("created", "limit")]
    times += [ends.schema[c].dataType for c in ("start", "end")]
    if not all(isinstance(t, T.StringType) for t in keys):
        return None
    if not all(isinstance(t, T.DoubleType) for t in times):
        return None
    names = ("k0", "k1", "t0", "t1")
    tagged = [
        df.select(
            F.lit(i).alias("_i"),
            *[F.col(c).alias(n) for c, n in zip(df.columns, names, strict=True)],
        ).limit(most + 1)
        for i, df in enumerate((messages, ends))
    ]
    found: tuple[list[Message], list[Interval]] = ([], [])
    for r in tagged[0].unionByName(tagged[1]).collect():
        row = (r["k0"], r["k1"], r["t0"], r["t1"])
        if any(v is None for v in row) or math.isnan(row[2]) or math.isnan(row[3]):
            return None
        found[r["_i"]].append(row)
    if len(found[0]) > most or len(found[1]) > most:
        return None
    if len(found[0]) * len(found[1]) > DRIVER_WORK:
        return None
    return found


@dataclass
class _Contacts:
    """One host's contacts sorted by start, with the running maximum of their ends: the
    contacts a holder at time t can use before ``limit`` lie between the first whose running
    maximum end reaches t and the last that starts by ``limit`` (two bisections, comparisons
    only)."""

    starts: list[float]
    max_ends: list[float]
    edges: list[tuple[str, float, float]]
    """(neighbour, start, end), by start."""

    @classmethod
    def of(cls, edges: list[tuple[str, float, float]]) -> _Contacts:
        edges.sort(key=lambda e: e[1])
        max_ends, top = [], -INF
        for _, _, end in edges:
            top = max(top, end)
            max_ends.append(top)
        return cls([e[1] for e in edges], max_ends, edges)

    def usable(self, t: float, limit: float) -> list[tuple[str, float, float]]:
        """The contacts with end >= t and start <= limit."""
        lo = bisect_left(self.max_ends, t)
        hi = bisect_right(self.starts, limit)
        return [e for e in self.edges[lo:hi] if e[2] >= t]


def _relax_on_driver(
    messages: list[Message], intervals: list[Interval], max_iterations: int
) -> tuple[dict[tuple[str, str], float], int, bool]:
    """The rounds of :func:`_relax_in_spark`, in Python: (best arrival per (msg_id, host),
    rounds run, converged). Same candidates, same comparisons, hence the same result."""
    edges: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    for a, b, start, end in intervals:
        edges[a].append((b, start, end))
        edges[b].append((a, start, end))
    contacts = {host: _Contacts.of(e) for host, e in edges.items()}
    limits = {m: lim for m, _, _, lim in messages}
    best = {(m, origin): created for m, origin, created, _ in messages}
    frontier = dict(best)
    iterations = 0
    while iterations < max_iterations:
        iterations += 1
        cand: dict[tuple[str, str], float] = {}
        for (m, node), t in frontier.items():
            here = contacts.get(node)
            if here is None:
                continue
            for v, start, _ in here.usable(t, limits[m]):
                arrive = max(t, start)
                if arrive < cand.get((m, v), INF):
                    cand[(m, v)] = arrive
        improved = {k: t for k, t in cand.items() if t < best.get(k, INF)}
        if not improved:
            return best, iterations, True
        best.update(improved)
        frontier = improved
    return best, iterations, False


def _arrivals_frame(messages: DataFrame, arrivals: dict[tuple[str, str], float]) -> DataFrame:
    """(msg_id, host, oracle_arrival) from the driver's result, laid out as the Spark rounds
    leave theirs (hash-partitioned by the join key, checkpointed) so that the join with the
    pairs plans the same way: without that, the mean oracle delay of quickstart changed in
    the 16th digit."""
    spark = messages.sparkSession
    schema = T.StructType(
        [
            T.StructField("msg_id", messages.schema["msg_id"].dataType),
            T.StructField("host", messages.schema["origin"].dataType),
            T.StructField("oracle_arrival", T.DoubleType()),
        ]
    )
    rows = [(m, host, t) for (m, host), t in arrivals.items()]
    parts = int(spark.conf.get("spark.sql.shuffle.partitions") or 8)
    return (
        spark.createDataFrame(rows, schema)
        .repartition(parts, "msg_id", "host")
        .localCheckpoint(eager=False)
    )


def _relax_in_spark(
    messages: DataFrame, ends: DataFrame, width: float, max_iterations: int
) -> OracleResult:
    """The rounds as Spark jobs, one per round, joins keyed by host and time bucket."""
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
