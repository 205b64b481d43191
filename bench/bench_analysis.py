"""Benchmark of the Spark analysis: synthetic logs of 10 million message events and 1 million
contacts (at --scale 1), generated with Spark itself into a temporary directory, then one full
analysis (delivery, overhead, contacts, oracle, report) in local mode.

    .venv/bin/python bench/bench_analysis.py             # full size
    .venv/bin/python bench/bench_analysis.py --scale 0.01  # quick check
    .venv/bin/python bench/bench_analysis.py --small       # start-up: a small simulated run

``--small`` measures what a researcher waits for on a small run: the Spark session's
start-up, then the whole analysis + report of a quickstart run (simulated first, not timed),
both in the same process, with the Spark jobs, stages and tasks the analysis ran and the
CPU time (the JVM's and this Python process's) of each step — wall times alone mean little
on a shared machine. The session is started as ``dodwan-sim analyze`` starts it for that input
(``--default-jvm``: without the small-input JVM options, for comparison); the first such run
on a machine writes the class-data archive of Spark's classes when it exits, later runs map
it (``DODWAN_SPARK_CDS=0``: without it). ``--small --cli``
times the whole ``dodwan-sim analyze`` command on such a run instead, start-up included.

Synthetic world: 200 hosts over 30 simulated days; contacts between random pairs at uniform
random times with exponential durations (mean 120 s); messages live 3 hours, each touching
100 hosts with 25 events per host (fragments, complete, delivered, evicted), 90 target hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sim.analysis import analyze_run, create_session, write_report
from sim.analysis.session import small_local_inputs

HOSTS = 200
UNTIL = 30 * 86400.0
TTL = 3 * 3600.0
EVENTS_PER_HOST = 25
HOSTS_PER_MESSAGE = 100
TARGETS_PER_MESSAGE = 90
DELIVERED_BLOCKS = 80  # hosts 0..79 of a message get a delivered event (some after the TTL)
FULL_EVENTS = 10_000_000
FULL_CONTACTS = 1_000_000


def _host(col: Column) -> Column:
    return F.concat(F.lit("h"), F.lpad(col.cast("string"), 3, "0"))


def _unit(*cols: Column) -> Column:
    """A deterministic pseudo-random number in [0, 1) from the given columns."""
    return (F.abs(F.xxhash64(*cols)) % 1_000_003) / 1_000_003.0


def _message_attrs(m: Column) -> tuple[Column, Column]:
    created = _unit(m, F.lit(1)) * (UNTIL - TTL)
    origin = (F.abs(F.xxhash64(m, F.lit(2))) % HOSTS).cast("int")
    return created, origin


def contacts(spark: SparkSession, n: int, parts: int) -> DataFrame:
    base = spark.range(0, n, numPartitions=parts)
    a = (_unit(F.col("id"), F.lit(11)) * HOSTS).cast("int")
    d = 1 + (_unit(F.col("id"), F.lit(12)) * (HOSTS - 1)).cast("int")
    start = _unit(F.col("id"), F.lit(13)) * UNTIL
    dur = -F.log(1 - _unit(F.col("id"), F.lit(14))) * 120.0
    c = base.select(a.alias("x"), ((a + d) % HOSTS).alias("y"), start.alias("s"), dur.alias("d"))
    c = c.select(
        _host(F.least("x", "y")).alias("a"), _host(F.greatest("x", "y")).alias("b"), "s", "d"
    )
    ev = F.explode(
        F.array(
            F.struct(F.col("s").alias("time"), F.lit(True).alias("up")),
            F.struct((F.col("s") + F.col("d")).alias("time"), F.lit(False).alias("up")),
        )
    )
    out = c.select("a", "b", ev.alias("e")).select("e.time", "a", "b", "e.up")
    return out.where(F.col("time") < UNTIL)


def messages(spark: SparkSession, n: int, parts: int) -> DataFrame:
    per_message = EVENTS_PER_HOST * HOSTS_PER_MESSAGE
    base = spark.range(0, n, numPartitions=parts)
    m = (F.col("id") / per_message).cast("long")
    j = F.col("id") % per_message
    block = (j / EVENTS_PER_HOST).cast("int")
    k = j % EVENTS_PER_HOST
    created, origin = _message_attrs(m)
    event = (
        F.when(j == 0, "created")
        .when(k == 22, "complete")
        .when((k == 23) & (block < DELIVERED_BLOCKS), "delivered")
        .when(k == 24, "evicted")
        .otherwise("fragment")
    )
    host = F.when(j == 0, origin).otherwise((origin + 1 + block) % HOSTS)
    time_ = F.when(j == 0, created).otherwise(created + (block + 1) * 150.0 + k)
    return base.select(
        time_.alias("time"),
        _host(host).alias("host"),
        F.concat(F.lit("m"), m.cast("string")).alias("msg_id"),
        event.alias("event"),
        F.when(event == "fragment", 1024).otherwise(10240).cast("long").alias("bytes"),
        F.when(j == 0, 0).otherwise(1 + block % 4).cast("int").alias("hops"),
    )


def targets(spark: SparkSession, n_messages: int, parts: int) -> DataFrame:
    base = spark.range(0, n_messages * TARGETS_PER_MESSAGE, numPartitions=parts)
    m = (F.col("id") / TARGETS_PER_MESSAGE).cast("long")
    block = (F.col("id") % TARGETS_PER_MESSAGE).cast("int")
    created, origin = _message_attrs(m)
    host = (origin + 1 + block) % HOSTS
    return base.select(
        F.concat(F.lit("m"), m.cast("string")).alias("msg_id"),
        _host(host).alias("host"),
        _host(origin).alias("origin"),
        created.alias("created"),
        (created + TTL).alias("deadline"),
        F.concat(F.lit("t"), (m % 10).cast("string")).alias("topic"),
        F.concat(F.lit("g"), (host % 5).cast("string")).alias("group"),
    )


def small_tables(spark: SparkSession, period: float) -> dict[str, DataFrame]:
    hosts = spark.range(HOSTS).select(
        _host(F.col("id")).alias("host"), F.concat(F.lit("g"), (F.col("id") % 5)).alias("group")
    )
    kinds = F.explode(F.array(*[F.lit(k) for k in ("announce", "catalog", "request", "fragment")]))
    dirs = F.explode(F.array(F.lit("sent"), F.lit("received")))
    dg = hosts.select("host", kinds.alias("kind")).select("host", "kind", dirs.alias("direction"))
    dg = dg.select(
        "*",
        (_unit(F.col("host"), F.col("kind")) * 1e5).cast("long").alias("count"),
        (_unit(F.col("kind"), F.col("host")) * 1e8).cast("long").alias("bytes"),
    )
    samples = int(UNTIL // period)
    cache = (
        spark.range(samples * HOSTS)
        .select(
            ((F.col("id") / HOSTS).cast("long") * period).alias("time"),
            _host(F.col("id") % HOSTS).alias("host"),
        )
        .select(
            "*",
            (_unit(F.col("time"), F.col("host")) * 5e7).cast("long").alias("bytes"),
            (_unit(F.col("host"), F.col("time")) * 500).cast("long").alias("messages"),
        )
    )
    return {"hosts": hosts, "datagrams": dg, "cache": cache}


def generate(spark: SparkSession, run_dir: Path, scale: float) -> dict[str, int]:
    n_events = max(EVENTS_PER_HOST * HOSTS_PER_MESSAGE, int(FULL_EVENTS * scale))
    n_messages = n_events // (EVENTS_PER_HOST * HOSTS_PER_MESSAGE)
    n_events = n_messages * EVENTS_PER_HOST * HOSTS_PER_MESSAGE
    n_contacts = max(100, int(FULL_CONTACTS * scale))
    parts = max(2, spark.sparkContext.defaultParallelism)
    period = 3600.0
    run_dir.mkdir(parents=True)
    frames = {
        "contacts": contacts(spark, n_contacts, parts),
        "messages": messages(spark, n_events, parts),
        "targets": targets(spark, n_messages, parts),
        **small_tables(spark, period),
    }
    for name, df in frames.items():
        df.write.parquet(str(run_dir / f"{name}.parquet"))
    meta = {
        "schema_version": 1,
        "scenario": "bench-synthetic",
        "scenario_file": "",
        "seed": 0,
        "until": UNTIL,
        "version": "bench",
        "wall_time": 0.0,
        "counters": {},
        "cache_sample_period": period,
    }
    (run_dir / "run.json").write_text(json.dumps(meta))
    written = spark.read.parquet(str(run_dir / "contacts.parquet")).count()
    return {
        "message_events": n_events,
        "messages": n_messages,
        "contacts": n_contacts,
        "contact_events": written,
        "target_pairs": n_messages * TARGETS_PER_MESSAGE,
    }


def _jvm_cpu(spark: SparkSession) -> float:
    """CPU seconds (user + system) used so far by the JVM of a local session (Linux)."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spark_work(spark: SparkSession, group: str) -> tuple[int, int, int]:
    """(jobs, stages run, tasks run) of a job group, from Spark's status tracker (kept with
    the UI off); stages whose output an earlier job had already computed are not counted."""
    tracker = spark.sparkContext.statusTracker()
    job_ids = tracker.getJobIdsForGroup(group)
    stage_ids = set()
    for jid in job_ids:
        info = tracker.getJobInfo(jid)
        stage_ids.update(info.stageIds if info is not None else ())
    stages = tasks = 0
    for sid in stage_ids:
        stage = tracker.getStageInfo(sid)
        if stage is not None and stage.numCompletedTasks > 0:
            stages += 1
            tasks += stage.numCompletedTasks
    return len(job_ids), stages, tasks


