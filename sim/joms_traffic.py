"""JOMS topic traffic in the simulator: one real JOMS service per host that takes part.

Owns the glue between a simulated host's core node and its :class:`JomsService` (in-memory
store, virtual clock): deliveries for ``joms:`` subscriptions go to the service, the
service's consumers' dispatches become ``delivered`` rows carrying the DoDWAN id of the
message that carried them, and JOMS publications are scheduled, sent and given their
``targets`` rows (hosts whose JOMS subscription, topic plus selector, matches). Queue
traffic is not handled here (see :func:`check_supported`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dodwan.core.events import MessageDelivered
from dodwan.core.node import Node
from joms.service import Destination, JomsMessage, JomsService, MemoryServiceStore
from joms.service.core_port import NodePort
from joms.service.events import MessageDispatched
from joms.service.model import MESSAGE_ID
from joms.service.service import KEY_PREFIX, compile_selector, selector_matches
from sim.logs import Recorder
from sim.scenario import JomsTopic, Scenario
from sim.seeds import py_rng


def check_supported(scenario: Scenario) -> str | None:
    """Why the scenario's JOMS traffic cannot run yet (None: it can)."""
    if scenario.joms_queues:
        names = ", ".join(repr(q.name) for q in scenario.joms_queues)
        return f"JOMS queues are not supported in the simulator yet (scenario uses queue {names})"
    return None


def joms_hosts(scenario: Scenario) -> list[str]:
    """Hosts that publish or subscribe on a JOMS topic, in scenario host order."""
    wanted: set[str] = set()
    for t in scenario.joms_topics:
        wanted.update(scenario.resolve(t.publishers))
        wanted.update(scenario.resolve(t.subscribers))
    return [h for h in scenario.host_names() if h in wanted]


class RecordingPort(NodePort):
    """A :class:`NodePort` that remembers the DoDWAN id and deadline of JMS messages sent."""

    def __init__(self, node: Node, clock: Any) -> None:
        super().__init__(node, clock)
        self.last: tuple[str, float] | None = None

    def publish(
        self,
        attributes: Mapping[str, str],
        payload: bytes,
        *,
        deadline: float,
        priority: int,
        persistent: bool,
    ) -> str:
        mid = super().publish(
            attributes, payload, deadline=deadline, priority=priority, persistent=persistent
        )
        self.last = (mid, deadline)
        return mid


@dataclass(frozen=True, slots=True)
class Sent:
    """A JMS message a publisher sent, with the DoDWAN message carrying it."""

    msg_id: str
    deadline: float
    message: JomsMessage


