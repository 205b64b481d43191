"""The oracle (earliest arrival over time-respecting paths), computed in Spark, against hand
-worked cases and a plain-Python reference on a random contact log."""

from __future__ import annotations

import random
from typing import Any

import pytest
from spark_fixtures import shared_spark

from sim.analysis.oracle import OracleNotConverged, oracle_arrivals

INF = float("inf")


@pytest.fixture(scope="session")
def spark() -> Any:
    return shared_spark()


def _frames(spark: Any, messages: list[tuple[Any, ...]], intervals: list[tuple[Any, ...]]) -> Any:
    pairs = spark.createDataFrame(
        messages, "msg_id string, origin string, created double, deadline double"
    )
    iv = spark.createDataFrame(intervals, "a string, b string, start double, end double")
    return pairs, iv


def _arrivals(result: Any) -> dict[tuple[str, str], float]:
    return {(r["msg_id"], r["host"]): r["oracle_arrival"] for r in result.arrivals.collect()}


def reference(
    message: tuple[str, str, float, float], intervals: list[tuple[str, str, float, float]]
) -> dict[str, float]:
    """Earliest arrival by plain relaxation until nothing improves (obviously correct, slow)."""
    _, origin, created, deadline = message
    best = {origin: created}
    changed = True
    while changed:
        changed = False
        for a, b, start, end in intervals:
            for u, v in ((a, b), (b, a)):
                t = best.get(u, INF)
                if t <= end:
                    arrive = max(t, start)
                    if arrive <= deadline and arrive < best.get(v, INF):
                        best[v] = arrive
                        changed = True
    return best


# Hand-worked cases, on disjoint host sets so that one Spark computation serves them all.
HAND_INTERVALS = [
    # A-B-C-D is connected over the run, but C-D happens before C can hold the message;
    # W-X-Y-Z is the same chain with the last contact later, so Z is reachable.
    ("C", "D", 5.0, 8.0),
    ("A", "B", 10.0, 20.0),
    ("B", "C", 30.0, 40.0),
    ("Y", "Z", 45.0, 50.0),
    ("W", "X", 10.0, 20.0),
    ("X", "Y", 30.0, 40.0),
    # expiry: P-Q only from 70; P-R ended before the messages existed
    ("P", "Q", 70.0, 80.0),
    ("P", "R", 10.0, 12.0),
    # S-T already up when the message is created at 15
    ("S", "T", 10.0, 20.0),
]
HAND_MESSAGES = [
    ("chain", "A", 0.0, 1000.0),
    ("later", "W", 0.0, 1000.0),
    ("early", "P", 50.0, 60.0),
    ("ok", "P", 50.0, 75.0),
    ("up", "T", 15.0, 100.0),
]


@pytest.fixture(scope="module")
def hand(spark: Any) -> dict[tuple[str, str], float]:
    pairs, iv = _frames(spark, HAND_MESSAGES, HAND_INTERVALS)
    result = oracle_arrivals(pairs, iv, 1000.0)
    assert result.converged
    return _arrivals(result)


def test_time_respecting_path_decides_not_connectivity(hand: dict[Any, float]) -> None:
    chain = {h: t for (m, h), t in hand.items() if m == "chain"}
    assert chain == {"A": 0.0, "B": 10.0, "C": 30.0}  # no D
    assert hand[("later", "Z")] == 45.0  # Y holds it from 30, Y-Z at 45


def test_message_expiring_before_any_path(hand: dict[Any, float]) -> None:
    assert ("early", "Q") not in hand  # the contact starts at 70, after the deadline 60
    assert ("early", "R") not in hand  # that contact ended before the message existed
    assert hand[("ok", "Q")] == 70.0  # deadline 75 >= 70: counts (deadline inclusive)


def test_contact_already_up_at_creation_carries_at_once(hand: dict[Any, float]) -> None:
    assert hand[("up", "S")] == 15.0


def test_hand_cases_match_reference(hand: dict[Any, float]) -> None:
    expected = {
        (m[0], h): t for m in HAND_MESSAGES for h, t in reference(m, HAND_INTERVALS).items()
    }
    assert hand == expected


def test_matches_reference_on_random_contacts(spark: Any) -> None:
    rng = random.Random(7)
    hosts = [f"h{i}" for i in range(8)]
    intervals = []
    for _ in range(40):
        a, b = rng.sample(hosts, 2)
        start = round(rng.uniform(0, 900), 1)
        intervals.append((min(a, b), max(a, b), start, round(start + rng.uniform(0, 30), 1)))
    messages = []
    for i in range(10):
        created = round(rng.uniform(0, 600), 1)
        messages.append((f"m{i}", rng.choice(hosts), created, created + rng.uniform(50, 400)))
    pairs, iv = _frames(spark, messages, intervals)
    result = oracle_arrivals(pairs, iv, 1000.0)
    assert result.converged
    expected = {(m[0], host): t for m in messages for host, t in reference(m, intervals).items()}
    got = _arrivals(result)
    assert set(got) == set(expected)
    for key, t in expected.items():
        assert got[key] == pytest.approx(t), key
    # a small bucket width (many buckets per message) must not change anything
    assert _arrivals(oracle_arrivals(pairs, iv, 1000.0, bucket=7.0)) == got


def test_iteration_cap_warns_and_reports_a_lower_bound(spark: Any) -> None:
    chain = [(f"h{i}", f"h{i + 1}", 10.0 * i, 10.0 * i + 1) for i in range(4)]
    pairs, iv = _frames(spark, [("m", "h0", 0.0, 100.0)], chain)
    with pytest.warns(OracleNotConverged):
        result = oracle_arrivals(pairs, iv, 100.0, max_iterations=2)
    assert not result.converged
    assert set(_arrivals(result)) == {("m", "h0"), ("m", "h1"), ("m", "h2")}
    with pytest.raises(ValueError):
        oracle_arrivals(pairs, iv, 100.0, max_iterations=0)
