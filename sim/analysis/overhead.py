"""Overhead: datagrams and bytes sent per delivered pair and byte, by kind; cache occupancy."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sim.analysis.batch import Pending, all_rows, combine, one_row, run
from sim.analysis.stats import time_bins

ByKind = dict[str, tuple[int, int]]

KINDS = ("announce", "catalog", "request", "fragment")
"""Datagram kinds always reported (announcements = announce + catalog); the other kinds a
run logs (``profile``, ``profile_request``, ``ack``) follow them, and every kind counts in
the totals."""


def _per(num: float, den: float) -> float | None:
    return num / den if den else None


def overhead_metrics(
    datagrams: DataFrame, delivered_pairs: int, delivered_bytes: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Totals sent (every hop's transmission) and the ratios to what was delivered on time.

    Returns (metrics, per-kind table). Only the ``sent`` direction counts as transmitted.
    """
    return overhead_figures(run(sent_by_kind_later(datagrams)), delivered_pairs, delivered_bytes)


def sent_by_kind_later(datagrams: DataFrame) -> Pending[ByKind]:
    """Datagrams and bytes sent per kind (not collected yet, see :mod:`sim.analysis.batch`)."""
    frame = (
        datagrams.where(F.col("direction") == "sent")
        .groupBy("kind")
        .agg(F.sum("count").alias("datagrams"), F.sum("bytes").alias("bytes"))
    )
    return all_rows(
        frame,
        lambda rows: {r["kind"]: (int(r["datagrams"] or 0), int(r["bytes"] or 0)) for r in rows},
    )


def overhead_figures(
    by_kind: ByKind, delivered_pairs: int, delivered_bytes: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """:func:`overhead_metrics` from the per-kind sums of :func:`sent_by_kind_later`."""
    kinds = list(KINDS) + sorted(k for k in by_kind if k not in KINDS)
    table = []
    for kind in kinds:
        n, b = by_kind.get(kind, (0, 0))
        table.append(
            {
                "kind": kind,
                "datagrams": n,
                "bytes": b,
                "datagrams_per_delivered": _per(n, delivered_pairs),
                "bytes_per_delivered": _per(b, delivered_pairs),
                "bytes_per_delivered_byte": _per(b, delivered_bytes),
            }
        )
    total_n = sum(n for n, _ in by_kind.values())
    total_b = sum(b for _, b in by_kind.values())
    metrics = {
        "datagrams_sent": total_n,
        "bytes_sent": total_b,
        "datagrams_per_delivered": _per(total_n, delivered_pairs),
        "bytes_per_delivered": _per(total_b, delivered_pairs),
        "bytes_per_delivered_byte": _per(total_b, delivered_bytes),
    }
    return metrics, table


def cache_occupancy(
    cache: DataFrame, until: float, period: float | None, bins: int = 200
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Cache occupancy over time: per time bin, total / mean / max bytes over hosts.

    Samples are put in bins of max(sample period, until/bins) seconds; a host's samples in
    one bin are averaged first. Returns (summary, table).
    """
    return run(cache_occupancy_later(cache, until, period, bins))


CacheFigures = tuple[dict[str, Any], list[dict[str, Any]]]


def cache_occupancy_later(
    cache: DataFrame, until: float, period: float | None, bins: int = 200
) -> Pending[CacheFigures]:
    """:func:`cache_occupancy`, not collected yet (see :mod:`sim.analysis.batch`)."""
    w = max(period or 0.0, time_bins(until, bins))
    per_host = cache.groupBy(F.floor(F.col("time") / w).alias("k"), "host").agg(
        F.mean("bytes").alias("bytes"), F.mean("messages").alias("messages")
    )
    per_bin = per_host.groupBy("k").agg(
        F.sum("bytes").alias("total_bytes"),
        F.mean("bytes").alias("mean_bytes"),
        F.max("bytes").alias("max_bytes"),
        F.mean("messages").alias("mean_messages"),
        F.count("*").alias("hosts"),
    )
    table = all_rows(
        per_bin,
        lambda rows: [
            {
                "time": int(r["k"]) * w,
                "total_bytes": float(r["total_bytes"]),
                "mean_bytes": float(r["mean_bytes"]),
                "max_bytes": float(r["max_bytes"]),
                "mean_messages": float(r["mean_messages"]),
                "hosts": int(r["hosts"]),
            }
            for r in sorted(rows, key=lambda r: int(r["k"]))
        ],
    )
    peak = one_row(
        cache.agg(F.max("bytes").alias("b"), F.mean("bytes").alias("m")),
        lambda p: {
            "cache_peak_host_bytes": int(p["b"]) if p["b"] is not None else None,
            "cache_mean_host_bytes": float(p["m"]) if p["m"] is not None else None,
        },
    )
    return combine([peak, table], lambda results: (results[0], results[1]))
