"""Building the SparkSession the analysis runs on: local mode by default, quiet, loopback-only."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from sim.analysis import class_archive
from sim.analysis.errors import AnalysisError

DEFAULT_MASTER = "local[*]"
"""Spark master used when none is given: every core of this machine."""

_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
# task failures reach the driver as exceptions, reported there in one line
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
# Spark 4 logs a harmless "non-existent accumulator" ERROR with a stack trace for tasks of
# local checkpoints whose accumulators were already cleaned (the oracle's rounds); a real
# scheduler failure still reaches the driver as an exception.
logger.dag.name = org.apache.spark.scheduler.DAGScheduler
logger.dag.level = fatal
"""


def _log4j_file() -> str:
    path = Path(tempfile.gettempdir()) / "dodwan-analysis-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J:
        path.write_text(_LOG4J)
    return str(path)


def create_session(
    master: str | None = None,
    *,
    app_name: str = "dodwan-analysis",
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
    small_inputs: bool = False,
) -> SparkSession:
    """Return a SparkSession for the analysis (reusing an active one in this process).

    Local masters bind the driver to 127.0.0.1, disable the web UI and use few shuffle
    partitions (8 unless given); other masters keep the cluster's defaults except the UI.
    ``small_inputs`` (see :func:`small_local_inputs`) starts a local JVM tuned for a short
    life: QUICK_JVM_OPTIONS, and the class-data archive of Spark's classes
    (:mod:`sim.analysis.class_archive`).
    """
    master = master or DEFAULT_MASTER
    local = master.startswith("local")
    java_options = f"-Dlog4j.configurationFile={_log4j_file()}"
    # JVM options only matter to the JVM this call starts, not to an active session's.
    starts_jvm = SparkSession.getActiveSession() is None
    archive = class_archive.ArchivePlan("")
    if local and small_inputs:
        java_options += " " + QUICK_JVM_OPTIONS
        if starts_jvm:
            archive = class_archive.plan()
            java_options += " " + archive.options
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", java_options)
        # PySpark otherwise sends the Python call site to the JVM around every DataFrame
        # function call (6 Py4J round trips each, ~5,000 for a small run's analysis), for
        # error contexts the analysis never shows (AnalysisError is one line).
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
    )
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python tasks (the sweep's simulations) run in this interpreter's environment.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 8))
        )
    elif shuffle_partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if driver_memory:
        builder = builder.config("spark.driver.memory", driver_memory)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the JVM could not start: no Java, bad master URL, ...
        raise AnalysisError(f"cannot start Spark (master {master}): {exc}") from exc
    if archive.writing is not None:
        class_archive.write_at_exit(spark, archive)
    spark.sparkContext.setLogLevel("WARN")
    # Failed queries are turned into one-line AnalysisErrors; keep PySpark from also dumping
    # the JVM stack trace as a JSON log record.
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
    return spark


SMALL_INPUT_BYTES = 64 << 20
"""Inputs up to this size (Parquet bytes on a local disk) are analysed with SMALL_SETTINGS."""

QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
"""JVM options of a local session started for small inputs only: the JIT compiles with C1
alone. On a small run the JVM spends most of its CPU time warming up — the optimising C2
compiler working on Spark's own code for a few seconds of queries — and C1 alone halved the
JVM's CPU time for start-up and for the analysis of the quickstart run (measured:
docs/performance.md). Long analyses keep C2: they run long enough to profit from it.
Without C2 the JVM reserves only 48 MB for compiled code, which the analyses of a few small
runs in one JVM (a sweep's) filled, after which the JVM stopped compiling: 240 MB, as a
tiered JVM reserves (address space; only what is used is committed)."""

SMALL_SETTINGS = {
    # Adaptive execution re-plans every shuffle stage as a job of its own: on a small run it
    # more than doubles the jobs (121 -> 45 for quickstart) for nothing to adapt to.
    "spark.sql.adaptive.enabled": "false",
    # A few MB need no more partitions than cores; fewer tasks per stage.
    "spark.sql.shuffle.partitions": "2",
    # A broadcast join builds its small side in a Spark job of its own (one per oracle round
    # and per join of the figures): sort-merge joins run inside the query's job. Quickstart:
    # 24 -> 12 jobs, same CPU time.
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    # Generated code is compiled by Janino on a cold JVM, for plans that then process a few
    # thousand rows: interpreted expressions cost less. The factory mode is an internal Spark
    # setting (its interpreted fallback is the same code Spark uses when code generation
    # fails); unknown to another Spark version it is simply ignored. Quickstart: JVM CPU time
    # of the analysis 22.5 s -> 16.3-17.0 s, figures identical.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # Every query's plan is also rendered as text for the SQL UI's listeners (even with the
    # UI off); the one-line "simple" form costs less than the default "formatted" one. A
    # second analysis of quickstart in the same JVM, 4 A/B pairs: wall 10.9 -> 9.4 s.
    "spark.sql.ui.explainMode": "simple",
}
"""Runtime SQL settings for small inputs on a local master (measured: docs/performance.md)."""


def local_size(path: str) -> int | None:
    """Bytes under a local run directory or file; None for remote paths."""
    if "://" in path and not path.startswith("file://"):
        return None
    root = Path(path.removeprefix("file://"))
    if root.is_file():
        return root.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            total += (Path(dirpath) / f).stat().st_size
    return total


def small_local_inputs(paths: Iterable[str]) -> bool:
    """True when every input is on a local disk and they hold at most SMALL_INPUT_BYTES in
    all: the session is then started with QUICK_JVM_OPTIONS."""
    total = 0
    for path in paths:
        size = local_size(path)
        if size is None:
            return False
        total += size
    return total <= SMALL_INPUT_BYTES


@contextmanager
def tuned_for(spark: SparkSession, path: str) -> Iterator[None]:
    """Apply SMALL_SETTINGS while analysing ``path`` if it is a small local input on a local
    master; restore the session's settings afterwards."""
    size = local_size(path)
    local = spark.sparkContext.master.startswith("local")
    if not local or size is None or size > SMALL_INPUT_BYTES:
        yield
        return
    old = {k: spark.conf.get(k, None) for k in SMALL_SETTINGS}
    for k, v in SMALL_SETTINGS.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
