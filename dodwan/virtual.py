"""An in-memory radio medium with a virtual clock, for tests and examples.

It wires core :class:`~dodwan.core.node.Node` objects through explicit links (who hears
whom), with optional loss, latency and a per-sender bit rate, and runs them as a discrete
event loop: no threads, no sockets, no wall clock. A whole disconnected network runs in
milliseconds and every run with the same seed is identical.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .core import Event, MessageDelivered, Node, NodeConfig
from .core.store import Store

LOOKAHEAD = 0.05
"""Seconds of air time a host's radio is given ahead when the network has a bit rate."""


@dataclass
class _Host:
    node: Node
    timer: float | None = None
    busy_until: float = 0.0
    events: list[Event] = field(default_factory=list)


class VirtualNetwork:
    """Hosts, links between them, and a virtual clock that only moves in :meth:`run_until`."""

    def __init__(
        self,
        *,
        seed: int = 0,
        loss: float = 0.0,
        latency: float = 0.001,
        bitrate: float | None = None,
        start: float = 0.0,
    ) -> None:
        self.now = start
        self.loss = loss
        self.latency = latency
        self.bitrate = bitrate
        self._seed = seed
        self._rng = random.Random(seed)
        self._hosts: dict[str, _Host] = {}
        self._links: dict[str, dict[str, float]] = {}  # host -> neighbour -> loss
        self._queue: list[tuple[float, int, str, str, Any]] = []
        self._seq = itertools.count()
        self.transmissions: dict[str, int] = {}
        """Datagrams put on the air per sender."""

    # ------------------------------------------------------------------ topology

    def add(self, host_id: str, store: Store | None = None, **config: Any) -> Node:
        """Create a host running a core node (``config`` are :class:`NodeConfig` fields)."""
        if host_id in self._hosts:
            raise ValueError(f"host {host_id!r} exists")
        node = Node(
            NodeConfig(host_id=host_id, **config),
            rng=random.Random(f"{self._seed}/{host_id}"),
            store=store,
        )
        self._hosts[host_id] = _Host(node)
        self._links[host_id] = {}
        self._reschedule(host_id)
        return node

    def replace(self, host_id: str, node: Node) -> None:
        """Swap a host's node (e.g. a restarted node on the same store)."""
        self._hosts[host_id] = _Host(node)
        self._reschedule(host_id)

    def node(self, host_id: str) -> Node:
        return self._hosts[host_id].node

    def link(self, a: str, b: str, loss: float | None = None) -> None:
        """Put ``a`` and ``b`` in radio range of each other."""
        p = self.loss if loss is None else loss
        self._links[a][b] = p
        self._links[b][a] = p

    def unlink(self, a: str, b: str) -> None:
        self._links[a].pop(b, None)
        self._links[b].pop(a, None)

    def meet(self, a: str, b: str, seconds: float = 20.0, apart: float = 20.0) -> None:
        """A contact: ``a`` and ``b`` in range for ``seconds``, then apart for ``apart``
        seconds (by default long enough for each to forget the other)."""
        self.link(a, b)
        self.run(seconds)
        self.unlink(a, b)
        self.run(apart)

    def connect_all(self, *hosts: str) -> None:
        for a, b in itertools.combinations(hosts, 2):
            self.link(a, b)

    def isolate(self, host: str) -> None:
        for other in list(self._links[host]):
            self.unlink(host, other)

    # ------------------------------------------------------------------ observation

    def events(self, host_id: str) -> list[Event]:
        """Every event the host's node produced so far."""
        return self._hosts[host_id].events

    def deliveries(self, host_id: str) -> list[MessageDelivered]:
        return [e for e in self._hosts[host_id].events if isinstance(e, MessageDelivered)]

    # ------------------------------------------------------------------ running

    def _reschedule(self, host_id: str) -> None:
        h = self._hosts[host_id]
        t = h.node.get_timer()
        if t is not None and t != h.timer:
            h.timer = t
            heapq.heappush(self._queue, (max(t, self.now), next(self._seq), "timer", host_id, t))

    def _after_input(self, host_id: str) -> None:
        h = self._hosts[host_id]
        budget = None
        if self.bitrate:  # fragments as the radio can take them, a little ahead (LOOKAHEAD)
            backlog = max(0.0, h.busy_until - self.now)
            budget = int(max(0.0, LOOKAHEAD - backlog) * self.bitrate / 8)
        for data, _dest in h.node.datagrams_to_send(self.now, budget):
            self.transmissions[host_id] = self.transmissions.get(host_id, 0) + 1
            start = max(self.now, h.busy_until)
            air = len(data) * 8 / self.bitrate if self.bitrate else 0.0
            h.busy_until = start + air
            arrival = h.busy_until + self.latency
            for other, loss in sorted(self._links[host_id].items()):
                if loss and self._rng.random() < loss:
                    continue
                heapq.heappush(
                    self._queue, (arrival, next(self._seq), "rx", other, (data, host_id))
                )
        while (ev := h.node.next_event()) is not None:
            h.events.append(ev)
        if budget is not None and h.node.fragments_queued:  # pull more when the radio is idle
            idle = max(self.now, h.busy_until)
            heapq.heappush(self._queue, (idle, next(self._seq), "idle", host_id, None))
        self._reschedule(host_id)

    def run_until(self, t: float, stop: Callable[[], bool] | None = None) -> bool:
        """Advance the clock to ``t`` (or until ``stop()`` is true); returns ``stop()``'s last value."""
        while self._queue and self._queue[0][0] <= t:
            when, _, kind, host_id, arg = heapq.heappop(self._queue)
            h = self._hosts.get(host_id)
            if h is None:
                continue
            self.now = max(self.now, when)
            if kind == "timer":
                if h.timer != arg:
                    continue
                h.timer = None
                h.node.handle_timer(self.now)
            elif kind == "idle":
                if h.busy_until > self.now:
                    continue  # something else was sent meanwhile; its own idle event follows
            else:
                data, sender = arg
                if sender not in self._links[host_id]:
                    continue  # moved out of range while the datagram was in flight
                h.node.receive_datagram(data, sender, self.now)
            self._after_input(host_id)
            if stop is not None and stop():
                return True
        self.now = max(self.now, t)
        return stop() if stop is not None else False

    def run(self, duration: float, stop: Callable[[], bool] | None = None) -> bool:
        return self.run_until(self.now + duration, stop)

    def publish(
        self, host_id: str, attributes: dict[str, str], payload: bytes, ttl: float, **kw: Any
    ) -> str:
        """Publish on a host at the current virtual time."""
        mid = self._hosts[host_id].node.publish(
            attributes, payload, deadline=self.now + ttl, now=self.now, **kw
        )
        self._after_input(host_id)
        return mid

    def subscribe(self, host_id: str, patterns: Any, key: str | None = None, **kw: Any) -> str:
        k = self._hosts[host_id].node.subscribe(patterns, now=self.now, key=key, **kw)
        self._after_input(host_id)
        return k
