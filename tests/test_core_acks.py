"""Acknowledgements of delivery (``dodwan/core/acks.py``) on the in-memory network: a message
published ``once`` is done when one host has delivered it, and the copies carried for others
are purged as the acknowledgement travels back, instead of filling caches and contacts."""

from __future__ import annotations

import random

import pytest

from dodwan.core import message as m
from dodwan.core import wire
from dodwan.core.errors import WireError
from dodwan.core.limits import Limits
from dodwan.virtual import VirtualNetwork

KB = 1000
MB = 1 << 20


def _complete(net: VirtualNetwork, host: str, msg_id: str) -> bool:
    c = net.node(host)._cache.get(msg_id)
    return c is not None and c.complete


def _network(once: bool) -> tuple[VirtualNetwork, str]:
    """``a`` publishes for ``s``; carriers ``b`` and ``c`` take a copy from ``a``."""
    net = VirtualNetwork(seed=3, bitrate=2e6)
    net.add("a", cache_capacity=4 * MB)
    for h in "bcd":
        net.add(h, cache_capacity=4 * MB, altruistic=True, trace=True)
    net.add("s", cache_capacity=4 * MB)
    net.subscribe("s", {"dest": "s"})
    attributes = {"dest": "s", "once": "true"} if once else {"dest": "s"}
    mid = net.publish("a", attributes, random.Random(1).randbytes(200 * KB), 1e5)
    net.run(5.0)
    net.meet("a", "b")
    net.meet("a", "c")
    assert _complete(net, "b", mid) and _complete(net, "c", mid)
    return net, mid


def _evicted(net: VirtualNetwork, host: str) -> list[tuple[str, str]]:
    return [(r.msg_id, r.detail) for r in net.node(host).pop_trace() if r.kind == "message_evicted"]


def test_the_carrier_that_delivers_a_once_message_drops_its_copy() -> None:
    net, mid = _network(once=True)
    net.node("b").pop_trace()
    net.meet("b", "s")
    assert [d.descriptor["id"] for d in net.deliveries("s")] == [mid]
    assert _evicted(net, "b") == [(mid, "acked")]
    assert not _complete(net, "b", mid)
    assert _complete(net, "s", mid)  # the subscriber keeps its copy
    assert net.node("s").counters["acks_sent"] == 1
    assert net.node("b").counters["acks_received"] == 1


def test_without_once_the_copies_stay() -> None:
    net, mid = _network(once=False)
    net.meet("b", "s")
    assert [d.descriptor["id"] for d in net.deliveries("s")] == [mid]
    assert _complete(net, "b", mid) and _complete(net, "c", mid)
    assert "acks_sent" not in net.node("s").counters


def test_the_ack_travels_back_to_other_holders_and_stops_the_spreading() -> None:
    net, mid = _network(once=True)
    net.meet("b", "s")
    net.node("c").pop_trace()
    net.meet("c", "b")  # b knows it was delivered: c's offer is answered with an ack
    assert _evicted(net, "c") == [(mid, "acked")]
    net.meet("a", "b")  # the origin keeps its publication, but no longer offers it
    assert _complete(net, "a", mid)
    sent = net.node("a").counters.get("fragments_sent", 0)
    net.meet("a", "d")  # a fresh carrier meeting the origin gets nothing of it
    assert net.node("d")._cache.get(mid) is None
    assert net.node("a").counters.get("fragments_sent", 0) == sent
    # and a holder that learnt the ack does not fetch the message again
    net.meet("c", "s")
    assert net.node("c")._cache.get(mid) is None


def test_an_ack_only_acts_on_a_held_once_message() -> None:
    net, mid = _network(once=False)
    b = net.node("b")
    for dg in wire.encode_acks("x", [(mid, 100)], 1400):
        b.receive_datagram(dg, "x-address", net.now)
    assert _complete(net, "b", mid)  # not published once: an ack does not touch it
    assert mid not in b._acked


def test_the_subscriber_and_the_origin_keep_their_copies_when_an_ack_comes() -> None:
    net, mid = _network(once=True)
    a = net.node("a")
    for dg in wire.encode_acks("x", [(mid, 100)], 1400):
        a.receive_datagram(dg, "x-address", net.now)
    assert _complete(net, "a", mid)
    assert mid in a._acked


def test_acks_are_split_over_datagrams_that_fit() -> None:
    acks = [(f"msg-{i:04d}-" + "x" * 100, 20_000 + i) for i in range(40)]
    dgs = wire.encode_acks("h", acks, 1400)
    assert len(dgs) > 1 and all(len(d) <= 1400 for d in dgs)
    got: list[tuple[str, int]] = []
    for d in dgs:
        dg = wire.decode(d, Limits())
        assert isinstance(dg, wire.Ack) and dg.sender == "h"
        got.extend(dg.entries)
    assert got == acks


@pytest.mark.parametrize(
    "body",
    [
        b"\x00",
        b"\x01\x00\x05",
        b"\x01\x02m1",
        b"\x02\x02m1\x05",
    ],  # none; empty id; no time; truncated
)
def test_a_malformed_ack_is_refused(body: bytes) -> None:
    with pytest.raises(WireError):
        wire.decode(b"DW\x02\x07\x01h" + body, Limits())


