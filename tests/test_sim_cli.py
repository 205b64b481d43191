"""The dodwan-sim command line: help everywhere, validate, scenarios, run, clean errors."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from ptyrun import run_in_pty

from sim.cli import main
from sim.logs import SCHEMAS

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@pytest.mark.parametrize("command", [[], ["run"], ["validate"], ["scenarios"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_validate_ok_and_bad(tmp_path: Path) -> None:
    ok = CliRunner().invoke(main, ["validate", str(SCENARIOS / "islands.toml")])
    assert ok.exit_code == 0 and "OK: islands: 34 hosts" in ok.output
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\nduration = -5\nspeed = 3\n[world]\nwidth = 10\n')
    res = CliRunner().invoke(main, ["validate", str(bad)])
    assert res.exit_code == 1
    assert "line 2: duration: must be > 0" in res.output
    assert "line 3: speed: unknown key" in res.output
    assert "world.height: is required" in res.output
    assert "Traceback" not in res.output


def test_scenarios_lists_what_ships() -> None:
    res = CliRunner().invoke(main, ["scenarios"])
    assert res.exit_code == 0
    for f in SCENARIOS.glob("*.toml"):
        assert f.name in res.output
    assert "INVALID" not in res.output


def test_run_writes_tables_and_run_json(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main,
        ["run", str(SCENARIOS / "quickstart.toml"), "--out", str(out), "--until", "120",
         "--seed", "9", "--quiet"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "quickstart: 12 hosts" in res.output
    run = json.loads((out / "run.json").read_text())
    assert run["seed"] == 9 and run["until"] == 120.0
    assert run["complete"] is True
    for name in ("contacts", "messages", "targets", "datagrams", "cache", "hosts"):
        assert list((out / f"{name}.parquet").glob("part-*.parquet")), name


def test_progress_lines_are_printed_when_not_on_a_terminal(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        ["run", str(SCENARIOS / "quickstart.toml"), "--out", str(tmp_path / "o"),
         "--until", "300", "--progress", "0.000001"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("quickstart: sim ")]
    assert len(lines) >= 2
    assert "0:05:00 / 0:05:00 (100.0 %)" in lines[-1]
    assert "events/s" in lines[-1] and "ETA" in lines[-1] and "peak RSS" in lines[-1]


def test_run_with_contacts_option(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time,a,b,up\n0,walker-0,walker-3,up\n")
    out = tmp_path / "o"
    res = CliRunner().invoke(
        main,
        ["run", str(SCENARIOS / "quickstart.toml"), "--out", str(out), "--until", "30",
         "--contacts", str(trace), "--quiet"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads((out / "run.json").read_text())["contacts_trace"] == str(trace)


def test_run_errors_are_one_clean_message(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = CliRunner().invoke(
        main,
        ["run", str(SCENARIOS / "quickstart.toml"), "--out", str(blocker / "o"),
         "--until", "5", "--quiet"],
    )  # fmt: skip
    assert res.exit_code == 1
    assert "Error: cannot write the logs into " in res.output
    assert "Traceback" not in res.output
    trace = tmp_path / "bad.txt"
    trace.write_text("0 CONN 0 99 up\n")
    res = CliRunner().invoke(
        main,
        ["run", str(SCENARIOS / "quickstart.toml"), "--out", str(tmp_path / "p"),
         "--contacts", str(trace), "--quiet"],
    )  # fmt: skip
    assert res.exit_code == 1 and "'99'" in res.output


def test_contacts_writes_the_mobility_trace_that_replays_the_same_contacts(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    trace = tmp_path / "qs.one.txt.gz"
    res = CliRunner().invoke(
        main,
        ["contacts", str(SCENARIOS / "quickstart.toml"), "--out", str(trace), "--until", "300"],
    )
    assert res.exit_code == 0, res.output
    assert "contacts among 12 hosts" in res.output
    live, replay = tmp_path / "live", tmp_path / "replay"
    for out, extra in ((live, []), (replay, ["--contacts", str(trace)])):
        args = ["run", str(SCENARIOS / "quickstart.toml"), "--out", str(out), "--until", "300"]
        res = CliRunner().invoke(main, [*args, "--quiet", *extra])
        assert res.exit_code == 0, res.output
    rows = [pq.read_table(d / "contacts.parquet").to_pylist() for d in (live, replay)]
    assert rows[0] and rows[0] == rows[1]


def _started(out: Path, proc: subprocess.Popen[bytes], deadline: float = 120.0) -> float:
    """Wait until the run in ``proc`` has written a checkpoint; the time it reached."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        with contextlib.suppress(OSError, ValueError, KeyError):
            reached = float(json.loads((out / "run.json").read_text())["reached"])
            if reached > 0:
                return reached
        time.sleep(0.05)  # polling a file another process writes: no event to wait on
    raise AssertionError("no checkpoint within the deadline")


