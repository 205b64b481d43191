"""The ONE-compatible summary (MessageStatsReport fields) for comparing with other simulators.

The ONE routes unicast messages, so the unit here is the target pair: one (message,
interested host) pair is the equivalent of one ONE message from the origin to that host.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sim.analysis.batch import Pending, one_row, run


def relayed_and_created(messages: DataFrame) -> tuple[int, int]:
    """(complete copies received by a host other than the message's origin — ONE "relayed",
    messages created), in one job."""
    return run(relayed_and_created_later(messages))


def relayed_and_created_later(messages: DataFrame) -> Pending[tuple[int, int]]:
    """:func:`relayed_and_created`, not collected yet (see :mod:`sim.analysis.batch`)."""
    origins = (
        messages.where(F.col("event") == "created")
        .groupBy("msg_id")
        .agg(F.min("host").alias("origin"))
    )
    joined = messages.where(F.col("event").isin("created", "complete")).join(
        origins, "msg_id", "left"
    )
    not_origin = F.col("origin").isNull() | (F.col("host") != F.col("origin"))
    frame = joined.agg(
        F.sum(F.when((F.col("event") == "complete") & not_origin, 1).otherwise(0)).alias("r"),
        F.sum(F.when(F.col("event") == "created", 1).otherwise(0)).alias("c"),
    )
    return one_row(frame, lambda row: (int(row["r"] or 0), int(row["c"] or 0)))


def one_summary(delivery: dict[str, Any], relayed_created: tuple[int, int]) -> dict[str, Any]:
    """created, delivered, delivery_prob, relayed, overhead_ratio, latency_avg/med,
    hopcount_avg; ``delivery`` is the output of :func:`delivery.delivery_metrics`,
    ``relayed_created`` that of :func:`relayed_and_created`."""
    created = int(delivery["target_pairs"])
    delivered = int(delivery["delivered_pairs"])
    relayed, messages_created = relayed_created
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
