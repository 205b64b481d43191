"""The ``dodwan-sim`` command: run, validate and list scenarios (and, when present, analyze).

Thin commands: parse options, call ``sim.scenario`` / ``sim.runner``, turn library errors
into one clean message and a non-zero exit status.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dodwan import native
from dodwan.cli_types import FiniteFloat, PlainIntRange, non_empty
from dodwan.textsafe import safe, safe_text
from sim.mobility.trace import TraceError
from sim.runner import CHECKPOINT_EVERY, RunResult, SimulationError, simulate
from sim.scenario import (
    MAX_DURATION,
    ContactTrace,
    Scenario,
    ScenarioError,
    guess_trace_format,
    load,
)

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"


def _load(path: str) -> Scenario:
    try:
        return load(path)
    except ScenarioError as e:
        raise click.ClickException(_problems(e)) from None


def _problems(e: ScenarioError) -> str:
    """The error for a terminal: each problem on its own line, escaped on its own (a key
    name is the file's: it may hold escapes, or a line break that would fake a problem)."""
    return f"{safe(e.path)}: {len(e.problems)} problem(s)\n" + "\n".join(
        f"  {safe(p)}" for p in e.problems
    )


def _fmt_time(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


seed_option = click.option(
    "--seed", type=PlainIntRange(min=0), help="Override the scenario's seed."
)
until_option = click.option(
    "--until",
    type=FiniteFloat(min=0, min_open=True, max=MAX_DURATION),
    help="Simulated seconds to run (default: the scenario's duration).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dodwan")
def main() -> None:
    """Simulate DoDWAN networks: real protocol code on every host, SimPy mobility."""


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), callback=non_empty,
              help="Folder for the Parquet tables and run.json.")  # fmt: skip
@seed_option
@until_option
@click.option("--contacts", type=click.Path(exists=True, dir_okay=False),
              help="Replay this contact trace instead of the scenario's mobility.")  # fmt: skip
@click.option("--contacts-format", type=click.Choice(["one", "csv"]),
              help="Trace format (default: csv for *.csv and *.csv.gz, The ONE's otherwise).")  # fmt: skip
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--progress", "every", type=FiniteFloat(min=0, min_open=True), metavar="SECONDS",
              help="Print a progress line (simulated time, events/s, memory, ETA) every "
                   "SECONDS of wall time, also when stderr is not a terminal (logs, CI).")  # fmt: skip
@click.option("--checkpoint", "checkpoint_every", type=FiniteFloat(min=0, min_open=True),
              default=CHECKPOINT_EVERY, show_default=True, metavar="SECONDS",
              help="Write every table's rows recorded so far, and the simulated time reached "
                   "into run.json, at least every SECONDS of wall time (a tenth of the time "
                   "taken once that is longer): a killed run loses no more.")  # fmt: skip
def run(
    scenario: str,
    out: str,
    seed: int | None,
    until: float | None,
    contacts: str | None,
    contacts_format: str | None,
    quiet: bool,
    every: float | None,
    checkpoint_every: float,
) -> None:
    """Run SCENARIO and write its logs into --out (streamed as the run goes: a run that
    is stopped keeps the tables written so far, and its run.json says it is incomplete
    and how far it got). Ctrl-C or SIGTERM writes what was recorded before it exits."""
    sc = _load(scenario)
    trace = None
    if contacts is not None:
        p = Path(contacts)
        trace = ContactTrace(p, contacts_format or guess_trace_format(p))
    horizon = until if until is not None else sc.duration
    if not native.active() and os.environ.get(native.ENV) != "0":
        # a researcher who edited the core should know why the run is slower
        click.echo(f"note: {native.describe()} (the compiled one runs ~2.2x faster)", err=True)
    signal.signal(signal.SIGTERM, _interrupted)  # the logs are written on the way out
    try:
        if every is not None:
            result = simulate(
                sc, Path(out), seed=seed, until=until, contacts=trace,
                progress=ProgressLines(safe(sc.name), horizon, every),
                checkpoint_every=checkpoint_every,
            )  # fmt: skip
        elif quiet:
            result = simulate(
                sc, Path(out), seed=seed, until=until, contacts=trace,
                checkpoint_every=checkpoint_every,
            )  # fmt: skip
        else:
            result = _run_with_progress(
                sc, Path(out), seed, until, trace, horizon, checkpoint_every
            )
    except Stopped as e:
        _stopped(Path(out), e.code)
    except KeyboardInterrupt:
        _stopped(Path(out), 130)
    except (SimulationError, TraceError) as e:
        raise click.ClickException(safe_text(str(e))) from None
    except OSError as e:
        raise click.ClickException(f"cannot write the logs into {out}: {e.strerror}") from None
    c = result.counters
    click.echo(
        f"{safe(sc.name)}: {result.hosts} hosts, {_fmt_time(result.until)} simulated in "
        f"{result.wall_time:.1f} s wall ({result.hosts * result.until / max(result.wall_time, 1e-9):,.0f}"
        f" host-s/s); {c.get('sim_published', 0)} published"
        + (f" + {c['sim_joms_published']} JMS" if c.get("sim_joms_published") else "")
        + (
            f" ({c['sim_publish_refused']} refused by their host)"
            if c.get("sim_publish_refused")
            else ""
        )
        + ", "
        f"{c.get('sim_deliveries', 0)} deliveries; logs in {out}"
    )


