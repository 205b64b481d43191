"""Fragments that name their message's descriptor by digest instead of carrying it
(``NodeConfig.fragments_by_digest``): the same transfers in fewer bytes, and a host stores
one only for a descriptor it already holds."""

from __future__ import annotations

import os
import random

from dodwan import Node, NodeConfig
from dodwan.core import wire
from dodwan.core.transfers import DESCRIPTOR_EVERY
from dodwan.virtual import VirtualNetwork

MB = 1 << 20


def _transfer(by_digest: bool) -> tuple[VirtualNetwork, str]:
    net = VirtualNetwork(seed=7)
    net.add("a", fragments_by_digest=by_digest)
    net.add("b")
    net.subscribe("b", {"topic": "report"})
    msg_id = net.publish("a", {"topic": "report"}, os.urandom(200_000), ttl=1e5)
    net.link("a", "b")
    net.run(60, stop=lambda: bool(net.deliveries("b")))
    return net, msg_id


def test_a_transfer_by_digest_delivers_the_same_message_in_fewer_bytes() -> None:
    lean, lean_id = _transfer(True)
    full, full_id = _transfer(False)
    for net, msg_id in ((lean, lean_id), (full, full_id)):
        assert [d.descriptor["id"] for d in net.deliveries("b")] == [msg_id]
    a_lean, a_full = lean.node("a"), full.node("a")
    sent_lean = a_lean.datagrams_sent_by_kind["fragment"]
    sent_full = a_full.datagrams_sent_by_kind["fragment"]
    frags = a_lean._cache[lean_id].header.frags
    assert sent_lean[0] == sent_full[0] == frags  # the same fragments, each sent once
    # a fragment by digest carries 8 bytes where the full one carries the descriptor; every
    # DESCRIPTOR_EVERY-th (indexes 0, 16, ...) still carries it
    full_desc = len(wire._blob(a_full._cache[full_id].meta.zdesc))
    assert full_desc - wire.DESCRIPTOR_DIGEST_SIZE > 100
    with_desc = -(-frags // DESCRIPTOR_EVERY)
    assert frags > 2 * DESCRIPTOR_EVERY
    base = sent_full[1] - frags * full_desc  # everything but the descriptors
    lean_desc = len(wire._blob(a_lean._cache[lean_id].meta.zdesc))
    assert sent_lean[1] == (
        base + with_desc * lean_desc + (frags - with_desc) * wire.DESCRIPTOR_DIGEST_SIZE
    )
    assert lean.node("b").counters.get("fragments_unknown_descriptor", 0) == 0


def _published(host: str, size: int) -> tuple[Node, str]:
    node = Node(NodeConfig(host_id=host), rng=random.Random(3))
    msg_id = node.publish({"topic": "t"}, random.Random(4).randbytes(size), 1e5, 0.0)
    return node, msg_id


def _by_digest(node: Node, msg_id: str, index: int, zdesc: bytes | None = None) -> bytes:
    c = node._cache[msg_id]
    chunk = node._store.get_fragment(msg_id, index)
    assert chunk is not None
    return wire.encode_fragment_by_digest(
        node.host_id, msg_id, 1, index, c.meta.zdesc if zdesc is None else zdesc, chunk
    )


def test_a_fragment_naming_a_descriptor_the_host_does_not_hold_is_dropped() -> None:
    o, msg_id = _published("o", 5_000)
    h = Node(NodeConfig(host_id="h", altruistic=True), rng=random.Random(1))
    h.receive_datagram(_by_digest(o, msg_id, 0), "o", now=1.0)
    assert h.counters["fragments_unknown_descriptor"] == 1
    assert h.cache_listing() == []


def test_fragments_by_digest_complete_a_copy_started_from_the_descriptor() -> None:
    o, msg_id = _published("o", 5_000)
    h = Node(NodeConfig(host_id="h", altruistic=True), rng=random.Random(1))
    h.subscribe({"topic": "t"}, now=0.0)
    c = o._cache[msg_id]
    assert c.header.frags >= 3
    first = o._store.get_fragment(msg_id, 0)
    assert first is not None
    h.receive_datagram(wire.encode_fragment("o", msg_id, 1, 0, c.meta.zdesc, first), "o", 1.0)
    for i in range(1, c.header.frags):
        h.receive_datagram(_by_digest(o, msg_id, i), "o", now=1.0 + i)
    assert h.cache_entry(msg_id) is not None and h._cache[msg_id].complete
    delivered = [e for e in iter(h.next_event, None) if type(e).__name__ == "MessageDelivered"]
    assert [e.descriptor["id"] for e in delivered] == [msg_id]


def test_a_fragment_naming_another_descriptor_is_refused() -> None:
    o, msg_id = _published("o", 5_000)
    h = Node(NodeConfig(host_id="h", altruistic=True), rng=random.Random(1))
    c = o._cache[msg_id]
    first = o._store.get_fragment(msg_id, 0)
    assert first is not None
    h.receive_datagram(wire.encode_fragment("o", msg_id, 1, 0, c.meta.zdesc, first), "o", 1.0)
    forged = _by_digest(o, msg_id, 1, zdesc=c.meta.zdesc + b"x")  # names another descriptor
    h.receive_datagram(forged, "o", now=2.0)
    assert h.counters["dropped_descriptor_mismatch"] == 1
    assert h._cache[msg_id].count == 1  # only the first fragment


def test_an_overhearer_that_decoded_the_offer_keeps_fragments_by_digest() -> None:
    """A carrier in range of a transfer it did not ask for holds the descriptor from the
    catalog it overheard, and keeps the fragments sent to the requester."""
    net = VirtualNetwork(seed=11)
    net.add("a")
    net.add("b")
    c = net.add("c", altruistic=True)
    net.subscribe("b", {"topic": "report"})
    msg_id = net.publish("a", {"topic": "report"}, os.urandom(300_000), ttl=1e5)
    net.connect_all("a", "b", "c")
    net.run(60, stop=lambda: bool(net.deliveries("b")) and c.cache_entry(msg_id) is not None)
    assert [d.descriptor["id"] for d in net.deliveries("b")] == [msg_id]
    entry = c._cache.get(msg_id)
    assert entry is not None and entry.count > 0
    assert c.counters.get("fragments_unknown_descriptor", 0) == 0


def test_a_host_arriving_mid_transfer_keeps_fragments_after_one_with_the_descriptor() -> None:
    """It missed the offer: fragments by digest mean nothing to it until one of the
    fragments that still carry the descriptor (every ``DESCRIPTOR_EVERY``-th) comes."""
    o, msg_id = _published("o", 40_000)
    c = o._cache[msg_id]
    assert c.header.frags > DESCRIPTOR_EVERY + 2
    h = Node(NodeConfig(host_id="h", altruistic=True), rng=random.Random(1))
    h.subscribe({"topic": "t"}, now=0.0)
    h.receive_datagram(_by_digest(o, msg_id, DESCRIPTOR_EVERY - 1), "o", now=1.0)
    assert h.counters["fragments_unknown_descriptor"] == 1 and h.cache_listing() == []
    chunk = o._store.get_fragment(msg_id, DESCRIPTOR_EVERY)
    assert chunk is not None
    full = wire.encode_fragment("o", msg_id, 1, DESCRIPTOR_EVERY, c.meta.zdesc, chunk)
    h.receive_datagram(full, "o", now=2.0)
    h.receive_datagram(_by_digest(o, msg_id, DESCRIPTOR_EVERY + 1), "o", now=3.0)
    assert h._cache[msg_id].count == 2
    assert h.counters["fragments_unknown_descriptor"] == 1