def _long_run(out: Path) -> subprocess.Popen[bytes]:
    """The 12-hour ONE benchmark scenario: far longer than the test waits for."""
    return subprocess.Popen(
        [sys.executable, "-m", "sim.cli", "run", str(SCENARIOS / "one_default_trace.toml"),
         "--out", str(out), "--quiet", "--checkpoint", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _kept(out: Path) -> dict[str, pa.Table]:
    """Every table of a run folder, read as pyarrow (and so Spark) reads it."""
    tables = {name: pq.read_table(out / f"{name}.parquet") for name in SCHEMAS}
    for name, t in tables.items():
        assert t.schema.remove_metadata() == SCHEMAS[name], name
    return tables


def test_a_run_killed_with_sigkill_keeps_every_table_up_to_its_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    proc = _long_run(out)
    try:
        reached = _started(out, proc)
    finally:
        proc.kill()
        proc.wait()
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] is False and run["reached"] >= reached > 0
    tables = _kept(out)
    assert tables["hosts"].num_rows == 126
    assert tables["contacts"].num_rows > 0 and tables["datagrams"].num_rows > 0
    times = tables["messages"].column("time").to_pylist()
    assert times and max(times) <= run["reached"] and times == sorted(times)


def test_a_run_stopped_by_sigterm_writes_what_it_recorded_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "stopped"
    proc = _long_run(out)
    try:
        _started(out, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert b"stopped at " in err and b"Traceback" not in err
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] is False and run["reached"] > 0
    tables = _kept(out)
    sent = pc.sum(tables["datagrams"].column("count")).as_py()
    assert sent > 0 and max(tables["messages"].column("time").to_pylist()) <= run["reached"]


def test_a_run_refused_at_start_leaves_the_previous_logs_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [
        "run",
        str(SCENARIOS / "quickstart.toml"),
        "--out",
        str(out),
        "--until",
        "60",
        "--quiet",
    ]
    assert CliRunner().invoke(main, args).exit_code == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    bad = tmp_path / "unknown.one.txt"
    bad.write_text("10 CONN 0 99 up\n")  # host 99: the scenario has 12
    res = CliRunner().invoke(main, [*args, "--contacts", str(bad)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert json.loads((out / "run.json").read_text())["complete"] is True


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "infinity"])
@pytest.mark.parametrize(
    "args",
    [
        ["run", "--quiet", "--until"],
        ["run", "--quiet", "--until", "10", "--progress"],
        ["contacts", "--until"],
    ],
)
def test_float_options_refuse_non_finite_values(
    tmp_path: Path, args: list[str], value: str
) -> None:
    # --until nan/inf was accepted: the run never ended, and run.json held NaN (not JSON)
    command = [args[0], str(SCENARIOS / "quickstart.toml"), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(main, [*command, *args[1:], value])
    assert res.exit_code == 2, res.output
    assert "finite" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("1e300", "315360000"),  # MAX_DURATION, as the scenario's duration
        ("٣", "ASCII digits"),  # float() reads 3
        ("1_0", "ASCII digits"),  # float() reads 10
    ],
)
@pytest.mark.parametrize("command", ["run", "contacts"])
def test_until_is_bounded_and_written_with_ascii_digits(
    tmp_path: Path, command: str, value: str, needle: str
) -> None:
    args = [command, str(SCENARIOS / "quickstart.toml"), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(main, [*args, "--until", value])
    assert res.exit_code == 2 and needle in res.output, res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["٣", "1_0", "+3 "])
