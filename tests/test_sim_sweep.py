"""Parameter sweeps: keys and values, the plan, local and Spark runs, resume, determinism."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from spark_fixtures import SPARK_GROUP, shared_spark

from sim.cli import main
from sim.runner import simulate
from sim.sweep import (
    MANIFEST,
    MARKER,
    Setting,
    SweepError,
    key_path,
    make_plan,
    parse_values,
    run_sweep,
    scenario_for,
    set_key,
)

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"
TABLES = ("contacts", "messages", "targets", "datagrams", "cache", "hosts")


def small_scenario(tmp_path: Path, extra: str = "") -> Path:
    """quickstart cut to two simulated minutes (a run takes a fraction of a second)."""
    text = (SCENARIOS / "quickstart.toml").read_text()
    text = text.replace("duration = 600.0", "duration = 120.0").replace(
        "interval = 60.0", "interval = 20.0"
    )
    path = tmp_path / "small.toml"
    path.write_text(text + extra)
    return path


def tables_of(run_dir: Path) -> dict[str, Any]:
    return {t: pq.read_table(run_dir / f"{t}.parquet") for t in TABLES}


# --------------------------------------------------------------------------- keys, values


def test_parse_values() -> None:
    assert parse_values("1,2,3") == [1, 2, 3]
    assert parse_values("true,false") == [True, False]
    assert parse_values("0.5, 2") == [0.5, 2]
    assert parse_values("[0.5,1.0],[1,2]") == [[0.5, 1.0], [1, 2]]
    assert parse_values("poisson,periodic") == ["poisson", "periodic"]
    assert parse_values('"a,b",c') == ["a,b", "c"]
    with pytest.raises(SweepError):
        parse_values("")
    with pytest.raises(SweepError):
        parse_values("1,,2")


def test_key_paths() -> None:
    assert key_path("protocol.horizon") == ["protocol", "horizon"]
    assert key_path("groups[0].mobility.speed") == ["groups", 0, "mobility", "speed"]
    assert key_path("traffic.publish[1].interval") == ["traffic", "publish", 1, "interval"]
    for bad in ("", "[0].x", "seed", "a..b"):
        with pytest.raises(SweepError):
            key_path(bad)


def test_set_key_creates_tables_and_selects_entries_by_name() -> None:
    data: dict[str, Any] = {"groups": [{"name": "a", "count": 1}, {"name": "b", "count": 2}]}
    set_key(data, "protocol.horizon", 3)
    set_key(data, "groups.b.count", 5)
    set_key(data, "groups[0].mobility.speed", [1, 2])
    assert data["protocol"] == {"horizon": 3}
    assert data["groups"][1]["count"] == 5
    assert data["groups"][0]["mobility"] == {"speed": [1, 2]}
    with pytest.raises(SweepError, match="out of range"):
        set_key(data, "groups[5].count", 1)
    with pytest.raises(SweepError, match="no single entry named 'zz'"):
        set_key(data, "groups.zz.count", 1)


# --------------------------------------------------------------------------- the plan


def test_any_key_can_be_swept(tmp_path: Path) -> None:
    path = small_scenario(tmp_path)
    plan = make_plan(
        path,
        [
            ("groups.walker.mobility.speed", [[1.0, 1.0], [3.0, 4.0]]),
            ("traffic.publish[0].interval", [10.0]),
            ("radio.loss", [0.0]),
        ],
        seeds=2,
    )
    assert len(plan.settings) == 2 and plan.seeds == [1, 2]
    sc = scenario_for(plan.text, plan.source, plan.settings[1])
    assert sc.groups[0].mobility.speed == (3.0, 4.0)
    assert sc.publish[0].interval == 10.0
    assert sc.radio.loss == 0.0


def _changed(value: Any) -> Any:
    """A valid value other than a setting's default (to see that a swept value lands)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return value * 2 if value else 1.0


def test_every_protocol_setting_and_limit_can_be_swept(tmp_path: Path) -> None:
    """Every [protocol] key and every [protocol.limits] key the scenario format has (the
    core's NodeConfig and Limits fields) is a sweep key, and its value reaches the hosts."""
    from sim.protocol import DEFAULTS, LIMIT_DEFAULTS

    path = small_scenario(tmp_path)
    sets = [(f"protocol.{k}", [_changed(v)]) for k, v in DEFAULTS.items()]
    sets += [(f"protocol.limits.{k}", [_changed(v)]) for k, v in LIMIT_DEFAULTS.items()]
    plan = make_plan(path, sets)
    proto = scenario_for(plan.text, plan.source, plan.settings[0]).groups[0].protocol
    for k, v in DEFAULTS.items():
        assert proto.settings[k] == _changed(v), k
    for k, v in LIMIT_DEFAULTS.items():
        assert proto.limits[k] == _changed(v), k
    assert proto.node_config("walker-0").limits.max_ttl == _changed(LIMIT_DEFAULTS["max_ttl"])


