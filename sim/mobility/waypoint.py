"""Waypoint movement: ``random_waypoint`` and ``carrier`` (waypoints are island discs).

A host walks straight to its target at its leg's speed, pauses there (uniform in
``pause``), then draws a new target and speed. Movement within one step stops at the
target, so no host ever covers more than speed * dt in a step.
"""

from __future__ import annotations

import numpy as np

from sim.mobility.base import Area, Model
from sim.mobility.static import disc_points


class RandomWaypoint(Model):
    """Targets uniform in the area."""

    moving = True

    def __init__(
        self,
        rows: slice,
        area: Area,
        rng: np.random.Generator,
        speed: tuple[float, float],
        pause: tuple[float, float],
    ) -> None:
        super().__init__(rows, area, rng)
        self.speed_range = speed
        self.pause_range = pause
        self.target = np.zeros((self.n, 2))
        self.speed = np.zeros(self.n)
        self.pause_left = np.zeros(self.n)

    def place(self, pos: np.ndarray) -> None:
        super().place(pos)
        self._new_legs(np.arange(self.n))

    def _targets(self, idx: np.ndarray) -> np.ndarray:
        x0, y0, x1, y1 = self.area
        k = idx.size
        return np.column_stack((self.rng.uniform(x0, x1, k), self.rng.uniform(y0, y1, k)))

    def _new_legs(self, idx: np.ndarray) -> None:
        self.target[idx] = self._targets(idx)
        lo, hi = self.speed_range
        self.speed[idx] = self.rng.uniform(lo, hi, idx.size) if hi > lo else lo

    def step(self, pos: np.ndarray, dt: float) -> None:
        p = pos[self.rows]
        waiting = self.pause_left > 0
        if waiting.any():
            self.pause_left[waiting] -= dt
            done = np.flatnonzero(waiting & (self.pause_left <= 0))
            if done.size:
                self._new_legs(done)
        mv = np.flatnonzero(~waiting)
        if mv.size:
            d = self.target[mv] - p[mv]
            dist = np.hypot(d[:, 0], d[:, 1])
            travel = self.speed[mv] * dt
            arrive = dist <= travel
            frac = np.where(arrive, 1.0, travel / np.maximum(dist, 1e-12))
            p[mv] += d * frac[:, None]
            arrived = mv[arrive]
            if arrived.size:
                p[arrived] = self.target[arrived]
                lo, hi = self.pause_range
                pause = (
                    self.rng.uniform(lo, hi, arrived.size) if hi > lo else np.full(arrived.size, lo)
                )
                self.pause_left[arrived] = pause
                again = arrived[pause <= 0]
                if again.size:
                    self._new_legs(again)
        pos[self.rows] = p


class Carrier(RandomWaypoint):
    """Travels between island discs, pausing at each; ``route`` is ``random`` or ``cycle``."""

    def __init__(
        self,
        rows: slice,
        area: Area,
        rng: np.random.Generator,
        speed: tuple[float, float],
        pause: tuple[float, float],
        islands: list[tuple[tuple[float, float], float]],
        route: str,
    ) -> None:
        super().__init__(rows, area, rng, speed, pause)
        self.islands = islands
        self.route = route
        self.at = np.arange(self.n) % len(islands)

    def place(self, pos: np.ndarray) -> None:
        for i in range(self.n):
            center, radius = self.islands[int(self.at[i])]
            pos[self.rows.start + i] = disc_points(self.rng, 1, center, radius)[0]
        self._new_legs(np.arange(self.n))

    def _targets(self, idx: np.ndarray) -> np.ndarray:
        k = len(self.islands)
        out = np.zeros((idx.size, 2))
        for j, i in enumerate(idx):
            if self.route == "cycle":
                nxt = (int(self.at[i]) + 1) % k
            else:
                nxt = int(self.rng.integers(0, k - 1))
                if nxt >= self.at[i]:
                    nxt += 1
            self.at[i] = nxt
            center, radius = self.islands[nxt]
            out[j] = disc_points(self.rng, 1, center, radius)[0]
        return out
