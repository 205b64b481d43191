"""bench/bench_delivery.py: its figures are what the logs say (hand-made logs with known
answers, and a few simulated minutes of a small ONE-like run recomputed here another way),
and --baseline prints the second column side by side."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from spark_fixtures import write_run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_delivery  # noqa: E402
import delivery_diagnosis  # noqa: E402

TINY = """
name = "tiny_one"
description = "16 hosts in a small square, ONE-like traffic"
seed = 3
duration = 600.0
mobility_step = 1.0
cache_sample_period = 60.0

[world]
width = 120.0
height = 120.0

[radio]
range = 15.0
bit_rate = 2_000_000.0
loss = 0.0

[protocol]
altruistic = true
cache_capacity = 5_000_000

[[groups]]
name = "p"
count = 12
mobility = { model = "random_waypoint", speed = [0.5, 1.5], pause = [0.0, 30.0] }

[[groups]]
name = "c"
count = 4
mobility = { model = "random_waypoint", speed = [2.7, 13.9], pause = [0.0, 30.0] }

[[traffic.generate]]
name = "one"
sources = ["0..15"]
destinations = ["0..15"]
interval = [5, 10]
size = [20_000, 60_000]
ttl = 300
attributes = { topic = "one" }
"""


def test_figures_of_hand_made_logs(tmp_path: Path) -> None:
    # a-b [0, 10], a-d [5, 6] (its repeated up changes nothing), b-c [20, 30], c-d from 50
    # to the end (100).
    contacts = [
        (0.0, "a", "b", True), (5.0, "d", "a", True), (5.5, "a", "d", True),
        (6.0, "a", "d", False), (10.0, "b", "a", False), (20.0, "b", "c", True),
        (30.0, "c", "b", False), (50.0, "c", "d", True),
    ]  # fmt: skip
    targets = [  # msg, host, origin, created, deadline, topic, group
        ("m1", "c", "a", 5.0, 60.0, "one", "g"),  # oracle a->b at 5, b->c at 20: 15 s
        ("m1", "d", "a", 5.0, 60.0, "one", "g"),  # oracle over a-d at once: 0 s
        ("m2", "a", "c", 40.0, 45.0, "one", "g"),  # no contact of c before 45: unreachable
        ("m3", "d", "b", 12.0, 200.0, "one", "g"),  # b->c at 20, c->d at 50: 38 s
    ]
    messages = [  # time, host, msg, event, bytes, hops
        (5.0, "a", "m1", "created", 1000, 0), (40.0, "c", "m2", "created", 2000, 0),
        (12.0, "b", "m3", "created", 500, 0), (6.0, "b", "m1", "fragment", 100, 1),
        (7.0, "b", "m1", "complete", 1000, 1), (5.0, "a", "m1", "complete", 1000, 0),
        (25.0, "c", "m1", "complete", 1000, 2), (25.0, "c", "m1", "delivered", 1000, 2),
        (70.0, "d", "m1", "complete", 1000, 3), (70.0, "d", "m1", "delivered", 1000, 3),
        (21.0, "c", "m3", "complete", 500, 1), (55.0, "d", "m3", "complete", 500, 2),
        (55.0, "d", "m3", "delivered", 500, 2), (80.0, "d", "m3", "complete", 500, 2),
        (80.0, "d", "m3", "delivered", 500, 2),
    ]  # fmt: skip
    datagrams = [
        ("a", "fragment", "sent", 3, 3000), ("b", "fragment", "received", 3, 3000),
        ("b", "announce", "sent", 2, 100), ("c", "request", "sent", 1, 400),
    ]  # fmt: skip
    run = write_run(
        tmp_path / "run", until=100.0, contacts=contacts, messages=messages,
        targets=targets, datagrams=datagrams,
    )  # fmt: skip
    f = bench_delivery.figures(run, 100.0)
    assert f["target_pairs"] == 4
    assert f["delivered"] == 2  # m1 at d came after its deadline; m3 at d counts once
    assert f["delivery_ratio"] == 0.5
    assert f["oracle_delivered"] == 3 and f["oracle_ratio"] == 0.75
    assert f["efficiency"] == pytest.approx(0.5 / 0.75)
    assert f["delay_median"] == 20.0  # of 20 and 43: the lower one, as the analysis takes it
    assert f["oracle_delay_median"] == 15.0  # of 0, 15, 38
    assert f["delivered_bytes"] == 1500
    assert f["bytes_sent"] == 3500 and f["fragment_bytes_sent"] == 3000
    assert f["fragment_share"] == pytest.approx(3000 / 3500)
    assert f["bytes_per_delivered_byte"] == pytest.approx(3500 / 1500)
    # The ONE's relayed: every completed copy away from the origin (b, c, d for m1; c, d
    # and d again for m3), final recipients included; (6 - 2) / 2.
    assert f["relayed"] == 6
    assert f["overhead_ratio"] == 2.0


def _rows(block: str) -> dict[str, list[str]]:
    rows = {}
    for line in block.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 2:
            rows[cells[0]] = cells[1:]
    return rows


def _intervals(run: Path, until: float) -> list[tuple[str, str, float, float]]:
    t = pq.read_table(run / "contacts.parquet").to_pylist()
    t.sort(key=lambda r: r["time"])
    since: dict[frozenset[str], float] = {}
    out = []
    for r in t:
        key = frozenset((r["a"], r["b"]))
        if r["up"] and key not in since:
            since[key] = r["time"]
        elif not r["up"] and key in since:
            out.append((r["a"], r["b"], since.pop(key), r["time"]))
    return out + [(*sorted(k), s, until) for k, s in since.items()]  # type: ignore[misc]


def _recomputed(run: Path, until: float) -> dict[str, Any]:
    """The printed figures computed again from the logs, the oracle by plain relaxation
    over every contact until nothing improves (not the bench's Dijkstra)."""
    targets = pq.read_table(run / "targets.parquet").to_pylist()
    msgs = pq.read_table(run / "messages.parquet").to_pylist()
    origin = {m["msg_id"]: m["host"] for m in msgs if m["event"] == "created"}
    first: dict[tuple[str, str], dict[str, Any]] = {}
    for m in sorted((m for m in msgs if m["event"] == "delivered"), key=lambda m: m["time"]):
        first.setdefault((m["msg_id"], m["host"]), m)
    delays, got_bytes = [], 0
    for t in targets:
        d = first.get((t["msg_id"], t["host"]))
        if d is not None and d["time"] <= t["deadline"]:
            delays.append(d["time"] - t["created"])
            got_bytes += d["bytes"]
    iv = _intervals(run, until)
    oracle = []
    for t in targets:
        best = {t["origin"]: t["created"]}
        limit = min(t["deadline"], until)
        changed = True
        while changed:
            changed = False
            for a, b, s, e in iv:
                for u, v in ((a, b), (b, a)):
                    if u in best and best[u] <= e and s <= limit:
                        c = max(best[u], s)
                        if c < best.get(v, math.inf):
                            best[v], changed = c, True
        if t["host"] in best and t["host"] != t["origin"]:
            oracle.append(best[t["host"]] - t["created"])
    dgs = [
        r for r in pq.read_table(run / "datagrams.parquet").to_pylist() if r["direction"] == "sent"
    ]
    sent = sum(r["bytes"] for r in dgs)
    fragments = sum(r["bytes"] for r in dgs if r["kind"] == "fragment")
    relayed = sum(
        1 for m in msgs if m["event"] == "complete" and m["host"] != origin.get(m["msg_id"])
    )
    n, k = len(targets), len(delays)
    return {
        "target pairs": n,
        "delivered pairs": k,
        "delivery ratio": k / n,
        "oracle ratio": len(oracle) / n,
        "efficiency (delivery / oracle)": k / len(oracle),
        "median delay (s)": sorted(delays)[math.ceil(k / 2) - 1],
        "oracle median delay (s)": sorted(oracle)[math.ceil(len(oracle) / 2) - 1],
        "bytes sent per delivered byte": sent / got_bytes,
        "fragment share of bytes sent": fragments / sent,
        "ONE relayed": relayed,
        "ONE overhead ratio": (relayed - k) / k,
    }


def test_a_few_simulated_minutes_print_what_the_logs_say(tmp_path: Path) -> None:
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    if git.returncode != 0:
        pytest.skip("--baseline needs a git checkout of the project")
    scenario = tmp_path / "tiny_one.toml"
    scenario.write_text(TINY)
    logs = tmp_path / "logs"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_delivery.py"), "--variant", str(scenario),
         "--until", "300", "--baseline", "HEAD", "--jobs", "2", "--logs", str(logs)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"== {scenario} (tiny_one.toml), 300 simulated s\n"), r.stdout
    rows = _rows(r.stdout)
    assert rows["figure"] == ["ours", "HEAD", "ours/HEAD"]
    for column, run in ((0, logs / "ours-tiny_one"), (1, logs / "HEAD-tiny_one")):
        want = _recomputed(run, 300.0)
        assert want["target pairs"] > 10
        assert 0 < want["delivered pairs"] < want["target pairs"]  # not a trivial run
        # where the pairs went: delivery_diagnosis (tested on hand-made logs) of these logs
        d = delivery_diagnosis.diagnose(run, 300.0)
        assert d["met_not_delivered"] + d["never_met"] > 0
        want |= {
            "met complete holder, undelivered": d["share"]["met_not_delivered"],
            "never met a complete holder": d["share"]["never_met"],
            "complete-copy hours per message": d["copy_hours_mean"],
            "transfers never completed": d["transfers_never_completed"],
        }
        for label, value in want.items():
            printed = rows[label][column]
            digits = len(printed.partition(".")[2])
            assert float(printed.replace(",", "")) == pytest.approx(
                value, abs=0.5 * 10**-digits + 1e-9
            ), (label, printed, value)
    # The same code, seed and scenario on both sides: the same run.
    for label in ("delivered pairs", "oracle ratio", "ONE relayed"):
        assert rows[label][0] == rows[label][1] and rows[label][2] == "1.00", rows[label]
    assert "goal" not in r.stdout  # the goals are for the benchmark variants only


