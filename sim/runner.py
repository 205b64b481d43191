"""One simulation run: build hosts, medium, mobility and traffic, run SimPy, write logs.

``simulate()`` is the library entry point behind ``dodwan-sim run``. Everything random
comes from streams derived from the scenario seed (``sim.seeds``), hosts are visited in
index order and sets in sorted order, so the same scenario and seed give identical tables.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from dodwan import native
from dodwan.core.message import VerifiedPayloads
from dodwan.core.node import CacheFullError
from sim import joms_traffic
from sim.host import Hosts, SimHost
from sim.logs import FLUSH_ROWS, SCHEMA_VERSION, Recorder, write_run_json
from sim.medium import Medium
from sim.mobility.ahead import LinksAhead
from sim.mobility.contacts import link_changes
from sim.mobility.trace import load_trace, map_hosts
from sim.scenario import ContactTrace, JomsQueue, Scenario, input_digests, settings_digest
from sim.seeds import py_rng
from sim.traffic import Publication, Targets, exact_delay, schedule, subscriptions


class SimulationError(Exception):
    """A run that cannot go ahead (unsupported feature, bad trace, ...)."""


@dataclass
class RunResult:
    """What a finished run reports besides its files."""

    out: Path
    until: float
    wall_time: float
    hosts: int
    events: int
    counters: dict[str, int] = field(default_factory=dict)


Progress = Callable[[float, int], None]
"""``progress(now, events)``: simulated time reached and simulation events handled so far."""

CHECKPOINT_EVERY = 10.0
"""Default wall seconds between a run's first checkpoints (see :func:`checkpoint_due`)."""


def checkpoint_due(elapsed: float, every: float) -> float:
    """Wall seconds between two checkpoints of a run that has taken ``elapsed`` so far: a
    tenth of it, at least ``every`` (a killed run loses at most that much, and a long one
    writes a few dozen parts per table, not thousands)."""
    return max(every, elapsed / 10)


