"""Traffic: when each publisher publishes, what each host subscribes to, who is a target.

Publication times are drawn up front from one random stream per (publish entry, host)
(``periodic``: a random phase then every ``interval``; ``poisson``: exponential gaps of
mean ``interval``), so adding a host never shifts another host's schedule. ``at`` times,
generated messages (``sim.generators``, one stream per generator entry) and external
events (``sim.external_events``) join the same schedule. Subscriptions are static: made
at time 0 and kept for the whole run, so a host is a target of a message exactly when its
profile matches the message's descriptor (and it is not the origin). Destinations of
generators and external events subscribe to their address automatically.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from dodwan.core.patterns import Profile
from sim import generators
from sim.external_events import EVENT_ID
from sim.scenario import Publish, Scenario
from sim.seeds import py_rng


@dataclass(frozen=True, slots=True)
class Publication:
    """One message to publish."""

    time: float
    host: int
    """Host index."""
    spec: int
    """Traffic entry: an index into ``scenario.publish``, then ``generate``, then
    ``external`` (numbered on from ``len(scenario.publish)``)."""
    seq: int
    """Running number of this (spec, host) pair (of the entry for generated and external)."""
    attributes: Mapping[str, str]
    size: int
    ttl: float
    priority: int = 4
    persistent: bool = True
    exact: bool = False
    """Published at exactly ``time`` (``at``, generated and external messages: the message
    is created at ``time`` and the clock reaches it as closely as floating point allows, see
    :func:`exact_delay`); periodic and Poisson arrivals keep their historical scheduling."""


def schedule(
    scenario: Scenario, hosts: list[str], until: float, seed: int | None = None
) -> list[Publication]:
    """Every publication before ``until``, in time order (ties: host then spec order)."""
    seed = scenario.seed if seed is None else seed
    index = {h: i for i, h in enumerate(hosts)}
    out: list[Publication] = []
    for s, pub in enumerate(scenario.publish):
        stop = min(until, pub.stop if pub.stop is not None else until)
        for h in scenario.resolve(pub.hosts):
            out.extend(_times(seed, s, pub, index[h], h, stop))
    s = len(scenario.publish)
    for gen in scenario.generate:
        stop = min(until, gen.stop if gen.stop is not None else until)
        rng = py_rng(seed, "generate", gen.name)
        sources = scenario.resolve(gen.sources)
        dests = scenario.resolve(gen.destinations)
        shared = {**gen.attributes, gen.attribute: gen.name}
        for seq, m in enumerate(generators.draw(gen, sources, dests, rng, stop)):
            attrs = shared if m.destination is None else {
                **gen.attributes, gen.attribute: m.destination
            }  # fmt: skip
            out.append(
                Publication(
                    m.time, index[m.source], s, seq, attrs, m.size, m.ttl, gen.priority,
                    gen.persistent, exact=True,
                )
            )  # fmt: skip
        s += 1
    for ext in scenario.external:
        for seq, c in enumerate(ext.events):
            if c.time < until:
                attrs = {**ext.attributes, ext.attribute: c.destination, EVENT_ID: c.msg_id}
                out.append(
                    Publication(
                        c.time, index[c.source], s, seq, attrs, c.size, ext.ttl, ext.priority,
                        ext.persistent, exact=True,
                    )
                )  # fmt: skip
        s += 1
    out.sort(key=lambda p: (p.time, p.host, p.spec, p.seq))
    return out


def _times(seed: int, s: int, pub: Publish, host: int, name: str, stop: float) -> list[Publication]:
    if pub.at:
        exact = sorted(t for t in pub.at if t < stop)
        return [
            Publication(
                t, host, s, seq, pub.attributes, pub.size, pub.ttl, pub.priority,
                pub.persistent, exact=True,
            )
            for seq, t in enumerate(exact)
        ]  # fmt: skip
    rng = py_rng(seed, "traffic", s, name)
    times = arrival_times(rng, pub.process, pub.interval, pub.start, stop)
    return [
        Publication(
            t, host, s, seq, pub.attributes, pub.size, pub.ttl, pub.priority, pub.persistent
        )
        for seq, t in enumerate(times)
    ]


def arrival_times(
    rng: random.Random, process: str, interval: float, start: float, stop: float
) -> Iterator[float]:
    """Publication times in [start, stop) of one ``periodic`` or ``poisson`` stream."""
    periodic = process == "periodic"
    t = start + (rng.uniform(0.0, interval) if periodic else rng.expovariate(1.0 / interval))
    while t < stop:
        yield t
        t += interval if periodic else rng.expovariate(1.0 / interval)


def exact_delay(now: float, t: float) -> float:
    """The smallest delay ``d`` with ``now + d >= t`` in floating point: SimPy's clock then
    reads exactly ``t`` whenever some ``now + d`` rounds to ``t`` (rounding may skip it; the
    clock then reads the next float after ``t``, and the publication still carries ``t``)."""
    d = t - now
    for _ in range(64):  # each step moves the sum by about one ulp; a few always suffice
        if now + d < t:
            d = math.nextafter(d, math.inf)
        elif now + math.nextafter(d, -math.inf) >= t:
            d = math.nextafter(d, -math.inf)
        else:
            break
    return d


def as_events(
    scenario: Scenario, publications: list[Publication]
) -> list[tuple[float, str, int, int, int]]:
    """The generated and external messages of a schedule as external-events rows ``(time,
    id, from, to, size)`` (host indices; ids ``M1``, ``M2``, … in schedule order), for
    :func:`sim.external_events.write`. Messages to all destinations (mode ``all``) and
    ``[[traffic.publish]]`` messages have no single destination and are left out."""
    index = {h: i for i, h in enumerate(scenario.host_names())}
    first = len(scenario.publish)
    ends = first + len(scenario.generate)
    address_of = {
        first + i: g.attribute for i, g in enumerate(scenario.generate) if g.mode == "one"
    }
    address_of |= {ends + i: e.attribute for i, e in enumerate(scenario.external)}
    rows: list[tuple[float, str, int, int, int]] = []
    for p in publications:
        attr = address_of.get(p.spec)
        if attr is not None:
            rows.append((p.time, f"M{len(rows) + 1}", p.host, index[p.attributes[attr]], p.size))
    return rows


def address_subscriptions(scenario: Scenario) -> dict[str, list[dict[str, str]]]:
    """Host -> the address patterns it subscribes to (generator and external-event
    destinations, each pattern once)."""
    subs: dict[str, list[dict[str, str]]] = {}

    def add(host: str, attribute: str, value: str) -> None:
        pattern = {attribute: generators.literal(value)}
        mine = subs.setdefault(host, [])
        if pattern not in mine:
            mine.append(pattern)

    for gen in scenario.generate:
        for h in scenario.resolve(gen.destinations):
            add(h, gen.attribute, h if gen.mode == "one" else gen.name)
    for ext in scenario.external:
        for c in ext.events:
            add(c.destination, ext.attribute, c.destination)
    return subs


def subscriptions(scenario: Scenario) -> dict[str, list[list[dict[str, str]]]]:
    """Host -> the pattern lists it subscribes with (one subscription per traffic entry)."""
    subs: dict[str, list[list[dict[str, str]]]] = {h: [] for h in scenario.host_names()}
    for sub in scenario.subscribe:
        for h in scenario.resolve(sub.hosts):
            subs[h].append([dict(p) for p in sub.patterns])
    for h, patterns in address_subscriptions(scenario).items():
        subs[h].extend([p] for p in patterns)
    return subs


class Targets:
    """Finds the hosts whose static subscriptions match a descriptor."""

    def __init__(self, scenario: Scenario) -> None:
        subs = subscriptions(scenario)
        groups: dict[Profile, list[str]] = {}
        for h in scenario.host_names():
            specs = [p for s in subs[h] for p in s]
            if not specs:
                continue
            prof = Profile.from_patterns(specs)
            groups.setdefault(prof, []).append(h)
        self.by_profile = list(groups.items())
        self.order = {h: i for i, h in enumerate(scenario.host_names())}

    def of(self, descriptor: dict[str, str], origin: str) -> list[str]:
        """Target hosts of a message, in scenario host order, the origin excluded."""
        out: list[str] = []
        for prof, hosts in self.by_profile:
            if prof.matches(descriptor):
                out.extend(h for h in hosts if h != origin)
        return sorted(out, key=self.order.__getitem__)
