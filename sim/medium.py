"""The radio medium: neighbour sets, air time, one datagram at a time per sender, loss.

A datagram of n bytes occupies its sender's radio for 8n / bit_rate seconds, after the
datagrams the sender queued before it. When its transmission ends it reaches the hosts in
range of the sender at that moment (every neighbour for a broadcast, the addressee only
for a unicast), each losing it independently with probability ``loss`` drawn from the
medium's own random stream. ``loss`` is per link frame: a datagram larger than one frame
of ``mtu`` bytes travels as IP fragments and is lost if any of them is. Neighbour sets are
kept up to date by ``link_up`` / ``link_down`` (from mobility or a contact trace).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

import simpy
from simpy.core import NORMAL  # type: ignore[attr-defined]

MTU = 1500
"""Default link MTU (bytes): Ethernet's and Wi-Fi's."""
_IP_HEADER, _UDP_HEADER = 20, 8

LOOKAHEAD = 0.05
"""Seconds of air time a host is asked to fill ahead (:meth:`Medium.ready_bytes`): the
node keeps the rest of its requested fragments and decides their order itself."""

Deliver = Callable[[int, int, bytes], None]
"""``deliver(receiver, sender, data)``."""


class Medium:
    """Broadcast radio shared by ``n`` hosts (hosts are indices 0..n-1)."""

    def __init__(
        self,
        env: simpy.Environment,
        n: int,
        bit_rate: float,
        loss: float,
        rng: random.Random,
        deliver: Deliver,
        mtu: int = MTU,
    ) -> None:
        if mtu < 68:
            raise ValueError("mtu must be at least 68 bytes (IPv4's minimum)")
        self.env = env
        self.seconds_per_byte = 8.0 / bit_rate
        self.loss = loss
        self.frame_payload = (mtu - _IP_HEADER) // 8 * 8
        """UDP bytes (datagram and its header) one IP fragment carries: what is left of the
        MTU after the IP header, rounded down to 8 bytes as fragment offsets are."""
        self.rng = rng
        self.deliver = deliver
        self.neighbours: list[set[int]] = [set() for _ in range(n)]
        """Per host, the hosts in range: change them only through :meth:`link_up` and
        :meth:`link_down`, which keep ``_in_order`` in step."""
        self._in_order: list[list[int] | None] = [None] * n
        """Per host, its neighbours in order (None: to sort again after a link change)."""
        self.free_at = [0.0] * n
        self.queues: list[deque[tuple[tuple[float, int, int], bytes, int | None]]] = [
            deque() for _ in range(n)
        ]
        """Per sender: ((arrival time, priority, event id), data, dest) of what its radio is sending, in order."""
        self.arrival_events = [_ArrivalEvent(_Arrival(self, i)) for i in range(n)]
        """Per sender, what SimPy's queue holds for the arrival at the head of its queue
        (one at a time: the next is scheduled once it has arrived)."""
        self.on_idle: Callable[[int], None] | None = None
        """Called with a sender's index when its radio has sent everything queued."""
        self.idle_needed: Callable[[int], bool] = _always
        """Whether ``on_idle`` could do anything for a sender now (see :meth:`send`)."""
        self.alone_margin = 65536 * self.seconds_per_byte
        """How long before a link of a host alone may come up it stops being run ahead of
        the clock (see ``SimHost._catch_up``): the air time of 64 KiB, more than what a
        host's timer sends at once, so its datagrams have arrived before."""
        self.links_fixed_until = -math.inf
        """No link comes up before this time (set by whoever drives the links; strictly
        before it, a datagram sent by a host without neighbours reaches nobody)."""
        self.sent = 0
        self.delivered = 0
        self.lost = 0
        self.unreachable = 0
        self.silent = 0
        """Broadcasts sent while alone, whose arrival was not scheduled (see :meth:`send`)."""

    def frames(self, size: int) -> int:
        """Link frames (IP fragments) a datagram of ``size`` bytes travels in."""
        return -(-(size + _UDP_HEADER) // self.frame_payload)

    def ready_bytes(self, sender: int, now: float | None = None) -> int:
        """Bytes ``sender`` may queue at ``now`` (default: the clock's time): what keeps its
        radio busy ``LOOKAHEAD`` ahead."""
        backlog = self.free_at[sender] - (self.env.now if now is None else now)
        room = LOOKAHEAD - backlog if backlog > 0.0 else LOOKAHEAD
        return int(room / self.seconds_per_byte) if room > 0.0 else 0

    def link_up(self, i: int, j: int) -> None:
        self.neighbours[i].add(j)
        self.neighbours[j].add(i)
        self._in_order[i] = self._in_order[j] = None

    def link_down(self, i: int, j: int) -> None:
        self.neighbours[i].discard(j)
        self.neighbours[j].discard(i)
        self._in_order[i] = self._in_order[j] = None

    def send_all(
        self,
        sender: int,
        out: list[tuple[bytes, Hashable]],
        broadcast: Hashable,
        dest_index: Callable[[Hashable], int | None],
        now: float,
        quiet_until: float = -math.inf,
    ) -> None:
        """:meth:`send` each of ``out``, a node's ``(data, address)`` pairs in order: the
        ``broadcast`` address to every neighbour, any other to the host ``dest_index``
        gives (none: an address no host has, counted as unreachable)."""
        send = self.send
        for data, dest in out:
            if dest is broadcast or dest == broadcast:
                send(sender, data, None, now, quiet_until)
                continue
            target = dest_index(dest)
            if target is None:  # an address no host has: nobody can receive it
                self.unreachable += 1
            else:
                send(sender, data, target, now, quiet_until)

    def send(
        self,
        sender: int,
        data: bytes,
        dest: int | None,
        now: float | None = None,
        quiet_until: float = -math.inf,
    ) -> float:
        """Queue a datagram (``dest`` None = broadcast); return when it finishes arriving.

        ``now`` (default: the clock's time) and ``quiet_until`` serve a host alone that is
        let run ahead of the clock (see ``SimHost``): it sends at its own time ``now``, and
        no link of its comes up before ``quiet_until``."""
        if now is None:
            now = self.env.now
        free = self.free_at[sender]
        end = (free if free > now else now) + len(data) * self.seconds_per_byte
        self.free_at[sender] = end
        self.sent += 1
        # The arrival's place in SimPy's event order, taken now as a timeout started now
        # would take it: its time (``now + delay``, rounded the same way) and its event id.
        key = (now + (end - now), NORMAL, next(self.env._eid))
        queue = self.queues[sender]
        if (
            dest is None
            and not queue
            and not self.neighbours[sender]
            and (key[0] < self.links_fixed_until or key[0] < quiet_until)
            and not self.idle_needed(sender)
        ):
            # Nobody can be in range when it arrives and its arrival would do nothing (no
            # receiver, an idle call that does nothing): only its air time is kept. Most
            # datagrams of a sparse network are beacons of hosts alone.
            self.silent += 1
            return end
        queue.append((key, data, dest))
        if len(queue) == 1:  # the radio was idle: its first arrival is the next event
            self._schedule(sender, key)
        return end

    def _schedule(self, sender: int, key: tuple[float, int, int]) -> None:
        """Put an arrival in SimPy's queue at its place ``key`` (time, priority, id)."""
        ev = self.arrival_events[sender]
        ev.callbacks = ev.arrive  # SimPy's step takes them and sets None
        queue: list[Any] = self.env._queue  # SimPy's event queue (see _ArrivalEvent)
        heapq.heappush(queue, (key[0], key[1], key[2], ev))

    def _arrive_run(self, sender: int) -> None:
        """The head of ``sender``'s queue has arrived; so may the datagrams behind it.

        A sender's back-to-back datagrams arrive one after another; each is handed over at
        its own arrival time. Rather than one scheduled event per datagram, the next one is
        handed over right here, with the clock moved to its arrival time, whenever no other
        event is due before then: no host can act in between, so nothing can tell the
        difference (same bytes, order, times and losses). Otherwise it is scheduled.
        """
        env = self.env
        pending = env._queue
        queue = self.queues[sender]
        _key, data, dest = queue.popleft()
        self.arrive(sender, data, dest)
        while queue:
            key = queue[0][0]
            if pending and pending[0][:3] < key:
                self._schedule(sender, key)
                return
            env._now = key[0]  # SimPy internals: nothing is due before this arrival
            _key, data, dest = queue.popleft()
            self.arrive(sender, data, dest)
        if self.on_idle is not None:
            self.on_idle(sender)

    def arrive(self, sender: int, data: bytes, dest: int | None) -> None:
        nbrs = self.neighbours[sender]
        if dest is None:
            receivers = self._in_order[sender]
            if receivers is None:
                receivers = self._in_order[sender] = sorted(nbrs)
        elif dest in nbrs:
            receivers = [dest]
        else:
            self.unreachable += 1
            return
        loss, rnd = self.loss, self.rng.random
        if loss:
            frames = self.frames(len(data))
            if frames > 1:  # one draw still: lost unless every frame arrives
                loss = 1.0 - (1.0 - loss) ** frames
        for r in receivers:
            if loss and rnd() < loss:
                self.lost += 1
                continue
            self.delivered += 1
            self.deliver(r, sender, data)


def _always(_sender: int) -> bool:
    return True


class _ArrivalEvent:
    """What SimPy's step needs of a triggered event (``callbacks``, ``_ok``, ``_value``),
    without building a ``simpy.Event`` per datagram; one per sender, used again for each
    of its arrivals."""

    __slots__ = ("_ok", "_value", "arrive", "callbacks")

    def __init__(self, arrival: _Arrival) -> None:
        self._ok = True
        self._value = None
        self.arrive = [arrival]
        self.callbacks: list[_Arrival] | None = None


class _Arrival:
    """Callback run when the transmission at the head of a sender's queue ends."""

    __slots__ = ("medium", "sender")

    def __init__(self, medium: Medium, sender: int) -> None:
        self.medium = medium
        self.sender = sender

    def __call__(self, _event: simpy.Event) -> None:
        self.medium._arrive_run(self.sender)