def test_generator_ranges_can_be_swept(tmp_path: Path) -> None:
    """The ranges of a ONE-style generator ([min, max] lists) are sweep values like any other."""
    path = small_scenario(
        tmp_path,
        '\n[[traffic.generate]]\nname = "one"\nsources = ["walker"]\n'
        'destinations = ["walker"]\ninterval = [25, 35]\nsize = [500, 1000]\n',
    )
    plan = make_plan(
        path,
        [
            ("traffic.generate[0].interval", parse_values("[5,10],[50,70]")),
            ("traffic.generate.one.size", parse_values("[100,200]")),
            ("traffic.generate[0].ttl", parse_values("[60,120]")),
            ("traffic.generate[0].mode", parse_values("one,all")),
        ],
    )
    assert len(plan.settings) == 4
    gens = [scenario_for(plan.text, plan.source, s).generate[0] for s in plan.settings]
    assert [g.interval for g in gens] == [(5.0, 10.0)] * 2 + [(50.0, 70.0)] * 2
    assert {g.size for g in gens} == {(100, 200)} and {g.ttl for g in gens} == {(60.0, 120.0)}
    assert [g.mode for g in gens] == ["one", "all", "one", "all"]
    with pytest.raises(SweepError, match=r"traffic\.generate\[0\]\.interval: must be .*\[10, 5\]"):
        make_plan(path, [("traffic.generate[0].interval", [[10, 5]])])


def test_bad_settings_are_all_reported_before_anything_runs(tmp_path: Path) -> None:
    path = small_scenario(tmp_path)
    with pytest.raises(SweepError) as info:
        make_plan(path, [("protocol.horizon", [1, 0, 99]), ("protocol.colour", ["red"])])
    text = str(info.value)
    assert "protocol.horizon=0" in text and "horizon must be between 1 and 8" in text
    assert "protocol.horizon=99" in text and text.count("horizon must be between 1 and 8") == 2
    assert "protocol.colour: unknown key" in text
    assert not (tmp_path / "out").exists()


def test_sweep_table_in_the_file_and_command_line_override(tmp_path: Path) -> None:
    path = small_scenario(
        tmp_path,
        '\n[sweep]\nseeds = [4, 9]\n[sweep.set]\n"protocol.horizon" = [1, 2]\n'
        "protocol.altruistic = [true, false]\n",
    )
    plan = make_plan(path)
    assert plan.keys == ["protocol.horizon", "protocol.altruistic"]
    assert plan.seeds == [4, 9] and len(plan.runs()) == 8
    plan = make_plan(path, [("protocol.horizon", [3])], seeds=1)
    assert [s.as_dict() for s in plan.settings] == [
        {"protocol.horizon": 3, "protocol.altruistic": True},
        {"protocol.horizon": 3, "protocol.altruistic": False},
    ]
    assert plan.seeds == [1]
    # a single run of that file ignores [sweep]
    res = CliRunner().invoke(main, ["validate", str(path)])
    assert res.exit_code == 0, res.output


def test_the_shipped_sweep_example_is_the_one_the_readme_and_docs_show() -> None:
    example = SCENARIOS / "sweep_horizon.toml"
    plan = make_plan(example)
    assert plan.keys == ["protocol.horizon", "protocol.altruistic"]
    assert len(plan.settings) == 6 and plan.seeds == [1, 2, 3, 4, 5] and len(plan.runs()) == 30
    root = SCENARIOS.parent
    readme = (root / "README.md").read_text()
    assert "dodwan-sim sweep scenarios/sweep_horizon.toml --out out/sw" in readme
    assert "dodwan-sim analyze out/sw --out" in readme
    docs = (root / "docs" / "scenarios.md").read_text()
    assert "`sweep_horizon.toml` | 12 | 10 min |" in docs and "## Sweeps: settings × seeds" in docs


def test_validate_checks_every_setting_of_the_sweep_table(tmp_path: Path) -> None:
    path = small_scenario(
        tmp_path, '\n[sweep]\nseeds = 3\n[sweep.set]\n"protocol.horizon" = [1, 0]\n'
    )
    res = CliRunner().invoke(main, ["validate", str(path)])
    assert res.exit_code == 1 and "1 setting(s) are not valid" in res.output
    assert "setting protocol.horizon=0:" in res.output and "Traceback" not in res.output
    path.write_text(path.read_text().replace("[1, 0]", "[1, 2]"))
    res = CliRunner().invoke(main, ["validate", str(path)])
    assert (
        res.exit_code == 0 and "sweep: 2 setting(s) × 3 seed(s) over protocol.horizon" in res.output
    )


def test_setting_folder_names_are_stable_and_safe() -> None:
    s = Setting((("groups[0].mobility.speed", [1, 2]), ("protocol.altruistic", True)))
    assert s.slug() == Setting(s.values).slug()
    assert "/" not in s.slug() and " " not in s.slug()
    assert s.label() == "groups[0].mobility.speed=[1,2], protocol.altruistic=true"


# --------------------------------------------------------------------------- running


