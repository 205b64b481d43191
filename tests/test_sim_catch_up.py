"""Hosts alone run their presence timers ahead of the clock (issue 12), with identical logs.

``SimHost._catch_up`` handles a lone host's beacons and announcements right where its
previous timer fired instead of through SimPy's queue, up to the next time a link of its
may come up (``LinksAhead``) or it publishes. These tests run sparse networks both ways and
compare every table row by row, in file order, and the counters; and they check that the
catch-up really happened, so the comparison is not vacuous.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from sim.logs import SCHEMAS
from sim.mobility.ahead import LinksAhead
from sim.runner import Simulation
from sim.scenario import load, loads

ROOT = Path(__file__).resolve().parent.parent

# Sparse: 12 hosts in 900 x 700 m with 30 m radios are alone most of the time. Messages of
# one entry share their deadline on every host holding a copy, so two hosts' expiries fall
# due at the same instant: the order SimPy gives them (by when each was armed) must not
# change because one of the hosts ran ahead.
SPARSE = """
name = "sparse"
seed = 11
duration = 2400.0
cache_sample_period = 300.0
[world]
width = 900.0
height = 700.0
[radio]
range = 30.0
bit_rate = 500_000.0
loss = 0.02
[protocol]
altruistic = true
cache_capacity = 200_000
[[groups]]
name = "w"
count = 10
mobility = { model = "random_waypoint", speed = [1.0, 4.0], pause = [0.0, 30.0] }
[[groups]]
name = "s"
count = 2
mobility = { model = "static" }
[[traffic.publish]]
hosts = ["w-0", "w-4", "s-1"]
attributes = { topic = "t" }
interval = 200.0
size = 20_000
ttl = 600.0
[[traffic.publish]]
hosts = ["w-2"]
attributes = { topic = "t" }
at = [100.0, 100.5, 700.0]
size = 3_000
ttl = 400.0
[[traffic.subscribe]]
hosts = ["w-1", "w-3", "s-0"]
patterns = [{ topic = "t" }]
"""


def _tables(out: Path) -> dict[str, list[dict[str, object]]]:
    return {name: pq.read_table(out / f"{name}.parquet").to_pylist() for name in SCHEMAS}


def _run(sim: Simulation) -> tuple[dict[str, list[dict[str, object]]], dict[str, int], int]:
    sim.run()
    sim.recorder.close()
    assert sim.recorder.out is not None
    ahead = sum(h.caught_up for h in sim.hosts)
    return _tables(sim.recorder.out), sim.counters(), ahead


@pytest.mark.parametrize("case", ["sparse mobility", "trace replay"])
def test_running_lone_hosts_ahead_changes_no_row(tmp_path: Path, case: str) -> None:
    def make(catch_up: bool, out: Path) -> Simulation:
        if case == "sparse mobility":
            return Simulation(loads(SPARSE), out=out, catch_up=catch_up)
        sc = load(ROOT / "scenarios" / "trace.toml")
        return Simulation(sc, out=out, until=2400.0, catch_up=catch_up)

    plain, plain_counters, none_ahead = _run(make(False, tmp_path / "plain"))
    fast, fast_counters, ahead = _run(make(True, tmp_path / "fast"))
    assert none_ahead == 0
    assert ahead > 0.3 * fast_counters["sim_timer_fires"]  # most timers of lone hosts
    assert fast_counters == plain_counters
    for name in SCHEMAS:
        assert fast[name] == plain[name], f"table {name} changed"
    if case == "sparse mobility":  # expiries at one instant on several hosts compared
        assert sum(r["event"] == "evicted" for r in plain["messages"]) > 10


def _steps(n: int, ups: dict[float, list[tuple[int, int]]], until: float) -> list:
    none = np.zeros(0, dtype=np.int64)
    out = []
    t = 0.0
    while t <= until:
        codes = np.array([i * n + j for i, j in ups.get(t, [])], dtype=np.int64)
        out.append((t, codes if codes.size else none, none))
        t += 1.0
    return out


def test_links_ahead_finds_a_hosts_next_link_up_within_the_window() -> None:
    ahead = LinksAhead.of_steps(
        iter(_steps(4, {0.0: [(0, 1)], 5.0: [(2, 3)], 9.0: [(1, 2)]}, 30.0)), 4, window=20.0
    )
    steps = ahead.steps()
    assert next(steps)[0] == 0.0  # the step at time 0 is applied
    assert ahead.quiet_until(2, 0.5) == 5.0
    assert ahead.quiet_until(3, 0.5) == 5.0
    assert ahead.quiet_until(1, 0.5) == 9.0  # its link of time 0 came up already
    # host 0 has no link-up ahead: the answer is as far as was read, not beyond the window
    assert 20.5 <= ahead.quiet_until(0, 0.5) <= 21.0
    # the steps read ahead are replayed in order, none lost
    assert [s[0] for s in steps] == [float(t) for t in range(1, 31)]
    assert ahead.quiet_until(0, 30.5) == math.inf  # the source is exhausted: never


def test_links_ahead_at_a_link_up_time_says_now() -> None:
    ahead = LinksAhead.of_events([(3.0, 0, 1, True), (4.0, 0, 1, False), (8.0, 1, 2, True)], 3)
    assert ahead.quiet_until(0, 1.0) == 3.0
    assert ahead.quiet_until(0, 3.0) == 3.0  # may come up at this very time: not quiet
    assert ahead.quiet_until(0, 3.5) == math.inf
    assert ahead.quiet_until(1, 3.5) == 8.0
    assert ahead.quiet_until(2, 0.0) == 8.0
