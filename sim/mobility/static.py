"""Models that never move: ``static`` (given or random positions) and ``island`` (a disc)."""

from __future__ import annotations

import numpy as np

from sim.mobility.base import Area, Model


class Static(Model):
    """Hosts at explicit positions, or uniformly spread over the area."""

    def __init__(
        self,
        rows: slice,
        area: Area,
        rng: np.random.Generator,
        positions: tuple[tuple[float, float], ...] = (),
    ) -> None:
        super().__init__(rows, area, rng)
        self.positions = positions

    def place(self, pos: np.ndarray) -> None:
        if self.positions:
            pos[self.rows] = np.asarray(self.positions, dtype=np.float64)
        else:
            super().place(pos)


def disc_points(
    rng: np.random.Generator, n: int, center: tuple[float, float], radius: float
) -> np.ndarray:
    """``n`` points uniformly distributed in a disc."""
    r = radius * np.sqrt(rng.uniform(0.0, 1.0, n))
    a = rng.uniform(0.0, 2 * np.pi, n)
    return np.column_stack((center[0] + r * np.cos(a), center[1] + r * np.sin(a)))


class Island(Model):
    """A stationary cluster: hosts uniformly placed in a disc around ``center``."""

    def __init__(
        self,
        rows: slice,
        area: Area,
        rng: np.random.Generator,
        center: tuple[float, float],
        radius: float,
    ) -> None:
        super().__init__(rows, area, rng)
        self.center = center
        self.radius = radius

    def place(self, pos: np.ndarray) -> None:
        pos[self.rows] = disc_points(self.rng, self.n, self.center, self.radius)