def test_seed_is_written_with_ascii_digits(tmp_path: Path, value: str) -> None:
    args = ["run", str(SCENARIOS / "quickstart.toml"), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(main, [*args, "--seed", value])
    assert res.exit_code == 2 and "ASCII digits" in res.output, res.output
    assert not (tmp_path / "o").exists()


def test_contacts_refuses_a_scenario_that_replays_a_trace(tmp_path: Path) -> None:
    # it used to write the contacts of random default positions, not the scenario's trace
    out = tmp_path / "c.one.txt"
    res = CliRunner().invoke(main, ["contacts", str(SCENARIOS / "trace.toml"), "--out", str(out)])
    assert res.exit_code == 1, res.output
    assert "replays the contact trace" in res.output and "walkers16.one.txt" in res.output
    assert not out.exists()


def test_a_scenario_file_that_is_not_utf8_is_a_clean_error(tmp_path: Path) -> None:
    # a Latin-1 comment made validate, run, sweep and scenarios --dir print a traceback
    f = tmp_path / "latin1.toml"
    text = (SCENARIOS / "quickstart.toml").read_text()
    f.write_bytes("# scénario\n".encode("latin-1") + text.encode())
    for args in (
        ["validate", str(f)],
        ["run", str(f), "--out", str(tmp_path / "o"), "--quiet"],
        ["sweep", str(f), "--out", str(tmp_path / "s"), "--quiet"],
    ):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 1, (args, res.output)
        assert "not UTF-8" in res.output and "line 1" in res.output, (args, res.output)
        assert not isinstance(res.exception, UnicodeDecodeError)
    res = CliRunner().invoke(main, ["scenarios", "--dir", str(tmp_path)])
    assert res.exit_code == 0 and "latin1.toml" in res.output and "INVALID" in res.output


def test_sweep_into_a_path_that_is_a_file_is_a_clean_error(tmp_path: Path) -> None:
    notadir = tmp_path / "notadir"
    notadir.write_text("x")
    res = CliRunner().invoke(
        main, ["sweep", str(SCENARIOS / "quickstart.toml"), "--out", str(notadir), "--quiet"]
    )
    assert res.exit_code == 1, res.output
    assert "is a file, not a folder" in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert notadir.read_text() == "x"


def test_validate_checks_an_inline_sweep_table(tmp_path: Path) -> None:
    # only a "[sweep" header used to make validate check the sweep
    f = tmp_path / "s.toml"
    text = (SCENARIOS / "quickstart.toml").read_text()
    f.write_text('sweep = { set = { "protocol.horizon" = [0, 99] } }\n' + text)
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 1, res.output
    assert "horizon" in res.output


# A scenario file may come from anyone: its name and description reach the terminal.
# (TOML escapes: the file itself stays printable.) "[/x]" is rich markup that matches no
# open tag: the progress bar on a terminal read the name as markup and died of it.
EVIL_TOML = "q\\u001b]0;pwned\\u0007[/x]\\u009b7m\\u202eZ"
EVIL_SHOWN = "q\\x1b]0;pwned\\x07[/x]\\x9b7m\\u202eZ"


def _evil_scenario(folder: Path, extra: str = "") -> Path:
    text = (SCENARIOS / "quickstart.toml").read_text()
    text = text.replace('name = "quickstart"', f'name = "{EVIL_TOML}"', 1)
    text = text.replace("description = ", f'description = "d{EVIL_TOML}" # ', 1)
    text = text.replace("duration = 600.0", "duration = 60.0", 1)
    f = folder / "evil.toml"
    f.write_text(extra + text)
    return f


def _no_raw(text: str) -> None:
    for raw in ("\x1b]0;pwned", "\x07", "\x9b", "\u202e"):
        assert raw not in text, (raw, text)


def test_scenario_names_descriptions_and_keys_are_escaped(tmp_path: Path) -> None:
    f = _evil_scenario(tmp_path)
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 0 and res.output.startswith(f"OK: {EVIL_SHOWN}: 12 hosts"), res.output
    res = CliRunner().invoke(main, ["scenarios", "--dir", str(tmp_path)])
    assert res.exit_code == 0 and f"  d{EVIL_SHOWN}\n" in res.output, res.output
    _no_raw(res.output)
    res = CliRunner().invoke(main, ["run", str(f), "--out", str(tmp_path / "o"), "--quiet"])
    assert res.exit_code == 0 and f"\n{EVIL_SHOWN}: 12 hosts" in f"\n{res.output}", res.output
    _no_raw(res.output)
    # an unknown key: its name is escaped, and one problem stays one line
    bad = tmp_path / "bad" / "bad.toml"
    bad.parent.mkdir()
    bad.write_text('"k\\u001b]0;pwned\\u0007\\nline 9: fake" = 1\n' + f.read_text())
    for args in (["validate", str(bad)], ["run", str(bad), "--out", str(tmp_path / "b")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 1, res.output
        _no_raw(res.output)
        problems = [x for x in res.output.splitlines() if x.startswith("  line ")]
        assert len(problems) == 1, res.output
        assert re.fullmatch(
            r"  line 1: k\\x1b\]0;pwned\\x07\\x0aline 9: fake: unknown key \(allowed: .*\)",
            problems[0],
        ), problems
    res = CliRunner().invoke(main, ["scenarios", "--dir", str(bad.parent)])
    assert res.exit_code == 0 and "bad.toml" in res.output and "INVALID" in res.output


def test_run_on_a_terminal_shows_a_scenario_name_with_markup_as_text(tmp_path: Path) -> None:
    f = _evil_scenario(tmp_path)
    rc, raw = run_in_pty(
        [sys.executable, "-m", "sim.cli", "run", str(f), "--out", str(tmp_path / "o")],
        timeout=120,
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    assert rc == 0 and "MarkupError" not in raw, raw
    _no_raw(raw)
    assert f"{EVIL_SHOWN}: 12 hosts" in raw, raw


@pytest.mark.parametrize(
    "args",
    [
        ["run", str(SCENARIOS / "quickstart.toml"), "--until", "10"],
        ["sweep", str(SCENARIOS / "quickstart.toml"), "--set", "protocol.horizon=1"],
        ["contacts", str(SCENARIOS / "quickstart.toml"), "--until", "10"],
        ["analyze", "somewhere"],
    ],
    ids=lambda a: a[0],
)
def test_an_empty_out_is_refused_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """``--out ''`` was taken as the current folder: a run wrote its tables there (after
    removing an earlier run's), a sweep its runs/ and sweep.json."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, [*args, "--out", ""])
    assert res.exit_code == 2 and "'--out': is empty" in res.output, res.output
    assert list(tmp_path.iterdir()) == []
