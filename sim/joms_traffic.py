"""JOMS topic traffic in the simulator: one real JOMS service per host that takes part.

Owns the glue between a simulated host's core node and its :class:`JomsService` (in-memory
store, virtual clock): deliveries for ``joms:`` subscriptions go to the service, the
service's consumers' dispatches become ``delivered`` rows carrying the DoDWAN id of the
message that carried them, and JOMS publications are scheduled, sent and given their
``targets`` rows (hosts whose JOMS subscription, topic plus selector, matches). Queue
messages are logged under the DoDWAN id of the sender's original (a receiver consumes the
manager's re-published copy); their one target is decided at the end of the run (see
:class:`QueueTargets`).
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
from joms.service.model import COPY_OF, MESSAGE_ID
from joms.service.service import KEY_PREFIX, compile_selector, selector_matches
from sim.logs import Recorder
from sim.scenario import JomsQueue, JomsTopic, Scenario
from sim.seeds import py_rng
from sim.traffic import arrival_times


def joms_hosts(scenario: Scenario) -> list[str]:
    """Hosts that publish or subscribe on a JOMS topic, in scenario host order."""
    wanted: set[str] = set()
    for t in scenario.joms_topics:
        wanted.update(scenario.resolve(t.publishers))
        wanted.update(scenario.resolve(t.subscribers))
    for q in scenario.joms_queues:
        wanted.add(q.manager)
        wanted.update(scenario.resolve(q.senders))
        wanted.update(scenario.resolve(q.receivers))
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
        if self.last is None:  # the message itself, not what a local manager hands out
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

    def __init__(
        self,
        name: str,
        node: Node,
        clock: Any,
        seed: int,
        recorder: Recorder,
        consumed: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = RecordingPort(node, clock)
        self.service = JomsService(
            self.port, store=MemoryServiceStore(), rng=py_rng(seed, "joms", name)
        )
        self.recorder = recorder
        self.conn: str | None = None
        self.carrier: dict[str, tuple[str, str]] = {}
        """JMSMessageID -> (DoDWAN id logged, DoDWAN id of the copy the core delivered here);
        they differ for a queue message: the original's id is logged."""
        self.consumed = consumed if consumed is not None else {}
        """Shared by all hosts: logged DoDWAN id -> first host whose consumer got it."""
        self.received: dict[str, tuple[int, int]] = {}
        """DoDWAN id -> (bytes, hops) from the core's delivery trace."""
        self.consumers: list[str] = []
        """Consumer ids the scenario created here, in creation order."""

    def start(self, now: float) -> None:
        self.service.start(now)
        self.conn = self.service.open_connection(now)

    def subscribe(self, entry: int, topic: JomsTopic, now: float) -> None:
        """One consumer for ``topic`` (durable: its own connection with a client id)."""
        svc = self.service
        dest = Destination("topic", topic.name)
        if topic.durable:
            conn = svc.open_connection(now, client_id=f"sim-{self.name}-{entry}")
            cid = svc.subscribe(
                conn, dest, now, selector=topic.selector or None, durable_name=f"t{entry}"
            )
        else:
            assert self.conn is not None
            cid = svc.subscribe(self.conn, dest, now, selector=topic.selector or None)
        self.consumers.append(cid)

    def receive(self, queue: JomsQueue, now: float) -> None:
        """One auto-acknowledging receiver on ``queue``."""
        assert self.conn is not None
        dest = Destination("queue", f"{queue.name}@{queue.manager}")
        self.consumers.append(self.service.subscribe(self.conn, dest, now))

    def send(self, topic: JomsTopic | JomsQueue, body: bytes, now: float) -> Sent | None:
        """Send one JMS bytes message; None when the service refused it."""
        assert self.conn is not None
        if isinstance(topic, JomsQueue):
            dest = Destination("queue", f"{topic.name}@{topic.manager}")
            props: dict[str, Any] = {}
            priority, persistent = 4, True
        else:
            dest = Destination("topic", topic.name)
            props, priority, persistent = dict(topic.properties), topic.priority, topic.persistent
        msg = JomsMessage(
            destination=dest,
            body=body,
            body_type="bytes",
            properties=props,
            priority=priority,
            delivery_mode="PERSISTENT" if persistent else "NON_PERSISTENT",
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
            logged = ev.descriptor.get(COPY_OF) or mid
            if jms_id not in self.carrier or logged != mid:  # a queue copy wins
                self.carrier[jms_id] = (logged, mid)
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
            ids = self.carrier.get(ev.message.message_id)
            if ids is None:  # not carried by a core delivery here (cannot happen)
                continue
            mid, core_id = ids
            size, hops = self.received.get(core_id, (len(ev.message.body), 0))
            self.consumed.setdefault(mid, self.name)
            self.recorder.message(now, self.name, mid, "delivered", size, hops)
            n += 1
        self.service.settle(now)  # the application has them: auto-mode ones are consumed
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
    """Index into ``scenario.joms_topics``, then (from ``len(joms_topics)`` on) into
    ``scenario.joms_queues``."""
    seq: int


def schedule(
    scenario: Scenario, hosts: list[str], until: float, seed: int
) -> list[JomsPublication]:
    """Every JOMS publication before ``until`` in time order (one stream per entry and host)."""
    index = {h: i for i, h in enumerate(hosts)}
    out: list[JomsPublication] = []
    entries: list[tuple[tuple[str, ...], float, str]] = [
        (t.publishers, t.interval, t.process) for t in scenario.joms_topics
    ] + [(q.senders, q.interval, "poisson") for q in scenario.joms_queues]
    for e, (senders, interval, process) in enumerate(entries):
        for h in scenario.resolve(senders):
            times = arrival_times(py_rng(seed, "joms-traffic", e, h), process, interval, 0.0, until)
            out.extend(JomsPublication(at, index[h], e, seq) for seq, at in enumerate(times))
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


@dataclass(frozen=True, slots=True)
class QueueSent:
    """A queue message waiting for its target to be decided."""

    msg_id: str
    origin: str
    created: float
    deadline: float
    queue: str
    """``Name@Manager``."""
    receivers: tuple[str, ...]


class QueueTargets:
    """One target per queue message, decided when the run ends: the receiver whose consumer
    got it first, or (never consumed) the first receiver in scenario order."""

    def __init__(self) -> None:
        self.sent: list[QueueSent] = []

    def rows(self, consumed: Mapping[str, str]) -> list[tuple[QueueSent, str]]:
        out = []
        for q in self.sent:
            host = consumed.get(q.msg_id)
            if host is None and q.receivers:
                host = q.receivers[0]
            if host is not None:
                out.append((q, host))
        return out


def body_rng(seed: int) -> random.Random:
    """The stream JMS message bodies are drawn from."""
    return py_rng(seed, "joms-payload")
