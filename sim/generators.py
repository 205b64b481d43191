"""ONE-style message generators (The ONE's ``MessageEventGenerator``), drawn up front.

Each ``[[traffic.generate]]`` entry has its own random stream (``sim.seeds``, labelled by
the entry's name). The first message comes one uniform ``interval`` after ``start``, each
next one a fresh uniform ``interval`` later, until ``stop``. Per message, in this order:
the source (uniform over ``sources``), the destination (uniform over ``destinations``,
drawn again while it is the source; mode ``one`` only), the size (uniform integer in
``size``, bounds included) and the TTL (uniform in ``ttl``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from sim.scenario import Generate


@dataclass(frozen=True, slots=True)
class Generated:
    """One generated message."""

    time: float
    source: str
    destination: str | None
    """The one destination (mode ``one``), None when addressed to all (mode ``all``)."""
    size: int
    ttl: float


def draw(
    gen: Generate, sources: list[str], destinations: list[str], rng: random.Random, stop: float
) -> Iterator[Generated]:
    """The messages of one generator entry published before ``stop``."""
    lo, hi = gen.interval
    t = gen.start + rng.uniform(lo, hi)
    while t < stop:
        src = rng.choice(sources)
        dst: str | None = None
        if gen.mode == "one":
            dst = rng.choice(destinations)
            while dst == src:  # the validator made sure another destination exists
                dst = rng.choice(destinations)
        size = rng.randint(*gen.size)
        ttl = rng.uniform(*gen.ttl)
        yield Generated(t, src, dst, size, ttl)
        t += rng.uniform(lo, hi)


def literal(value: str) -> str:
    """A regex (RE2, matched in full) that matches exactly ``value``."""
    return re.sub(r"([^A-Za-z0-9_-])", r"\\\1", value)