def test_local_sweep_runs_every_setting_and_seed_deterministically(tmp_path: Path) -> None:
    path = small_scenario(tmp_path)
    out = tmp_path / "sweep"
    plan = make_plan(path, [("protocol.horizon", [1, 2])], seeds=3)
    seen: list[tuple[int, int]] = []
    outcomes = run_sweep(plan, str(out), jobs=2, report=lambda o, k, n: seen.append((k, n)))
    assert all(o.ok and not o.skipped for o in outcomes), outcomes
    assert sorted(seen) == [(k, 6) for k in range(1, 7)]
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["keys"] == ["protocol.horizon"] and manifest["seeds"] == [1, 2, 3]
    assert len(manifest["runs"]) == 6
    for r in manifest["runs"]:
        run_dir = out / r["dir"]
        assert (run_dir / MARKER).is_file()
        info = json.loads((run_dir / "run.json").read_text())
        assert info["seed"] == r["seed"]
        assert info["sweep"]["setting"] == r["setting"]
    # the same (setting, seed) run by hand gives the same tables
    first = manifest["runs"][4]
    sc = scenario_for(plan.text, plan.source, Setting(tuple(first["setting"].items())))
    assert sc.groups[0].protocol.horizon == first["setting"]["protocol.horizon"]
    simulate(sc, tmp_path / "by-hand", seed=first["seed"])
    assert tables_of(out / first["dir"]) == tables_of(tmp_path / "by-hand")
    # different seeds give different runs
    a, b = (tables_of(out / manifest["runs"][k]["dir"]) for k in (0, 1))
    assert a["contacts"] != b["contacts"]


def test_resume_skips_finished_runs_and_redoes_interrupted_ones(tmp_path: Path) -> None:
    path = small_scenario(tmp_path)
    out = tmp_path / "sweep"
    plan = make_plan(path, [("protocol.altruistic", [True, False])], seeds=2)
    run_sweep(plan, str(out), jobs=1)
    runs = [out / r.rel for r in plan.runs()]
    stamps = {r: (r / "messages.parquet").stat().st_mtime_ns for r in runs}
    # an interrupted run: logs half written, no marker
    (runs[2] / MARKER).unlink()
    (runs[2] / "messages.parquet" / "part-00099.parquet").write_bytes(b"truncated")
    (runs[2] / "leftover.tmp").write_text("x")
    outcomes = run_sweep(plan, str(out), jobs=1)
    assert sorted(o.skipped for o in outcomes) == [False, True, True, True]
    redone = [o for o in outcomes if not o.skipped]
    assert redone[0].rel == plan.runs()[2].rel and redone[0].ok
    for r in runs:
        if r != runs[2]:
            assert (r / "messages.parquet").stat().st_mtime_ns == stamps[r]
    assert not (runs[2] / "leftover.tmp").exists()
    assert pq.read_table(runs[2] / "messages.parquet").num_rows > 0
    assert (runs[2] / MARKER).is_file()


