"""Delivery over target pairs: which (message, interested host) pairs were delivered, when, how.

A pair is *delivered* when its earliest ``delivered`` event is at or before the message's
deadline, *late* when that event is after the deadline, *undelivered* when there is none.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sim.analysis.batch import Pending, all_rows, combine, one_row, run
from sim.analysis.stats import ACCURACY, cumulative_by_time_many_later, describe_many_later

STATUSES = ("delivered", "late", "undelivered")


def target_pairs(targets: DataFrame) -> DataFrame:
    """One row per (msg_id, host) target pair (duplicates in the log collapse)."""
    return targets.groupBy("msg_id", "host").agg(
        F.min("origin").alias("origin"),
        F.min("created").alias("created"),
        F.max("deadline").alias("deadline"),
        F.min("topic").alias("topic"),
        F.min("group").alias("group"),
    )


def first_deliveries(messages: DataFrame) -> DataFrame:
    """(msg_id, host, delivered_at, hops, bytes, deliveries): earliest delivered event per pair."""
    ev = messages.where(F.col("event") == "delivered")
    return ev.groupBy("msg_id", "host").agg(
        F.min("time").alias("delivered_at"),
        F.min_by("hops", "time").alias("hops"),
        F.min_by("bytes", "time").alias("bytes"),
        F.count("*").alias("deliveries"),
    )


def pair_outcomes(targets: DataFrame, messages: DataFrame) -> DataFrame:
    """Target pairs with delivered_at, status, delay (on-time pairs only), hops and bytes."""
    pairs = target_pairs(targets).join(first_deliveries(messages), ["msg_id", "host"], "left")
    status = (
        F.when(F.col("delivered_at").isNull(), "undelivered")
        .when(F.col("delivered_at") <= F.col("deadline"), "delivered")
        .otherwise("late")
    )
    on_time = status == "delivered"
    return pairs.select(
        "msg_id",
        "host",
        "origin",
        "created",
        "deadline",
        "topic",
        "group",
        "delivered_at",
        status.alias("status"),
        F.when(on_time, F.col("delivered_at") - F.col("created")).alias("delay"),
        F.when(on_time, F.col("hops")).alias("hops"),
        F.when(on_time, F.col("bytes")).alias("bytes"),
        F.coalesce(F.col("deliveries"), F.lit(0)).alias("deliveries"),
    )


def extra_deliveries(targets: DataFrame, messages: DataFrame) -> tuple[int, int]:
    """(origin_deliveries, unexpected_deliveries): delivered (message, host) pairs that are not
    target pairs, at the message's own origin (local subscribers) and elsewhere."""
    return run(extra_deliveries_later(targets, messages))


def extra_deliveries_later(targets: DataFrame, messages: DataFrame) -> Pending[tuple[int, int]]:
    """:func:`extra_deliveries`, not collected yet (see :mod:`sim.analysis.batch`)."""
    delivered = messages.where(F.col("event") == "delivered").select("msg_id", "host").distinct()
    extra = delivered.join(targets.select("msg_id", "host"), ["msg_id", "host"], "left_anti")
    origins = (
        messages.where(F.col("event") == "created")
        .groupBy("msg_id")
        .agg(F.min("host").alias("origin"))
    )
    at_origin = F.coalesce(F.col("host") == F.col("origin"), F.lit(False))
    frame = extra.join(origins, "msg_id", "left").agg(
        F.sum(F.when(at_origin, 1).otherwise(0)).alias("own"),
        F.sum(F.when(at_origin, 0).otherwise(1)).alias("other"),
    )
    return one_row(frame, lambda row: (int(row["own"] or 0), int(row["other"] or 0)))


def _ratio(num: float | int | None, den: float | int | None) -> float | None:
    if num is None or not den:
        return None
    return float(num) / float(den)


DeliveryFigures = tuple[dict[str, Any], dict[str, Any]]


def delivery_metrics(pairs: DataFrame, until: float) -> DeliveryFigures:
    """Overall delivery figures and plot series from the pair outcomes."""
    return run(delivery_metrics_later(pairs, until))


