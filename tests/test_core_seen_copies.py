"""A full carrier evicts first the carried copies it has seen others hold
(``NodeConfig.seen_copy_age``): a cache keeps what few others hold."""

from __future__ import annotations

import os
import random

import pytest

from dodwan import Node, NodeConfig
from dodwan.core import cache, wire
from dodwan.virtual import VirtualNetwork

SIZE = 200_000
TTL = 1e5


def _carrier_after_three_offers(seen_copy_age: float) -> tuple[VirtualNetwork, dict[str, str]]:
    """Carrier k, room for two messages, holds A (published by a, older) and B (published
    by x, newer, also held by y: k sees two holders of B, one of A); then z's C comes."""
    net = VirtualNetwork(seed=3)
    for host in ("a", "x", "z"):
        net.add(host)
    net.add("y", altruistic=True)
    ids = {"A": net.publish("a", {"topic": "t"}, os.urandom(SIZE), ttl=TTL)}
    net.run(10)
    ids["B"] = net.publish("x", {"topic": "t"}, os.urandom(SIZE), ttl=TTL)
    net.link("x", "y")
    net.run(30, stop=lambda: (net.node("y").cache_entry(ids["B"]) or {}).get("complete") is True)
    net.unlink("x", "y")
    size = net.node("a").cache_listing()[0]["stored_bytes"]
    k = net.add("k", altruistic=True, cache_capacity=int(2.5 * size), seen_copy_age=seen_copy_age)
    net.link("k", "a")
    net.run(30)
    net.unlink("k", "a")
    net.link("k", "x")  # both offer B before k holds it (then they know it does)
    net.link("k", "y")
    net.run(30)
    net.unlink("k", "x")
    net.unlink("k", "y")
    assert {c["id"] for c in k.cache_listing() if c["complete"]} == {ids["A"], ids["B"]}
    net.run(10)
    ids["C"] = net.publish("z", {"topic": "t"}, os.urandom(SIZE), ttl=TTL)
    net.link("k", "z")
    net.run(30, stop=lambda: (k.cache_entry(ids["C"]) or {}).get("complete") is True)
    return net, ids


def test_a_full_carrier_evicts_the_copy_others_hold_and_keeps_the_rare_one() -> None:
    net, ids = _carrier_after_three_offers(seen_copy_age=0.2)
    k = net.node("k")
    assert sorted(k._copies_seen[ids["B"]]) == ["x", "y"]
    assert sorted(k._copies_seen[ids["A"]]) == ["a"]
    held = {c["id"] for c in k.cache_listing()}
    assert held == {ids["A"], ids["C"]}  # B, newer but held by two others, went


def test_without_it_the_oldest_carried_copy_goes() -> None:
    net, ids = _carrier_after_three_offers(seen_copy_age=0.0)
    k = net.node("k")
    assert k._copies_seen == {}
    assert {c["id"] for c in k.cache_listing()} == {ids["B"], ids["C"]}  # drop-oldest


def _catalog_from(sender: str, entries: list[wire.CatalogEntry]) -> bytes:
    return wire.encode_catalog(sender, 1, [wire.encode_catalog_entry(e) for e in entries])


def test_holders_are_counted_once_each_up_to_a_bound_and_only_for_a_valid_descriptor() -> None:
    origin = Node(NodeConfig(host_id="o"), rng=random.Random(1))
    msg_id = origin.publish({"topic": "t"}, random.Random(2).randbytes(5_000), 1e5, 0.0)
    c = origin._cache[msg_id]
    k = Node(NodeConfig(host_id="k", altruistic=True), rng=random.Random(3))
    entry = wire.CatalogEntry(msg_id, c.header.frags, None, c.meta.zdesc, 0)
    forged = wire.CatalogEntry(msg_id, c.header.frags, None, b"\x00" * 40, 0)
    partial = wire.CatalogEntry(msg_id, c.header.frags, 1, c.meta.zdesc, 0)
    k.receive_datagram(_catalog_from("liar", [forged]), "liar", 1.0)
    k.receive_datagram(_catalog_from("half", [partial]), "half", 1.0)
    assert msg_id not in k._copies_seen  # no valid descriptor, or not complete: not a holder
    for i in range(3 * cache._SEEN_HOLDERS):
        sender = f"h{i % (2 * cache._SEEN_HOLDERS)}"
        k.receive_datagram(_catalog_from(sender, [entry]), sender, 2.0 + i)
    assert len(k._copies_seen[msg_id]) == cache._SEEN_HOLDERS


def test_messages_tracked_are_bounded() -> None:
    k = Node(NodeConfig(host_id="k", altruistic=True), rng=random.Random(3))
    for i in range(cache._SEEN_MESSAGES + 10):
        k._seen_complete(f"m{i}", "h")
    assert len(k._copies_seen) == cache._SEEN_MESSAGES
    assert "m0" not in k._copies_seen and f"m{cache._SEEN_MESSAGES + 9}" in k._copies_seen


@pytest.mark.parametrize("value", [-0.1, 10.5, float("nan")])
def test_seen_copy_age_out_of_range_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="seen_copy_age"):
        NodeConfig(host_id="k", seen_copy_age=value)
