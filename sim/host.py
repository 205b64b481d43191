"""The SimPy adapter around one core ``Node``: timers, datagrams in and out, trace drain.

The same sans-IO calls the daemon makes: ``receive_datagram`` when the medium hands over
a datagram, ``handle_timer`` when ``get_timer()`` falls due, then ``service()`` pulls
outgoing datagrams onto the medium, drains events and trace records and re-arms one
SimPy timeout at the node's earliest deadline. Hosts with nothing due cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any, Protocol

import simpy

from dodwan.core.events import MessageDelivered
from sim.logs import Recorder
from sim.medium import Medium


class JomsService(Protocol):
    """What a host's JOMS service is to its adapter (``sim.joms_traffic.JomsHost``; named
    by this protocol, so that this module compiles without the JOMS service's modules)."""

    def on_event(self, ev: MessageDelivered, now: float) -> bool: ...
    def filter_trace(self, records: list[Any]) -> list[Any]: ...
    def pump(self, now: float) -> int: ...
    def timer(self) -> float | None: ...
    def handle_timer(self, now: float) -> None: ...


Quiet = Callable[[int, float], float]
"""``quiet(index, now)``: see :attr:`SimHost.quiet`."""


class SimHost:
    """One simulated host: its index, name, node and the SimPy timer driving it."""

    __slots__ = (
        "_dest",
        "armed",
        "broadcast",
        "caught_up",
        "deliveries",
        "drains_trace",
        "env",
        "index",
        "joms",
        "medium",
        "name",
        "node",
        "pending",
        "quiet",
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
        *,
        drains_trace: bool = True,
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
        self.joms: JomsService | None = None
        """The host's JOMS service when the scenario gives it JOMS traffic."""
        self.quiet: Quiet | None = None
        """``quiet(index, now)``: a time before which no link of this host comes up and
        nothing else touches it; None: the host is never run ahead (see :meth:`_catch_up`)."""
        self.caught_up = 0
        """Timers handled ahead of the clock by :meth:`_catch_up`."""
        self.drains_trace = drains_trace
        """Whether the node's trace records are pulled (``pop_trace``); False for a node
        given a ``trace_sink``, which keeps none (and then keeps datagram totals instead of
        a record per datagram, which the simulation reads at the end)."""

    def receive(self, sender: str, data: bytes) -> None:
        """A datagram from ``sender`` (its host name is its address) finished arriving."""
        node = self.node
        now: float = self.env.now
        node.receive_datagram(data, sender, now)  # positional: a faster call, compiled
        # Most datagrams received (fragments) leave the node nothing to say: pulling would
        # return nothing and change nothing.
        if node.has_output or self.joms is not None:
            self._pull(now)
        self.arm()

    def service(self) -> None:
        """Pull everything the node has to say, then re-arm its timer."""
        self._pull(self.env.now)
        self.arm()

    def _pull(self, now: float, quiet_until: float = -math.inf) -> None:
        """Send what the node has to say at ``now``, drain its events and trace records
        (``quiet_until``: no link of this host comes up before then, see :meth:`_catch_up`)."""
        node = self.node
        joms = self.joms
        if joms is not None:
            self._service_joms(joms, now)
        medium = self.medium
        out = node.datagrams_to_send(now, medium.ready_bytes(self.index, now))
        if out:
            medium.send_all(self.index, out, self.broadcast, self._dest, now, quiet_until)
        ev = node.next_event()
        while ev is not None:
            if isinstance(ev, MessageDelivered):
                self.deliveries += 1
            ev = node.next_event()
        if self.drains_trace:
            records = node.pop_trace()
            if records:
                self.recorder.trace(self.name, records)

    def _service_joms(self, joms: JomsService, now: float) -> None:
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
        t: float | None = self.node.get_timer()
        if self.joms is not None:
            tj = self.joms.timer()
            if tj is not None and (t is None or tj < t):
                t = tj
        if t is None:
            return
        armed = self.armed
        if armed is not None and armed <= t:
            return  # the pending timeout fires first and re-arms
        self._arm_at(t)

    def _arm_at(self, t: float, callback: Callable[[simpy.Event], None] | None = None) -> None:
        self.armed = t
        env = self.env
        ev = env.timeout(t - env.now if t > env.now else 0.0)
        ev.callbacks.append(self._on_timer if callback is None else callback)
        self.pending = ev

    def _on_rearm(self, ev: simpy.Event) -> None:
        """The last timer run ahead is due (see :meth:`_catch_up`): arm the next one."""
        if ev is self.pending:
            self.armed = None
            self.pending = None
            self.arm()

    def _on_timer(self, ev: simpy.Event) -> None:
        if ev is not self.pending:
            return  # superseded by an earlier deadline
        self.armed = None
        self.pending = None
        now: float = self.env.now
        node = self.node
        t: float | None = node.get_timer()  # typed: compiled, float arithmetic is native
        if t is not None and t <= now + 1e-9:
            self.timer_fires += 1
            node.handle_timer(t if t > now else now)
        if self.joms is not None:
            self.joms.handle_timer(now)
        self._pull(now)
        last = self._catch_up(now, self.quiet) if self.quiet is not None else None
        if last is None:
            self.arm()
        else:
            # Its next timeout is armed when the last timer it ran ahead would have fired,
            # as it would have been without running ahead: SimPy orders timeouts due at one
            # time (two hosts' expiries of a message) by when they were armed.
            self._arm_at(last, self._on_rearm)

    def _catch_up(self, now: float, quiet: Quiet) -> float | None:
        """A host alone runs its next timers right here rather than through SimPy, while
        they only announce its presence to nobody: same calls, same times, same bytes.

        Each is handled at the time its SimPy timeout would fire (``now + (t - now)``) as
        long as: no link of the host is up and none comes up before the datagrams it sends
        have finished arriving (``quiet``, less a margin; a later arrival is scheduled as
        usual and ends the catch-up), nothing of its own is in the air or queued, it has no
        JOMS service, and the core has nothing else due then (``get_timer(presence=False)``
        — what else a timer does, such as expiry, writes log rows, which must keep their
        order). Nothing else can touch the host meanwhile: the simulation's ``quiet`` says
        until when (its next link-up, its next publication, the end of the run). Its log
        rows are totals, which do not depend on order. Returns the time of the last timer
        run ahead (None: none was)."""
        medium, me, node = self.medium, self.index, self.node
        if self.joms is not None or medium.neighbours[me] or medium.queues[me]:
            return None
        horizon = quiet(me, now)
        until = horizon - medium.alone_margin
        last = None
        while not node.fragments_queued and not medium.queues[me]:
            t: float | None = node.get_timer()
            if t is None:
                break
            fire = now + (t - now) if t > now else now  # when env.timeout(t - now) fires
            if fire >= until:
                break
            other: float | None = node.get_timer(presence=False)
            if other is not None and other <= (t if t > fire else fire):
                break
            now = last = fire
            self.timer_fires += 1
            self.caught_up += 1
            node.handle_timer(t if t > now else now)
            self._pull(now, horizon)
        return last


class Hosts:
    """The simulation's hosts as the medium sees them: its ``deliver`` (the receiver takes
    the datagram under the sender's name, its address), ``on_idle`` and ``idle_needed``. A
    class rather than closures or runner methods, so that, compiled, these per-datagram
    calls are direct ones."""

    __slots__ = ("hosts", "names")

    def __init__(self, hosts: list[SimHost], names: list[str]) -> None:
        self.hosts = hosts
        self.names = names

    def __call__(self, receiver: int, sender: int, data: bytes) -> None:
        self.hosts[receiver].receive(self.names[sender], data)

    def idle(self, sender: int) -> None:
        """A radio went idle: its node may have more requested fragments to send."""
        host = self.hosts[sender]
        if host.node.fragments_queued:
            host.service()

    def idle_needed(self, sender: int) -> bool:
        """Whether :meth:`idle` would do anything for ``sender`` (it only serves queued
        fragments, and only requests from neighbours queue them)."""
        return bool(self.hosts[sender].node.fragments_queued > 0)
