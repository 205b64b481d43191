"""The array literal of percentile probabilities: one JVM call, and exactly the doubles (and
the percentiles) that ``F.lit`` of the list gives."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T
from spark_fixtures import SPARK_GROUP, shared_spark

from sim.analysis.stats import ACCURACY, curve_probs, doubles

pytestmark = [SPARK_GROUP, pytest.mark.timeout(300)]

AWKWARD = [0.1 + 0.2, 1e-300, 5e-324, 1.7976931348623157e308, -0.0, 1 - 1e-16, 123456.789e-20]


def test_doubles_is_the_same_array_as_lit_of_the_list() -> None:
    spark = shared_spark()
    values = curve_probs() + AWKWARD
    row = spark.range(1).select(doubles(values).alias("d"), F.lit(values).alias("l")).first()
    assert row is not None
    assert [repr(v) for v in row["d"]] == [repr(v) for v in row["l"]] == [repr(v) for v in values]
    schema = spark.range(1).select(doubles(values).alias("d")).schema
    assert schema["d"].dataType == T.ArrayType(T.DoubleType(), False)


def test_percentiles_with_doubles_equal_those_with_lit() -> None:
    spark = shared_spark()
    rng = random.Random(3)
    df = spark.createDataFrame([(rng.expovariate(0.1),) for _ in range(500)], "x double")
    probs = curve_probs()

    def q(p: Any) -> list[float]:
        row = df.agg(F.percentile_approx("x", p, ACCURACY).alias("q")).first()
        assert row is not None
        return list(row["q"])

    assert q(doubles(probs)) == q(probs)