def test_an_unknown_variant_is_refused_with_the_choices() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_delivery.py"), "--variant", "huge"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert (
        "unknown variant 'huge': one of town1k, town, 1k, mb, trace or a scenario .toml file"
        in r.stderr
    )


def test_goals_are_judged_from_the_figures() -> None:
    one_k = {"efficiency": 0.96, "delay_median": 1500.0, "oracle_delay_median": 758.0}
    assert [g[1] for g in bench_delivery.goals("1k", one_k)] == [True, True]
    one_k["delay_median"] = 1517.0
    assert [g[1] for g in bench_delivery.goals("1k", one_k)] == [True, False]
    mb = {"delivery_ratio": 0.56, "overhead_ratio": 74.6}
    assert [g[1] for g in bench_delivery.goals("mb", mb)] == [False, True]
    mb = {"delivery_ratio": 0.6, "overhead_ratio": None}
    assert [g[1] for g in bench_delivery.goals("mb", mb)] == [True, None]


def test_the_report_says_what_the_ratios_leave_out_and_which_run_failed() -> None:
    f = {"efficiency": 0.5, "delay_median": 3.0, "oracle_delay_median": 2.0, "until": 60.0}
    f |= {"publish_refused": 4, "target_pairs": 3, "delivered": 1}
    text = bench_delivery.report(
        bench_delivery.VARIANTS["1k"], 60.0, [("ours", f), ("old", "stopped by signal 15")]
    )
    assert "  old: stopped by signal 15\n" in text
    assert "(ours: 4 publications refused by a full cache have no target pairs" in text
    assert "goal: delivery >= 0.95 x oracle     ours: NOT met (0.500 x)" in text
    assert "(goals are for the 12 h run; this run covers 0.02 h)" in text


