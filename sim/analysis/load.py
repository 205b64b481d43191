"""Reading inputs into DataFrames: a run directory (log schema v1) or an external contact trace.

Every table is checked against the schema and cast to its documented types, so the metric
modules can rely on column names and types. Nothing here collects table rows to the driver.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sim.analysis.errors import SPARK_ERRORS, AnalysisError, brief

SCHEMA_VERSION = 1
"""The log schema version this analysis reads."""

SCHEMAS: dict[str, dict[str, str]] = {
    "contacts": {"time": "double", "a": "string", "b": "string", "up": "boolean"},
    "messages": {
        "time": "double",
        "host": "string",
        "msg_id": "string",
        "event": "string",
        "bytes": "bigint",
        "hops": "int",
    },
    "targets": {
        "msg_id": "string",
        "host": "string",
        "origin": "string",
        "created": "double",
        "deadline": "double",
        "topic": "string",
        "group": "string",
    },
    "datagrams": {
        "host": "string",
        "kind": "string",
        "direction": "string",
        "count": "bigint",
        "bytes": "bigint",
    },
    "cache": {"time": "double", "host": "string", "bytes": "bigint", "messages": "bigint"},
    "hosts": {"host": "string", "group": "string"},
}
"""Columns and Spark SQL types of each table of log schema v1."""

REQUIRED_TABLES = ("contacts", "messages", "targets", "datagrams")
OPTIONAL_TABLES = ("cache", "hosts")

_NUMERIC: tuple[type[T.DataType], ...] = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.DecimalType,
)


@dataclass
class RunTables:
    """The tables of one simulation run, conformed to schema v1."""

    name: str
    """Display name (the run directory's base name)."""
    path: str
    """The run directory as given."""
    run: dict[str, Any]
    """Contents of run.json."""
    until: float
    """Simulated end of the run (seconds); contacts still up end here."""
    contacts: DataFrame
    messages: DataFrame
    targets: DataFrame
    datagrams: DataFrame
    cache: DataFrame | None
    hosts: DataFrame | None


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def run_name(path: str) -> str:
    """The name a run directory is reported under: its last path component."""
    return os.path.basename(path.rstrip("/")) or path


def _type_ok(actual: T.DataType, wanted: str) -> bool:
    if wanted == "string":
        return isinstance(actual, T.StringType)
    if wanted == "boolean":
        return isinstance(actual, T.BooleanType)
    return isinstance(actual, _NUMERIC)


def conform(df: DataFrame, table: str, source: str) -> DataFrame:
    """Check ``df`` against the schema of ``table`` and return it with exactly those columns."""
    fields = {f.name: f.dataType for f in df.schema.fields}
    wanted = SCHEMAS[table]
    for name, typ in wanted.items():
        if name not in fields:
            expected = ", ".join(wanted)
            raise AnalysisError(f"{source}: missing column '{name}' (expected: {expected})")
        if not _type_ok(fields[name], typ):
            raise AnalysisError(
                f"{source}: column '{name}' is {fields[name].simpleString()}, expected {typ}"
            )
    return df.select([F.col(n).cast(t).alias(n) for n, t in wanted.items()])


def read_table(spark: SparkSession, path: str, table: str) -> DataFrame:
    """Read one Parquet table (a file or a folder dataset) and conform it to the schema."""
    if _is_local(path) and not os.path.exists(_local(path)):
        raise AnalysisError(f"{path}: no such table")
    try:
        df = spark.read.parquet(path)
        return conform(df, table, path)
    except SPARK_ERRORS as exc:
        raise AnalysisError(f"{path}: cannot read Parquet table ({brief(exc)})") from exc


def _read_run_json(spark: SparkSession, run_dir: str) -> dict[str, Any]:
    path = _join(run_dir, "run.json")
    try:
        if _is_local(path):
            with open(_local(path), encoding="utf-8") as fh:
                text = fh.read()
        else:  # one small metadata file on a Hadoop-compatible store
            rows = spark.read.option("wholetext", True).text(path).collect()
            text = rows[0][0] if rows else ""
        run = json.loads(text)
    except FileNotFoundError as exc:
        raise AnalysisError(f"{run_dir}: missing run.json") from exc
    except (OSError, ValueError, PySparkException, Py4JError) as exc:
        raise AnalysisError(f"{path}: unreadable run.json ({exc})") from exc
    if not isinstance(run, dict):
        raise AnalysisError(f"{path}: run.json is not a JSON object")
    version = run.get("schema_version")
    if version != SCHEMA_VERSION:
        raise AnalysisError(
            f"{path}: schema_version {version!r} is not supported (this analysis reads "
            f"{SCHEMA_VERSION})"
        )
    until = run.get("until")
    if not isinstance(until, int | float) or isinstance(until, bool) or until < 0:
        raise AnalysisError(f"{path}: 'until' must be a non-negative number, got {until!r}")
    return run


def precheck_run_dir(run_dir: str) -> None:
    """Fail fast, before Spark starts, on a local run directory that cannot be a run."""
    if not _is_local(run_dir):
        return
    local = _local(run_dir)
    if not os.path.isdir(local):
        raise AnalysisError(f"{run_dir}: not a run directory (no such directory)")
    if not os.path.exists(os.path.join(local, "run.json")):
        raise AnalysisError(f"{run_dir}: missing run.json")
    for table in REQUIRED_TABLES:
        if not os.path.exists(os.path.join(local, f"{table}.parquet")):
            raise AnalysisError(f"{run_dir}: missing table {table}.parquet")


def precheck_trace(path: str) -> None:
    """Fail fast, before Spark starts, on a local contact trace that does not exist."""
    if _is_local(path) and not os.path.exists(_local(path)):
        raise AnalysisError(f"{path}: no such contact trace")


def load_run(spark: SparkSession, run_dir: str, name: str | None = None) -> RunTables:
    """Open the run directory written by ``dodwan-sim run`` (clear AnalysisError if unusable)."""
    if _is_local(run_dir) and not os.path.isdir(_local(run_dir)):
        raise AnalysisError(f"{run_dir}: not a run directory (no such directory)")
    run = _read_run_json(spark, run_dir)
    tables: dict[str, DataFrame | None] = {}
    for table in REQUIRED_TABLES + OPTIONAL_TABLES:
        path = _join(run_dir, f"{table}.parquet")
        if _is_local(path) and not os.path.exists(_local(path)):
            if table in REQUIRED_TABLES:
                raise AnalysisError(f"{run_dir}: missing table {table}.parquet")
            tables[table] = None
            continue
        tables[table] = read_table(spark, path, table)
    contacts, messages, targets, datagrams = (tables[t] for t in REQUIRED_TABLES)
    assert contacts is not None and messages is not None
    assert targets is not None and datagrams is not None
    return RunTables(
        name=name or run_name(run_dir),
        path=run_dir,
        run=run,
        until=float(run["until"]),
        contacts=contacts,
        messages=messages,
        targets=targets,
        datagrams=datagrams,
        cache=tables["cache"],
        hosts=tables["hosts"],
    )


# --- external contact traces -------------------------------------------------------------

TRACE_FORMATS = ("auto", "one", "csv", "parquet")
"""Accepted contact trace formats: The ONE connectivity text, CSV ``time,a,b,up``, Parquet."""

_TRUE = ("true", "1", "up")
_FALSE = ("false", "0", "down")


def _up_flag(col: Column) -> Column:
    v = F.lower(F.trim(col))
    return F.when(v.isin(*_TRUE), F.lit(True)).when(v.isin(*_FALSE), F.lit(False))


def _reject_bad(bad: DataFrame, path: str, what: str) -> None:
    """Raise a clear error naming one bad line if ``bad`` is not empty (one aggregate + one row)."""
    n = bad.count()
    if n:
        example = bad.select(F.col("_line")).first()
        shown = example[0] if example else "?"
        raise AnalysisError(f"{path}: {n} malformed line(s), expected {what}; e.g. {shown!r}")


def _read_one(spark: SparkSession, path: str) -> DataFrame:
    lines = spark.read.text(path).select(F.trim("value").alias("_line"))
    lines = lines.where((F.col("_line") != "") & ~F.col("_line").startswith("#"))
    parts = F.split("_line", r"\s+")

    def part(i: int) -> Column:  # null, not an error, when the line is too short
        return F.try_element_at(parts, F.lit(i + 1))

    df = lines.select(
        "_line",
        part(0).try_cast("double").alias("time"),
        F.upper(part(1)).alias("_kind"),
        part(2).alias("a"),
        part(3).alias("b"),
        _up_flag(part(4)).alias("up"),
        F.size(parts).alias("_n"),
    )
    ok = (
        (F.col("_kind") == "CONN")
        & (F.col("_n") == 5)
        & F.col("time").isNotNull()
        & F.col("up").isNotNull()
    )
    _reject_bad(df.where(~ok | ok.isNull()), path, "'<time> CONN <a> <b> up|down'")
    return df.where(ok).select("time", "a", "b", "up")


def _read_csv(spark: SparkSession, path: str) -> DataFrame:
    raw = spark.read.option("header", True).csv(path)
    cols = [c.strip().lower() for c in raw.columns]
    missing = [c for c in ("time", "a", "b", "up") if c not in cols]
    if missing:
        raise AnalysisError(
            f"{path}: CSV header must contain time,a,b,up (missing {', '.join(missing)})"
        )
    raw = raw.toDF(*cols)
    df = raw.select(
        F.concat_ws(",", *[F.coalesce(F.col(c), F.lit("")) for c in cols]).alias("_line"),
        F.trim("time").try_cast("double").alias("time"),
        F.trim("a").alias("a"),
        F.trim("b").alias("b"),
        _up_flag(F.col("up")).alias("up"),
    )
    ok = (
        F.col("time").isNotNull()
        & F.col("up").isNotNull()
        & (F.coalesce(F.col("a"), F.lit("")) != "")
        & (F.coalesce(F.col("b"), F.lit("")) != "")
    )
    _reject_bad(df.where(~ok), path, "'time,a,b,up' with a number and up in true/false/1/0")
    return df.where(ok).select("time", "a", "b", "up")


def _guess_format(path: str) -> str:
    low = path.rstrip("/").lower()
    if low.endswith(".csv") or low.endswith(".csv.gz"):
        return "csv"
    if low.endswith(".parquet"):
        return "parquet"
    return "one"


def read_contact_trace(spark: SparkSession, path: str, fmt: str = "auto") -> DataFrame:
    """Read an external contact trace into the ``contacts`` schema (time, a, b, up).

    Parsing happens in Spark (``spark.read.text`` / ``csv``); only a count of malformed lines
    and one example reach the driver.
    """
    if fmt not in TRACE_FORMATS:
        raise AnalysisError(f"unknown trace format {fmt!r} (one of {', '.join(TRACE_FORMATS)})")
    if _is_local(path) and not os.path.exists(_local(path)):
        raise AnalysisError(f"{path}: no such contact trace")
    fmt = _guess_format(path) if fmt == "auto" else fmt
    try:
        if fmt == "parquet":
            return read_table(spark, path, "contacts")
        df = _read_one(spark, path) if fmt == "one" else _read_csv(spark, path)
    except SPARK_ERRORS as exc:
        raise AnalysisError(f"{path}: cannot read contact trace ({brief(exc)})") from exc
    return df