class Simulation:
    """A scenario wired up and ready to run (also used directly by tests and benchmarks)."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int | None = None,
        until: float | None = None,
        contacts: ContactTrace | None = None,
        out: Path | None = None,
        flush_rows: int = FLUSH_ROWS,
        catch_up: bool = True,
    ) -> None:
        """With ``out``, logs stream into that folder as the run goes, a part file each
        ``flush_rows`` rows of a table (see ``Recorder``). ``catch_up``: hosts alone run
        their presence timers ahead of the clock (``SimHost._catch_up``; the results are
        the same either way, only faster)."""
        from dodwan import BROADCAST, Node

        self.scenario = scenario
        self.seed = scenario.seed if seed is None else seed
        self.until = float(scenario.duration if until is None else until)
        self.contacts = contacts if contacts is not None else scenario.contacts
        self.env = simpy.Environment()
        self.recorder = Recorder(out, flush_rows=flush_rows)
        self.names = scenario.host_names()
        self.group_of = scenario.group_of()
        self.index = index = {h: i for i, h in enumerate(self.names)}
        self.hosts: list[SimHost] = []
        self.verified = VerifiedPayloads()
        """Shared by every host's node: a copy completed again somewhere, equal to one
        already verified, is not hashed again (same verdict, same results)."""
        self._wiring = Hosts(self.hosts, self.names)
        self.medium = Medium(
            self.env,
            len(self.names),
            scenario.radio.bit_rate,
            scenario.radio.loss,
            py_rng(self.seed, "medium"),
            self._wiring,
            mtu=scenario.radio.mtu,
        )
        joms_names = set(joms_traffic.joms_hosts(scenario))
        for g in scenario.groups:
            for name in g.host_names():
                cfg = g.protocol.node_config(
                    name,
                    max_datagram=scenario.radio.max_datagram,
                    trace=name in joms_names,  # JOMS hosts filter their trace first
                )
                sink = None if name in joms_names else self.recorder.sink(name)
                drains_trace = sink is None
                # The datagrams table holds totals: a host with a sink keeps them in its
                # node (no record per datagram), read at the end (``finish``).
                node = Node(
                    cfg, rng=py_rng(self.seed, "node", name), trace_sink=sink,
                    trace_datagrams=drains_trace, verified=self.verified,
                )  # fmt: skip
                host = SimHost(
                    index[name], name, node, self.env, self.medium, self.recorder, BROADCAST,
                    lambda addr: index.get(str(addr)), drains_trace=drains_trace,
                )  # fmt: skip
                self.hosts.append(host)
        self.medium.on_idle = self._wiring.idle
        self.medium.idle_needed = self._wiring.idle_needed
        self.targets = Targets(scenario)
        self.joms_targets = joms_traffic.JomsTargets(scenario)
        self.joms_publications = joms_traffic.schedule(scenario, self.names, self.until, self.seed)
        self.joms_body_rng = joms_traffic.body_rng(self.seed)
        self.joms_published = 0
        self.joms_consumed: dict[str, str] = {}
        self.queue_targets = joms_traffic.QueueTargets()
        self.finished = False
        for name in joms_traffic.joms_hosts(scenario):
            host = self.hosts[index[name]]
            host.joms = joms_traffic.JomsHost(
                name, host.node, self._now, self.seed, self.recorder, self.joms_consumed
            )
        self.publications = schedule(scenario, self.names, self.until, self.seed)
        self.payload_rng = py_rng(self.seed, "payload")
        self.mobility_steps = 0
        self.published = 0
        self.publish_refused = 0
        for h in self.names:
            self.recorder.row("hosts", host=h, group=self.group_of[h])
        self.link_events: list[tuple[float, int, int, bool]] | None = None
        if self.contacts is not None:  # parse now: a bad trace fails before any work
            self.link_events = map_hosts(
                load_trace(self.contacts.path, self.contacts.format),
                self.names,
                self.contacts.path,
            )
            self.links = LinksAhead.of_events(self.link_events, len(self.names))
        else:
            self.links = LinksAhead.of_steps(link_changes(scenario, self.seed), len(self.names))
        self._next_publication: list[deque[float]] = [deque() for _ in self.names]
        for pub in self.publications:
            self._next_publication[pub.host].append(pub.time)
        if catch_up:
            for host in self.hosts:
                host.quiet = self._quiet
        if out is not None:  # everything above can refuse the run: only now clear ``out``
            self.recorder.begin()

    # -- wiring

    def _joms_of(self, name: str) -> joms_traffic.JomsHost:
        jh = self.hosts[self.index[name]].joms
        assert jh is not None
        return jh

    def _now(self) -> float:
        return float(self.env.now)

    def _link(self, i: int, j: int, up: bool) -> None:
        a, b = self.names[i], self.names[j]
        self.recorder.contact(self.env.now, a, b, up)
        if up:
            self.medium.link_up(i, j)
        else:
            self.medium.link_down(i, j)

    def _apply_links(self, codes: np.ndarray, up: bool) -> None:
        n = len(self.names)
        for c in codes.tolist():
            self._link(c // n, c % n, up)

    # -- processes

    def _quiet(self, i: int, now: float) -> float:
        """A time before which no link of host ``i`` comes up and nothing else touches it
        (no publication of its, the end of the run): see ``SimHost._catch_up``."""
        pubs = self._next_publication[i]
        while pubs and pubs[0] < now:
            pubs.popleft()
        t = self.links.quiet_until(i, now)
        if pubs and pubs[0] < t:
            t = pubs[0]
        return t if t < self.until else self.until

    def _mobility(self) -> Any:
        first = True
        for _t, up, down in self.links.steps():
            if not first:  # link_changes steps by mobility_step, as this timeout does
                self.medium.links_fixed_until = self.env.now + self.scenario.mobility_step
                yield self.env.timeout(self.scenario.mobility_step)
                self.mobility_steps += 1
            first = False
            if down.size:
                self._apply_links(down, False)
            if up.size:
                self._apply_links(up, True)
        self.medium.links_fixed_until = math.inf

    def _replay(self, events: list[tuple[float, int, int, bool]]) -> Any:
        n = len(self.names)
        up_now: set[int] = set()
        for t, i, j, up in events:
            if t > self.env.now:
                self.medium.links_fixed_until = self.env.now + (t - self.env.now)
                yield self.env.timeout(t - self.env.now)
            code = min(i, j) * n + max(i, j)
            if up and code not in up_now:
                up_now.add(code)
                self._link(i, j, True)
            elif not up and code in up_now:
                up_now.discard(code)
                self._link(i, j, False)
        self.medium.links_fixed_until = math.inf

    def _traffic(self) -> Any:
        for pub in self.publications:
            now = self.env.now
            if pub.time > now:
                delay = pub.time - now
                yield self.env.timeout(exact_delay(now, pub.time) if pub.exact else delay)
            self._publish(pub)

    def _publish(self, spec: Publication) -> None:
        host = self.hosts[spec.host]
        now = spec.time if spec.exact else self.env.now
        deadline = now + spec.ttl
        payload = self.payload_rng.randbytes(spec.size)
        attrs = dict(spec.attributes)
        try:
            mid = host.node.publish(
                attrs, payload, deadline=deadline, now=now, priority=spec.priority,
                persistent=spec.persistent,
            )  # fmt: skip
        except (CacheFullError, TypeError, ValueError):
            # What an application sees too: the host refuses it (a full cache, or traffic its
            # own limits refuse, which validation reports). Counted, and the run goes on.
            self.publish_refused += 1
            return
        self.published += 1
        desc = {
            **attrs,
            "id": mid,
            "origin": host.name,
            "deadline": repr(deadline),
            "date": repr(now),
            "size": str(spec.size),
            "priority": str(spec.priority),
            "persistent": "true" if spec.persistent else "false",
        }
        topic = attrs.get("topic")
        for t in self.targets.of(desc, host.name):
            self.recorder.row(
                "targets", msg_id=mid, host=t, origin=host.name, created=now,
                deadline=deadline, topic=topic, group=self.group_of[t],
            )  # fmt: skip
        host.service()

    def _joms_traffic(self) -> Any:
        for pub in self.joms_publications:
            if pub.time > self.env.now:
                yield self.env.timeout(pub.time - self.env.now)
            self._joms_publish(pub.host, pub.entry)

    def _joms_publish(self, h: int, e: int) -> None:
        sc = self.scenario
        n_topics = len(sc.joms_topics)
        entry = sc.joms_topics[e] if e < n_topics else sc.joms_queues[e - n_topics]
        host = self.hosts[h]
        assert host.joms is not None
        now = self.env.now
        body = self.joms_body_rng.randbytes(entry.size)
        sent = host.joms.send(entry, body, now)
        if sent is not None:
            self.joms_published += 1
            if isinstance(entry, JomsQueue):
                self.queue_targets.sent.append(
                    joms_traffic.QueueSent(
                        sent.msg_id, host.name, now, sent.deadline,
                        f"{entry.name}@{entry.manager}", tuple(sc.resolve(entry.receivers)),
                    )
                )  # fmt: skip
            else:
                for t in self.joms_targets.of(sent.message, host.name):
                    self.recorder.row(
                        "targets", msg_id=sent.msg_id, host=t, origin=host.name, created=now,
                        deadline=sent.deadline, topic=entry.name, group=self.group_of[t],
                    )  # fmt: skip
        host.service()

    def _sample_cache(self) -> Any:
        period = self.scenario.cache_sample_period
        while True:
            now = self.env.now
            for host in self.hosts:
                use = host.node.cache_usage()
                self.recorder.row(
                    "cache", time=now, host=host.name, bytes=use["bytes"], messages=use["messages"]
                )
            yield self.env.timeout(period)

    # -- running

    def start(self) -> None:
        """Subscribe, arm every node and start the processes (time 0)."""
        subs = subscriptions(self.scenario)
        for host in self.hosts:
            for patterns in subs[host.name]:
                host.node.subscribe(patterns, now=0.0)
            if host.joms is not None:
                host.joms.start(0.0)
        for e, topic in enumerate(self.scenario.joms_topics):
            for name in self.scenario.resolve(topic.subscribers):
                self._joms_of(name).subscribe(e, topic, 0.0)
        for queue in self.scenario.joms_queues:
            self._joms_of(queue.manager).service.create_queue(queue.name, 0.0)
            for name in self.scenario.resolve(queue.receivers):
                self._joms_of(name).receive(queue, 0.0)
        if self.link_events is not None:
            self.env.process(self._replay(self.link_events))
        else:
            self.env.process(self._mobility())
        self.env.process(self._traffic())
        if self.joms_publications:
            self.env.process(self._joms_traffic())
        self.env.process(self._sample_cache())
        for host in self.hosts:
            host.service()

    def run(
        self,
        progress: Progress | None = None,
        chunks: int = 1000,
        checkpoint: Callable[[], None] | None = None,
        checkpoint_every: float = CHECKPOINT_EVERY,
    ) -> None:
        """Run until ``self.until`` in ``chunks`` slices of simulated time, calling
        ``progress(now, events)`` after each and ``checkpoint()`` after those that end
        :func:`checkpoint_due` wall seconds after the last one. Neither changes the run."""
        self.start()
        # Everything built so far lives for the whole run: keep the collector off it, so
        # each collection walks only what the run allocates (and mostly frees) since.
        gc.collect()
        gc.freeze()
        began = last = time.monotonic()
        try:
            for k in range(1, chunks + 1):
                self.env.run(until=self.until * k / chunks)
                if progress is not None:
                    progress(self.env.now, self.events())
                if checkpoint is not None and k < chunks:
                    wall = time.monotonic()
                    if wall - last >= checkpoint_due(wall - began, checkpoint_every):
                        checkpoint()
                        last = time.monotonic()
        finally:
            gc.unfreeze()
        self.finish()

    def node_totals(self) -> list[tuple[str, dict[str, list[int]], dict[str, list[int]]]]:
        """Datagram totals the nodes keep themselves (hosts with a trace sink), as of now."""
        return [
            (h.name, h.node.datagrams_sent_by_kind, h.node.datagrams_received_by_kind)
            for h in self.hosts
            if not h.drains_trace
        ]

    def finish(self) -> None:
        """Write what is only known at the end: the targets of JOMS queue messages."""
        if self.finished:
            return
        self.finished = True
        for name, sent, received in self.node_totals():  # (see ``SimHost``)
            self.recorder.datagram_totals(name, sent, received)
        for q, host in self.queue_targets.rows(self.joms_consumed):
            self.recorder.row(
                "targets", msg_id=q.msg_id, host=host, origin=q.origin, created=q.created,
                deadline=q.deadline, topic=q.queue, group=self.group_of[host],
            )  # fmt: skip

    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for host in self.hosts:
            for k, v in host.node.counters.items():
                total[k] = total.get(k, 0) + int(v)
        total |= {
            "sim_hosts": len(self.hosts),
            "sim_published": self.published,
            "sim_publish_refused": self.publish_refused,
            "sim_joms_published": self.joms_published,
            "sim_deliveries": sum(h.deliveries for h in self.hosts),
            "sim_timer_fires": sum(h.timer_fires for h in self.hosts),
            "sim_mobility_steps": self.mobility_steps,
            "medium_sent": self.medium.sent,
            "medium_delivered": self.medium.delivered,
            "medium_lost": self.medium.lost,
            "medium_unreachable": self.medium.unreachable,
        }
        for host in self.hosts:
            if host.joms is not None:
                for k, v in host.joms.service.counters.items():
                    total[f"joms_{k}"] = total.get(f"joms_{k}", 0) + v
        for reason, n in sorted(self.recorder.dropped.items()):
            total[f"dropped_{reason}"] = n
        return dict(sorted(total.items()))

    def events(self) -> int:
        """Simulation events handled (datagram arrivals, timer fires, steps, publications)."""
        return (
            self.medium.sent
            + sum(h.timer_fires for h in self.hosts)
            + (self.mobility_steps + self.published + self.joms_published)
        )


def simulate(
    scenario: Scenario,
    out: Path,
    *,
    seed: int | None = None,
    until: float | None = None,
    contacts: ContactTrace | None = None,
    progress: Progress | None = None,
    checkpoint_every: float = CHECKPOINT_EVERY,
) -> RunResult:
    """Run a scenario and write its tables and ``run.json`` into ``out``.

    The tables stream into ``out`` as the run goes, and ``run.json`` is written first with
    ``"complete": false`` and the counters left empty. Every ``checkpoint_every`` seconds
    of wall time (a tenth of the time taken once that is more: :func:`checkpoint_due`) every
    table gets what was recorded so far and ``run.json`` the simulated time ``reached``; a
    run stopped by an exception (Ctrl-C, SIGTERM turned into one by the CLI) writes the
    same on its way out. So a run that is stopped part-way keeps what it wrote, says so,
    and can be analysed up to where it got. Nothing in ``out`` is touched when the scenario
    or its trace is refused before the run starts.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg_version = version("dodwan")
    except PackageNotFoundError:  # running from a source tree
        pkg_version = "0+unknown"
    t0 = time.perf_counter()
    sim = Simulation(scenario, seed=seed, until=until, contacts=contacts, out=out)
    inputs = input_digests(scenario, sim.contacts)
    fmt = sim.contacts.format if sim.contacts else None
    info: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "scenario": scenario.name,
        "scenario_file": str(scenario.source) if scenario.source else "",
        "seed": sim.seed,
        "until": sim.until,
        "version": pkg_version,
        "core": "compiled" if native.active() else "python",
        "cache_sample_period": scenario.cache_sample_period,
        "contacts_trace": str(sim.contacts.path) if sim.contacts else None,
        "inputs": inputs,
        "settings_sha256": settings_digest(scenario, inputs, fmt),
        "complete": False,
        "reached": 0.0,
    }
    write_run_json(out, info)

    def checkpoint() -> None:
        sim.recorder.checkpoint(sim.node_totals())
        write_run_json(out, {**info, "reached": sim.env.now})

    try:
        sim.run(progress, checkpoint=checkpoint, checkpoint_every=checkpoint_every)
    except BaseException:
        if not sim.finished:  # stopped part-way: keep what was recorded, say how far
            with contextlib.suppress(OSError):  # the error raised goes on, not this one
                checkpoint()
        raise
    sim.recorder.close()
    wall = time.perf_counter() - t0
    counters = sim.counters()
    write_run_json(
        out,
        {**info, "complete": True, "reached": sim.until, "wall_time": wall, "counters": counters},
    )
    return RunResult(out, sim.until, wall, len(sim.hosts), sim.events(), counters)
