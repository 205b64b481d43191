"""Movement along a road map (``sim.maps``): ``map`` and ``map_route``.

``map`` (The ONE's shortest-path map-based movement): a host starts at a random node,
walks the shortest path to another random node at a speed drawn for the trip, pauses
there (uniform in ``pause``), and sets off again. ``map_route`` (The ONE's map route
movement, for trams and buses): a host follows a fixed list of stops, each reached by the
shortest path from the previous one, pausing at every stop; at the end it starts over
(``cycle``) or turns back (``back_and_forth``). Each group moves only on the map layers it
is given.

A host covers exactly speed * dt in a step, carried on through as many nodes of its path
as that takes, so short segments do not slow it down.
"""

from __future__ import annotations

import numpy as np

from sim.maps import RoadMap
from sim.mobility.base import Area, Model


class MapWalk(Model):
    """Shortest paths between random nodes."""

    moving = True

    def __init__(
        self,
        rows: slice,
        area: Area,
        rng: np.random.Generator,
        roads: RoadMap,
        mask: int,
        speed: tuple[float, float],
        pause: tuple[float, float],
    ) -> None:
        super().__init__(rows, area, rng)
        self.roads = roads
        self.mask = mask
        self.speed_range = speed
        self.pause_range = pause
        self.nodes = roads.component(mask)
        self.at = np.zeros(self.n, dtype=np.int64)
        """The node each host last passed."""
        self.ahead: list[list[int]] = [[] for _ in range(self.n)]
        """The nodes each host still has to pass, the next first."""
        self.speed = np.zeros(self.n)
        self.pause_left = np.zeros(self.n)
        self.target = np.zeros((self.n, 2))

    def place(self, pos: np.ndarray) -> None:
        self.at[:] = self.nodes[self.rng.integers(0, self.nodes.size, self.n)]
        pos[self.rows] = self.roads.xy[self.at]
        for k in range(self.n):
            self._set_off(k)

    def _destination(self, k: int) -> int:
        """The next node host ``k`` heads for."""
        nodes = self.nodes
        if nodes.size < 2:
            return int(self.at[k])
        while True:
            dst = int(nodes[self.rng.integers(0, nodes.size)])
            if dst != self.at[k]:
                return dst

    def _set_off(self, k: int) -> None:
        """Draw host ``k``'s next trip and its speed."""
        self.ahead[k] = self.roads.path(int(self.at[k]), self._destination(k), self.mask)
        lo, hi = self.speed_range
        self.speed[k] = self.rng.uniform(lo, hi) if hi > lo else lo
        self.target[k] = self.roads.xy[self.ahead[k][0] if self.ahead[k] else self.at[k]]

    def _pause(self) -> float:
        lo, hi = self.pause_range
        return float(self.rng.uniform(lo, hi)) if hi > lo else lo

    def step(self, pos: np.ndarray, dt: float) -> None:
        p = pos[self.rows]
        waiting = self.pause_left > 0
        if waiting.any():
            self.pause_left[waiting] -= dt
            for k in np.flatnonzero(waiting & (self.pause_left <= 0)).tolist():
                self._set_off(k)
        mv = np.flatnonzero(~waiting)
        if mv.size:
            d = self.target[mv] - p[mv]
            dist = np.hypot(d[:, 0], d[:, 1])
            travel = self.speed[mv] * dt
            short = dist > travel
            on = mv[short]
            p[on] += d[short] * (travel[short] / dist[short])[:, None]
            for j in np.flatnonzero(~short).tolist():
                self._go_through(int(mv[j]), p, float(travel[j]))
        pos[self.rows] = p

    def _go_through(self, k: int, p: np.ndarray, travel: float) -> None:
        """Host ``k`` reaches its next node this step: move it on along its path by what
        is left of ``travel``; at the end of the path it pauses (or sets off at once)."""
        xy, ahead = self.roads.xy, self.ahead[k]
        x, y = float(p[k, 0]), float(p[k, 1])
        while ahead:
            nx, ny = float(xy[ahead[0], 0]), float(xy[ahead[0], 1])
            seg = float(np.hypot(nx - x, ny - y))
            if seg > travel:
                f = travel / seg
                x, y = x + (nx - x) * f, y + (ny - y) * f
                self.target[k] = (nx, ny)
                p[k] = (x, y)
                return
            travel -= seg
            x, y = nx, ny
            self.at[k] = ahead.pop(0)
        p[k] = (x, y)
        pause = self._pause()
        self.pause_left[k] = pause
        if pause <= 0:
            self._set_off(k)


class MapRoute(MapWalk):
    """A fixed route of stops (nodes), in order, pausing at each."""

    def __init__(
        self,
        rows: slice,
        area: Area,
        rng: np.random.Generator,
        roads: RoadMap,
        mask: int,
        speed: tuple[float, float],
        pause: tuple[float, float],
        stops: list[int],
        back_and_forth: bool,
    ) -> None:
        super().__init__(rows, area, rng, roads, mask, speed, pause)
        self.stops = stops
        self.back_and_forth = back_and_forth
        self.stop = np.zeros(self.n, dtype=np.int64)
        """Index in ``stops`` of the stop each host heads for (or is at)."""
        self.way = np.ones(self.n, dtype=np.int64)
        """+1 or -1: the direction each host goes along a back-and-forth route."""

    def place(self, pos: np.ndarray) -> None:
        self.stop[:] = self.rng.integers(0, len(self.stops), self.n)
        self.at[:] = [self.stops[int(i)] for i in self.stop]
        pos[self.rows] = self.roads.xy[self.at]
        for k in range(self.n):
            self._set_off(k)

    def _destination(self, k: int) -> int:
        n, i = len(self.stops), int(self.stop[k])
        if n < 2:
            return self.stops[0]
        if not self.back_and_forth:
            i = (i + 1) % n
        else:
            if not 0 <= i + int(self.way[k]) < n:
                self.way[k] = -self.way[k]
            i += int(self.way[k])
        self.stop[k] = i
        return self.stops[i]
