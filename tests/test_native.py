"""The core compiled with mypyc (``dodwan/native``): used only when built from the sources
at hand, and giving the same runs as the pure Python core."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_sim_golden import digest

import dodwan.core.node
import sim.host
import sim.logs
import sim.medium
from dodwan import native
from sim.runner import simulate
from sim.scenario import load

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _fake_build(tmp: Path) -> tuple[Path, Path]:
    """A core of two modules and a 'build' of them (empty files in the right places); the
    tests pass ``sim=None``: no simulator modules in these fake builds."""
    core, build = tmp / "core", tmp / "build"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "a.py").write_text("A = 1\n")
    (core / "b.py").write_text("B = 2\n")
    (build / "dodwan" / "core").mkdir(parents=True)
    for name in ("a", "b"):
        (build / "dodwan" / "core" / f"{name}{SUFFIX}").write_bytes(b"")
    (build / f"0123__mypyc{SUFFIX}").write_bytes(b"")
    manifest = {
        "suffix": SUFFIX,
        "sources": {
            f"dodwan.core.{n}": hashlib.sha256((core / f"{n}.py").read_bytes()).hexdigest()
            for n in ("a", "b")
        },
        "groups": ["0123__mypyc"],
    }
    (build / "manifest.json").write_text(json.dumps(manifest))
    return core, build


def test_a_build_of_these_very_sources_is_used(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(native.ENV, raising=False)
    core, build = _fake_build(tmp_path)
    modules, why = native.status(build, core, None)
    assert modules == {
        "dodwan.core.a": build / "dodwan" / "core" / f"a{SUFFIX}",
        "dodwan.core.b": build / "dodwan" / "core" / f"b{SUFFIX}",
        "0123__mypyc": build / f"0123__mypyc{SUFFIX}",
    }
    assert "2 modules" in why


def test_the_simulators_per_datagram_modules_are_built_with_the_core(
    tmp_path: Path, monkeypatch
) -> None:
    """``sim=`` adds :data:`native.SIM_MODULES`: an edit to one of them makes the build
    stale like an edit to the core (then everything runs pure Python)."""
    monkeypatch.delenv(native.ENV, raising=False)
    assert set(native.sources()) >= {"sim.medium", "sim.host", "sim.logs", "dodwan.core.node"}
    core, build = _fake_build(tmp_path)
    sim = tmp_path / "sim"
    sim.mkdir()
    for name in native.SIM_MODULES:
        (sim / f"{name}.py").write_text(f"NAME = {name!r}\n")
    modules, why = native.status(build, core, sim)
    assert modules is None and why.endswith("sim.host, sim.logs, sim.medium")
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["sources"].update(native.digests(native.sources(core, sim)))
    (build / "manifest.json").write_text(json.dumps(manifest))
    (build / "sim").mkdir()
    for name in native.SIM_MODULES:
        (build / "sim" / f"{name}{SUFFIX}").write_bytes(b"")
    modules, why = native.status(build, core, sim)
    assert modules is not None and modules["sim.medium"] == build / "sim" / f"medium{SUFFIX}"
    (sim / "logs.py").write_text("NAME = 'edited'\n")
    modules, why = native.status(build, core, sim)
    assert modules is None and why.endswith("changed since the native build: sim.logs")


def test_a_stale_build_is_never_used(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(native.ENV, raising=False)
    core, build = _fake_build(tmp_path)
    (core / "a.py").write_text("A = 3\n")  # edited after the build
    modules, why = native.status(build, core, None)
    assert modules is None and why.endswith("changed since the native build: dodwan.core.a")

    core, build = _fake_build(tmp_path / "added")
    (core / "c.py").write_text("C = 1\n")  # a module the build does not have
    modules, why = native.status(build, core, None)
    assert modules is None and "dodwan.core.c" in why

    core, build = _fake_build(tmp_path / "removed")
    (core / "b.py").unlink()
    modules, why = native.status(build, core, None)
    assert modules is None and "dodwan.core.b" in why


def test_a_build_for_another_interpreter_or_an_incomplete_one_is_not_used(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.delenv(native.ENV, raising=False)
    core, build = _fake_build(tmp_path)
    manifest = json.loads((build / "manifest.json").read_text())
    (build / "manifest.json").write_text(json.dumps({**manifest, "suffix": ".cpython-39.so"}))
    modules, why = native.status(build, core, None)
    assert modules is None and "built for .cpython-39.so" in why

    core, build = _fake_build(tmp_path / "incomplete")
    (build / "dodwan" / "core" / f"b{SUFFIX}").unlink()
    modules, why = native.status(build, core, None)
    assert modules is None and "missing" in why and f"b{SUFFIX}" in why

    core, build = _fake_build(tmp_path / "garbled")
    (build / "manifest.json").write_text("{not json")
    modules, why = native.status(build, core, None)
    assert modules is None and "unreadable manifest" in why

    modules, why = native.status(tmp_path / "nowhere", core, None)
    assert modules is None and "no native build" in why


def test_dodwan_native_0_runs_pure_python(tmp_path: Path, monkeypatch) -> None:
    core, build = _fake_build(tmp_path)
    monkeypatch.setenv(native.ENV, "0")
    assert native.status(build, core, None) == (None, "DODWAN_NATIVE=0")
    code = "import dodwan.core.node as n; from dodwan import native; print(n.__file__, native.describe())"
    env = {**os.environ, native.ENV: "0"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split()[0].endswith("node.py")
    assert "pure Python core: DODWAN_NATIVE=0" in done.stdout


def test_this_suite_runs_the_compiled_core_when_it_is_built() -> None:
    """``make test`` builds it first: there (and in CI), the suite must exercise the
    compiled core. Elsewhere, a missing or stale build (a core module edited since) only
    means the pure Python core runs, which the other tests then check."""
    if os.environ.get(native.ENV) == "0":
        pytest.skip("DODWAN_NATIVE=0: this run checks the pure Python core")
    usable, why = native.status()
    if usable is None and not os.environ.get("CI"):
        pytest.skip(f"{why}; `make setup` builds it")
    assert native.active(), native.describe()
    assert dodwan.core.node.__file__.endswith(SUFFIX)
    for module in (sim.medium, sim.host, sim.logs):
        assert module.__file__ is not None and module.__file__.endswith(SUFFIX), module
    assert "compiled core" in native.describe()


def test_pure_python_and_compiled_cores_give_the_same_run(tmp_path: Path) -> None:
    if not native.active():
        pytest.skip("nothing to compare: " + native.describe())
    scenario = ROOT / "scenarios" / "trace.toml"
    simulate(load(scenario), tmp_path / "compiled", until=1800.0)
    code = (
        "import sys; from pathlib import Path; from sim.runner import simulate; "
        "from sim.scenario import load; "
        f"simulate(load(Path({str(scenario)!r})), Path(sys.argv[1]), until=1800.0)"
    )
    env = {**os.environ, native.ENV: "0"}
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "python")], env=env, cwd=ROOT, check=True
    )
    runs = {
        name: json.loads((tmp_path / name / "run.json").read_text())
        for name in ("compiled", "python")
    }
    assert runs["compiled"]["core"] == "compiled" and runs["python"]["core"] == "python"
    assert runs["compiled"]["counters"]["sim_deliveries"] > 0
    assert digest(tmp_path / "compiled") == digest(tmp_path / "python")


def test_a_failed_build_says_so_and_keeps_the_previous_one(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "native"
    out.mkdir()
    (out / native.MANIFEST).write_text("{}")  # the previous build
    monkeypatch.setattr(native, "_SETUP", "import sys; print('no compiler'); sys.exit(3)")
    with pytest.raises(RuntimeError, match=r"mypyc failed \(exit 3\)\nno compiler"):
        native.build(out)
    assert (out / native.MANIFEST).read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["native"]  # no work files left behind


def test_a_simulation_on_the_pure_python_core_says_why(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from sim.cli import main

    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setattr(native, "_active", None)
    monkeypatch.setattr(
        native, "_reason", "sources changed since the native build: dodwan.core.bits"
    )
    args = ["run", str(ROOT / "scenarios" / "quickstart.toml"), "--until", "30", "--quiet"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(
        "note: pure Python core: sources changed since the native build: dodwan.core.bits"
    )
    assert "quickstart: 12 hosts" in result.stdout and "note:" not in result.stdout

    monkeypatch.setenv(native.ENV, "0")  # asked for: nothing to say
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")])
    assert result.exit_code == 0 and result.stderr == ""