def _archive_use(spark: SparkSession) -> str:
    """How the session's JVM used the class-data archive (sim.analysis.class_archive)."""
    opts = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions") or ""
    if "-XX:SharedArchiveFile=" in opts:
        return "mapped"
    if "-XX:ArchiveClassesAtExit=" in opts:
        return "none yet (this JVM writes it at exit; run again to use it)"
    return "none"


def small_cli(args: argparse.Namespace) -> None:
    """What the user waits for: ``dodwan-sim analyze RUN --out REPORT`` on a quickstart run,
    run in this process (its click command), session start-up included."""
    from pyspark.sql import SparkSession

    from sim.cli import main as cli_main
    from sim.runner import simulate
    from sim.scenario import load

    tmp = Path(tempfile.mkdtemp(prefix="bench-analysis-cli-"))
    try:
        scenario = load(Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.toml")
        simulate(scenario, tmp / "run")
        argv = ["analyze", str(tmp / "run"), "--out", str(tmp / "report")]
        p0, t0 = time.process_time(), time.perf_counter()
        cli_main(argv, standalone_mode=False)
        p1, t1 = time.process_time(), time.perf_counter()
        spark = SparkSession.getActiveSession()
        assert spark is not None
        jvm = _jvm_cpu(spark)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"dodwan-sim analyze (quickstart run): {t1 - t0:.1f} s wall")
    print(f"CPU: JVM {jvm:.1f} s, Python {p1 - p0:.1f} s")