def test_reference_routers_report_delivery_and_overhead() -> None:
    v = bench_delivery.VARIANTS["trace"]
    stats = {"created": 200, "delivered": 50, "relayed": 550}
    out = bench_delivery.pons_report(
        v,
        [
            ("epidemic", "parallel", {"stats": stats}),
            ("spray", "serial", {"stats": {"created": 200, "delivered": 0, "relayed": 7}}),
            ("spray", "parallel", "did not finish within 60 s"),
        ],
    )
    rows = out.splitlines()
    assert rows[0] == f"== {v.label}: reference routers on the same contacts and messages (PONS)"
    assert re.search(r"^  epidemic +parallel +50 +0\.250 +10\.00$", out, re.M), out
    assert re.search(r"^  spray +serial +0 +0\.000 +-$", out, re.M), out
    assert "  spray     parallel    did not finish within 60 s" in rows


def test_reference_routers_need_a_one_trace() -> None:
    out = bench_delivery.run_references(bench_delivery.VARIANTS["mb"], 60.0)
    assert "no ONE contact trace" in out and "--variant trace" in out


def test_reference_routers_run_on_the_trace_variant() -> None:
    pytest.importorskip(
        "pons", reason="PONS (pons-dtn, in the test and bench extras) is not installed"
    )
    out = bench_delivery.run_references(bench_delivery.VARIANTS["trace"], 300.0)
    for router in ("epidemic", "spray"):
        for radio in ("parallel", "serial"):
            assert re.search(rf"^  {router} +{radio} +\d+ +[\d.]+ ", out, re.M), out


def test_model_routers_report_delivery_overhead_and_delay() -> None:
    v = bench_delivery.VARIANTS["trace"]
    out = bench_delivery.model_report(
        v,
        [
            ("maxprop", "medium", {"delivered": 50, "ratio": 0.25, "overhead": 10.0, "median_delay": 3000.0}),
            ("epidemic", "one", {"delivered": 0, "ratio": 0.0, "overhead": float("inf"), "median_delay": float("nan")}),
        ],
    )  # fmt: skip
    assert (
        out.splitlines()[0]
        == f"== {v.label}: reference routers on the same contacts and messages (model)"
    )
    assert re.search(r"^  maxprop +medium +50 +0\.250 +10\.00 +3,000 s$", out, re.M), out
    assert re.search(r"^  epidemic +one +0 +0\.000 +- +- s$", out, re.M), out


def test_model_routers_run_on_a_trace_and_on_a_variant_s_own_mobility() -> None:
    for key in ("trace", "town"):
        out = bench_delivery.run_models(bench_delivery.VARIANTS[key], 600.0)
        for router in ("epidemic", "spray", "prophet", "maxprop"):
            for physics in ("one", "medium"):
                assert re.search(rf"^  {router} +{physics} +\d+ +[\d.]+ ", out, re.M), out