def test_a_sweep_in_a_remote_store_is_written_and_read_back_by_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store pyarrow opens from a URI (s3://, hdfs://...) gives paths without the scheme;
    the runs handed to Spark must keep it (``bucket/sweep/runs/...`` would be read as a
    local relative path). The 'remote' store here is a local folder behind the URI."""
    from pyarrow import fs as pafs

    from sim.analysis.sweep_report import read_sweep
    from sim.sweep import prepare, run_task

    bucket = tmp_path / "bucket-root"
    bucket.mkdir()
    remote = pafs.SubTreeFileSystem(str(bucket), pafs.LocalFileSystem())

    def open_uri(uri: str) -> Any:
        assert uri.startswith("s3://"), uri
        return remote, uri[len("s3://") :]  # as pyarrow's S3FileSystem does

    monkeypatch.setattr("sim.sweep.open_uri", open_uri)
    plan = make_plan(small_scenario(tmp_path), [("protocol.horizon", [1, 2])], seeds=1)
    root = "s3://results/sweep"
    _, todo, done = prepare(plan, root)
    assert len(todo) == 2 and not done
    outcomes = [run_task(t) for t in todo[:1]]  # what each Spark task runs
    assert outcomes[0].ok, outcomes[0].error
    first = bucket / "results" / "sweep" / todo[0].rel
    assert (first / MARKER).is_file() and (first / "messages.parquet").exists()
    sweep = read_sweep(root)
    assert [r.path for r in sweep.runs] == [f"{root}/{todo[0].rel}"]
    assert sweep.missing == [todo[1].rel]
    # local processes write to such a store too (no Spark needed to keep results remote)
    outcomes = run_sweep(plan, root, jobs=1)
    assert sorted(o.skipped for o in outcomes) == [False, True] and all(o.ok for o in outcomes)
    assert len(read_sweep(root).runs) == 2 and (bucket / "results/sweep" / todo[1].rel).is_dir()


def test_seeds_and_values_added_to_the_files_sweep_table_resume_the_sweep(tmp_path: Path) -> None:
    """[sweep] only chooses which runs to make, never what a run is: editing it (or a
    comment) keeps the folder usable, and only the new runs are made."""
    path = small_scenario(tmp_path, '\n[sweep]\nseeds = 1\n[sweep.set]\n"radio.loss" = [0.0]\n')
    out = tmp_path / "sweep"
    assert [o.skipped for o in run_sweep(make_plan(path), str(out), jobs=1)] == [False]
    path.write_text(
        "# two seeds now, and a second loss\n"
        + path.read_text().replace("seeds = 1", "seeds = 2").replace("[0.0]", "[0.0, 0.5]")
    )
    outcomes = run_sweep(make_plan(path), str(out), jobs=1)
    assert sorted(o.skipped for o in outcomes) == [False, False, False, True]
    assert all(o.ok for o in outcomes)
    path.write_text(path.read_text().replace("duration = 120.0", "duration = 100.0"))
    with pytest.raises(SweepError, match="another scenario"):
        run_sweep(make_plan(path), str(out), jobs=1)


def test_sweep_folder_of_another_scenario_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    run_sweep(make_plan(small_scenario(tmp_path), seeds=1), str(out), jobs=1)
    (tmp_path / "o").mkdir()
    other = small_scenario(tmp_path / "o")
    other.write_text(other.read_text().replace("loss = 0.05", "loss = 0.1"))
    with pytest.raises(SweepError, match="another scenario"):
        run_sweep(make_plan(other, seeds=1), str(out), jobs=1)


def test_sweep_command(tmp_path: Path) -> None:
    path = small_scenario(tmp_path)
    out = tmp_path / "sweep"
    args = ["sweep", str(path), "--set", "protocol.horizon=1,2", "--seeds", "2", "--out", str(out)]
    res = CliRunner().invoke(main, [*args, "--jobs", "2"])
    assert res.exit_code == 0, res.output
    assert "2 setting(s) × 2 seed(s) = 4 run(s)" in res.output
    assert "[4/4]" in res.output and "4 run(s) done, 0 already done, 0 failed" in res.output
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "0 run(s) done, 4 already done" in again.output
    bad = CliRunner().invoke(main, [*args[:3], "protocol.horizon"])
    assert bad.exit_code == 2 and "expected KEY=v1,v2" in bad.output
    invalid = CliRunner().invoke(
        main, ["sweep", str(path), "--set", "radio.loss=2", "--out", str(out)]
    )
    assert invalid.exit_code == 1 and "radio.loss=2" in invalid.output
    assert "must be <= 1.0" in invalid.output and "Traceback" not in invalid.output


def test_the_eta_of_a_resumed_sweep_counts_only_the_runs_of_this_call() -> None:
    """A resumed sweep reports k/n with the runs already done in k; its ETA must come from
    the pace of the runs made now (50 skipped runs took no time)."""
    from sim.cli import _sweep_reporter
    from sim.sweep import Outcome

    now = [0.0]
    lines: list[str] = []
    report = _sweep_reporter(0.0, lines.append, clock=lambda: now[0])
    for k, t in ((51, 100.0), (52, 200.0)):  # 100 s per run, 50 runs were already done
        now[0] = t
        report(Outcome(f"r{k}", k, "protocol.horizon=1", True, wall=100.0), k, 60)
    assert lines[0].startswith("[51/60] protocol.horizon=1 seed 51: 100.0 s")
    assert lines[0].endswith("(ETA 0:15:00)"), lines  # 9 runs to go
    assert lines[1].endswith("(ETA 0:13:20)"), lines  # 8 runs to go


def _run_in_a_terminal(args: list[str], timeout: float) -> str:
    """Run a command with a pseudo-terminal as its stdin, stdout and stderr; its output."""
    import pty
    import select
    import subprocess
    import sys
    import time

    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "dodwan-sim"), *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the command exited and closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
        assert proc.wait(timeout=max(deadline - time.monotonic(), 1)) == 0, out.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return out.decode("utf-8", "replace")


def test_the_issues_command_shows_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """The command as the issue spells it, 3 × 2 settings × 10 seeds, on a real terminal
    (a pty): a bar with runs done / total and an ETA, one line per run, and a second call
    skips all 60 runs."""
    path = small_scenario(tmp_path)
    path.write_text(
        path.read_text()
        .replace("duration = 120.0", "duration = 10.0")
        .replace("count = 12", "count = 3")
    )
    out = tmp_path / "sweep"
    args = ["sweep", str(path), "--set", "protocol.horizon=1,2,3"]
    args += ["--set", "protocol.altruistic=true,false", "--seeds", "10", "--out", str(out)]
    screen = _run_in_a_terminal([*args, "--jobs", "2"], timeout=300)
    assert "6 setting(s) × 10 seed(s) = 60 run(s)" in screen
    assert "\x1b[" in screen  # drawn with terminal control sequences: a live bar
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    bars = re.findall(r"sweep ━+╸?╺?━* (\d+)/60 ETA \d+:\d\d:\d\d", plain)
    assert bars and bars[-1] == "60" and len(set(bars)) > 10, plain[-2000:]
    assert "[60/60] " in screen and "60 run(s) done, 0 already done, 0 failed" in screen
    manifest = json.loads((out / "sweep.json").read_text())
    assert len(manifest["runs"]) == 60
    assert all((out / r["dir"] / MARKER).is_file() for r in manifest["runs"])
    assert {tuple(sorted(r["setting"].items())) for r in manifest["runs"]} == {
        (("protocol.altruistic", a), ("protocol.horizon", h))
        for h in (1, 2, 3)
        for a in (True, False)
    }
    again = _run_in_a_terminal(args, timeout=120)
    assert "0 run(s) done, 60 already done, 0 failed" in again


@pytest.fixture(scope="module")
def spark_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2 settings × 3 seeds sweep run through a real local Spark session (local[2]), and
    the same sweep run by local processes."""
    shared_spark()  # the sweep reuses the test session (local[2]) as its cluster
    base = tmp_path_factory.mktemp("spark-sweep")
    path = small_scenario(base)
    plan = make_plan(path, [("protocol.horizon", [1, 2])], seeds=3)
    local = base / "local"
    run_sweep(plan, str(local), jobs=2)
    spark_out = base / "spark"
    args = ["sweep", str(path), "--set", "protocol.horizon=1,2", "--seeds", "3"]
    args += ["--out", f"file://{spark_out}", "--master", "local[2]"]
    res = CliRunner().invoke(main, args)  # the command a researcher types, with --master
    return {"plan": plan, "local": local, "spark": spark_out, "res": res}


@SPARK_GROUP
def test_spark_sweep_gives_the_same_runs_as_local_processes(spark_sweep: dict[str, Any]) -> None:
    plan, local, spark_out = spark_sweep["plan"], spark_sweep["local"], spark_sweep["spark"]
    res = spark_sweep["res"]
    assert res.exit_code == 0, res.output
    assert "= 6 run(s) into file://" in res.output and "on Spark (local[2])" in res.output
    done = sorted(int(k) for k in re.findall(r"^\[(\d)/6\] ", res.output, re.M))
    assert done == [1, 2, 3, 4, 5, 6]  # one progress line per run, as each task finishes
    assert "6 run(s) done, 0 already done, 0 failed" in res.output
    for r in plan.runs():
        assert (spark_out / r.rel / MARKER).is_file()
        assert tables_of(spark_out / r.rel) == tables_of(local / r.rel)
    # resumable on Spark too
    again = run_sweep(plan, f"file://{spark_out}", master="local[2]")
    assert all(o.skipped for o in again)
    assert os.path.isfile(spark_out / "sweep.json")


def test_one_run_of_a_sweep_is_reported_alone_with_its_scenario_seed_and_setting(
    spark_sweep: dict[str, Any], tmp_path: Path
) -> None:
    """The single-run report keeps working on a run of a sweep, and names its setting."""
    from sim.analysis.cli import analyze

    run = spark_sweep["spark"] / "runs" / "protocol.horizon=2" / "seed-3"
    report = tmp_path / "report"
    res = CliRunner().invoke(analyze, [str(run), "--out", str(report)])
    assert res.exit_code == 0, res.output
    html = (report / "report.html").read_text()
    assert "scenario <b>quickstart</b>; seed 3; settings protocol.horizon=2;" in html
    assert "<th>seed-3</th>" in html and (report / "delivery_over_time.png").is_file()
    assert (
        (report / "seed-3.MessageStatsReport.txt")
        .read_text()
        .startswith("Message stats for scenario quickstart\n")
    )


def test_a_lost_spark_job_is_reported_against_its_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When Spark itself fails a run's job (a lost executor...), the failure names that
    run's setting and seed, and the run is retried by the next call."""
    from spark_fixtures import shared_spark

    import sim.sweep

    shared_spark()  # the sweep reuses the test session (local[2]) as its cluster

    real = sim.sweep.run_one_on_spark

    def flaky(sc: Any, task: Any) -> Any:
        if task.seed == 2:
            raise RuntimeError("executor lost")
        return real(sc, task)

    monkeypatch.setattr(sim.sweep, "run_one_on_spark", flaky)
    path = small_scenario(tmp_path)
    out = tmp_path / "sweep"
    args = ["sweep", str(path), "--seeds", "2", "--out", str(out), "--master", "local[2]"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1, res.output
    assert "1 run(s) done, 0 already done, 1 failed" in res.output
    assert "FAILED (base) seed 2: Spark job failed: " in res.output
    assert "executor lost" in res.output
    monkeypatch.setattr(sim.sweep, "run_one_on_spark", real)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "1 run(s) done, 1 already done, 0 failed" in again.output


T_975_2 = 4.302652729911275
"""Student t quantile for a two-sided 95 % interval with 2 degrees of freedom (tables)."""


@SPARK_GROUP
def test_analyze_sweep_aggregates_mean_and_ci_over_seeds(
    spark_sweep: dict[str, Any], tmp_path: Path
) -> None:
    import csv
    import math

    from sim.analysis.cli import analyze

    report = tmp_path / "report"
    res = CliRunner().invoke(analyze, [str(spark_sweep["spark"]), "--out", str(report)])
    assert res.exit_code == 0, res.output
    assert "6 finished run(s)" in res.output and "mean ± 95 % CI" in res.output
    per_run = json.loads((report / "metrics.json").read_text())
    agg = json.loads((report / "aggregate.json").read_text())
    assert agg["keys"] == ["protocol.horizon"] and agg["seeds"] == [1, 2, 3]
    assert [s["setting"] for s in agg["settings"]] == [
        {"protocol.horizon": 1},
        {"protocol.horizon": 2},
    ]
    checked = 0
    for s in agg["settings"]:
        assert len(s["runs"]) == 3 and s["seeds"] == [1, 2, 3]
        for metric in ("delivery_ratio", "latency_avg", "oracle_delivery_ratio"):
            xs = [per_run[name][metric] for name in s["runs"]]
            mean = sum(xs) / 3
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / 2)
            got = s["metrics"][metric]
            assert got["n"] == 3
            assert got["mean"] == pytest.approx(mean)
            assert got["std"] == pytest.approx(std)
            assert got["ci95"] == pytest.approx(T_975_2 * std / math.sqrt(3))
            assert got["ci95_low"] == pytest.approx(mean - T_975_2 * std / math.sqrt(3))
            checked += std > 0
    assert checked >= 2  # the seeds really differ: the intervals are not all empty
    # nested metrics too, and every row of the CSV
    s0 = agg["settings"][0]
    xs = [per_run[name]["overhead"]["bytes_sent"] for name in s0["runs"]]
    assert s0["metrics"]["overhead.bytes_sent"]["mean"] == pytest.approx(sum(xs) / 3)
    with (report / "sweep_summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    row = next(r for r in rows if r["metric"] == "delivery_ratio" and r["protocol.horizon"] == "2")
    assert float(row["mean"]) == pytest.approx(
        agg["settings"][1]["metrics"]["delivery_ratio"]["mean"]
    )
    html = (report / "report.html").read_text()
    assert "Sweep: quickstart" in html and " ± " in html
    # the table shows the standard deviation next to the mean and the interval
    from sim.analysis.report import fmt

    m = agg["settings"][1]["metrics"]["delivery_ratio"]
    cell = f"{fmt(m['mean'])} ± {fmt(m['ci95'])} (sd {fmt(m['std'])})"
    table = html[html.index("<h2>Sweep: quickstart</h2>") :].split("</table>", 1)[0]
    assert f"<td>{cell}</td>" in table, table
    assert "sd = standard deviation" in html
    notes = html[html.index("</table>", html.index("<h2>Sweep: quickstart</h2>")) :]
    assert "<li>ONE overhead ratio: The ONE&#x27;s (relayed − delivered) / delivered" in notes
    assert "<li>efficiency: delivery ratio ÷ oracle delivery ratio; 1 = " in notes
    assert (report / "sweep_protocol.horizon.png").stat().st_size > 1000
    assert (report / "sweep_protocol.horizon.svg").is_file()
    assert '<figure class=\'wide\'><img src="sweep_protocol.horizon.png" width="1280"' in html
    one = sorted(report.glob("*.MessageStatsReport.txt"))
    assert len(one) == 6


def test_t_quantile_matches_tables() -> None:
    from sim.analysis.aggregate import summarise, t_quantile

    table = {1: 12.7062, 2: 4.3027, 4: 2.7764, 9: 2.2622, 29: 2.0452, 120: 1.9799}
    for df, t in table.items():
        assert t_quantile(0.95, df) == pytest.approx(t, abs=1e-4)
    assert t_quantile(0.99, 4) == pytest.approx(4.6041, abs=1e-4)
    one = summarise([0.5])
    assert one.mean == 0.5 and one.std is None and one.ci is None


def test_sweep_plots_show_the_means_with_the_intervals_as_error_bars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metric vs parameter: a point per value at the mean, error bars of ± the 95 % CI
    half width, one line per value of the other key."""
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure

    from sim.analysis.aggregate import aggregate, summarise
    from sim.analysis.sweep_report import plot_key

    saved: list[Any] = []
    original = Figure.savefig

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    ratios = {
        (1, False): [0.5, 0.7, 0.6],
        (2, False): [0.8, 0.9, 0.95],
        (1, True): [0.9, 0.92, 1.0],
    }
    runs = [
        (
            f"{h}-{a}-{k}",
            {"protocol.horizon": h, "protocol.altruistic": a},
            "",
            k,
            {"delivery_ratio": x},
        )
        for (h, a), xs in ratios.items()
        for k, x in enumerate(xs)
    ]
    keys = ["protocol.horizon", "protocol.altruistic"]
    plot_key("protocol.horizon", keys, aggregate(runs), tmp_path / "sweep_h.png")
    assert (tmp_path / "sweep_h.png").is_file() and (tmp_path / "sweep_h.svg").is_file()
    ax = saved[0].axes[0]
    assert ax.get_title() == "delivery ratio" and ax.get_xlabel() == "protocol.horizon"
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # altruistic=false and altruistic=true
    for bar, altruistic in zip(bars, (False, True), strict=True):
        points = [(h, summarise(xs)) for (h, a), xs in sorted(ratios.items()) if a == altruistic]
        line, _, (segments,) = bar.lines
        assert list(line.get_xdata()) == [h for h, _ in points]
        assert list(line.get_ydata()) == pytest.approx([s.mean for _, s in points])
        for seg, (_, s) in zip(segments.get_segments(), points, strict=True):
            assert [y for _, y in seg] == pytest.approx([s.mean - s.ci, s.mean + s.ci])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]


def test_a_partly_finished_sweep_is_aggregated_over_the_finished_runs_and_says_so(
    tmp_path: Path,
) -> None:
    """Runs without a marker are left out of the aggregate, counted, and named on the page;
    a setting with one finished seed shows its mean without an interval."""
    from sim.analysis.pipeline import RunResult
    from sim.analysis.report import write_report
    from sim.analysis.sweep_report import aggregate_results, missing_text, read_sweep

    out = tmp_path / "sweep"
    plan = make_plan(small_scenario(tmp_path), [("protocol.horizon", [1, 2])], seeds=2)
    run_sweep(plan, str(out), jobs=1)
    unfinished = plan.runs()[3].rel  # horizon 2, seed 2
    (out / unfinished / MARKER).unlink()
    sweep = read_sweep(str(out))
    assert sweep.missing == [unfinished] and len(sweep.runs) == 3
    results = [
        RunResult(r.name, r.path, "run", {"delivery_ratio": 0.5 + 0.1 * i, "sweep": {}})
        for i, r in enumerate(sweep.runs)
    ]
    settings = aggregate_results(sweep, results)
    assert [s.seeds for s in settings] == [[1, 2], [1]]
    report = tmp_path / "report"
    write_report(results, report, sweep=(sweep, settings))
    html = (report / "report.html").read_text()
    assert f"1 run(s) of the sweep have not finished and are left out: {unfinished}." in html
    assert missing_text(sweep.missing) == f"1 not finished (left out): {unfinished}"
    row = html[html.index("<tr><td>2</td>") :].split("</tr>", 1)[0]
    assert "<td>1</td><td>0.7</td>" in row  # one seed: the mean, no interval
    agg = json.loads((report / "aggregate.json").read_text())
    assert agg["missing_runs"] == [unfinished]
    assert agg["settings"][1]["metrics"]["delivery_ratio"]["ci95"] is None


def test_analyze_a_sweep_with_no_finished_run_is_a_clean_error(tmp_path: Path) -> None:
    from sim.analysis.cli import analyze
    from sim.sweep import prepare

    out = tmp_path / "sweep"
    prepare(make_plan(small_scenario(tmp_path), seeds=2), str(out))  # the manifest, no run
    res = CliRunner().invoke(analyze, [str(out), "--out", str(tmp_path / "report")])
    assert res.exit_code == 1, res.output
    assert "no finished run in this sweep (run dodwan-sim sweep first)" in res.output
    assert "Traceback" not in res.output


def test_a_failing_run_is_reported_and_the_others_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setting that validates but fails while it runs (here the simulation raises for
    one setting; a trace naming a host the setting removed used to be the example, but
    validation reads the trace now) does not stop the others."""
    import sim.runner

    real = sim.runner.simulate

    def simulate_or_fail(scenario: Any, *args: Any, **kwargs: Any) -> Any:
        if len(scenario.host_names()) == 2:
            raise RuntimeError("the simulation broke")
        return real(scenario, *args, **kwargs)

    monkeypatch.setattr(sim.runner, "simulate", simulate_or_fail)
    path = small_scenario(tmp_path)
    out = tmp_path / "sweep"
    args = ["sweep", str(path), "--set", "groups.walker.count=4,2", "--out", str(out)]
    args += ["--jobs", "1"]  # in this process, where simulate is patched
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1, res.output
    assert "1 run(s) done, 0 already done, 1 failed" in res.output
    assert "FAILED groups.walker.count=2 seed 1: RuntimeError" in res.output
    assert "the simulation broke" in res.output and "Traceback" not in res.output
    ok, bad = (out / "runs" / f"groups.walker.count={n}" / "seed-1" for n in (4, 2))
    assert (ok / MARKER).is_file() and not (bad / MARKER).exists()
    again = CliRunner().invoke(main, args)  # the failed run is retried, the good one skipped
    assert again.exit_code == 1 and "0 run(s) done, 1 already done, 1 failed" in again.output


def test_a_trace_naming_a_host_a_setting_removes_is_refused_before_any_run(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("0,0,1,up\n5,0,3,up\n")
    path = small_scenario(tmp_path, f'\n[contacts]\ntrace = "{trace}"\n')
    out = tmp_path / "sweep"
    args = ["sweep", str(path), "--set", "groups.walker.count=4,2", "--out", str(out)]
    res = CliRunner().invoke(main, [*args, "--jobs", "1"])
    assert res.exit_code == 1, res.output
    assert "1 setting(s) are not valid" in res.output and "groups.walker.count=2" in res.output
    assert "t.csv:2: trace host '3' is not a scenario host" in res.output
    assert not (out / "runs").exists() and "Traceback" not in res.output


@pytest.mark.parametrize(
    "spoil",
    [
        lambda m: m["runs"][0].pop("seed"),
        lambda m: m["runs"][0].pop("dir"),
        lambda m: m["runs"][0].update(setting=[1, 2]),
        lambda m: m.update(runs={"a": 1}),
        lambda m: m.update(runs=[5]),
    ],
)
def test_a_damaged_sweep_manifest_is_one_clean_error(tmp_path: Path, spoil: Any) -> None:
    """A sweep.json whose run entries lack a field (edited by hand, cut short) is refused
    in one line naming the file, not with a KeyError traceback."""
    from sim.analysis.errors import AnalysisError
    from sim.analysis.sweep_report import read_sweep

    out = tmp_path / "sweep"
    run_sweep(make_plan(small_scenario(tmp_path), [("protocol.horizon", [1])], seeds=1), str(out), jobs=1)  # fmt: skip
    manifest = json.loads((out / MANIFEST).read_text())
    spoil(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(AnalysisError, match="not a usable sweep manifest"):
        read_sweep(str(out))


# --------------------------------------------------------------------------- input files

TRACE_EVENTS = """\
name = "ev"
seed = 1
duration = 60.0
[world]
width = 100.0
height = 100.0
[radio]
range = 10.0
[contacts]
trace = "tr.txt"
[[groups]]
name = "p"
count = 3
[[traffic.external]]
file = "ev.txt"
ttl = 50.0
"""
ON_A_MAP = """\
name = "m"
seed = 1
duration = 60.0
[world]
width = 300.0
height = 200.0
[radio]
range = 10.0
[map]
roads = "roads.wkt"
[[groups]]
name = "w"
count = 2
mobility = { model = "map", speed = [1.0, 2.0] }
[[groups]]
name = "t"
count = 1
mobility = { model = "map_route", stops = "tram.wkt", speed = [5.0, 5.0] }
"""


def scenario_with_files(folder: Path, kind: str) -> Path:
    """A scenario that reads a contact trace and an events file, or a map and its stops."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "trace":
        (folder / "tr.txt").write_text("0 CONN 0 1 up\n20 CONN 0 1 down\n30 CONN 1 2 up\n")
        (folder / "ev.txt").write_text("5 C M1 0 1 100\n35 C M2 2 0 100\n")
        text = TRACE_EVENTS
    else:
        (folder / "roads.wkt").write_text("LINESTRING (0 0, 200 0, 200 100)\n")
        (folder / "tram.wkt").write_text("LINESTRING (0 0, 200 0)\n")
        text = ON_A_MAP
    path = folder / "s.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("kind", "name", "key", "edit"),
    [
        ("trace", "tr.txt", "contacts.trace", "40 CONN 0 2 up\n"),
        ("trace", "ev.txt", r"traffic.external\[0\].file", "45 C M3 1 2 100\n"),
        ("map", "roads.wkt", "map.roads", "LINESTRING (200 100, 0 100)\n"),
        ("map", "tram.wkt", r"groups\[1\].mobility.stops", "LINESTRING (200 100)\n"),
    ],
)
def test_a_sweep_folder_refuses_runs_of_an_edited_input_file(
    tmp_path: Path, kind: str, name: str, key: str, edit: str
) -> None:
    """A run depends on the files its scenario names as much as on the scenario: resuming
    a sweep after one of them changed would mix runs of two inputs under one setting."""
    from sim.sweep import prepare

    path = scenario_with_files(tmp_path / "sc", kind)
    out = str(tmp_path / "sweep")
    _, todo, _ = prepare(make_plan(path, seeds=1), out)
    assert len(todo) == 1
    _, todo, done = prepare(make_plan(path, seeds=2), out)  # unchanged: resumes
    assert len(todo) == 2 and not done
    with (tmp_path / "sc" / name).open("a") as f:
        f.write(edit)
    with pytest.raises(SweepError, match=rf"{re.escape(name)} \({key}\) changed since"):
        prepare(make_plan(path, seeds=2), out)
    manifest = json.loads((tmp_path / "sweep" / MANIFEST).read_text())
    assert name in {i["file"] for i in manifest["inputs"]}


def test_an_edited_contact_trace_stops_the_sweep_command(tmp_path: Path) -> None:
    """The reproduction: `sweep` of a trace scenario, edit the trace, `sweep` with one more
    seed: refused, naming the trace, and no run is made from the edited file."""
    path = scenario_with_files(tmp_path / "sc", "trace")
    out = tmp_path / "sweep"
    args = ["sweep", str(path), "--set", "protocol.horizon=1", "--out", str(out), "--quiet"]
    first = CliRunner().invoke(main, [*args, "--seeds", "1"])
    assert first.exit_code == 0, first.output
    with (tmp_path / "sc" / "tr.txt").open("a") as f:
        f.write("40 CONN 0 2 up\n")
    second = CliRunner().invoke(main, [*args, "--seeds", "2"])
    assert second.exit_code != 0
    assert "tr.txt (contacts.trace) changed since the runs in" in second.output
    assert not (out / "runs" / "protocol.horizon=1" / "seed-2").exists()


def test_a_file_only_some_setting_reads_is_checked_after_other_settings_ran(
    tmp_path: Path,
) -> None:
    """Sweeping the trace itself: a later call without the first trace keeps its digest in
    sweep.json, so that trace edited and swept again is still refused."""
    from sim.sweep import prepare

    path = scenario_with_files(tmp_path / "sc", "trace")
    (tmp_path / "sc" / "tr2.txt").write_text("0 CONN 1 2 up\n")
    out = str(tmp_path / "sweep")
    prepare(make_plan(path, [("contacts.trace", ["tr.txt"])], seeds=1), out)
    prepare(make_plan(path, [("contacts.trace", ["tr2.txt"])], seeds=1), out)
    (tmp_path / "sc" / "tr.txt").write_text("0 CONN 0 2 up\n")
    with pytest.raises(SweepError, match=r"tr\.txt \(contacts\.trace\) changed"):
        prepare(make_plan(path, [("contacts.trace", ["tr.txt", "tr2.txt"])], seeds=1), out)


def test_a_sweep_folder_made_before_input_digests(tmp_path: Path) -> None:
    """sweep.json without "inputs": refused when the scenario reads files (nothing says
    whether they changed), accepted when it reads none (its runs digest covers it all); a
    copy of the scenario and its files elsewhere resumes its own folder."""
    from sim.sweep import prepare

    path = scenario_with_files(tmp_path / "sc", "trace")
    out = tmp_path / "sweep"
    prepare(make_plan(path, seeds=1), str(out))
    moved = scenario_with_files(tmp_path / "copy", "trace")
    _, todo, _ = prepare(make_plan(moved, seeds=1), str(out))
    assert len(todo) == 1
    manifest = json.loads((out / MANIFEST).read_text())
    del manifest["inputs"]
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(SweepError, match="made before sweeps recorded the digests"):
        prepare(make_plan(path, seeds=1), str(out))
    plain, plain_out = small_scenario(tmp_path), tmp_path / "plain"
    prepare(make_plan(plain, seeds=1), str(plain_out))
    manifest = json.loads((plain_out / MANIFEST).read_text())
    assert manifest["inputs"] == []
    del manifest["inputs"]
    (plain_out / MANIFEST).write_text(json.dumps(manifest))
    _, todo, _ = prepare(make_plan(plain, seeds=2), str(plain_out))
    assert len(todo) == 2