class JomsHost:
    """The JOMS service of one simulated host and the consumers the scenario gives it."""

    def __init__(self, name: str, node: Node, clock: Any, seed: int, recorder: Recorder) -> None:
        self.name = name
        self.port = RecordingPort(node, clock)
        self.service = JomsService(
            self.port, store=MemoryServiceStore(), rng=py_rng(seed, "joms", name)
        )
        self.recorder = recorder
        self.conn: str | None = None
        self.carrier: dict[str, str] = {}
        """JMSMessageID -> DoDWAN id of the copy the core delivered here."""
        self.received: dict[str, tuple[int, int]] = {}
        """DoDWAN id -> (bytes, hops) from the core's delivery trace."""
        self.dispatched = 0

    def start(self, now: float) -> None:
        self.service.start(now)
        self.conn = self.service.open_connection(now)

    def subscribe(self, entry: int, topic: JomsTopic, now: float) -> None:
        """One consumer for ``topic`` (durable: its own connection with a client id)."""
        svc = self.service
        dest = Destination("topic", topic.name)
        if topic.durable:
            conn = svc.open_connection(now, client_id=f"sim-{self.name}-{entry}")
            svc.subscribe(
                conn, dest, now, selector=topic.selector or None, durable_name=f"t{entry}"
            )
        else:
            assert self.conn is not None
            svc.subscribe(self.conn, dest, now, selector=topic.selector or None)

    def send(self, topic: JomsTopic, body: bytes, now: float) -> Sent | None:
        """Send one JMS bytes message; None when the service refused it."""
        assert self.conn is not None
        msg = JomsMessage(
            destination=Destination("topic", topic.name),
            body=body,
            body_type="bytes",
            properties=dict(topic.properties),
            priority=topic.priority,
            delivery_mode="PERSISTENT" if topic.persistent else "NON_PERSISTENT",
        )
        self.port.last = None
        self.service.send(self.conn, msg, now, time_to_live=topic.ttl)
        if self.port.last is None:
            return None
        mid, deadline = self.port.last
        return Sent(mid, deadline, msg)

    # -- driven by SimHost

    def on_event(self, ev: MessageDelivered, now: float) -> bool:
        """Hand a core delivery to the service; False when it is not a JOMS one."""
        if not ev.subscription.startswith(KEY_PREFIX):
            return False
        jms_id = ev.descriptor.get(MESSAGE_ID)
        mid = ev.descriptor.get("id")
        if jms_id and mid:
            self.carrier.setdefault(jms_id, mid)
        self.service.on_delivery(ev.subscription, ev.descriptor, ev.payload, now)
        return True

    def filter_trace(self, records: list[Any]) -> list[Any]:
        """Drop the core's deliveries to ``joms:`` subscriptions (the consumers' count)."""
        out = []
        for r in records:
            if r.kind == "message_delivered" and str(r.detail).startswith(KEY_PREFIX):
                self.received.setdefault(r.msg_id, (r.size, r.hops))
            else:
                out.append(r)
        return out

    def pump(self, now: float) -> int:
        """Log the consumers' dispatches as ``delivered`` rows; returns how many."""
        n = 0
        while (ev := self.service.next_event()) is not None:
            if not isinstance(ev, MessageDispatched):
                continue
            mid = self.carrier.get(ev.message.message_id)
            if mid is None:  # not carried by a core delivery here (cannot happen for topics)
                continue
            size, hops = self.received.get(mid, (len(ev.message.body), 0))
            self.recorder.row(
                "messages", time=now, host=self.name, msg_id=mid, event="delivered",
                bytes=size, hops=hops,
            )  # fmt: skip
            n += 1
        self.dispatched += n
        return n

    def timer(self) -> float | None:
        return self.service.get_timer()

    def handle_timer(self, now: float) -> None:
        t = self.service.get_timer()
        if t is not None and t <= now + 1e-9:
            self.service.handle_timer(now)


@dataclass(frozen=True, slots=True)
class JomsPublication:
    """One JMS message to send."""

    time: float
    host: int
    entry: int
    """Index into ``scenario.joms_topics``."""
    seq: int


def schedule(
    scenario: Scenario, hosts: list[str], until: float, seed: int
) -> list[JomsPublication]:
    """Every JOMS publication before ``until`` in time order (one stream per entry and host)."""
    index = {h: i for i, h in enumerate(hosts)}
    out: list[JomsPublication] = []
    for e, t in enumerate(scenario.joms_topics):
        for h in scenario.resolve(t.publishers):
            rng = py_rng(seed, "joms-traffic", e, h)
            periodic = t.process == "periodic"
            at = rng.uniform(0.0, t.interval) if periodic else rng.expovariate(1.0 / t.interval)
            seq = 0
            while at < until:
                out.append(JomsPublication(at, index[h], e, seq))
                seq += 1
                at += t.interval if periodic else rng.expovariate(1.0 / t.interval)
    out.sort(key=lambda p: (p.time, p.host, p.entry, p.seq))
    return out


class JomsTargets:
    """Which hosts a JMS message targets: a subscriber entry on its topic whose selector
    matches (the sender's own host excluded, as for DoDWAN traffic)."""

    def __init__(self, scenario: Scenario) -> None:
        self.entries: list[tuple[str, Any, list[str]]] = [
            (t.name, compile_selector(t.selector), scenario.resolve(t.subscribers))
            for t in scenario.joms_topics
            if t.subscribers
        ]
        self.order = {h: i for i, h in enumerate(scenario.host_names())}

    def of(self, msg: JomsMessage, origin: str) -> list[str]:
        out: set[str] = set()
        for topic, sel, hosts in self.entries:
            if topic == msg.destination.name and selector_matches(sel, msg):
                out.update(h for h in hosts if h != origin)
        return sorted(out, key=self.order.__getitem__)


def body_rng(seed: int) -> random.Random:
    """The stream JMS message bodies are drawn from."""
    return py_rng(seed, "joms-payload")
