"""Reading inputs into DataFrames: a run directory (log schema v1) or an external contact trace.

Every table is checked against the schema and cast to its documented types, so the metric
modules can rely on column names and types. Nothing here collects table rows to the driver.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from sim import contact_format as cf
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


class IncompleteRun(UserWarning):
    """A run stopped part-way (``run.json`` says ``"complete": false``)."""


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
    """Simulated end of the run (seconds); contacts still up end here. For a run stopped
    part-way, the simulated time it ``reached`` (every table cut there)."""
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


_ARROW_PRIMITIVES = (
    pa.types.is_string,
    pa.types.is_boolean,
    pa.types.is_int8,
    pa.types.is_int16,
    pa.types.is_int32,
    pa.types.is_int64,
    pa.types.is_float32,
    pa.types.is_float64,
)


def _local_parquet_schema(path: str) -> T.StructType | None:
    """The Spark schema of a local Parquet table, from one file footer read on the driver —
    the file Spark itself would infer the schema from (without schema merging). Spark's own
    inference is a Spark job per table; this is a file read. None (let Spark infer) for remote
    paths, empty folders, unreadable footers and column types outside the log schema's
    (strings, booleans, integers, floats), whose mapping is left to Spark; folders
    partitioned into sub-folders too."""
    if not _is_local(path):
        return None
    root = _local(path)
    if os.path.isdir(root):
        entries = sorted(f for f in os.listdir(root) if not f.startswith(("_", ".")))
        if not entries or any(os.path.isdir(os.path.join(root, f)) for f in entries):
            return None  # empty, or partitioned into sub-folders: Spark's own discovery
        root = os.path.join(root, entries[0])
    try:
        schema = pq.read_schema(root)
    except (OSError, pa.ArrowException):
        return None
    if not all(any(ok(f.type) for ok in _ARROW_PRIMITIVES) for f in schema):
        return None
    return from_arrow_schema(schema)


def read_table(spark: SparkSession, path: str, table: str) -> DataFrame:
    """Read one Parquet table (a file or a folder dataset) and conform it to the schema."""
    if _is_local(path) and not os.path.exists(_local(path)):
        raise AnalysisError(f"{path}: no such table")
    try:
        schema = _local_parquet_schema(path)
        reader = spark.read if schema is None else spark.read.schema(schema)
        df = reader.parquet(path)
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
    cache = tables["cache"]
    until = float(run["until"])
    if run.get("complete") is False:
        reached = run.get("reached")
        if isinstance(reached, int | float) and not isinstance(reached, bool) and reached >= 0:
            # What was recorded after ``reached`` (hosts alone run ahead of the clock) is
            # cut off with the rest: every figure covers the same simulated time.
            until = min(until, float(reached))
            contacts = contacts.where(F.col("time") <= until)
            messages = messages.where(F.col("time") <= until)
            targets = targets.where(F.col("created") <= until)
            cache = None if cache is None else cache.where(F.col("time") <= until)
            warnings.warn(
                IncompleteRun(
                    f"the run stopped part-way (run.json: complete false): analysed up to "
                    f"{until:g} s of {float(run['until']):g} s simulated"
                ),
                stacklevel=2,
            )
        else:
            warnings.warn(
                IncompleteRun(
                    "the run stopped part-way (run.json: complete false) and does not say "
                    "how far it got: figures that depend on its end use its 'until'"
                ),
                stacklevel=2,
            )
    return RunTables(
        name=name or run_name(run_dir),
        path=run_dir,
        run=run,
        until=until,
        contacts=contacts,
        messages=messages,
        targets=targets,
        datagrams=datagrams,
        cache=cache,
        hosts=tables["hosts"],
    )


# --- external contact traces -------------------------------------------------------------

TRACE_FORMATS = ("auto", "one", "csv", "parquet")
"""Accepted contact trace formats: The ONE connectivity text, CSV ``time,a,b,up``, Parquet."""

_PARSED = T.StructType(
    [
        T.StructField("time", T.DoubleType()),
        T.StructField("a", T.StringType()),
        T.StructField("b", T.StringType()),
        T.StructField("up", T.BooleanType()),
        T.StructField("_error", T.StringType()),
        T.StructField("_line", T.StringType()),
    ]
)


def _line_parser(fmt: str, layout: cf.Layout, header: list[str] | None) -> Any:
    """A partition function parsing text lines with ``sim.contact_format`` (the simulator's
    own definition of the formats); bad lines come out with ``_error`` set."""

    def parse(rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        from sim import contact_format as cf

        for row in rows:
            line = row[0]
            try:
                if fmt == "one":
                    ev = cf.parse_one_line(line)
                else:
                    ev = cf.parse_csv_fields(cf.split_csv(line), layout, header)
            except cf.FormatError as e:
                yield (None, None, None, None, str(e), line)
                continue
            if ev is not None:
                yield (*ev, None, line)

    return parse


def _first_fields(lines: DataFrame) -> list[str] | None:
    """The CSV fields of the first line that is not blank nor a comment (as the simulator
    finds it): the first 64 lines on the driver, the rest only if those are all comments."""
    head = [r[0] for r in lines.limit(64).collect()]
    first = cf.first_data_line(head)
    if first is not None or len(head) < 64:
        return first
    found = lines.rdd.map(lambda r: r[0]).filter(cf.has_fields).take(1)
    return cf.split_csv(found[0]) if found else None


def _read_lines(spark: SparkSession, path: str, fmt: str) -> DataFrame:
    """Parse a ONE or CSV trace in Spark (Python tasks running the shared line parser)."""
    lines = spark.read.text(path)
    layout, header = cf.PLAIN, None
    if fmt == "csv":
        try:
            first = _first_fields(lines)  # where a header would be, however far down
            found = cf.csv_layout(first) if first else None
        except cf.FormatError as e:
            raise AnalysisError(f"{path}: {e}") from None
        if found is not None and first is not None:
            layout, header = found, first
    parsed = spark.createDataFrame(
        lines.rdd.mapPartitions(_line_parser(fmt, layout, header)), _PARSED
    ).cache()
    what = (
        "'<time> CONN <a> <b> up|down'"
        if fmt == "one"
        else "'time,a,b,up' with a number and up in true/false/1/0"
    )
    bad = parsed.where(F.col("_error").isNotNull())
    row = bad.agg(
        F.count("*").alias("n"), F.first("_line").alias("l"), F.first("_error").alias("e")
    ).first()
    if row is not None and row["n"]:
        raise AnalysisError(
            f"{path}: {row['n']} malformed line(s), expected {what}; e.g. {row['l']!r}: {row['e']}"
        )
    return parsed.where(F.col("_error").isNull()).select("time", "a", "b", "up")


def _guess_format(path: str) -> str:
    """Parquet for ``*.parquet``, else what the simulator guesses (``cf.guess_format``)."""
    return "parquet" if path.rstrip("/").lower().endswith(".parquet") else cf.guess_format(path)


def read_contact_trace(spark: SparkSession, path: str, fmt: str = "auto") -> DataFrame:
    """Read an external contact trace into the ``contacts`` schema (time, a, b, up).

    Lines are parsed in Spark (Python) tasks by ``sim.contact_format`` — the very functions the
    simulator replays traces with; only a count of malformed lines and one example reach the
    driver (and, for CSV, the first lines, where a header may be).
    """
    if fmt not in TRACE_FORMATS:
        raise AnalysisError(f"unknown trace format {fmt!r} (one of {', '.join(TRACE_FORMATS)})")
    if _is_local(path) and not os.path.exists(_local(path)):
        raise AnalysisError(f"{path}: no such contact trace")
    fmt = _guess_format(path) if fmt == "auto" else fmt
    try:
        if fmt == "parquet":
            return read_table(spark, path, "contacts")
        df = _read_lines(spark, path, fmt)
    except SPARK_ERRORS as exc:
        raise AnalysisError(f"{path}: cannot read contact trace ({brief(exc)})") from exc
    return df
