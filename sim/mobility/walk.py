"""Random walk: straight legs of random heading, speed and duration, reflected at the edges."""

from __future__ import annotations

import numpy as np

from sim.mobility.base import Area, Model


class RandomWalk(Model):
    """Each host walks a leg (uniform duration in ``leg``) then draws a new heading/speed."""

    moving = True

    def __init__(
        self,
        rows: slice,
        area: Area,
        rng: np.random.Generator,
        speed: tuple[float, float],
        leg: tuple[float, float],
    ) -> None:
        super().__init__(rows, area, rng)
        self.speed_range = speed
        self.leg_range = leg
        self.vel = np.zeros((self.n, 2))
        self.left = np.zeros(self.n)
        self._new_legs(np.arange(self.n))

    def _new_legs(self, idx: np.ndarray) -> None:
        k = idx.size
        heading = self.rng.uniform(0.0, 2 * np.pi, k)
        speed = self.rng.uniform(*self.speed_range, k)
        self.vel[idx, 0] = speed * np.cos(heading)
        self.vel[idx, 1] = speed * np.sin(heading)
        self.left[idx] = np.maximum(self.rng.uniform(*self.leg_range, k), 1e-9)

    def step(self, pos: np.ndarray, dt: float) -> None:
        p = pos[self.rows]
        p += self.vel * dt
        x0, y0, x1, y1 = self.area
        for axis, lo, hi in ((0, x0, x1), (1, y0, y1)):
            c = p[:, axis]
            low = c < lo
            if low.any():
                c[low] = 2 * lo - c[low]
                self.vel[low, axis] *= -1
            high = c > hi
            if high.any():
                c[high] = 2 * hi - c[high]
                self.vel[high, axis] *= -1
            np.clip(c, lo, hi, out=c)
        pos[self.rows] = p
        self.left -= dt
        done = np.flatnonzero(self.left <= 0)
        if done.size:
            self._new_legs(done)
