"""Traffic: when each publisher publishes, what each host subscribes to, who is a target.

Publication times are drawn up front from one random stream per (publish entry, host)
(``periodic``: a random phase then every ``interval``; ``poisson``: exponential gaps of
mean ``interval``), so adding a host never shifts another host's schedule. Subscriptions
are static: made at time 0 and kept for the whole run, so a host is a target of a message
exactly when its profile matches the message's descriptor (and it is not the origin).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from dodwan.core.patterns import Profile
from sim.scenario import Publish, Scenario
from sim.seeds import py_rng


@dataclass(frozen=True, slots=True)
class Publication:
    """One message to publish."""

    time: float
    host: int
    """Host index."""
    spec: int
    """Index into ``scenario.publish``."""
    seq: int
    """Running number of this (spec, host) pair."""


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
    out.sort(key=lambda p: (p.time, p.host, p.spec, p.seq))
    return out


def _times(seed: int, s: int, pub: Publish, host: int, name: str, stop: float) -> list[Publication]:
    rng = py_rng(seed, "traffic", s, name)
    times = arrival_times(rng, pub.process, pub.interval, pub.start, stop)
    return [Publication(t, host, s, seq) for seq, t in enumerate(times)]


def arrival_times(
    rng: random.Random, process: str, interval: float, start: float, stop: float
) -> Iterator[float]:
    """Publication times in [start, stop) of one ``periodic`` or ``poisson`` stream."""
    periodic = process == "periodic"
    t = start + (rng.uniform(0.0, interval) if periodic else rng.expovariate(1.0 / interval))
    while t < stop:
        yield t
        t += interval if periodic else rng.expovariate(1.0 / interval)


def subscriptions(scenario: Scenario) -> dict[str, list[list[dict[str, str]]]]:
    """Host -> the pattern lists it subscribes with (one subscription per traffic entry)."""
    subs: dict[str, list[list[dict[str, str]]]] = {h: [] for h in scenario.host_names()}
    for sub in scenario.subscribe:
        for h in scenario.resolve(sub.hosts):
            subs[h].append([dict(p) for p in sub.patterns])
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