def test_once_must_be_true_or_false() -> None:
    net = VirtualNetwork(seed=1)
    net.add("a")
    with pytest.raises(ValueError, match='"once" must be "true" or "false"'):
        net.publish("a", {"once": "yes"}, b"x", 100.0)
    d = {
        m.ID: "a-1", m.DEADLINE: "10.0", m.ORIGIN: "a", m.DATE: "0.0", m.SIZE: "1",
        m.PRIORITY: "4", m.PERSISTENT: "true", m.ZSIZE: "10", m.FRAGS: "1", m.FSIZE: "10",
        m.ZHASH: "00", m.ONCE: "yes",
    }  # fmt: skip
    with pytest.raises(WireError, match="bad descriptor"):
        m.Header.parse(d, Limits())
    d[m.ONCE] = "true"
    assert m.Header.parse(d, Limits()).once


def test_acks_spread_to_hosts_that_never_held_the_message() -> None:
    net, mid = _network(once=True)
    net.meet("b", "s")  # delivered; b drops its copy
    d = net.node("d")
    net.meet("d", "s")  # d never held it: s tells it on arrival
    assert mid in d._acked and d.counters["acks_learnt"] == 1
    assert d._remote.owner_of("ack", mid) is not None  # charged to s's address
    net.node("c").pop_trace()
    net.meet("d", "c")  # c still carries it: d answers its offer with an ack
    assert _evicted(net, "c") == [(mid, "acked")]
    assert d._cache.get(mid) is None  # and d never fetched it
    sent = net.node("a").counters.get("fragments_sent", 0)
    net.meet("a", "d")  # nor does it take it from the origin, which learns it too
    assert d._cache.get(mid) is None
    assert mid in net.node("a")._acked
    assert net.node("a").counters.get("fragments_sent", 0) == sent


def test_a_forged_ack_does_not_stop_a_message_published_without_once() -> None:
    net = VirtualNetwork(seed=4, bitrate=2e6)
    net.add("a", cache_capacity=4 * MB)
    net.add("b", cache_capacity=4 * MB, altruistic=True)
    mid = net.publish("a", {"id": "plain-1", "topic": "t"}, b"x" * 5000, 1e5)
    b = net.node("b")
    for dg in wire.encode_acks("x", [(mid, 100)], 1400):  # forged: nobody delivered it
        b.receive_datagram(dg, "x-address", net.now)
    assert mid in b._acked  # remembered, not knowing the message yet ...
    net.link("a", "b")
    net.run(20.0)
    assert _complete(net, "b", mid)  # ... but its descriptor does not say once: fetched


def test_the_subscribers_copy_of_a_delivered_once_message_goes_before_carried_ones() -> None:
    net = VirtualNetwork(seed=5, bitrate=2e6)
    for h in "abc":  # three origins: each within its share of s's cache
        net.add(h, cache_capacity=4 * MB)
    s = net.add("s", cache_capacity=int(1.6 * MB), altruistic=True)
    net.subscribe("s", {"dest": "s"})
    older = net.publish("b", {"topic": "t"}, random.Random(1).randbytes(500 * KB), 1e5)
    net.meet("b", "s")
    done = net.publish(
        "a", {"dest": "s", "once": "true"}, random.Random(2).randbytes(500 * KB), 1e5
    )
    net.meet("a", "s")
    assert [d.descriptor["id"] for d in net.deliveries("s")] == [done]
    assert s._cache[done].done and s.cache_entry(older) is not None
    newer = net.publish("c", {"topic": "t"}, random.Random(3).randbytes(700 * KB), 1e5)
    net.meet("c", "s")
    # room for the newer message came from the delivered copy, not the older carried one
    assert s.cache_entry(newer) is not None and s.cache_entry(older) is not None
    assert s.cache_entry(done) is None


def test_acks_learnt_from_peers_are_bounded_charged_and_expire() -> None:
    from dodwan import Node, NodeConfig
    from dodwan.core import acks

    n = Node(NodeConfig(host_id="v"), rng=random.Random(1))
    ids = [(f"forged-{i}", 60) for i in range(acks._ACKS_KEPT + 100)]
    for dg in wire.encode_acks("x", ids, 1400):
        n.receive_datagram(dg, "x-address", 0.0)
    assert len(n._acked) == acks._ACKS_KEPT  # the oldest forgotten first
    assert "forged-0" not in n._acked and f"forged-{acks._ACKS_KEPT + 99}" in n._acked
    assert n._remote.held_by("x-address") > 0
    n.handle_timer(61.0)  # past the deadline the acks named
    assert n._acked == {} and n._remote.held_by("x-address") == 0


def test_acks_go_to_new_neighbours_at_most_once_per_beacon_period() -> None:
    from dodwan import Node, NodeConfig

    n = Node(NodeConfig(host_id="v", beacon_period=1.0), rng=random.Random(1))
    for dg in wire.encode_acks("x", [("m1", 600)], 1400):
        n.receive_datagram(dg, "x-address", 0.0)
    sent = n.counters.get("acks_sent", 0)
    beacon = wire.encode_announce("y", 1, False, 0, 0, (), ())
    n.receive_datagram(beacon, "y-address", 0.2)  # a new neighbour: told
    assert n.counters["acks_sent"] == sent + 1
    n.receive_datagram(wire.encode_announce("z", 1, False, 0, 0, (), ()), "z", 0.5)
    assert n.counters["acks_sent"] == sent + 1  # another one within the period: not again
    n.receive_datagram(wire.encode_announce("w", 1, False, 0, 0, (), ()), "w", 1.3)
    assert n.counters["acks_sent"] == sent + 2