class Stopped(BaseException):
    """SIGTERM during a run (raised where the run is, so that it writes its logs)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _interrupted(signum: int, _frame: object) -> None:
    raise Stopped(128 + signum)


def _stopped(out: Path, code: int) -> None:
    """Say how far a stopped run got and that its logs are kept, then exit with ``code``."""
    reached = "?"
    with contextlib.suppress(OSError, ValueError):
        reached = _fmt_time(float(json.loads((out / "run.json").read_text())["reached"]))
    click.echo(
        f"stopped at {reached} simulated: the logs recorded so far are in {out} "
        '(run.json says "complete": false)',
        err=True,
    )
    sys.exit(code)


class ProgressLines:
    """Progress as plain lines on stderr, at most one every ``every`` wall seconds."""

    def __init__(self, name: str, horizon: float, every: float) -> None:
        self.name, self.horizon, self.every = name, horizon, every
        self.start = self.last = time.perf_counter()

    def __call__(self, now: float, events: int) -> None:
        wall = time.perf_counter()
        if wall - self.last < self.every and now < self.horizon:
            return
        self.last = wall
        spent = wall - self.start
        rate = events / spent if spent > 0 else 0.0
        eta = spent * (self.horizon - now) / now if now > 0 else float("nan")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        click.echo(
            f"{self.name}: sim {_fmt_time(now)} / {_fmt_time(self.horizon)} "
            f"({100 * now / self.horizon:.1f} %), {rate:,.0f} events/s, "
            f"peak RSS {rss:,.0f} MB, wall {_fmt_time(spent)}, "
            f"ETA {_fmt_time(eta) if eta == eta else '?'}",
            err=True,
        )


def _run_with_progress(
    sc: Scenario,
    out: Path,
    seed: int | None,
    until: float | None,
    trace: ContactTrace | None,
    horizon: float,
    checkpoint_every: float,
) -> RunResult:
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("sim {task.fields[sim]} / {task.fields[end]}"),
        TextColumn("wall"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=None,
        transient=False,
        disable=not sys.stderr.isatty(),
    )
    with progress:
        # the description is read as rich markup: "[/x]" in a name would raise MarkupError
        name = escape(safe(sc.name))
        task = progress.add_task(name, total=horizon, sim=_fmt_time(0), end=_fmt_time(horizon))

        def tick(now: float, _events: int) -> None:
            progress.update(task, completed=now, sim=_fmt_time(now))

        result = simulate(
            sc, out, seed=seed, until=until, contacts=trace, progress=tick,
            checkpoint_every=checkpoint_every,
        )  # fmt: skip
    return result


def _parse_set(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> list[tuple[str, list[Any]]]:
    from sim.sweep import SweepError, parse_values

    out = []
    for item in value:
        key, sep, values = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=v1,v2,...", ctx, param)
        try:
            out.append((key.strip(), parse_values(values)))
        except SweepError as e:
            raise click.BadParameter(f"{key}: {e}", ctx, param) from None
    return out


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=V1,V2", callback=_parse_set,
              help="Sweep a scenario key over values (repeatable; any dotted key, e.g. "
              "protocol.horizon=1,2,3 or groups[0].mobility.speed=[1,2],[2,4]).")  # fmt: skip
@click.option("--seeds", type=click.IntRange(min=1),
              help="Seeds per setting: the scenario's seed, +1, ... (default: [sweep].seeds "
              "or 1).")  # fmt: skip
@click.option("--out", "out", required=True, metavar="DIR", callback=non_empty,
              help="Sweep folder (a local path, or any URI pyarrow opens: s3://, hdfs://...).")  # fmt: skip
@click.option("--master", metavar="URL",
              help="Run on Spark: each simulation is one Spark task (e.g. local[4], "
              "spark://host:7077). Default: local processes.")  # fmt: skip
@click.option("--jobs", type=click.IntRange(min=1),
              help="Runs at once (default: CPU count, or Spark's default parallelism).")  # fmt: skip
@click.option("--quiet", is_flag=True, help="No progress output.")
def sweep(
    scenario: str,
    sets: list[tuple[str, list[Any]]],
    seeds: int | None,
    out: str,
    master: str | None,
    jobs: int | None,
    quiet: bool,
) -> None:
    """Run SCENARIO for every combination of --set values × seeds into --out.

    Finished runs are skipped, so an interrupted sweep resumes where it stopped. Analyse the
    folder with `dodwan-sim analyze DIR --out REPORT`.
    """
    from sim.sweep import SweepError, make_plan, run_sweep

    try:
        plan = make_plan(scenario, sets, seeds)
    except SweepError as e:
        raise click.ClickException(safe_text(str(e))) from None
    runs = len(plan.settings) * len(plan.seeds)
    if not quiet:
        click.echo(
            f"{safe(plan.name)}: {len(plan.settings)} setting(s) × {len(plan.seeds)} seed(s) = "
            f"{runs} run(s) into {out}" + (f" on Spark ({master})" if master else "")
        )
    started = time.monotonic()
    try:
        if quiet or not sys.stderr.isatty():
            report = None if quiet else _sweep_reporter(started, click.echo)
            outcomes = run_sweep(plan, out, master=master, jobs=jobs, report=report)
        else:
            outcomes = _sweep_with_bar(plan, out, master, jobs, started)
    except SweepError as e:
        raise click.ClickException(safe_text(str(e))) from None
    failed = [o for o in outcomes if not o.ok]
    skipped = sum(o.skipped for o in outcomes)
    if not quiet:
        click.echo(
            f"{len(outcomes) - len(failed) - skipped} run(s) done, {skipped} already done, "
            f"{len(failed)} failed in {time.monotonic() - started:.1f} s; "
            f"analyse with: dodwan-sim analyze {out} --out REPORT"
        )
    if failed:
        for o in failed:
            click.echo(f"FAILED {safe(o.label)} seed {o.seed}: {safe(o.error)}", err=True)
        raise click.ClickException(f"{len(failed)} run(s) failed (re-run the command to retry)")


def _sweep_with_bar(
    plan: Any, out: str, master: str | None, jobs: int | None, started: float
) -> list[Any]:
    """A progress bar on a terminal (runs finished / to do, ETA), one line per run above it."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from sim.sweep import run_sweep

    with Progress(
        TextColumn("[bold]sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ) as bar:
        task = bar.add_task("sweep", total=None)
        line = _sweep_reporter(
            started, lambda text: bar.console.print(text, markup=False, highlight=False)
        )

        def report(o: Any, k: int, n: int) -> None:
            bar.update(task, completed=k, total=n)
            line(o, k, n)

        return run_sweep(plan, out, master=master, jobs=jobs, report=report)


def _sweep_reporter(
    started: float, echo: Callable[[str], None], clock: Callable[[], float] = time.monotonic
) -> Callable[[Any, int, int], None]:
    before: list[int] = []  # runs done before this call (the first report is run before + 1)

    def report(o: Any, k: int, n: int) -> None:
        if not before:
            before.append(k - 1)
        made = k - before[0]  # the pace of the runs made by this call
        eta = (clock() - started) / made * (n - k) if made > 0 else 0.0
        if o.skipped:
            what = "already done"
        elif o.ok:
            what = f"{o.wall:.1f} s, {o.published} published, {o.deliveries} deliveries"
        else:
            what = f"FAILED: {safe(o.error)}"
        echo(f"[{k}/{n}] {safe(o.label)} seed {o.seed}: {what}  (ETA {_fmt_time(eta)})")

    return report


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), callback=non_empty,
              help="Trace file to write (The ONE's connectivity format; gzip if it ends in .gz).")  # fmt: skip
