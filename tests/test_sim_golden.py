"""The simulator's results for a given seed are pinned by a committed digest.

Every optimisation of the simulator, the medium or the core's hot paths must leave the logs
of a run unchanged: same rows, same order, same counters. This test runs two small but busy
scenarios (multi-fragment messages, radio loss, altruistic carriers, caches small enough to
evict, a contact-trace replay) and compares a SHA-256 of every table's rows and of the
run's counters with ``tests/golden/sim_digest.json``.

A change that is *meant* to change results (a protocol change) regenerates the file with
``DODWAN_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_sim_golden.py`` and says
why in its commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sim.logs import SCHEMAS
from sim.runner import simulate
from sim.scenario import load, loads

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "sim_digest.json"

BUSY = """
name = "golden-busy"
seed = 3
duration = 1200.0
cache_sample_period = 60.0
[world]
width = 400.0
height = 300.0
[radio]
range = 40.0
bit_rate = 250_000.0
loss = 0.05
max_datagram = 1400
[protocol]
horizon = 2
altruistic = true
cache_capacity = 300_000
[[groups]]
name = "w"
count = 14
mobility = { model = "random_waypoint", speed = [0.5, 3.0], pause = [0.0, 20.0] }
[[groups]]
name = "car"
count = 4
protocol = { altruistic = false, horizon = 1 }
mobility = { model = "random_waypoint", speed = [5.0, 12.0], pause = [0.0, 5.0] }
[[traffic.publish]]
hosts = ["w-0", "w-3", "car-1"]
attributes = { topic = "big" }
interval = 90.0
size = 60_000
ttl = 900.0
[[traffic.publish]]
hosts = ["w"]
attributes = { topic = "small", prio = "x" }
interval = 120.0
process = "periodic"
size = 500
ttl = 600.0
priority = 7
persistent = false
[[traffic.subscribe]]
hosts = ["w-1", "w-5", "w-9", "car"]
patterns = [{ topic = "big" }]
[[traffic.subscribe]]
hosts = ["w-2", "w-7", "car-0"]
patterns = [{ topic = "small" }]
"""


def digest(out: Path) -> dict[str, str]:
    """SHA-256 of each table's rows (in file order) and of the run's counters."""
    result: dict[str, str] = {}
    for name in SCHEMAS:
        rows = pq.read_table(out / f"{name}.parquet").to_pylist()
        blob = json.dumps(rows, sort_keys=True, default=repr).encode()
        result[name] = hashlib.sha256(blob).hexdigest()
    counters = json.loads((out / "run.json").read_text())["counters"]
    result["counters"] = hashlib.sha256(json.dumps(counters, sort_keys=True).encode()).hexdigest()
    return result


def runs(tmp: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    simulate(loads(BUSY), tmp / "busy")
    out["busy"] = digest(tmp / "busy")
    simulate(load(ROOT / "scenarios" / "trace.toml"), tmp / "trace", until=3600.0)
    out["trace"] = digest(tmp / "trace")
    return out


def test_small_runs_match_the_committed_digest(tmp_path: Path) -> None:
    got = runs(tmp_path)
    if os.environ.get("DODWAN_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        pytest.skip("golden digest rewritten")
    want = json.loads(GOLDEN.read_text())
    assert got == want, "simulation results changed (see this module's docstring)"
