"""The mobility world: the positions array, the model interface and the factory."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sim.seeds import np_rng

if TYPE_CHECKING:
    from sim.scenario import Group, Scenario

Area = tuple[float, float, float, float]


class Model:
    """Moves the rows ``rows`` of the shared positions array; subclasses override ``step``."""

    moving = False
    """Whether ``step`` can ever change a position."""

    def __init__(self, rows: slice, area: Area, rng: np.random.Generator) -> None:
        self.rows = rows
        self.area = area
        self.rng = rng
        self.n = rows.stop - rows.start

    def place(self, pos: np.ndarray) -> None:
        """Set initial positions (default: uniform in the area)."""
        x0, y0, x1, y1 = self.area
        pos[self.rows, 0] = self.rng.uniform(x0, x1, self.n)
        pos[self.rows, 1] = self.rng.uniform(y0, y1, self.n)

    def step(self, pos: np.ndarray, dt: float) -> None:
        """Advance ``dt`` seconds, updating ``pos[self.rows]`` in place."""


class World:
    """All host positions and the models that move them."""

    def __init__(self, width: float, height: float, n: int) -> None:
        self.width = width
        self.height = height
        self.pos = np.zeros((n, 2), dtype=np.float64)
        self.models: list[Model] = []

    @property
    def moving(self) -> bool:
        return any(m.moving for m in self.models)

    def step(self, dt: float) -> None:
        for m in self.models:
            if m.moving:
                m.step(self.pos, dt)


def build_world(scenario: Scenario, seed: int | None = None) -> World:
    """Create every group's model, place the hosts and return the world (``seed`` overrides)."""
    seed = scenario.seed if seed is None else seed
    from sim.maps import load_map, route_stops
    from sim.mobility.onmap import MapRoute, MapWalk
    from sim.mobility.static import Island, Static
    from sim.mobility.walk import RandomWalk
    from sim.mobility.waypoint import Carrier, RandomWaypoint
    from sim.scenario import MAP_MODELS, STOP_TOLERANCE

    width, height = scenario.world
    world = World(width, height, sum(g.count for g in scenario.groups))
    groups = {g.name: g for g in scenario.groups}
    roads = load_map(scenario.map_layers) if scenario.map_layers else None
    start = 0
    for g in scenario.groups:
        rows = slice(start, start + g.count)
        start += g.count
        spec = g.mobility
        area: Area = spec.area or (0.0, 0.0, width, height)
        rng = np_rng(seed, "mobility", g.name)
        model: Model
        if spec.model == "static":
            model = Static(rows, area, rng, spec.positions)
        elif spec.model == "island":
            model = Island(rows, area, rng, spec.center, spec.radius)
        elif spec.model == "random_waypoint":
            model = RandomWaypoint(rows, area, rng, spec.speed, spec.pause)
        elif spec.model == "random_walk":
            model = RandomWalk(rows, area, rng, spec.speed, spec.leg)
        elif spec.model == "carrier":
            isl: list[Group] = [groups[name] for name in spec.islands]
            discs = [(i.mobility.center, i.mobility.radius) for i in isl]
            model = Carrier(rows, area, rng, spec.speed, spec.pause, discs, spec.route)
        elif spec.model in MAP_MODELS and roads is not None:
            mask = roads.mask(spec.layers)
            if spec.model == "map":
                model = MapWalk(rows, area, rng, roads, mask, spec.speed, spec.pause)
            else:
                assert spec.stops is not None
                stops = route_stops(roads, spec.stops, mask, STOP_TOLERANCE)
                back = spec.route == "back_and_forth"
                model = MapRoute(rows, area, rng, roads, mask, spec.speed, spec.pause, stops, back)
        else:  # pragma: no cover - the validator only lets known models through
            raise ValueError(f"unknown mobility model {spec.model!r}")
        model.place(world.pos)
        world.models.append(model)
    warm, dt = scenario.mobility_warmup, scenario.mobility_step
    if warm > 0 and world.moving:
        for _ in range(math.ceil(warm / dt - 1e-9)):
            world.step(dt)
    return world
