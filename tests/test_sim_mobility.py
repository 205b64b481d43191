"""Mobility models stay in their area, honour speeds and pauses; the grid finds all pairs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import grid
from sim.mobility.base import World, build_world
from sim.mobility.walk import RandomWalk
from sim.mobility.waypoint import Carrier, RandomWaypoint
from sim.scenario import loads

AREA = (10.0, 20.0, 110.0, 70.0)


def run_model(model, n: int, steps: int, dt: float) -> np.ndarray:
    pos = np.zeros((n, 2))
    model.place(pos)
    track = [pos.copy()]
    for _ in range(steps):
        model.step(pos, dt)
        track.append(pos.copy())
    return np.array(track)  # (steps+1, n, 2)


def inside(track: np.ndarray, area: tuple[float, float, float, float]) -> bool:
    x0, y0, x1, y1 = area
    eps = 1e-9
    return bool(
        (track[..., 0] >= x0 - eps).all()
        and (track[..., 0] <= x1 + eps).all()
        and (track[..., 1] >= y0 - eps).all()
        and (track[..., 1] <= y1 + eps).all()
    )


def step_lengths(track: np.ndarray) -> np.ndarray:
    d = np.diff(track, axis=0)
    return np.hypot(d[..., 0], d[..., 1])


@pytest.mark.parametrize("dt", [0.5, 1.0, 3.0])
def test_random_waypoint_stays_in_area_and_honours_speed(dt: float) -> None:
    m = RandomWaypoint(slice(0, 20), AREA, np.random.default_rng(1), (1.0, 4.0), (0.0, 0.0))
    track = run_model(m, 20, 400, dt)
    assert inside(track, AREA)
    steps = step_lengths(track)
    assert steps.max() <= 4.0 * dt + 1e-9
    assert steps.max() > 0.5 * dt  # they do move
    # Each host's per-step displacement never exceeds its own leg speed.
    assert (steps <= m.speed[None, :] * dt + 1e-9).mean() > 0.5


def test_random_waypoint_pauses_at_waypoints() -> None:
    m = RandomWaypoint(slice(0, 10), AREA, np.random.default_rng(2), (2.0, 2.0), (20.0, 30.0))
    track = run_model(m, 10, 600, 1.0)
    still = step_lengths(track) == 0.0  # (steps, n)
    # Every stop lasts at least the minimum pause (ignoring a stop cut by the run's end).
    for h in range(10):
        runs, k = [], 0
        for s in still[:, h]:
            if s:
                k += 1
            elif k:
                runs.append(k)
                k = 0
        assert runs, "each host reached at least one waypoint"
        assert min(runs) >= 19  # a 20 s pause at dt=1 leaves >= 19 zero-length steps
        assert max(runs) <= 31


def test_random_walk_reflects_and_honours_speed() -> None:
    m = RandomWalk(slice(0, 30), AREA, np.random.default_rng(3), (2.0, 5.0), (5.0, 40.0))
    track = run_model(m, 30, 500, 1.0)
    assert inside(track, AREA)
    assert step_lengths(track).max() <= 5.0 + 1e-9


def test_carrier_visits_islands_within_their_discs() -> None:
    islands = [((0.0, 0.0), 5.0), ((500.0, 0.0), 5.0), ((250.0, 400.0), 5.0)]
    area = (-100.0, -100.0, 700.0, 600.0)
    m = Carrier(
        slice(0, 3), area, np.random.default_rng(4), (10.0, 10.0), (5.0, 5.0), islands, "cycle"
    )
    track = run_model(m, 3, 800, 1.0)
    assert step_lengths(track).max() <= 10.0 + 1e-9
    centres = np.array([c for c, _ in islands])
    visited = set()
    for t in range(track.shape[0]):
        for h in range(3):
            d = np.hypot(*(centres - track[t, h]).T)
            visited.update(int(i) for i in np.flatnonzero(d <= 5.0 + 1e-9))
    assert visited == {0, 1, 2}


def test_build_world_places_islands_statically() -> None:
    sc = loads(
        """
name = "w"
duration = 10.0
[world]
width = 1000.0
height = 1000.0
[radio]
range = 10.0
[[groups]]
name = "a"
count = 5
mobility = { model = "island", center = [100.0, 200.0], radius = 15.0 }
[[groups]]
name = "s"
count = 2
mobility = { model = "static", positions = [[1.0, 2.0], [3.0, 4.0]] }
"""
    )
    w = build_world(sc)
    assert not w.moving
    d = np.hypot(w.pos[:5, 0] - 100.0, w.pos[:5, 1] - 200.0)
    assert (d <= 15.0).all()
    assert w.pos[5:].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    before = w.pos.copy()
    w.step(1.0)
    assert np.array_equal(before, w.pos)


def brute(pos: np.ndarray, r: float) -> np.ndarray:
    n = len(pos)
    d = np.hypot(*(pos[:, None, :] - pos[None, :, :]).transpose(2, 0, 1))
    i, j = np.nonzero(np.triu(d <= r, 1))
    return np.sort(i * n + j)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 60),
    r=st.floats(0.5, 200.0),
    seed=st.integers(0, 2**31),
)
def test_grid_matches_brute_force(n: int, r: float, seed: int) -> None:
    pos = np.random.default_rng(seed).uniform(-300.0, 300.0, (n, 2))
    assert np.array_equal(grid.links(pos, r), brute(pos, r))


def test_grid_diff_reports_changes() -> None:
    old = np.array([1, 5, 9], dtype=np.int64)
    new = np.array([5, 7], dtype=np.int64)
    up, down = grid.diff(old, new)
    assert up.tolist() == [7] and down.tolist() == [1, 9]
    up, down = grid.diff(new, new)
    assert up.size == 0 and down.size == 0


def test_world_step_moves_only_moving_models() -> None:
    w = World(100.0, 100.0, 4)
    rw = RandomWaypoint(
        slice(2, 4), (0.0, 0.0, 100.0, 100.0), np.random.default_rng(0), (1.0, 1.0), (0.0, 0.0)
    )
    rw.place(w.pos)
    w.models.append(rw)
    w.step(1.0)
    assert w.pos[:2].tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert w.moving
