"""bench/delivery_diagnosis.py: the split of target pairs, copy hours and failed transfers
of hand-made logs with known answers, and its command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from spark_fixtures import write_run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import delivery_diagnosis  # noqa: E402


def _run(tmp_path: Path) -> Path:
    # a-b [0, 10], a-d [5, 6], b-c [20, 30], c-d from 50 to the end (100)
    contacts = [
        (0.0, "a", "b", True), (5.0, "d", "a", True), (6.0, "a", "d", False),
        (10.0, "b", "a", False), (20.0, "b", "c", True), (30.0, "c", "b", False),
        (50.0, "c", "d", True),
    ]  # fmt: skip
    targets = [  # msg, host, origin, created, deadline, topic, group
        ("m1", "c", "a", 5.0, 60.0, "one", "g"),  # delivered at 25
        ("m1", "d", "a", 5.0, 60.0, "one", "g"),  # met a (1 s) and c (10 s), got it at 70
        ("m2", "a", "c", 40.0, 45.0, "one", "g"),  # c never meets a
        ("m3", "d", "b", 12.0, 200.0, "one", "g"),  # delivered at 55
    ]
    messages = [  # time, host, msg, event, bytes, hops
        (5.0, "a", "m1", "created", 1000, 0), (5.0, "a", "m1", "complete", 1000, 0),
        (6.0, "b", "m1", "fragment", 100, 1), (7.0, "b", "m1", "complete", 1000, 1),
        (8.0, "b", "m1", "evicted", 1000, 1),
        (25.0, "c", "m1", "complete", 1000, 2), (25.0, "c", "m1", "delivered", 1000, 2),
        (70.0, "d", "m1", "complete", 1000, 3), (70.0, "d", "m1", "delivered", 1000, 3),
        (40.0, "c", "m2", "created", 2000, 0), (41.0, "b", "m2", "fragment", 100, 1),
        (12.0, "b", "m3", "created", 500, 0), (21.0, "c", "m3", "complete", 500, 1),
        (55.0, "d", "m3", "complete", 500, 2), (55.0, "d", "m3", "delivered", 500, 2),
    ]  # fmt: skip
    return write_run(
        tmp_path / "run", until=100.0, contacts=contacts, messages=messages,
        targets=targets, datagrams=[("a", "fragment", "sent", 1, 100)],
        hosts=[("a", "g"), ("b", "g"), ("c", "g"), ("d", "g")],
    )  # fmt: skip


def test_pairs_copies_and_failed_transfers_of_hand_made_logs(tmp_path: Path) -> None:
    d = delivery_diagnosis.diagnose(_run(tmp_path))
    assert d["target_pairs"] == 4
    assert (d["delivered"], d["met_not_delivered"], d["never_met"]) == (2, 1, 1)
    assert d["share"]["never_met"] == 0.25
    # m1 at d: a (held from 5) over a-d [5, 6], c (held from 25) over c-d [50, deadline 60]
    assert d["met_meetings_median"] == 2
    assert d["met_contact_seconds_median"] == 11.0
    assert d["met_fragments_held_median"] == 0
    # origin and carriers, not targets, from creation to deadline (or the end, 100):
    # m1: a 55 s + b 1 s (evicted at 8); m2: c 5 s; m3: b 88 s + c 79 s
    assert d["copy_hours_quartiles"] == pytest.approx([5 / 3600, 56 / 3600, 167 / 3600])
    assert d["copy_hours_mean"] == pytest.approx(228 / 3 / 3600)
    # byte-seconds of every complete copy: m1 201 s x 1000, m2 60 s x 2000, m3 212 s x 500
    assert d["complete_bytes_held_per_host"] == pytest.approx(427_000 / (4 * 100))
    assert d["transfers_completed"] == 6
    assert d["transfers_never_completed"] == 1  # m2 at b
    assert d["bytes_of_transfers_never_completed"] == 100


def test_command_line_prints_the_split_or_says_what_is_wrong(tmp_path: Path) -> None:
    run = _run(tmp_path)
    script = str(ROOT / "bench" / "delivery_diagnosis.py")
    out = subprocess.run(
        [sys.executable, script, str(run)], capture_output=True, text=True, check=True
    ).stdout
    assert "never met a complete holder" in out and "0.250" in out
    bad = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a run folder" in bad.stderr
