"""The ONE-compatible summary (MessageStatsReport fields) for comparing with other simulators.

The ONE routes unicast messages, so the unit here is the target pair: one (message,
interested host) pair is the equivalent of one ONE message from the origin to that host.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def relayed_and_created(messages: DataFrame) -> tuple[int, int]:
    """(complete copies received by a host other than the message's origin — ONE "relayed",
    messages created), in one job."""
    origins = (
        messages.where(F.col("event") == "created")
        .groupBy("msg_id")
        .agg(F.min("host").alias("origin"))
    )
    joined = messages.where(F.col("event").isin("created", "complete")).join(
        origins, "msg_id", "left"
    )
    not_origin = F.col("origin").isNull() | (F.col("host") != F.col("origin"))
    row = joined.agg(
        F.sum(F.when((F.col("event") == "complete") & not_origin, 1).otherwise(0)).alias("r"),
        F.sum(F.when(F.col("event") == "created", 1).otherwise(0)).alias("c"),
    ).first()
    if row is None:
        return 0, 0
    return int(row["r"] or 0), int(row["c"] or 0)


def one_summary(delivery: dict[str, Any], messages: DataFrame) -> dict[str, Any]:
    """created, delivered, delivery_prob, relayed, overhead_ratio, latency_avg/med,
    hopcount_avg; ``delivery`` is the output of :func:`delivery.delivery_metrics`."""
    created = int(delivery["target_pairs"])
    delivered = int(delivery["delivered_pairs"])
    relayed, messages_created = relayed_and_created(messages)
    return {
        "created": created,
        "delivered": delivered,
        "delivery_prob": delivered / created if created else None,
        "relayed": relayed,
        "overhead_ratio": (relayed - delivered) / delivered if delivered else None,
        "latency_avg": delivery["delay"]["mean"],
        "latency_med": delivery["delay"]["median"],
        "hopcount_avg": delivery["hops"]["mean"],
        "messages_created": messages_created,
    }