@seed_option
@until_option
def contacts(scenario: str, out: str, seed: int | None, until: float | None) -> None:
    """Write the contacts SCENARIO's own mobility makes as a ONE contact trace (host i =
    the i-th host of the scenario), to replay the same contacts with other settings or
    other simulators."""
    from sim.mobility.contacts import write_one_trace

    sc = _load(scenario)
    if sc.contacts is not None:
        # its mobility is not what moves its hosts: writing its contacts would be a lie
        raise click.ClickException(
            f"{scenario} replays the contact trace {sc.contacts.path} ([contacts]); "
            "its contacts are that file (convert it, if needed, instead of this command)"
        )
    horizon = until if until is not None else sc.duration
    try:
        n = write_one_trace(sc, sc.seed if seed is None else seed, horizon, Path(out))
    except OSError as e:
        raise click.ClickException(f"cannot write {out}: {e.strerror}") from None
    click.echo(
        f"{safe(sc.name)}: {n} contacts among {len(sc.host_names())} hosts in {_fmt_time(horizon)} -> {out}"
    )


def _has_sweep(scenario: str) -> bool:
    """Whether the (loadable) scenario has a ``sweep`` table, as a header or inline."""
    import tomllib

    return "sweep" in tomllib.loads(Path(scenario).read_text(encoding="utf-8"))


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
def validate(scenario: str) -> None:
    """Check SCENARIO and list every problem with its key and line."""
    sc = _load(scenario)
    hosts = len(sc.host_names())
    traffic = f"{len(sc.publish)} publish, {len(sc.subscribe)} subscribe"
    if sc.uses_joms:
        traffic += f", {len(sc.joms_topics)} JOMS topic(s), {len(sc.joms_queues)} JOMS queue(s)"
    moves = f"trace {sc.contacts.path}" if sc.contacts else "mobility"
    sweep_text = ""
    if _has_sweep(scenario):
        from sim.sweep import SweepError, make_plan

        try:
            plan = make_plan(scenario)
        except SweepError as e:
            raise click.ClickException(safe_text(str(e))) from None
        sweep_text = (
            f"; sweep: {len(plan.settings)} setting(s) × {len(plan.seeds)} seed(s) over "
            + ", ".join(plan.keys)
        )
    click.echo(
        f"OK: {safe(sc.name)}: {hosts} hosts in {len(sc.groups)} group(s), "
        f"{_fmt_time(sc.duration)} simulated, {moves}, {traffic}{sweep_text}"
    )


@main.command()
@click.option("--dir", "folder", type=click.Path(file_okay=False, exists=True),
              default=str(SCENARIO_DIR), show_default=True, help="Where to look.")  # fmt: skip
def scenarios(folder: str) -> None:
    """List the scenarios that ship (name, hosts, duration, description)."""
    files = sorted(Path(folder).glob("*.toml"))
    if not files:
        raise click.ClickException(f"no *.toml scenarios in {folder}")
    for f in files:
        try:
            sc = load(f)
        except ScenarioError as e:
            click.echo(f"{safe(f.name):<20} INVALID ({len(e.problems)} problem(s))")
            continue
        click.echo(
            f"{safe(f.name):<20} {len(sc.host_names()):>4} hosts {_fmt_time(sc.duration):>9}  "
            f"{safe(sc.description)}"
        )


try:
    from sim.analysis.cli import analyze

    main.add_command(analyze)
except ImportError:  # the analysis command ships separately
    pass


if __name__ == "__main__":
    main()