def small(args: argparse.Namespace) -> None:
    """Session start-up vs the analysis of a small simulated run, in the same process."""
    from sim.runner import simulate
    from sim.scenario import load

    tmp = Path(tempfile.mkdtemp(prefix="bench-analysis-small-"))
    try:
        scenario = load(Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.toml")
        ts = time.perf_counter()
        simulate(scenario, tmp / "run")
        t_sim = time.perf_counter() - ts
        quick = small_local_inputs([str(tmp / "run")]) and not args.default_jvm
        p0, t0 = time.process_time(), time.perf_counter()
        spark = create_session(args.master, small_inputs=quick)
        spark.range(1).count()  # the JVM, the session and a first job: fixed costs
        p1, t1, j1 = time.process_time(), time.perf_counter(), _jvm_cpu(spark)
        sc = spark.sparkContext
        sc.setJobGroup("bench-small", "small-run analysis")
        result = analyze_run(spark, str(tmp / "run"), name="quickstart")
        write_report([result], tmp / "report")
        p2, t2, j2 = time.process_time(), time.perf_counter(), _jvm_cpu(spark)
        jobs, stages, tasks = _spark_work(spark, "bench-small")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    m = result.metrics
    print(f"master: {spark.sparkContext.master}  cores: {spark.sparkContext.defaultParallelism}")
    print(f"JVM options for small inputs: {'yes' if quick else 'no'}")
    print(f"class-data archive of Spark's classes: {_archive_use(spark)}")
    print(f"simulation (quickstart, 600 s simulated): {t_sim:.1f} s")
    print(
        f"Spark session start-up (+ first job): {t1 - t0:.1f} s  "
        f"(CPU: JVM {j1:.1f} s, Python {p1 - p0:.1f} s)"
    )
    print(
        f"small-run analysis + report: {t2 - t1:.1f} s in {jobs} Spark jobs, {stages} stages, "
        f"{tasks} tasks  "
        f"(CPU: JVM {j2 - j1:.1f} s, Python {p2 - p1:.1f} s)"
    )
    print(f"start-up + analysis: {t2 - t0:.1f} s  (CPU {j2 + p2 - p0:.1f} s)")
    print(
        f"figures: delivery_ratio={m['delivery_ratio']:.3f} "
        f"oracle_iterations={m['oracle_iterations']} pairs={m['target_pairs']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="1 = 10M events, 1M contacts")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument(
        "--small", action="store_true", help="session start-up vs a small run's analysis"
    )
    parser.add_argument(
        "--default-jvm",
        action="store_true",
        help="with --small: start the JVM without the small-input options (A/B)",
    )
    parser.add_argument(
        "--cli",
        action="store_true",
        help="with --small: time the whole `dodwan-sim analyze` command instead",
    )
    args = parser.parse_args()
    if args.small and args.cli:
        small_cli(args)
        return
    if args.small:
        small(args)
        return
    spark = create_session(args.master, driver_memory=args.driver_memory)
    tmp = Path(tempfile.mkdtemp(prefix="bench-analysis-"))
    try:
        t0 = time.perf_counter()
        sizes = generate(spark, tmp / "run", args.scale)
        t1 = time.perf_counter()
        result = analyze_run(spark, str(tmp / "run"), name="bench")
        t2 = time.perf_counter()
        write_report([result], tmp / "report")
        t3 = time.perf_counter()
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = sizes["message_events"] + sizes["contact_events"] + sizes["target_pairs"]
    m = result.metrics
    print(f"master: {spark.sparkContext.master}  cores: {spark.sparkContext.defaultParallelism}")
    print("input:", ", ".join(f"{k}={v:,}" for k, v in sizes.items()))
    print(f"generate: {t1 - t0:.1f} s")
    print(f"analysis: {t2 - t1:.1f} s  ({rows / (t2 - t1):,.0f} input rows/s)")
    print(f"report:   {t3 - t2:.1f} s  (Parquet pair tables, CSV, PNG, HTML)")
    print(f"total:    {t3 - t1:.1f} s  ({rows / (t3 - t1):,.0f} input rows/s)")
    print(
        f"figures: delivery_ratio={m['delivery_ratio']:.3f} "
        f"oracle_delivery_ratio={m['oracle_delivery_ratio']:.3f} "
        f"oracle_iterations={m['oracle_iterations']} contacts={m['contacts']['contacts']:,}"
    )
    if args.keep:
        print(f"data kept in {tmp}")


if __name__ == "__main__":
    main()
