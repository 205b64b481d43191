"""The radio medium: neighbour sets, air time, one datagram at a time per sender, loss.

A datagram of n bytes occupies its sender's radio for 8n / bit_rate seconds, after the
datagrams the sender queued before it. When its transmission ends it reaches the hosts in
range of the sender at that moment (every neighbour for a broadcast, the addressee only
for a unicast), each losing it independently with probability ``loss`` drawn from the
medium's own random stream. Neighbour sets are kept up to date by ``link_up`` /
``link_down`` (from mobility or a contact trace).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import simpy

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
    ) -> None:
        self.env = env
        self.seconds_per_byte = 8.0 / bit_rate
        self.loss = loss
        self.rng = rng
        self.deliver = deliver
        self.neighbours: list[set[int]] = [set() for _ in range(n)]
        self.free_at = [0.0] * n
        self.sent = 0
        self.delivered = 0
        self.lost = 0
        self.unreachable = 0

    def link_up(self, i: int, j: int) -> None:
        self.neighbours[i].add(j)
        self.neighbours[j].add(i)

    def link_down(self, i: int, j: int) -> None:
        self.neighbours[i].discard(j)
        self.neighbours[j].discard(i)

    def send(self, sender: int, data: bytes, dest: int | None) -> float:
        """Queue a datagram (``dest`` None = broadcast); return when it finishes arriving."""
        now = self.env.now
        start = max(now, self.free_at[sender])
        end = start + len(data) * self.seconds_per_byte
        self.free_at[sender] = end
        self.sent += 1
        ev = self.env.timeout(end - now)
        ev.callbacks.append(_Arrival(self, sender, data, dest))
        return end

    def arrive(self, sender: int, data: bytes, dest: int | None) -> None:
        nbrs = self.neighbours[sender]
        if dest is None:
            receivers = sorted(nbrs)
        elif dest in nbrs:
            receivers = [dest]
        else:
            self.unreachable += 1
            return
        loss, rnd = self.loss, self.rng.random
        for r in receivers:
            if loss and rnd() < loss:
                self.lost += 1
                continue
            self.delivered += 1
            self.deliver(r, sender, data)


class _Arrival:
    """Callback run when a transmission ends (cheaper than a closure per datagram)."""

    __slots__ = ("data", "dest", "medium", "sender")

    def __init__(self, medium: Medium, sender: int, data: bytes, dest: int | None) -> None:
        self.medium = medium
        self.sender = sender
        self.data = data
        self.dest = dest

    def __call__(self, _event: simpy.Event) -> None:
        self.medium.arrive(self.sender, self.data, self.dest)
