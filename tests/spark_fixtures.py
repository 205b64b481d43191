"""Shared helpers for the Spark analysis tests: one SparkSession per test session, and small
hand-made run directories written with pyarrow in log schema v1."""

from __future__ import annotations

import atexit
import functools
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.analysis.session import create_session
from sim.logs import SCHEMAS  # the contract the analysis reads: fixtures use it as it is

SPARK_GROUP = pytest.mark.xdist_group("spark")
"""Mark of every test using :func:`shared_spark`: under pytest-xdist they all run on one
worker, which starts the one JVM (see conftest.py)."""


@functools.cache
def shared_spark() -> Any:
    """The test suite's one local SparkSession (2 shuffle partitions keeps tiny jobs fast),
    stopped when the test process exits. Its JVM is the one ``dodwan-sim analyze`` starts for
    inputs this small (``small_inputs``: C1 JIT only and the class-data archive); query
    results do not depend on the JIT."""
    spark = create_session(
        "local[2]", app_name="dodwan-analysis-tests", shuffle_partitions=2, small_inputs=True
    )
    atexit.register(spark.stop)
    return spark


def write_table(path: Path, table: str, rows: list[tuple[Any, ...]]) -> None:
    schema = SCHEMAS[table]
    cols: list[list[Any]] = [[row[i] for row in rows] for i in range(len(schema.names))]
    arrays = [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)]
    pq.write_table(pa.Table.from_arrays(arrays, schema=schema), path)


def write_run(
    run_dir: Path,
    *,
    until: float,
    contacts: list[tuple[Any, ...]],
    messages: list[tuple[Any, ...]],
    targets: list[tuple[Any, ...]],
    datagrams: list[tuple[Any, ...]],
    cache: list[tuple[Any, ...]] | None = None,
    hosts: list[tuple[Any, ...]] | None = None,
    cache_sample_period: float = 10.0,
) -> Path:
    """Write a run directory the way ``dodwan-sim run`` does (schema v1)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tables = {
        "contacts": contacts,
        "messages": messages,
        "targets": targets,
        "datagrams": datagrams,
    }
    if cache is not None:
        tables["cache"] = cache
    if hosts is not None:
        tables["hosts"] = hosts
    for name, rows in tables.items():
        write_table(run_dir / f"{name}.parquet", name, rows)
    run = {
        "schema_version": 1,
        "scenario": run_dir.name,
        "scenario_file": f"scenarios/{run_dir.name}.toml",
        "seed": 1,
        "until": until,
        "version": "0.1.0",
        "wall_time": 0.1,
        "counters": {},
        "cache_sample_period": cache_sample_period,
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir


# The hand-made run used across the tests. Hosts A..E, run of 100 s.
# Contacts (undirected): A-B [10,20] (a repeated up at 12 changes nothing, written as B,A),
# B-C [5,8] and [30,40], C-D [5,8], A-E [70, end of run], D-E [90,95].
HAND_CONTACTS = [
    (5.0, "B", "C", True),
    (5.0, "C", "D", True),
    (8.0, "B", "C", False),
    (8.0, "C", "D", False),
    (10.0, "B", "A", True),
    (12.0, "A", "B", True),
    (20.0, "A", "B", False),
    (30.0, "B", "C", True),
    (40.0, "B", "C", False),
    (70.0, "A", "E", True),
    (90.0, "D", "E", True),
    (95.0, "D", "E", False),
]
# m1: A at 0, deadline 80, 100 bytes, topic t1. m2: A at 50, deadline 60, 200 bytes, t2.
# m3: B at 12, deadline 100, 300 bytes, t1.
HAND_MESSAGES = [
    (0.0, "A", "m1", "created", 100, 0),
    (0.0, "A", "m1", "delivered", 100, 0),  # to a subscriber on the origin: not a target pair
    (12.0, "B", "m1", "complete", 100, 1),
    (35.0, "C", "m1", "complete", 100, 2),
    (35.0, "C", "m1", "delivered", 100, 2),
    (12.0, "B", "m3", "created", 300, 0),
    (15.0, "A", "m3", "complete", 300, 1),
    (15.0, "A", "m3", "delivered", 300, 1),
    (16.0, "A", "m3", "delivered", 300, 1),
    (38.0, "C", "m3", "complete", 300, 1),
    (38.0, "C", "m3", "delivered", 300, 1),
    (50.0, "A", "m2", "created", 200, 0),
    (75.0, "E", "m2", "complete", 200, 1),
    (75.0, "E", "m2", "delivered", 200, 1),
    (90.0, "B", "m1", "evicted", 100, 1),
]
HAND_TARGETS = [
    ("m1", "C", "A", 0.0, 80.0, "t1", "g1"),
    ("m1", "D", "A", 0.0, 80.0, "t1", "g2"),
    ("m2", "E", "A", 50.0, 60.0, "t2", "g2"),
    ("m3", "A", "B", 12.0, 100.0, "t1", "g1"),
    ("m3", "C", "B", 12.0, 100.0, "t1", "g1"),
    ("m3", "D", "B", 12.0, 100.0, "t1", "g2"),
]
HAND_DATAGRAMS = [
    ("A", "announce", "sent", 6, 600),
    ("B", "announce", "sent", 4, 400),
    ("A", "catalog", "sent", 2, 400),
    ("B", "request", "sent", 3, 150),
    ("A", "fragment", "sent", 6, 1200),
    ("B", "fragment", "received", 6, 1200),
]
HAND_CACHE = [
    (0.0, "A", 100, 1),
    (0.0, "B", 0, 0),
    (50.0, "A", 300, 2),
    (50.0, "B", 500, 2),
]
HAND_HOSTS = [("A", "g1"), ("B", "g0"), ("C", "g1"), ("D", "g2"), ("E", "g2")]


def write_hand_run(run_dir: Path) -> Path:
    return write_run(
        run_dir,
        until=100.0,
        contacts=HAND_CONTACTS,
        messages=HAND_MESSAGES,
        targets=HAND_TARGETS,
        datagrams=HAND_DATAGRAMS,
        cache=HAND_CACHE,
        hosts=HAND_HOSTS,
    )
