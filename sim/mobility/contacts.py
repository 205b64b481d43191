"""Contacts made by a scenario's own mobility: the link changes step by step, and a trace.

``link_changes`` is the one definition of which links come up and go down as the hosts
move (the simulator's mobility process replays it live); ``write_one_trace`` stores it in
The ONE's connectivity format so a workload can be replayed, shared or compared with other
simulators on exactly the same contacts.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim import grid
from sim.mobility.base import build_world

if TYPE_CHECKING:
    from sim.scenario import Scenario

_NONE = np.zeros(0, dtype=np.int64)


def link_changes(
    scenario: Scenario, seed: int, until: float | None = None
) -> Iterator[tuple[float, np.ndarray, np.ndarray]]:
    """``(time, up, down)`` per mobility step: codes ``i * n + j`` of links that came up and
    went down (first at time 0: every link in range). Endless for moving worlds unless
    ``until`` is given; times add ``mobility_step`` as the simulator's clock does."""
    world = build_world(scenario, seed)
    radius, dt = scenario.radio.range, scenario.mobility_step
    current = grid.links(world.pos, radius)
    yield 0.0, current, _NONE
    if not world.moving:
        return
    t = 0.0
    while until is None or t + dt <= until:
        t += dt
        world.step(dt)
        new = grid.links(world.pos, radius)
        up, down = grid.diff(current, new)
        yield t, up, down
        current = new


def write_one_trace(scenario: Scenario, seed: int, until: float, path: Path) -> int:
    """Write the contacts of ``scenario``'s mobility up to ``until`` as a ONE connectivity
    trace (hosts as 0-based indices in scenario order; gzip-compressed when ``path`` ends
    in ``.gz``); links still up at ``until`` are closed then. Returns the contacts."""
    n = len(scenario.host_names())
    opener = gzip.open if path.suffix == ".gz" else open
    contacts = 0
    up_now: set[int] = set()
    with opener(path, "wt", encoding="utf-8") as f:  # type: ignore[operator]
        for t, up, down in link_changes(scenario, seed, until):
            for c in down.tolist():
                f.write(f"{t!r} CONN {c // n} {c % n} down\n")
                up_now.discard(c)
            for c in up.tolist():
                f.write(f"{t!r} CONN {c // n} {c % n} up\n")
                up_now.add(c)
                contacts += 1
        for c in sorted(up_now):
            f.write(f"{float(until)!r} CONN {c // n} {c % n} down\n")
    return contacts
