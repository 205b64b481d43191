"""bench/bench_sim.py --workload one: a one-minute run keeps the benchmark from rotting, and
PONS gets exactly our contacts and messages (the longer runs are in docs/performance.md)."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sim.runner import Simulation
from sim.scenario import load
from sim.traffic import as_events, schedule

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_one  # noqa: E402


def test_one_workload_runs_both_variants_and_prints_their_figures() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_sim.py"), "--workload", "one",
         "--until", "60", "--skip-pons", "--profile-until", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = r.stdout
    sc = load(bench_one.TRACE_SCENARIO)
    published = len(schedule(sc, sc.host_names(), 60.0))
    assert published > 0
    blocks = out.split("== dodwan-sim, ")[1:]
    assert [b.splitlines()[0] for b in blocks] == [
        "altruistic, 0.5-1 MB: 126 hosts, 60 simulated s",
        "not altruistic, 0.5-1 MB: 126 hosts, 60 simulated s",
    ]
    for b in blocks:
        for label in ("wall time", "cpu time", "host-seconds / s", "peak RSS", "datagrams sent"):
            assert re.search(rf"^{label} +[\d,.]+ ", b, re.M), (label, b)
        rss = float(re.search(r"^peak RSS +([\d.]+) MB", b, re.M).group(1))  # type: ignore[union-attr]
        assert 20 < rss < 1536
        assert re.search(rf"^messages +{published} published, \d+ delivered", b, re.M), b
    assert "not judged, this run covers 0.02 h" in blocks[0]
    assert "goal" not in blocks[1]
    assert "PONS" not in out


def test_max_datagram_reaches_our_runs_and_is_checked() -> None:
    sc = bench_one.variant(load(bench_one.TRACE_SCENARIO), True, "mb", 16384)
    assert sc.radio.max_datagram == 16384
    assert bench_one.variant(sc, True, "mb").radio.max_datagram == 16384  # kept when not given
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_sim.py"), "--workload", "one",
         "--until", "1", "--skip-pons", "--profile-until", "0", "--max-datagram", "100"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "--max-datagram must be between 256 and 65507" in r.stderr


def test_request_window_reaches_every_group_and_is_checked() -> None:
    base = load(bench_one.TRACE_SCENARIO)
    assert {g.protocol.settings["request_window"] for g in base.groups} == {64}
    sc = bench_one.variant(base, True, "mb", 8192, 11)
    assert sc.groups and all(g.protocol.settings["request_window"] == 11 for g in sc.groups)
    assert all(g.protocol.settings["altruistic"] is True for g in sc.groups)
    sim = Simulation(sc, until=1.0)  # what the hosts' nodes are given
    assert {h.node.config.request_window for h in sim.hosts} == {11}
    assert {h.node.config.max_datagram for h in sim.hosts} == {8192}
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_sim.py"), "--workload", "one",
         "--until", "1", "--skip-pons", "--profile-until", "0", "--request-window", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "--request-window must be at least 1 fragment" in r.stderr


def test_pons_gets_the_trace_contacts_and_our_messages(tmp_path: Path) -> None:
    trace = tmp_path / "t.one.txt.gz"
    with gzip.open(trace, "wt") as f:
        f.write(
            "0.0 CONN 3 1 up\n2.5 CONN 1 3 down\n4.0 CONN 0 2 up\n"
            "7.2 CONN 1 2 up\n9.0 CONN 1 2 down\n12.0 CONN 0 1 up\n"
        )
    # Pairs either way round, start rounded down, end up; links still up close at
    # `until`; nothing from `until` on.
    assert bench_one.one_contacts(trace, 10.0) == [(0, 3, 1, 3), (4, 10, 0, 2), (7, 9, 1, 2)]

    sc = bench_one.variant(load(bench_one.TRACE_SCENARIO), True, "mb")
    cfg = bench_one.pons_config(sc, 600.0)
    assert cfg["hosts"] == 126 and cfg["cache"] == 5_000_000 and cfg["ttl"] == 18000
    assert cfg["rate"] == 250_000
    assert cfg["contacts"] == bench_one.one_contacts(sc.contacts.path, 600.0)  # type: ignore[union-attr]
    assert len(cfg["contacts"]) > 100
    assert cfg["messages"] == as_events(sc, schedule(sc, sc.host_names(), 600.0))
    assert all(500_000 <= m[4] <= 1_000_000 for m in cfg["messages"])
    small = bench_one.pons_config(bench_one.variant(sc, True, "1k"), 600.0)
    assert {m[4] for m in small["messages"]} == {1000}
    assert cfg["router"] == "epidemic"
    assert bench_one.pons_config(sc, 600.0, "spray")["router"] == "spray"
    with pytest.raises(ValueError, match="unknown PONS router 'maxprop'"):
        bench_one.pons_config(sc, 600.0, "maxprop")
    assert cfg["radio"] == "parallel"
    assert bench_one.pons_config(sc, 600.0, radio="serial")["radio"] == "serial"
    with pytest.raises(ValueError, match="unknown PONS radio 'duplex'"):
        bench_one.pons_config(sc, 600.0, radio="duplex")


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--pons-router", "maxprop", "--pons-router: unknown 'maxprop' (one of epidemic, spray)"),
        ("--pons-radio", "duplex", "--pons-radio: unknown 'duplex' (one of parallel, serial)"),
    ],
)
def test_unknown_pons_router_or_radio_is_a_usage_error(option: str, value: str, says: str) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_sim.py"), "--workload", "one",
         "--until", "1", option, value],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert says in r.stderr


def test_variants_change_only_altruism_and_size() -> None:
    sc = load(bench_one.TRACE_SCENARIO)
    selfish = bench_one.variant(sc, False, "1k")
    assert all(g.protocol.altruistic for g in sc.groups)
    assert not any(g.protocol.altruistic for g in selfish.groups)
    assert [g.protocol.cache_capacity for g in selfish.groups] == [5_000_000] * 6
    assert selfish.generate[0].size == (1000, 1000) and sc.generate[0].size == (500_000, 1_000_000)
    assert selfish.contacts == sc.contacts and selfish.host_names() == sc.host_names()


def test_pons_runs_five_minutes_of_the_workload() -> None:
    pytest.importorskip(
        "pons", reason="PONS (pons-dtn, in the test and bench extras) is not installed"
    )
    sc = bench_one.variant(load(bench_one.TRACE_SCENARIO), True, "mb")
    received = {}
    for router in bench_one.PONS_ROUTERS:
        for radio in bench_one.PONS_RADIOS:
            res = bench_one.run_pons(sc, 600.0, 300, router, radio)
            assert isinstance(res, dict), (router, radio, res)
            assert res["until"] == 600 and (res["router"], res["radio"]) == (router, radio)
            assert res["stats"]["created"] == len(schedule(sc, sc.host_names(), 600.0))
            assert res["net"]["tx"] > 0 and res["wall"] > 0
            received[router, radio] = res["net"]["rx"]
    # One radio per host: epidemic's whole-store hand-overs queue, and fewer arrive in time.
    assert received["epidemic", "serial"] < received["epidemic", "parallel"]


def test_bundled_trace_is_what_one_default_mobility_makes(tmp_path: Path) -> None:
    """The bundled trace stays in step with one_default.toml (its first ten minutes are
    regenerated here; regenerate the whole file as docs/scenarios.md says if this fails)."""
    from sim.mobility.contacts import write_one_trace

    sc = load(ROOT / "scenarios" / "one_default.toml")
    fresh = tmp_path / "fresh.one.txt"
    write_one_trace(sc, 1, 600.0, fresh)

    def before(lines: list[str], until: float) -> list[str]:
        return [ln for ln in lines if ln.strip() and float(ln.split()[0]) < until]

    with gzip.open(ROOT / "scenarios" / "traces" / "one_default.one.txt.gz", "rt") as f:
        bundled = f.read()
    want = before(fresh.read_text().splitlines(), 600.0)
    assert len(want) > 50
    assert before(bundled.splitlines(), 600.0) == want


def test_goal_lines_judge_a_whole_run_in_wall_and_cpu_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = {"until": 43200.0, "wall": 300.0, "cpu": 100.0, "rss_mb": 1000.0}
    bench_one._print_goal(run)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("NOT met in wall time (300 s, 1,000 MB)")
    assert lines[1].endswith("met in cpu time (100 s, 1,000 MB)") and "NOT" not in lines[1]
    bench_one._print_goal({**run, "rss_mb": 2000.0})
    assert capsys.readouterr().out.count("NOT met") == 2
    bench_one._print_goal({**run, "until": 3600.0})
    assert "not judged, this run covers 1.00 h" in capsys.readouterr().out
