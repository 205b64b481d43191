"""The oracle (earliest arrival over time-respecting paths), against hand-worked cases and a
plain-Python reference on a random contact log, along both of its paths (the rounds as Spark
jobs, and on the driver for small inputs), which must agree exactly, down to the figures of
a whole analysed run."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest
from spark_fixtures import SPARK_GROUP, shared_spark

from sim.analysis import analyze_run, oracle
from sim.analysis.oracle import OracleNotConverged, oracle_arrivals

pytestmark = SPARK_GROUP

INF = float("inf")

PATHS = {"spark": 0, "driver": None}
"""driver_rows for each path: 0 forces the Spark rounds, None is the default (small inputs
run on the driver)."""


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


@pytest.fixture(scope="module", params=sorted(PATHS))
def hand(spark: Any, request: pytest.FixtureRequest) -> dict[tuple[str, str], float]:
    pairs, iv = _frames(spark, HAND_MESSAGES, HAND_INTERVALS)
    result = oracle_arrivals(pairs, iv, 1000.0, driver_rows=PATHS[request.param])
    assert result.converged
    assert (result.bucket is None) == (request.param == "driver")
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


@pytest.mark.parametrize("path", sorted(PATHS))
def test_matches_reference_on_random_contacts(spark: Any, path: str) -> None:
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
    result = oracle_arrivals(pairs, iv, 1000.0, driver_rows=PATHS[path])
    assert result.converged
    expected = {(m[0], host): t for m in messages for host, t in reference(m, intervals).items()}
    got = _arrivals(result)
    assert set(got) == set(expected)
    for key, t in expected.items():
        assert got[key] == pytest.approx(t), key
    # a small bucket width (many buckets per message) must not change anything
    assert _arrivals(oracle_arrivals(pairs, iv, 1000.0, bucket=7.0)) == got


@pytest.mark.parametrize("path", sorted(PATHS))
def test_iteration_cap_warns_and_reports_a_lower_bound(spark: Any, path: str) -> None:
    chain = [(f"h{i}", f"h{i + 1}", 10.0 * i, 10.0 * i + 1) for i in range(4)]
    pairs, iv = _frames(spark, [("m", "h0", 0.0, 100.0)], chain)
    with pytest.warns(OracleNotConverged):
        result = oracle_arrivals(pairs, iv, 100.0, max_iterations=2, driver_rows=PATHS[path])
    assert result.iterations == 2
    assert not result.converged
    assert set(_arrivals(result)) == {("m", "h0"), ("m", "h1"), ("m", "h2")}
    with pytest.raises(ValueError):
        oracle_arrivals(pairs, iv, 100.0, max_iterations=0)


def _random_log(
    seed: int, hosts: int, contacts: int, messages: int
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Messages and contact intervals drawn at random, with ties in times and durations."""
    rng = random.Random(seed)
    names = [f"h{i}" for i in range(hosts)]
    intervals = []
    for _ in range(contacts):
        a, b = rng.sample(names, 2)
        start = float(rng.randrange(0, 900))  # whole seconds: many equal times
        intervals.append((min(a, b), max(a, b), start, start + rng.choice([0.0, 1.5, 20.0, 90.0])))
    intervals.append(("h0", "h1", 5.0, 850.0))  # a long contact among short ones
    msgs = []
    for i in range(messages):
        created = rng.uniform(0, 700)
        msgs.append((f"m{i}", rng.choice(names), created, created + rng.choice([5.0, 60.0, 900.0])))
    return msgs, intervals


def _run_both(spark: Any, msgs: Any, intervals: Any, **kw: Any) -> tuple[Any, Any]:
    pairs, iv = _frames(spark, msgs, intervals)
    return tuple(oracle_arrivals(pairs, iv, 800.0, driver_rows=PATHS[p], **kw) for p in PATHS)


@pytest.mark.parametrize("cap", [oracle.DEFAULT_MAX_ITERATIONS, 3])
def test_driver_and_spark_rounds_agree_exactly(spark: Any, cap: int) -> None:
    msgs, intervals = _random_log(11, hosts=25, contacts=300, messages=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OracleNotConverged)
        in_spark, on_driver = _run_both(spark, msgs, intervals, max_iterations=cap)
    assert in_spark.bucket is not None and on_driver.bucket is None  # each took its path
    assert on_driver.iterations == in_spark.iterations > 2
    assert on_driver.converged == in_spark.converged == (cap != 3)
    assert _arrivals(on_driver) == _arrivals(in_spark)  # exactly: same comparisons, no sums
    assert on_driver.arrivals.schema == in_spark.arrivals.schema


def test_inputs_above_the_driver_limits_run_in_spark(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    msgs, intervals = _random_log(3, hosts=6, contacts=11, messages=4)  # 12 intervals
    pairs, iv = _frames(spark, msgs, intervals)
    at_limit = oracle_arrivals(pairs, iv, 800.0, driver_rows=12)
    above = oracle_arrivals(pairs, iv, 800.0, driver_rows=11)  # 12 intervals > 11
    assert at_limit.bucket is None and above.bucket is not None
    assert _arrivals(at_limit) == _arrivals(above)
    monkeypatch.setattr(oracle, "DRIVER_WORK", 4 * 12 - 1)  # 4 messages × 12 intervals
    too_much = oracle_arrivals(pairs, iv, 800.0)
    assert too_much.bucket is not None
    assert _arrivals(too_much) == _arrivals(at_limit)


def test_nan_times_run_in_spark(spark: Any) -> None:
    """Spark orders NaN above every number, Python compares it false: such input is left to
    Spark, whose answer it keeps."""
    msgs, intervals = _random_log(5, hosts=6, contacts=12, messages=4)
    intervals[0] = (*intervals[0][:3], float("nan"))
    in_spark, default = _run_both(spark, msgs, intervals)
    assert default.bucket is not None
    assert _arrivals(default) == _arrivals(in_spark)


def test_whole_analysis_is_identical_on_both_paths(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every figure of a simulated run (quickstart) is the same whichever path the oracle
    takes, down to the last digit of the means (the frames' layout decides the order of
    floating-point sums)."""
    from sim.runner import simulate
    from sim.scenario import load

    simulate(load(Path(__file__).parent.parent / "scenarios" / "quickstart.toml"), tmp_path)
    default, on_driver = oracle.DRIVER_ROWS, []
    relax = oracle._relax_on_driver
    monkeypatch.setattr(oracle, "_relax_on_driver", lambda *a: on_driver.append(1) or relax(*a))
    results = {}
    for path, rows in PATHS.items():
        monkeypatch.setattr(oracle, "DRIVER_ROWS", default if rows is None else rows)
        result = analyze_run(spark, str(tmp_path), name="q")
        pairs = sorted(map(repr, result.frames["pairs"].collect()))
        results[path] = (result.metrics, result.series, result.tables, pairs)
        assert len(on_driver) == (path == "driver")  # the path it was meant to take
    assert results["driver"][0]["oracle_iterations"] > 1
    assert results["driver"][0]["oracle_delivered_pairs"] > 0
    assert results["driver"] == results["spark"]