def delivery_metrics_later(pairs: DataFrame, until: float) -> Pending[DeliveryFigures]:
    """:func:`delivery_metrics`, not collected yet (see :mod:`sim.analysis.batch`)."""
    is_delivered = F.col("status") == "delivered"
    described = describe_many_later(
        pairs,
        ["delay", "hops"],
        {
            "pairs": F.count("*"),
            "delivered": F.sum(F.when(is_delivered, 1).otherwise(0)),
            "late": F.sum(F.when(F.col("status") == "late", 1).otherwise(0)),
            "delivered_bytes": F.sum(F.when(is_delivered, F.col("bytes"))),
            "duplicates": F.sum(F.greatest(F.col("deliveries") - 1, F.lit(0))),
            "messages": F.countDistinct("msg_id"),
        },
        curves=["delay"],
    )
    hop_hist = all_rows(
        pairs.where(F.col("hops").isNotNull()).groupBy("hops").agg(F.count("*").alias("n")),
        lambda rows: [
            {"hops": int(r["hops"]), "pairs": int(r["n"])}
            for r in sorted(rows, key=lambda r: int(r["hops"]))
        ],
    )
    over_time = cumulative_by_time_many_later(
        pairs,
        {
            "delivered_over_time": F.when(is_delivered, F.col("delivered_at")),
            # the denominator at time t: pairs of the messages published by t
            "published_over_time": F.col("created"),
        },
        until,
    )

    def finish(results: list[Any]) -> DeliveryFigures:
        (stats, row), hops_histogram, curves = results
        n, delivered = int(row["pairs"]), int(row["delivered"] or 0)
        metrics: dict[str, Any] = {
            "target_pairs": n,
            "target_messages": int(row["messages"]),
            "delivered_pairs": delivered,
            "late_deliveries": int(row["late"] or 0),
            "duplicate_deliveries": int(row["duplicates"] or 0),
            "delivered_bytes": int(row["delivered_bytes"] or 0),
            "delivery_ratio": _ratio(delivered, n),
            "delay": stats["delay"],
            "hops": stats["hops"],
        }
        series = {"delay_cdf": row["delay_cdf"], **curves, "hop_histogram": hops_histogram}
        return metrics, series

    return combine([described, hop_hist, over_time], finish)


Tables = dict[str, list[dict[str, Any]]]


def breakdowns(pairs: DataFrame, keys: tuple[str, ...]) -> Tables:
    """``delivery_by_<key>`` tables for every key (topic, group, host), in one job: per value,
    pairs, delivered, late, ratio, median delay, and the oracle ratio when the pairs carry
    ``oracle_arrival``."""
    return run(breakdowns_later(pairs, keys))


def breakdowns_later(pairs: DataFrame, keys: tuple[str, ...]) -> Pending[Tables]:
    """:func:`breakdowns`, not collected yet (see :mod:`sim.analysis.batch`)."""
    aggs = [
        F.count("*").alias("pairs"),
        F.sum(F.when(F.col("status") == "delivered", 1).otherwise(0)).alias("delivered"),
        F.sum(F.when(F.col("status") == "late", 1).otherwise(0)).alias("late"),
        F.percentile_approx("delay", 0.5, ACCURACY).alias("delay_median"),
    ]
    has_oracle = "oracle_arrival" in pairs.columns
    if has_oracle:
        aggs.append(F.count("oracle_arrival").alias("oracle_delivered"))
    parts = [
        pairs.groupBy(F.lit(key).alias("_key"), F.col(key).cast("string").alias("_value")).agg(
            *aggs
        )
        for key in keys
    ]
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return all_rows(union, lambda rows: _breakdown_tables(rows, keys, has_oracle))


def _breakdown_tables(
    rows: list[dict[str, Any]], keys: tuple[str, ...], has_oracle: bool
) -> Tables:
    out: Tables = {f"delivery_by_{key}": [] for key in keys}
    rows = sorted(rows, key=lambda r: (r["_key"], r["_value"] is not None, r["_value"] or ""))
    for r in rows:
        key = r["_key"]
        d: dict[str, Any] = {
            key: r["_value"],
            "pairs": int(r["pairs"]),
            "delivered": int(r["delivered"]),
            "late": int(r["late"]),
            "delivery_ratio": _ratio(r["delivered"], r["pairs"]),
            "delay_median": r["delay_median"],
        }
        if has_oracle:
            d["oracle_delivery_ratio"] = _ratio(r["oracle_delivered"], r["pairs"])
            d["efficiency"] = _ratio(d["delivery_ratio"], d["oracle_delivery_ratio"])
        out[f"delivery_by_{key}"].append(d)
    return out
