"""The order fragments are served in (``TransfersMixin._next_to_send``): choosing the next
message costs O(log M) with M messages queued, not a walk of the whole queue, and picks the
same message the walk did. Counted, not timed (timings are in bench/attack_cpu.py).

Two tests patch the node's class, which only the pure Python core allows: ``make test``
runs this module again with ``DODWAN_NATIVE=0``."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from dodwan import native
from dodwan.core import Node, NodeConfig, wire
from dodwan.core.transfers import TransfersMixin
from dodwan.virtual import VirtualNetwork

pure_python = pytest.mark.skipif(
    native.active(), reason="patches the core's classes: pure Python only (DODWAN_NATIVE=0)"
)


@pytest.fixture
def class_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts ``_send_class`` calls: every queued message the selection looks at."""
    calls = [0]
    original = TransfersMixin._send_class

    def counted(self: Node, msg_id: str) -> tuple[int, int, bool]:
        calls[0] += 1
        return original(self, msg_id)

    monkeypatch.setattr(Node, "_send_class", counted)
    yield calls


def drain_many_messages(count: int) -> tuple[int, int]:
    """A node holding ``count`` one-fragment messages is asked fragment 0 of each (four
    requesters on four addresses, within the serving budgets), then drains them on a paced
    link. Returns (fragments queued, fragments sent)."""
    now = 1000.0
    v = Node(NodeConfig(host_id="v"), rng=random.Random(1))
    rnd = random.Random(2)
    ids = [
        v.publish({"topic": "t"}, rnd.randbytes(60), deadline=now + 3000, now=now)
        for _ in range(count)
    ]
    v.datagrams_to_send(now)
    for k, i in enumerate(range(0, count, 250)):
        entries = [(mid, [(0, 1)]) for mid in ids[i : i + 250]]
        v.receive_datagram(
            wire.encode_request(f"asker{k % 4}", "v", entries), (f"10.0.0.{k % 4}", 9), now
        )
    queued = v.fragments_queued
    sent = 0
    while v.fragments_queued:
        sent += len(v.datagrams_to_send(now, 12_500))  # 0.05 s at 2 Mbit/s
    return queued, sent


@pure_python
def test_serving_many_distinct_messages_looks_at_each_a_bounded_number_of_times(
    class_calls: list[int],
) -> None:
    counts = {}
    for count in (1000, 4000):
        class_calls[0] = 0
        queued, sent = drain_many_messages(count)
        assert queued == sent == count  # all within the budgets, all served
        counts[count] = class_calls[0]
    # one look per message (and a few more), not one per message per fragment sent
    assert counts[4000] <= 3 * 4000, counts
    assert counts[4000] <= 5 * counts[1000], counts


def test_a_message_taken_over_competes_with_the_fragments_it_has_left() -> None:
    """A is under way (6 of its 10 fragments sent) when C, of a higher priority, is asked
    for, with B (6 fragments, A's class): C goes first, then A, which has 4 left, not B."""
    now = 1000.0
    v = Node(NodeConfig(host_id="v"), rng=random.Random(1))
    rnd = random.Random(2)

    def publish(frags: int, priority: int) -> str:
        return v.publish(
            {"topic": "t"}, rnd.randbytes(frags * 1100), now + 3000, now, priority=priority
        )

    a, b, c = publish(10, 4), publish(6, 4), publish(1, 9)
    assert [v._cache[x].header.frags for x in (a, b, c)] == [10, 6, 1]
    v.datagrams_to_send(now)

    def ask(msg_id: str, frags: int) -> None:
        request = wire.encode_request("asker", "v", [(msg_id, [(0, frags)])])
        v.receive_datagram(request, ("10.0.0.1", 9), now)

    def sent(calls: int) -> list[str]:
        out = []
        for _ in range(calls):  # a budget of one byte: one fragment each time
            for dg, _ in v.datagrams_to_send(now, 1):
                decoded = wire.decode(dg, v.config.limits)
                if isinstance(decoded, wire.Fragment):
                    out.append(decoded.msg_id)
        return out

    ask(a, 10)
    assert sent(6) == [a] * 6
    ask(b, 6)
    ask(c, 1)
    assert sent(12) == [c] + [a] * 4 + [b] * 6
    assert not v.fragments_queued


def reference_next_to_send(node: Node) -> str:
    """The selection as a walk of the whole queue (what ``_next_to_send`` did before it
    kept an ordered index): the message under way unless a better class (direct, priority,
    persistent) is queued; else the least (class, fragments left), the first queued on a
    tie."""
    cur = node._sending
    if cur is not None and cur not in node._send_queue:
        cur = None
    best: tuple[tuple[int, int, bool], int] | None = None
    best_id = ""
    cur_class: tuple[int, int, bool] | None = None
    for msg_id, q in node._send_queue.items():
        cls = node._send_class(msg_id)
        if msg_id == cur:
            cur_class = cls
        if best is None or (cls, len(q)) < best:
            best, best_id = (cls, len(q)), msg_id
    assert best is not None
    if cur is not None and cur_class is not None and cur_class <= best[0]:
        return cur
    return best_id


@pure_python
def test_the_order_is_the_walk_of_the_whole_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hosts publishing messages of every class and size to one another through contacts
    that come and go (requesters lost, profiles changing, requests arriving while a message
    is under way): at every choice, the same message as the walk."""
    original = TransfersMixin._next_to_send
    seen = {"choices": 0, "among several": 0, "taken over": 0}

    def checked(self: Node) -> str:
        before = self._sending if self._sending in self._send_queue else None
        expected = reference_next_to_send(self)
        got = original(self)
        assert got == expected
        seen["choices"] += 1
        seen["among several"] += len(self._send_queue) > 1
        seen["taken over"] += before is not None and got != before  # a better class came
        return got

    monkeypatch.setattr(Node, "_next_to_send", checked)
    rnd = random.Random(7)
    hosts = [f"h{i}" for i in range(6)]
    net = VirtualNetwork(seed=7, bitrate=250_000)
    for i, h in enumerate(hosts):  # carriers too: some requests are not for the requester
        net.add(h, max_datagram=500, altruistic=i % 2 == 0)
    for h in hosts[3:]:
        net.subscribe(h, {"topic": f"t{rnd.randrange(3)}"})
    for step in range(40):
        a, b = rnd.sample(hosts, 2)
        if rnd.random() < 0.6:
            net.link(a, b)
        else:
            net.unlink(a, b)
        for _ in range(rnd.randrange(6)):
            net.publish(
                rnd.choice(hosts[:4]),
                {"topic": f"t{rnd.randrange(4)}"},
                rnd.randbytes(rnd.choice((50, 900, 3000, 12_000))),
                ttl=3600,
                priority=rnd.randrange(10),
                persistent=rnd.random() < 0.5,
            )
        if step % 10 == 9:
            h = rnd.choice(hosts)
            net.subscribe(h, {"topic": f"t{rnd.randrange(4)}"})
        net.run(rnd.uniform(0.5, 6.0))
    assert seen["choices"] > 2000 and seen["among several"] > 1000, seen
    assert seen["taken over"] > 10, seen
