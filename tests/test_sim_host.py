"""The SimPy host adapter: one timer at the node's earliest deadline, datagrams onto the medium."""

from __future__ import annotations

import random
from typing import Any

import simpy

from sim.host import SimHost
from sim.logs import Recorder
from sim.medium import Medium

BCAST = "<broadcast>"


class FakeNode:
    """Just enough of the core's sans-IO surface to watch the adapter drive it."""

    def __init__(self, deadlines: list[float]) -> None:
        self.deadlines = sorted(deadlines)
        self.handled: list[float] = []
        self.received: list[tuple[float, Any, bytes]] = []
        self.outbox: list[tuple[bytes, Any]] = []

    def get_timer(self) -> float | None:
        return self.deadlines[0] if self.deadlines else None

    def handle_timer(self, now: float) -> None:
        assert self.deadlines and now >= self.deadlines[0]
        self.handled.append(now)
        while self.deadlines and self.deadlines[0] <= now:
            self.deadlines.pop(0)
        self.outbox.append((b"tick", BCAST))

    def receive_datagram(self, data: bytes, source: Any, now: float) -> None:
        self.received.append((now, source, data))
        if data == b"hurry":
            self.deadlines = sorted([now + 0.5, *self.deadlines])
        if data == b"reply":
            self.outbox.append((b"to-you", source))

    def datagrams_to_send(self, now: float, budget: int | None = None) -> list[tuple[bytes, Any]]:
        out, self.outbox = self.outbox, []
        return out

    fragments_queued = 0

    @property
    def has_output(self) -> bool:
        return bool(self.outbox)

    def next_event(self) -> None:
        return None

    def pop_trace(self) -> list[Any]:
        return []


def wire(nodes: list[FakeNode]) -> tuple[simpy.Environment, list[SimHost], Medium]:
    env = simpy.Environment()
    hosts: list[SimHost] = []
    names = [f"h-{i}" for i in range(len(nodes))]
    index = {n: i for i, n in enumerate(names)}
    medium = Medium(
        env, len(nodes), 8000.0, 0.0, random.Random(0),
        lambda r, s, d: hosts[r].receive(names[s], d),
    )  # fmt: skip
    rec = Recorder()
    for i, node in enumerate(nodes):
        hosts.append(
            SimHost(i, names[i], node, env, medium, rec, BCAST, lambda a: index.get(str(a)))
        )
    return env, hosts, medium


def test_timer_fires_at_each_deadline() -> None:
    node = FakeNode([1.0, 2.5, 7.0])
    env, hosts, _ = wire([node])
    hosts[0].service()
    env.run(until=10)
    assert node.handled == [1.0, 2.5, 7.0]


def test_earlier_deadline_supersedes_the_armed_one() -> None:
    a, b = FakeNode([]), FakeNode([10.0])
    env, hosts, medium = wire([a, b])
    medium.link_up(0, 1)
    hosts[1].service()
    env.process(_send_later(env, medium, 2.0, b"hurry"))
    env.run(until=20)
    # 'hurry' (5 bytes, 5 ms of air time) arrives at 2.005 and asks for a timer 0.5 s later.
    assert [round(t, 6) for t in b.handled] == [2.505, 10.0]


def test_unicast_replies_go_to_the_source_only() -> None:
    nodes = [FakeNode([]), FakeNode([]), FakeNode([])]
    env, _hosts, medium = wire(nodes)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        medium.link_up(i, j)
    env.process(_send_later(env, medium, 1.0, b"reply"))
    env.run(until=5)
    assert [(s, d) for _, s, d in nodes[0].received] == [("h-1", b"to-you"), ("h-2", b"to-you")]
    assert [d for _, _, d in nodes[1].received] == [b"reply"]


def _send_later(env: simpy.Environment, medium: Medium, at: float, data: bytes) -> Any:
    yield env.timeout(at)
    medium.send(0, data, None)
