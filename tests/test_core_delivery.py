"""Cache policy for short contacts and small buffers (issue: deliver what the contacts
allow), on the in-memory network and on single nodes fed real datagrams."""

from __future__ import annotations

import os
import random

from dodwan import Node, NodeConfig
from dodwan.core import wire
from dodwan.virtual import VirtualNetwork

MB = 1 << 20


def forge(host: str, topic: str, size: int, seed: int, now: float) -> list[bytes]:
    """The fragment datagrams of a fresh incompressible message published by ``host``."""
    node = Node(NodeConfig(host_id=host, cache_capacity=8 * MB), rng=random.Random(seed))
    msg_id = node.publish({"topic": topic}, random.Random(seed).randbytes(size), 1e6, now)
    c = node._cache[msg_id]
    return [
        wire.encode_fragment(host, msg_id, 1, i, c.meta.zdesc, node._store.get_fragment(msg_id, i))
        for i in range(c.header.frags)
    ]


def test_an_own_publication_is_not_evicted_before_it_is_handed_on() -> None:
    net = VirtualNetwork(seed=41)
    a = net.add("a", cache_capacity=int(2.5 * MB))
    net.add("b", cache_capacity=8 * MB)
    net.add("c", cache_capacity=8 * MB)
    net.subscribe("a", {"topic": "mail"})
    mine = net.publish("a", {"topic": "report"}, os.urandom(MB), ttl=1e5)
    net.run(1)
    # Newer messages a subscribed to arrive from b: they used to evict a's own publication
    # (same tier, newer) before anyone else had it.
    for _ in range(3):
        net.publish("b", {"topic": "mail"}, os.urandom(MB), ttl=1e5)
    net.link("a", "b")
    net.run(120)
    assert a.cache_entry(mine) is not None
    assert len(net.deliveries("a")) >= 1  # what fits still arrives
    net.unlink("a", "b")
    # Handed on to c, it becomes an ordinary message subscribed here: evictable again.
    net.subscribe("c", {"topic": "report"})
    net.link("a", "c")
    net.run(120, stop=lambda: bool(net.deliveries("c")))
    assert [d.descriptor["id"] for d in net.deliveries("c")] == [mine]
    assert a._cache[mine].handed


def test_partial_sets_do_not_crowd_out_a_complete_message() -> None:
    h = Node(NodeConfig(host_id="h", altruistic=True, cache_capacity=2 * MB), random.Random(1))
    complete = forge("o1", "x", 700_000, seed=1, now=0.0)
    for d in complete:
        h.receive_datagram(d, "o1", now=1.0)
    assert h.cache_usage()["complete"] == 1
    # Fragments of three newer large messages, from other origins, never completed here.
    for k in range(3):
        for d in forge(f"o{k + 2}", "y", 900_000, seed=10 + k, now=10.0 + k)[:400]:
            h.receive_datagram(d, f"o{k + 2}", now=20.0)
    assert h.cache_usage()["complete"] == 1  # the complete message stayed
    assert h.counters.get("messages_evicted", 0) > 0  # older partial sets made room instead
