"""The SimPy adapter around one core ``Node``: timers, datagrams in and out, trace drain.

The same sans-IO calls the daemon makes: ``receive_datagram`` when the medium hands over
a datagram, ``handle_timer`` when ``get_timer()`` falls due, then ``service()`` pulls
outgoing datagrams onto the medium, drains events and trace records and re-arms one
SimPy timeout at the node's earliest deadline. Hosts with nothing due cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import simpy

from dodwan.core.events import MessageDelivered
from sim.logs import Recorder

if TYPE_CHECKING:
    from sim.joms_traffic import JomsHost
from sim.medium import Medium


class SimHost:
    """One simulated host: its index, name, node and the SimPy timer driving it."""

    __slots__ = (
        "_dest",
        "armed",
        "broadcast",
        "deliveries",
        "env",
        "index",
        "joms",
        "medium",
        "name",
        "node",
        "pending",
        "recorder",
        "timer_fires",
    )

    def __init__(
        self,
        index: int,
        name: str,
        node: Any,
        env: simpy.Environment,
        medium: Medium,
        recorder: Recorder,
        broadcast: Hashable,
        dest_index: Callable[[Hashable], int | None],
    ) -> None:
        self.index = index
        self.name = name
        self.node = node
        self.env = env
        self.medium = medium
        self.recorder = recorder
        self.broadcast = broadcast
        self._dest = dest_index
        self.armed: float | None = None
        self.pending: simpy.Event | None = None
        self.deliveries = 0
        self.timer_fires = 0
        self.joms: JomsHost | None = None
        """The host's JOMS service when the scenario gives it JOMS traffic."""

    def receive(self, sender: str, data: bytes) -> None:
        """A datagram from ``sender`` (its host name is its address) finished arriving."""
        self.node.receive_datagram(data, sender, now=self.env.now)
        self.service()

    def service(self) -> None:
        """Pull everything the node has to say, then re-arm its timer."""
        node = self.node
        now = self.env.now
        joms = self.joms
        if joms is not None:
            self._service_joms(joms, now)
        out = node.datagrams_to_send(now, self.medium.ready_bytes(self.index))
        if out:
            send, me, bcast = self.medium.send, self.index, self.broadcast
            for data, dest in out:
                if dest == bcast:
                    send(me, data, None)
                    continue
                target = self._dest(dest)
                if target is None:  # an address no host has: nobody can receive it
                    self.medium.unreachable += 1
                else:
                    send(me, data, target)
        ev = node.next_event()
        while ev is not None:
            if isinstance(ev, MessageDelivered):
                self.deliveries += 1
            ev = node.next_event()
        records = node.pop_trace()
        if records:
            self.recorder.trace(self.name, records)
        self.arm()

    def _service_joms(self, joms: JomsHost, now: float) -> None:
        """Core deliveries to the JOMS service, its dispatches to the messages table."""
        node = self.node
        ev = node.next_event()
        while ev is not None:
            if isinstance(ev, MessageDelivered) and not joms.on_event(ev, now):
                self.deliveries += 1
            ev = node.next_event()
        records = node.pop_trace()
        if records:
            self.recorder.trace(self.name, joms.filter_trace(records))
        self.deliveries += joms.pump(now)

    def arm(self) -> None:
        t = self.node.get_timer()
        if self.joms is not None:
            tj = self.joms.timer()
            if tj is not None and (t is None or tj < t):
                t = tj
        if t is None:
            return
        armed = self.armed
        if armed is not None and armed <= t:
            return  # the pending timeout fires first and re-arms
        self.armed = t
        env = self.env
        ev = env.timeout(t - env.now if t > env.now else 0.0)
        ev.callbacks.append(self._on_timer)
        self.pending = ev

    def _on_timer(self, ev: simpy.Event) -> None:
        if ev is not self.pending:
            return  # superseded by an earlier deadline
        self.armed = None
        self.pending = None
        now = self.env.now
        node = self.node
        t = node.get_timer()
        if t is not None and t <= now + 1e-9:
            self.timer_fires += 1
            node.handle_timer(now=t if t > now else now)
        if self.joms is not None:
            self.joms.handle_timer(now)
        self.service()
