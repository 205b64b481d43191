"""A host at scale (issue: hundreds of subscriptions, a 100,000-message cache, prompt first
delivery), on the in-memory network in virtual time."""

from __future__ import annotations

import random

from dodwan.virtual import VirtualNetwork


def pair(seed: int, **config: object) -> VirtualNetwork:
    net = VirtualNetwork(seed=seed)
    net.add("a", **config)
    net.add("b", **config)
    net.link("a", "b")
    return net


def test_a_host_with_500_subscriptions_is_served_on_every_one() -> None:
    net = pair(11)
    keys = {}
    for i in range(250):  # distinct topics, and topic + selector-like attribute patterns
        keys[f"t{i}"] = net.subscribe("b", {"topic": f"news\\.t{i}"})
        keys[f"s{i}"] = net.subscribe("b", {"topic": f"sel\\.{i}", "level": f"({i}|{i + 1000})"})
    assert len(net.node("b").subscriptions()) == 500
    net.run(10)
    # b's profile spans several datagrams: a assembled it from pieces.
    assert len(net.node("b")._own_pieces) > 1
    assert net.node("a").neighbours()["b"]["patterns"] == net.node("b").profile()["own"]
    for i in range(250):
        net.publish("a", {"topic": f"news.t{i}"}, b"t%d" % i, ttl=3600)
        net.publish("a", {"topic": f"sel.{i}", "level": str(i + 1000)}, b"s%d" % i, ttl=3600)
    net.publish("a", {"topic": "news.t999"}, b"nobody", ttl=3600)
    net.run(120)
    got = {d.subscription: d.payload for d in net.deliveries("b")}
    assert len(got) == 500
    for i in range(250):
        assert got[keys[f"t{i}"]] == b"t%d" % i
        assert got[keys[f"s{i}"]] == b"s%d" % i


def test_an_unchanged_profile_costs_a_few_bytes_per_announcement() -> None:
    net = pair(12, announce_period=1.0)
    for i in range(300):
        net.subscribe("b", {"topic": f"news\\.topic-number-{i}"})
    net.run(5)
    sent = net.node("b").counters["bytes_sent"]
    pieces = net.node("b").counters["profile_pieces_sent"]
    net.run(60)
    # sixty more announcements, no piece sent again: each announcement stays small
    assert net.node("b").counters["profile_pieces_sent"] == pieces
    per_announce = (net.node("b").counters["bytes_sent"] - sent) / 60
    assert per_announce < 40


def test_first_delivery_after_subscribe_on_a_quiet_link_is_under_a_second() -> None:
    for seed in range(5):
        net = pair(20 + seed)
        mid = net.publish("a", {"topic": "news"}, b"hello", ttl=3600)
        net.run(17.3)  # a quiet link: a few announcement rounds already went by
        t0 = net.now
        net.subscribe("b", {"topic": "news"})
        net.run(5, stop=lambda net=net: bool(net.deliveries("b")))
        [d] = net.deliveries("b")
        assert d.descriptor["id"] == mid
        assert net.now - t0 < 1.0, f"seed {seed}: {net.now - t0:.2f} s"


def test_a_new_message_reaches_a_neighbour_past_a_100000_message_cache() -> None:
    net = pair(31, announce_period=5.0, cache_capacity=1 << 30, altruistic=False)
    a = net.node("a")
    rng = random.Random(5)
    for i in range(100_000):
        a.publish({"topic": f"old.{i % 977}"}, rng.randbytes(16), deadline=5e5, now=0.0)
    net.subscribe("b", {"topic": "old\\..*|fresh"})
    net.run(3)
    sent_before = a.counters.get("bytes_sent", 0)
    t0 = net.now
    mid = net.publish("a", {"topic": "fresh"}, b"new!", ttl=3600)
    net.run(10, stop=lambda: any(d.descriptor["id"] == mid for d in net.deliveries("b")))
    assert any(d.descriptor["id"] == mid for d in net.deliveries("b"))
    assert net.now - t0 <= 2 * 5.0
    assert a.counters.get("bytes_sent", 0) > sent_before
