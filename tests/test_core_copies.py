"""Copy budget (binary Spray-and-Wait) for altruistic carriers, on the in-memory network:
a carrier that fetches a message only to carry it takes half of its holder's budget, and a
copy whose budget is down to 1 goes to subscribers only."""

from __future__ import annotations

import random

import pytest

from dodwan import NodeConfig
from dodwan.core import wire
from dodwan.core.limits import Limits
from dodwan.virtual import VirtualNetwork

KB = 1000
MB = 1 << 20


def _copies(net: VirtualNetwork, host: str, msg_id: str) -> int | None:
    c = net.node(host)._cache.get(msg_id)
    return c.copies if c is not None and c.complete else None


def _spray(budget: int) -> tuple[VirtualNetwork, str]:
    net = VirtualNetwork(seed=7, bitrate=2e6)
    net.add("a", cache_capacity=8 * MB, copy_budget=budget)
    for h in "bcde":
        net.add(h, cache_capacity=8 * MB, altruistic=True)
    net.add("s", cache_capacity=8 * MB)
    net.subscribe("s", {"topic": "maps"})
    mid = net.publish("a", {"topic": "maps"}, random.Random(1).randbytes(300 * KB), 1e5)
    net.run(5.0)
    net.meet("a", "b")  # b takes 2 of 4
    net.meet("a", "c")  # c takes 1 of a's 2
    net.meet("a", "d")  # a's budget is 1: d, a carrier, does not take it
    net.meet("b", "e")  # e takes 1 of b's 2
    return net, mid


def test_carriers_take_half_of_the_budget_and_a_spent_copy_goes_to_subscribers_only() -> None:
    net, mid = _spray(4)
    assert {h: _copies(net, h, mid) for h in "abcde"} == {
        "a": 1,
        "b": 1,
        "c": 1,
        "d": None,
        "e": 1,
    }
    assert net.node("a").counters["copies_handed"] == 2
    # four copies in all, as the budget said; the subscriber still gets it from a carrier
    # whose budget is spent
    net.meet("d", "c")  # a carrier meeting a spent copy does not take it
    assert _copies(net, "d", mid) is None
    net.meet("s", "c")
    assert [d.descriptor["id"] for d in net.deliveries("s")] == [mid]
    assert _copies(net, "s", mid) == 1  # and may hand it to other subscribers only


def test_without_a_budget_every_carrier_takes_a_copy() -> None:
    net, mid = _spray(0)
    assert all(_copies(net, h, mid) == 0 for h in "abcde")


def test_a_spent_copy_is_not_offered_to_carriers() -> None:
    net, mid = _spray(2)  # b took 1 of 2; a has 1 left: c, d and e get nothing
    assert [_copies(net, h, mid) for h in "abcde"] == [1, 1, None, None, None]
    # a's catalogs to a carrier leave the spent copy out (they used to offer it every round)
    sent = net.node("a").counters.get("bytes_sent", 0)
    net.link("a", "d")
    net.run(12.0)
    net.unlink("a", "d")
    offered = net.node("d")._neighbours.get("a")
    assert offered is not None and mid not in offered.offers  # d heard a: nothing of it
    assert net.node("a").counters.get("bytes_sent", 0) - sent < 2 * KB


def test_the_copy_budget_travels_in_the_catalog_entry_flags() -> None:
    entry = wire.CatalogEntry("m1", 3, None, b"zdesc", copies=5)
    plain = wire.CatalogEntry("m1", 3, None, b"zdesc")
    encoded = wire.encode_catalog_entry(entry)
    # the same bytes as before budgets existed, but for the flags byte's bits 1-7
    old = wire.encode_catalog_entry(plain)
    assert len(encoded) == len(old)
    assert [i for i in range(len(old)) if encoded[i] != old[i]] == [len("m1") + 2]
    dg = wire.encode_catalog("h", 1, [encoded, wire.encode_catalog_entry(plain)])
    decoded = wire.decode(dg, Limits())
    assert isinstance(decoded, wire.Catalog)
    assert [e.copies for e in decoded.catalog] == [5, 0]
    with pytest.raises(ValueError, match="copy budget"):
        wire.encode_catalog_entry(wire.CatalogEntry("m1", 3, None, b"z", copies=128))


@pytest.mark.parametrize("bad", [-1, 128])
def test_a_copy_budget_out_of_range_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="copy_budget"):
        NodeConfig(host_id="h", copy_budget=bad)


def test_after_a_restart_own_publications_keep_their_budget_and_carried_copies_get_one() -> None:
    # The budget is not stored (docs/protocol.md, "Copy budget"); a restart must not give
    # carried copies an unbounded budget, nor take its own publications' budget away.
    from dodwan import MemoryStore, Node

    net = VirtualNetwork(seed=8, bitrate=2e6)
    store = MemoryStore()
    net.add("a", cache_capacity=8 * MB, copy_budget=4)
    net.add("b", store=store, cache_capacity=8 * MB, altruistic=True, copy_budget=6)
    carried = net.publish("a", {"topic": "maps"}, random.Random(2).randbytes(300 * KB), 1e5)
    own = net.publish("b", {"topic": "mine"}, b"own", 1e5)
    net.run(5.0)
    net.meet("a", "b")
    assert _copies(net, "b", carried) == 2  # half of a's 4
    again = Node(NodeConfig(host_id="b", altruistic=True, copy_budget=6), random.Random(1), store)
    assert again._cache[own].copies == 6
    assert again._cache[carried].copies == 1
