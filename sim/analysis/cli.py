"""The ``analyze`` click command: run directories and/or contact traces in, a report out.

Registered by the simulator's command group (``dodwan-sim analyze``); thin on purpose: parse,
call the library, print a summary table, turn AnalysisError into one line and exit code 1.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dodwan.cli_types import non_empty
from sim.analysis.aggregate import SettingResult
from sim.analysis.errors import SPARK_ERRORS, AnalysisError, brief
from sim.analysis.load import (
    TRACE_FORMATS,
    IncompleteRun,
    precheck_run_dir,
    precheck_trace,
    run_name,
)
from sim.analysis.oracle import DEFAULT_MAX_ITERATIONS, OracleNotConverged
from sim.analysis.pipeline import RunResult, analyze_contact_trace, analyze_run
from sim.analysis.report import (
    mean_column,
    mean_column_note,
    prepare_report_dir,
    summary_rows,
    write_frames,
    write_report,
)
from sim.analysis.session import DEFAULT_MASTER, create_session, small_local_inputs
from sim.analysis.sweep_report import (
    SWEEP_METRICS,
    aggregate_results,
    is_sweep,
    mean_ci,
    missing_text,
    read_sweep,
)


def unique_names(paths: Sequence[str]) -> list[str]:
    """Report names for the inputs: base names, with -2, -3 ... appended on collisions."""
    seen: dict[str, int] = {}
    names = []
    for path in paths:
        base = run_name(path)
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return names


def summary_table(results: Sequence[RunResult]) -> Table:
    """The terminal summary: one row per figure, one column per run."""
    table = Table(title="DoDWAN analysis")
    table.add_column("metric")
    for r in results:
        table.add_column(r.name, justify="right")
    mean_head = mean_column(results)
    if mean_head is not None:
        table.add_column(mean_head, justify="right")
    table.caption = mean_column_note(results)
    for label, values in summary_rows(results):
        table.add_row(label, *values)
    return table


def sweep_table(keys: Sequence[str], settings: Sequence[SettingResult]) -> Table:
    """The terminal summary of a sweep: one row per setting, mean ± 95 % CI over seeds."""
    table = Table(title="DoDWAN sweep (mean ± 95 % CI over seeds)")
    for k in keys:
        table.add_column(k)
    table.add_column("seeds", justify="right")
    shown = [(p, label) for p, label in SWEEP_METRICS[:4]]
    for _, label in shown:
        table.add_column(label, justify="right")
    for s in settings:
        table.add_row(
            *[str(s.setting.get(k)) for k in keys],
            str(len(s.seeds)),
            *[mean_ci(s, p) for p, _ in shown],
        )
    return table


@click.command("analyze")
@click.argument("run_dirs", nargs=-1, metavar="[RUN_DIR | SWEEP_DIR]...")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    callback=non_empty,
    help="Report directory (metrics.json, CSV tables, PNG plots, report.html).",
)
@click.option(
    "--contacts",
    "traces",
    multiple=True,
    metavar="TRACE",
    help="External contact trace to analyse alone (The ONE CONN lines, CSV time,a,b,up, "
    "or Parquet); repeatable.",
)
@click.option(
    "--format",
    "trace_format",
    type=click.Choice(TRACE_FORMATS),
    default="auto",
    show_default=True,
    help="Format of --contacts traces (auto: by file extension, .csv / .parquet / else ONE).",
)
@click.option(
    "--master",
    default=None,
    metavar="URL",
    help=f"Spark master URL (default {DEFAULT_MASTER}: this machine).",
)
@click.option(
    "--tables-out",
    default=None,
    metavar="PATH",
    help="Where per-pair Parquet tables go (any Hadoop path; default REPORT_DIR/tables).",
)
@click.option("--no-oracle", is_flag=True, help="Skip the oracle (earliest-arrival) computation.")
@click.option(
    "--max-oracle-iterations",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_ITERATIONS,
    show_default=True,
    help="Cap on oracle relaxation rounds (figures become lower bounds when hit).",
)
@click.option("--driver-memory", default=None, help="Spark driver memory, e.g. 4g.")
def analyze(
    run_dirs: tuple[str, ...],
    out_dir: str,
    traces: tuple[str, ...],
    trace_format: str,
    master: str | None,
    tables_out: str | None,
    no_oracle: bool,
    max_oracle_iterations: int,
    driver_memory: str | None,
) -> None:
    """Analyse simulation runs (RUN_DIR...) and/or contact traces with Spark.

    A SWEEP_DIR (written by `dodwan-sim sweep`) is analysed alone: every finished run, then
    per setting the mean, standard deviation and 95 % confidence interval over seeds.

    Computes delivery ratios, delays, overheads, contact statistics and the oracle bound,
    then writes metrics.json, CSV tables, PNG plots and report.html into --out.
    """
    if not run_dirs and not traces:
        raise click.UsageError("give at least one RUN_DIR or --contacts TRACE")
    console = Console()
    names = unique_names([*run_dirs, *traces])
    started = time.monotonic()
    results: list[RunResult] = []
    logging.getLogger("py4j").setLevel(logging.ERROR)
    sweep = None
    if any(is_sweep(p) for p in run_dirs):
        if len(run_dirs) != 1 or traces:
            raise click.UsageError("a sweep folder is analysed alone (no other inputs)")
        try:
            sweep = read_sweep(run_dirs[0])
        except AnalysisError as exc:
            raise click.ClickException(str(exc)) from exc
        console.print(
            f"sweep [bold]{sweep.manifest.get('scenario')}[/]: {len(sweep.runs)} finished run(s)"
            + (f", {escape(missing_text(sweep.missing))}" if sweep.missing else "")
        )
        run_dirs = tuple(r.path for r in sweep.runs)
        names = [r.name for r in sweep.runs]
    try:
        for path in run_dirs:
            precheck_run_dir(path)
        for path in traces:
            precheck_trace(path)
        prepare_report_dir(Path(out_dir))
        small = small_local_inputs([*run_dirs, *traces])  # a JVM tuned for a short life
        spark = create_session(master, driver_memory=driver_memory, small_inputs=small)
        for path, name in zip(run_dirs, names, strict=False):
            console.print(f"analysing run [bold]{name}[/] ({path})")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", OracleNotConverged)
                warnings.simplefilter("always", IncompleteRun)
                results.append(
                    analyze_run(
                        spark,
                        path,
                        name=name,
                        with_oracle=not no_oracle,
                        max_oracle_iterations=max_oracle_iterations,
                    )
                )
            for w in caught:
                console.print(f"[yellow]warning[/] {name}: {w.message}")
            if sweep is not None:  # many runs: write per-pair tables now, free the cache
                write_frames(results[-1:], tables_out or str(Path(out_dir).resolve() / "tables"))
                results[-1].frames = {}
                spark.catalog.clearCache()
        for path, name in zip(traces, names[len(run_dirs) :], strict=True):
            console.print(f"analysing contact trace [bold]{name}[/] ({path})")
            results.append(analyze_contact_trace(spark, path, fmt=trace_format, name=name))
        settings = aggregate_results(sweep, results) if sweep is not None else None
        report = write_report(
            results,
            out_dir,
            tables_out=tables_out,
            sweep=(sweep, settings) if sweep is not None else None,
        )
    except AnalysisError as exc:
        raise click.ClickException(str(exc)) from exc
    except SPARK_ERRORS as exc:  # e.g. a corrupt file found mid-job
        raise click.ClickException(f"Spark job failed: {brief(exc)}") from exc
    except OSError as exc:
        raise click.ClickException(f"cannot write the report: {exc}") from exc
    if sweep is not None and settings is not None:
        console.print(sweep_table(list(sweep.manifest.get("keys") or []), settings))
    else:
        console.print(summary_table(results))
    elapsed = time.monotonic() - started
    console.print(f"report: {Path(report).resolve()}  ({elapsed:.1f} s)")
