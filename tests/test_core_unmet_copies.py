"""A full carrier evicts first the carried copies whose subscribers it rarely meets
(``NodeConfig.unmet_copy_age``): a cache keeps what this host is likely to hand over."""

from __future__ import annotations

import os
import random

import pytest

from dodwan import Node, NodeConfig
from dodwan.core import cache
from dodwan.core.patterns import Profile
from dodwan.virtual import VirtualNetwork

SIZE = 200_000
TTL = 1e5


def _carrier_after_meeting_d(unmet_copy_age: float) -> tuple[VirtualNetwork, dict[str, str]]:
    """Carrier k (room for two messages) met d three times, never e; then it fetches A (for
    d, older) and B (for e, newer); then z's C comes and one of them must go."""
    net = VirtualNetwork(seed=5)
    for host in ("a", "b", "z", "d", "e"):
        net.add(host)
    net.subscribe("d", {"dest": "d"})
    net.subscribe("e", {"dest": "e"})
    size_probe = net.add("p")
    probe = size_probe.publish({"dest": "e"}, os.urandom(SIZE), TTL, 0.0)
    size = size_probe.cache_entry(probe)["stored_bytes"]
    k = net.add(
        "k",
        altruistic=True,
        cache_capacity=int(2.5 * size),
        seen_copy_age=0.0,  # only the contacts decide here
        unmet_copy_age=unmet_copy_age,
    )
    for _ in range(3):
        net.meet("k", "d")
    ids: dict[str, str] = {}
    for name, publisher, dest in (("A", "a", "d"), ("B", "b", "e"), ("C", "z", "e")):
        if name == "C":
            held = {c["id"] for c in k.cache_listing() if c["complete"]}
            assert held == {ids["A"], ids["B"]}
        msg_id = ids[name] = net.publish(publisher, {"dest": dest}, os.urandom(SIZE), ttl=TTL)
        net.link("k", publisher)
        net.run(30, stop=lambda m=msg_id: (k.cache_entry(m) or {}).get("complete") is True)
        net.unlink("k", publisher)
        net.run(10)
    return net, ids


def test_a_full_carrier_keeps_the_copy_for_the_host_it_meets_and_evicts_the_other() -> None:
    net, ids = _carrier_after_meeting_d(unmet_copy_age=0.4)
    k = net.node("k")
    assert k._met == {"d": 3, "a": 1, "b": 1, "z": 1}
    assert k._cache[ids["A"]].unmet_age == pytest.approx(0.4 * TTL / 4)  # 3 contacts with d
    assert k._cache[ids["C"]].unmet_age == pytest.approx(0.4 * TTL)  # nobody met wants it
    assert {c["id"] for c in k.cache_listing()} == {ids["A"], ids["C"]}  # B, newer, went


def test_without_it_the_oldest_carried_copy_goes() -> None:
    net, ids = _carrier_after_meeting_d(unmet_copy_age=0.0)
    k = net.node("k")
    assert k._met == {}
    assert {c["id"] for c in k.cache_listing()} == {ids["B"], ids["C"]}  # drop-oldest


def test_the_unmet_age_follows_the_profiles_held_and_the_hosts_met() -> None:
    """The hosts met whose profile matches are found through an index, built again when a
    profile held changes or another host is met: the answer stays a sum over every host."""
    net, ids = _carrier_after_meeting_d(unmet_copy_age=0.4)
    k = net.node("k")
    copy_for_d = k._cache[ids["A"]]
    assert k._unmet_age(copy_for_d) == pytest.approx(0.4 * TTL / 4)  # 3 contacts with d
    d_now = k._profiles.latest("d")
    assert d_now is not None
    moved = Profile.from_patterns({"dest": "elsewhere"})
    k._profiles.remember("d", moved.version, moved, (), "test")
    assert k._unmet_age(copy_for_d) == pytest.approx(0.4 * TTL)  # d no longer wants it
    k._profiles.drop("d", moved.version)
    assert k._profiles.latest("d") is d_now
    assert k._unmet_age(copy_for_d) == pytest.approx(0.4 * TTL / 4)
    also_d = Profile.from_patterns([{"dest": "d"}, {"dest": "q"}])
    k._profiles.remember("q", also_d.version, also_d, (), "test")
    assert k._unmet_age(copy_for_d) == pytest.approx(0.4 * TTL / 4)  # q not met yet
    k._met_host("q")
    assert k._unmet_age(copy_for_d) == pytest.approx(0.4 * TTL / 5)
    # the remote-memory budget gives d's profile up: the index lets go of it at once
    k._profile_given_up("d", d_now.version)
    assert k._met_index is None
    assert k._unmet_age(copy_for_d) == pytest.approx(0.4 * TTL / 2)  # q's one contact


def test_contacts_are_counted_for_a_bounded_number_of_hosts_least_recent_first_out() -> None:
    k = Node(NodeConfig(host_id="k", altruistic=True), rng=random.Random(3))
    k._met_host("h0")
    for i in range(1, cache._MET_HOSTS + 10):
        k._met_host(f"h{i}")
        k._met_host("h0")  # met again and again: never the least recent
    assert len(k._met) == cache._MET_HOSTS
    assert k._met["h0"] == cache._MET_HOSTS + 10
    assert "h1" not in k._met and f"h{cache._MET_HOSTS + 9}" in k._met


@pytest.mark.parametrize("value", [-0.1, 10.5, float("nan")])
def test_unmet_copy_age_out_of_range_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="unmet_copy_age"):
        NodeConfig(host_id="k", unmet_copy_age=value)


def test_an_own_publication_handed_on_takes_its_age_from_the_contacts_with_its_subscribers() -> (
    None
):
    """A host's own publication joins the carried copies once every fragment has gone out:
    from then on it counts as older by the share its subscribers' contacts leave."""
    net = VirtualNetwork(seed=7)
    net.add("d")
    net.subscribe("d", {"dest": "d"})
    p = net.add("p", seen_copy_age=0.0, unmet_copy_age=0.4)
    net.add("k", altruistic=True)
    for _ in range(2):
        net.meet("p", "d")
    msg_id = net.publish("p", {"dest": "d"}, os.urandom(SIZE), ttl=TTL)
    assert p._cache[msg_id].unmet_age == 0.0  # not handed on: the top tier ignores it
    net.link("p", "k")  # a carrier, not a subscriber, takes every fragment
    net.run(30, stop=lambda: p._cache[msg_id].handed)
    assert p._cache[msg_id].handed
    assert p._cache[msg_id].unmet_age == pytest.approx(0.4 * TTL / 3)  # 2 contacts with d
