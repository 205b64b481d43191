"""The analysis' one-job collection of many aggregates (sim.analysis.batch) and its driver-side
Parquet schema reading (sim.analysis.load): exact values, one Spark job, Spark's own schema."""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_fixtures import SPARK_GROUP, shared_spark

from sim.analysis.batch import all_rows, gather, gather_frames, none, one_row
from sim.analysis.load import _local_parquet_schema, read_table

pytestmark = [SPARK_GROUP, pytest.mark.timeout(300)]

SCHEMA = T.StructType(
    [
        T.StructField("s", T.StringType()),
        T.StructField("i", T.LongType()),
        T.StructField("d", T.DoubleType()),
        T.StructField("b", T.BooleanType()),
        T.StructField("a", T.ArrayType(T.DoubleType())),
    ]
)

ROWS = [
    ('quote " and \\ and é', 2**62 + 1, 0.1 + 0.2, True, [1e-300, 2.5, -0.0]),
    (None, None, None, None, None),
    ("inf", -(2**63), float("inf"), False, [float("nan"), float("-inf")]),
    ("nan", 0, float("nan"), None, []),
    ("tiny", 7, 5e-324, True, [1.7976931348623157e308]),
]


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and str(a) == str(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _jobs_in(group: str) -> int:
    return len(shared_spark().sparkContext.statusTracker().getJobIdsForGroup(group))


def test_gather_returns_exactly_what_collect_returns_in_one_job() -> None:
    spark = shared_spark()
    df = spark.createDataFrame(ROWS, SCHEMA)
    per_s = df.groupBy("s").agg(F.count("*").alias("n"), F.max("d").alias("top"))
    totals = df.agg(F.sum("i").alias("sum_i"), F.countDistinct("s").alias("kinds"))
    expected = [
        [r.asDict() for r in df.collect()],
        [r.asDict() for r in per_s.collect()],
        [r.asDict() for r in totals.collect()],
    ]
    group = f"batch-{uuid.uuid4()}"
    spark.sparkContext.setJobGroup(group, "gather")
    # as for a small input (sim.analysis.session.SMALL_SETTINGS): adaptive execution would run
    # each shuffle stage as a job of its own
    aqe = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        got = gather_frames([df, per_s, totals])
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", aqe)
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert _jobs_in(group) == 1
    assert len(got) == 3
    for want, have in zip(expected, got, strict=True):
        key = lambda r: repr(r.get("s"))  # noqa: E731 - row order of a group-by is not fixed
        want, have = sorted(want, key=key), sorted(have, key=key)
        assert len(want) == len(have)
        for w, h in zip(want, have, strict=True):
            assert w.keys() == h.keys()
            for k in w:
                assert _same(w[k], h[k]), (k, w[k], h[k])


def test_gather_hands_each_pending_its_own_rows() -> None:
    spark = shared_spark()
    a = spark.range(5).agg(F.sum("id").alias("x"))
    b = spark.range(3).select((F.col("id") * 10).alias("y"))
    got = gather(
        one_row(a, lambda r: r["x"]),
        none(),
        all_rows(b, lambda rows: sorted(r["y"] for r in rows)),
        one_row(a, lambda r: -r["x"]).then(lambda v: v * 2),
    )
    assert got == [10, None, [0, 10, 20], -20]
    assert gather() == []


def _write(path: Path, table: pa.Table) -> None:
    path.mkdir(parents=True)
    pq.write_table(table, path / "part-00000.parquet")
    pq.write_table(table, path / "part-00001.parquet")


def test_driver_side_parquet_schema_is_the_one_spark_infers(tmp_path: Path) -> None:
    spark = shared_spark()
    table = pa.table(
        {
            "time": pa.array([1.5], pa.float64()),
            "host": pa.array(["h1"], pa.string()),
            "msg_id": pa.array(["m"], pa.string()),
            "event": pa.array(["created"], pa.string()),
            "bytes": pa.array([10], pa.int64()),
            "hops": pa.array([1], pa.int32()),
            "small": pa.array([1], pa.int8()),
            "flag": pa.array([True], pa.bool_()),
            "f32": pa.array([0.5], pa.float32()),
        }
    )
    _write(tmp_path / "messages.parquet", table)
    path = str(tmp_path / "messages.parquet")
    inferred = spark.read.parquet(path).schema
    assert _local_parquet_schema(path) == inferred
    assert [tuple(r) for r in read_table(spark, path, "messages").collect()] == [
        (1.5, "h1", "m", "created", 10, 1),
        (1.5, "h1", "m", "created", 10, 1),
    ]


def test_spark_infers_what_the_driver_does_not_read(tmp_path: Path) -> None:
    odd = pa.table({"t": pa.array([1], pa.timestamp("us", tz="UTC"))})
    _write(tmp_path / "odd.parquet", odd)
    assert _local_parquet_schema(str(tmp_path / "odd.parquet")) is None
    (tmp_path / "bad.parquet").mkdir()
    (tmp_path / "bad.parquet" / "part-00000.parquet").write_bytes(b"truncated")
    assert _local_parquet_schema(str(tmp_path / "bad.parquet")) is None
    (tmp_path / "empty.parquet").mkdir()
    assert _local_parquet_schema(str(tmp_path / "empty.parquet")) is None
    assert _local_parquet_schema("hdfs://nowhere/x.parquet") is None
