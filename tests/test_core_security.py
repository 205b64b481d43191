"""Origin signatures and per-origin quotas: what a hostile carrier or flooder cannot do."""

from __future__ import annotations

import os
import random

import pytest
import zstandard

from dodwan import MemoryStore, Node, NodeConfig
from dodwan.core import message as m
from dodwan.core import wire
from dodwan.core.events import MessageDelivered
from dodwan.core.limits import Limits
from dodwan.core.profiles import MATCH_MEMORY
from dodwan.core.signing import public_key_of
from dodwan.virtual import VirtualNetwork

KEY_A = bytes(range(32))
KEY_X = bytes(range(1, 33))


def delivered(net: VirtualNetwork, host: str, key: str) -> list[bytes]:
    return [d.payload for d in net.deliveries(host) if d.subscription == key]


def test_subscription_requiring_a_key_gets_only_messages_signed_by_it() -> None:
    net = VirtualNetwork(seed=1)
    net.add("a", signing_key=KEY_A)
    net.add("x", signing_key=KEY_X)
    net.add("plain")
    net.add("b")
    net.connect_all("a", "x", "plain", "b")
    trusted = net.subscribe("b", {"t": "news"}, key="trusted", trusted_keys=[public_key_of(KEY_A)])
    anyone = net.subscribe("b", {"t": "news"}, key="anyone")
    net.publish("a", {"t": "news"}, b"from a", ttl=3600)
    net.publish("x", {"t": "news"}, b"from x", ttl=3600)
    net.publish("plain", {"t": "news"}, b"unsigned", ttl=3600)
    net.run(60)
    assert delivered(net, "b", trusted) == [b"from a"]
    assert sorted(delivered(net, "b", anyone)) == [b"from a", b"from x", b"unsigned"]
    assert net.node("a").public_key == public_key_of(KEY_A)
    assert net.node("b").trusted_keys("trusted") == [public_key_of(KEY_A)]
    assert net.node("b").trusted_keys("anyone") is None


def _signed_fragment(mutate: dict[str, str | None]) -> bytes:
    n = Node(NodeConfig(host_id="a", signing_key=KEY_A), rng=random.Random(0))
    n.publish({"t": "news"}, b"genuine", deadline=1000, now=0)
    n.handle_timer(0)
    [c] = n.cache_listing()
    desc = dict(c["descriptor"])
    for k, v in mutate.items():
        if v is None:
            desc.pop(k, None)
        else:
            desc[k] = v
    zdesc = zstandard.ZstdCompressor().compress(wire.encode_attributes(desc))
    chunk = n._store.get_fragment(c["id"], 0)  # type: ignore[attr-defined]
    assert chunk is not None
    return wire.encode_fragment("evil-carrier", c["id"], 3, 0, zdesc, chunk)


@pytest.mark.parametrize(
    "mutate",
    [
        {"t": "news", "extra": "injected"},  # altered attribute
        {m.SIG: None},  # signature stripped, key kept
        {m.SIGKEY: public_key_of(KEY_X)},  # another signer claimed
        {m.SIG: "00" * 64},
        {m.SIGKEY: "zz"},
    ],
)
def test_tampered_signed_messages_are_dropped(mutate: dict[str, str | None]) -> None:
    b = Node(NodeConfig(host_id="b"), rng=random.Random(1))
    b.subscribe({"t": "news"}, now=0)
    b.receive_datagram(_signed_fragment(mutate), "evil-carrier", now=1)
    assert b.counters["dropped_bad_signature"] == 1
    assert b.cache_listing() == []


def test_untampered_signed_fragment_from_a_carrier_is_accepted() -> None:
    b = Node(NodeConfig(host_id="b"), rng=random.Random(1))
    b.subscribe({"t": "news"}, now=0, trusted_keys=[public_key_of(KEY_A)])
    b.receive_datagram(_signed_fragment({}), "evil-carrier", now=1)
    payloads = [e.payload for e in iter(b.next_event, None) if hasattr(e, "payload")]
    assert payloads == [b"genuine"]


def test_trusted_keys_survive_a_restart_and_are_validated() -> None:
    store = MemoryStore()
    n = Node(NodeConfig(host_id="b"), rng=random.Random(0), store=store)
    n.subscribe({"t": "x"}, now=0, key="k", trusted_keys=[public_key_of(KEY_A)])
    again = Node(NodeConfig(host_id="b"), rng=random.Random(0), store=store)
    assert again.trusted_keys("k") == [public_key_of(KEY_A)]
    assert again.subscriptions() == {"k": [{"t": "x"}]}
    with pytest.raises(ValueError, match="not hex"):
        n.subscribe({"t": "x"}, now=0, trusted_keys=["nothex"])
    with pytest.raises(ValueError, match="32-byte"):
        n.subscribe({"t": "x"}, now=0, trusted_keys=["abcd"])
    with pytest.raises(TypeError):
        n.subscribe({"t": "x"}, now=0, trusted_keys="abcd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="signing_key"):
        NodeConfig(host_id="a", signing_key=b"short")
    with pytest.raises(ValueError, match="set by DoDWAN"):
        n.publish({"sig": "forged"}, b"x", deadline=10, now=0)


def test_a_flooding_origin_cannot_evict_own_or_subscribed_persistent_messages() -> None:
    capacity = 200_000
    net = VirtualNetwork(seed=2)
    victim = net.add("victim", altruistic=True, cache_capacity=capacity)
    net.add("friend")
    net.add("flooder", cache_capacity=1 << 26)
    net.subscribe("victim", {"t": "news"})
    own = net.publish("victim", {"t": "mine"}, os.urandom(20_000), ttl=10_000, priority=0)
    net.link("friend", "victim")
    wanted = net.publish("friend", {"t": "news"}, os.urandom(20_000), ttl=10_000, priority=0)
    net.run(30)
    assert {own, wanted} <= {c["id"] for c in victim.cache_listing()}
    net.link("flooder", "victim")
    for i in range(40):  # 40 x 20 KB of junk that even matches the subscription, top priority
        net.publish(
            "flooder", {"t": "news", "n": str(i)}, os.urandom(20_000), ttl=10_000, priority=9
        )
        net.run(2)
    net.run(60)
    held = {c["id"]: c for c in victim.cache_listing()}
    assert own in held and wanted in held
    usage = victim.cache_usage()
    assert usage["bytes"] <= capacity
    junk = sum(c["stored_bytes"] for c in held.values() if c["descriptor"]["origin"] == "flooder")
    assert junk <= 0.5 * capacity
    # the flooder sent far more than its share: the quota made its own oldest junk go
    from dodwan import MessageEvicted

    evicted = [e.msg_id for e in net.events("victim") if isinstance(e, MessageEvicted)]
    assert len(evicted) >= 20
    assert own not in evicted and wanted not in evicted


# --- bounded lifetimes and bounded work per datagram (issue: a hostile neighbour) ----------


def _unsigned_fragment(deadline: str) -> tuple[str, bytes]:
    """Fragment 0 of a one-fragment message whose descriptor says ``deadline``."""
    n = Node(NodeConfig(host_id="evil"), rng=random.Random(0))
    mid = n.publish({"t": "news"}, b"forever", deadline=1000, now=0)
    c = n._cache[mid]
    desc = dict(c.descriptor)
    desc[m.DEADLINE] = deadline
    zdesc = zstandard.ZstdCompressor().compress(wire.encode_attributes(desc))
    chunk = n._store.get_fragment(mid, 0)
    assert chunk is not None
    return mid, wire.encode_fragment("evil", mid, 1, 0, zdesc, chunk)


@pytest.mark.parametrize("deadline", ["inf", "1e300", "1e999", "nan", "9999999999"])
def test_a_descriptor_living_for_ever_is_refused(deadline: str) -> None:
    # inf and 1e300 used to be cached and delivered; `cache ls` then crashed on every host
    # carrying them (OverflowError) and GET /cache emitted non-JSON Infinity.
    b = Node(NodeConfig(host_id="b", altruistic=True), rng=random.Random(1))
    b.subscribe({"t": "news"}, now=0)
    mid, frag = _unsigned_fragment(deadline)
    b.receive_datagram(frag, "evil", now=1)
    assert b.cache_entry(mid) is None
    assert not [e for e in iter(b.next_event, None) if isinstance(e, MessageDelivered)]
    assert b.counters.get("bad_descriptors", 0) + b.counters.get("dropped_ttl_too_long", 0) == 1
    # one within the limit is still fine
    mid, frag = _unsigned_fragment(str(1 + 6 * 86400))
    b.receive_datagram(frag, "evil", now=1)
    assert b.cache_entry(mid) is not None


@pytest.mark.parametrize("deadline", [float("inf"), 1e300, float("nan"), 10 * 86400.0])
def test_a_local_publication_cannot_live_for_ever(deadline: float) -> None:
    n = Node(NodeConfig(host_id="a"), rng=random.Random(0))
    with pytest.raises(ValueError, match=r"finite|max_ttl|later than now"):
        n.publish({"t": "x"}, b"p", deadline=deadline, now=0)
    assert n.cache_listing() == []


def test_a_request_repeating_one_range_costs_what_it_asks_for_once() -> None:
    # One 60 KB request naming the same range 20,000 times stalled a daemon 2-3 s per
    # datagram, and the rate limiter counted nothing.
    a = Node(NodeConfig(host_id="a", max_datagram=1400), rng=random.Random(0))
    mid = a.publish({"t": "x"}, os.urandom(40_000), deadline=1000, now=0)
    frags = a._cache[mid].header.frags
    a.handle_timer(0)
    a.receive_datagram(wire.encode_announce("evil", 1, False, 0, 0, (), ()), "evil", now=0.5)
    a.datagrams_to_send(0.5)
    ranges = [(0, 65535)] * 15_000
    request = wire.encode_request("evil", "a", [(mid, ranges)])
    assert len(request) < 65_000
    a.receive_datagram(request, "evil", now=1.0)
    assert a.fragments_queued == frags
    tokens_left = a._serving.available("evil", 1.0)
    assert tokens_left <= a._limits.max_requests_per_second - frags  # charged
    # asked again at once: charged again, so a flood of such requests runs into the limit
    for _ in range(100):
        a.receive_datagram(request, "evil", now=1.0)
    assert a.counters["requests_rate_limited"] >= 1


# --- what compiled patterns cost ------------------------------------------------------------


def test_an_expression_that_compiles_to_a_huge_program_is_refused() -> None:
    # `.{999}` repeated is short text but a huge RE2 program: 16 x 64 of them in one profile
    # took +460 MB in a victim daemon, never released.
    from dodwan.core.patterns import PatternError, Profile

    for regex in (".{999}", ".{999}" * 7, "[^/]{1,255}[^/]{1,255}"):
        with pytest.raises(PatternError, match=r"too complex|too large"):
            Profile.from_patterns([{"topic": regex}])
    ok = Profile.from_patterns([{"topic": "[0-9a-f]{64}"}, {"topic": "news|sport"}])
    assert 0 < ok.cost < 200
    # many acceptable expressions together exceed the profile's budget
    lim = Limits(max_profile_program=2000)
    with pytest.raises(PatternError, match="max_profile_program"):
        Profile.from_patterns([{"topic": f"[0-9a-f]{{64}}-{i}"} for i in range(20)], lim)
    # a local subscription gets the same clear error
    n = Node(NodeConfig(host_id="a"), rng=random.Random(0))
    with pytest.raises(ValueError, match=r"too complex|too large"):
        n.subscribe({"topic": ".{999}"}, now=0)


def test_the_profiles_of_other_hosts_share_one_budget() -> None:
    # Each host subscribes to 4 expressions (RE2, 96 KiB each at worst): ~390 KiB a profile,
    # so a 1 MiB remote-memory budget holds two or three of the twelve.
    budget = 1 << 20
    net = VirtualNetwork(seed=2)
    v = net.add("v", limits=Limits(max_remote_memory=budget))
    held = []
    for k in range(12):
        net.add(f"h{k}")
        net.subscribe(f"h{k}", [{"topic": f"[0-9a-f]{{64}}{k}-{i}"} for i in range(4)])
        net.link("v", f"h{k}")
        net.run(8)
        net.unlink("v", f"h{k}")
        held.append(v._remote.total)
        # what is given up is let go everywhere: the compiled profiles still referenced by
        # neighbours and by the matcher fit the budget too
        live = {id(n.profile): n.profile.memory for n in v._neighbours.values()}
        assert sum(live.values()) <= budget
    assert v.counters["profiles_assembled"] >= 12
    assert max(held) <= budget and v.counters["remote_memory_evicted_profile"] > 0
    assert v._profiles.versions() < 12
    assert v._neighbours["h11"].profile  # the latest arrival holds its share


def test_what_remote_profiles_match_is_charged_to_the_budget() -> None:
    # The matcher keeps, per known profile, the set of cached messages it matches: a crowd of
    # cheap profiles matching everything (a plain string on an attribute every descriptor
    # has) made one set of every cached message each, outside any budget.
    budget = 400 << 10
    net = VirtualNetwork(seed=3)
    v = net.add("v", limits=Limits(max_remote_memory=budget))
    for i in range(300):
        net.publish("v", {"topic": f"t{i}"}, b"x", 600)
    for k in range(30):
        net.add(f"h{k}")
        net.subscribe(f"h{k}", {"persistent": "true"})
        net.link("v", f"h{k}")
    net.run(20)
    assert v.counters["profiles_assembled"] >= 30
    matched = sum(len(v._matcher.matching(h)) for h in v._matcher.hosts())
    assert v.counters["remote_memory_evicted_profile"] > 0
    assert matched * MATCH_MEMORY <= budget  # 30 x 300 entries (650 KB) would not fit
    kept = [h for h in v._matcher.hosts() if len(v._matcher.matching(h)) == 300]
    assert kept  # some are held, each charged for its 300 entries
    prof = v._known[kept[0]][1]
    assert v._remote.charged("profile", (kept[0], prof.version)) >= 300 * MATCH_MEMORY


def test_a_neighbour_arriving_after_a_flood_still_gets_its_share() -> None:
    # One socket (40 sender names) fills the whole remote-memory budget with offers of
    # padded descriptors; a neighbour that arrives afterwards at another address still gets
    # its profile assembled and its message asked for, and keeps them while the flood goes
    # on: the address holding the most gives up its oldest state first.
    budget = 1 << 20
    net = VirtualNetwork(seed=5)
    v = net.add("v", limits=Limits(max_remote_memory=budget), altruistic=True)
    evil = Node(NodeConfig(host_id="evil", cache_capacity=1 << 30), rng=random.Random(0))
    rng = random.Random(1)
    entries = []
    for i in range(900):
        pad = "".join(rng.choice("ab") for _ in range(2000))
        mid = evil.publish({"t": f"junk{i}", "pad": pad}, b"x", deadline=10_000, now=0)
        zdesc = evil._cache[mid].meta.zdesc
        entries.append(wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, zdesc)))

    def flood(part: int) -> None:
        for k in range(part * 300, part * 300 + 300, 10):
            name = f"evil{k % 40}"
            v.receive_datagram(wire.encode_catalog(name, 2, entries[k : k + 10]), "sock", net.now)

    for name in (f"evil{j}" for j in range(40)):
        v.receive_datagram(wire.encode_announce(name, 1, False, 0, 0, (), ()), "sock", net.now)
    flood(0)
    assert v._remote.held_by("sock") > budget * 0.9  # it holds (nearly) everything
    net.add("real")
    net.subscribe("real", [{"topic": f"[0-9a-f]{{8}}-{i}"} for i in range(3)])
    mid = net.publish("real", {"topic": "deadbeef-1"}, b"wanted", 600)
    net.link("v", "real")
    net.run(6)
    flood(1)
    flood(2)
    net.run(6)
    assert v._remote.total <= budget
    assert v.counters["remote_memory_evicted_descriptor"] > 0
    real = v._neighbours["real"]
    assert real.profile and len(real.profile.patterns) == 3  # its profile is known
    assert v._remote.held_by("real") > 0 and mid in v._cache  # and its message was taken
    assert v._remote.held_by("sock") <= budget - v._remote.held_by("real")


def test_a_crowd_of_fake_neighbours_cannot_hold_a_host_and_a_real_one_still_gets_in() -> None:
    # 3,000 sender names with offers each used to be tracked until they expired (+330 MB).
    v = Node(NodeConfig(host_id="v", limits=Limits(max_neighbours=32)), rng=random.Random(0))
    v.subscribe({"topic": "x"}, now=0.0)
    for i in range(3000):
        v.receive_datagram(wire.encode_announce(f"fake{i}", 1, False, 0, 0, (), ()), i, 0.001 * i)
    assert len(v.neighbours()) == 32
    assert v.counters["neighbours_displaced"] == 3000 - 32
    real = Node(NodeConfig(host_id="real"), rng=random.Random(1))
    mid = real.publish({"topic": "x"}, b"hello", deadline=100, now=3.0)
    real.receive_datagram(wire.encode_announce("v", 1, False, 0, 0, (), ()), "v", now=3.0)
    for t in (3.0, 3.5, 4.0, 5.0, 6.0):  # real and v talk: v lets it in and gets the message
        real.handle_timer(t)
        for data, _ in real.datagrams_to_send(t):
            v.receive_datagram(data, "real", now=t)
        v.handle_timer(t + 0.1)
        for data, _ in v.datagrams_to_send(t + 0.1):
            real.receive_datagram(data, "v", now=t + 0.1)
    assert "real" in v.neighbours()
    assert [
        e.descriptor["id"] for e in iter(v.next_event, None) if isinstance(e, MessageDelivered)
    ] == [mid]


def test_offered_descriptors_are_kept_decoded_within_a_budget() -> None:
    # Catalogs of valid descriptors padded to ~8 KB (160 bytes compressed) filled a
    # 65,536-entry cache of decoded descriptors: 10.6 MB sent -> +671 MB.
    import tracemalloc

    evil = Node(NodeConfig(host_id="evil", cache_capacity=1 << 30), rng=random.Random(0))
    rng = random.Random(1)
    entries = []
    for i in range(1500):
        pad = "".join(rng.choice("ab") for _ in range(3000))  # compresses, decodes big
        mid = evil.publish({"t": f"junk{i}", "pad": pad}, b"x", deadline=1000, now=0)
        c = evil._cache[mid]
        entries.append(wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, c.meta.zdesc)))
    budget = 1 << 20
    v = Node(NodeConfig(host_id="v", limits=Limits(max_remote_memory=budget)), random.Random(2))
    v.receive_datagram(wire.encode_announce("evil", 1, False, 0, 0, (), ()), "evil", now=1.0)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for k in range(0, len(entries), 10):
        v.receive_datagram(wire.encode_catalog("evil", 2, entries[k : k + 10]), "evil", now=1.0)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert v.counters.get("datagrams_dropped", 0) == 0  # all were valid catalogs
    assert v._remote.total <= budget and len(v._zdesc_cache) < 1500
    assert v.counters["remote_memory_evicted_descriptor"] > 0
    assert grown < 4 * budget, grown  # the decoded descriptors alone would be ~6 MB


def test_offers_of_huge_messages_cost_what_was_sent() -> None:
    # Catalog entries of ids declaring 65,536 fragments, from hundreds of sender names: an
    # 8 KiB mask was kept per offered id (1.4 MB sent -> +900 MB).
    import tracemalloc

    v = Node(NodeConfig(host_id="v"), rng=random.Random(0))
    desc = {"id": "x", "deadline": "1000", "origin": "o", "date": "0", "size": "1",
            "zsize": str(65536 * 100), "frags": "65536", "fsize": "100", "zhash": "0" * 64,
            "priority": "4", "persistent": "true"}  # fmt: skip
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    sent = 0
    for s in range(50):
        entries = []
        for i in range(200):
            d = {**desc, "id": f"o-{s}-{i}"}
            zdesc = zstandard.ZstdCompressor().compress(wire.encode_attributes(d))
            entries.append(
                wire.encode_catalog_entry(wire.CatalogEntry(d["id"], 65536, None, zdesc))
            )
        dg = wire.encode_announce(f"fake{s}", 1, False, 0, 0, (), entries)
        sent += len(dg)
        v.receive_datagram(dg, f"fake{s}", now=1.0)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    # each offer is charged its mask (8 KiB here, shared or not): 10,000 of them pass the
    # remote-memory budget, and the senders holding the most gave up their oldest offers
    assert v._remote.total <= v._limits.max_remote_memory
    assert v.counters["remote_memory_evicted_offers"] > 0
    assert len(v._neighbours["fake49"].offers) == 200  # the latest still got its share
    assert grown < 20 * sent, (grown, sent)  # was 10,000 x 8 KiB = 80 MB for ~0.6 MB sent


def test_partial_offers_from_many_addresses_stay_within_the_remote_budget() -> None:
    # A partial offer carries its fragment mask (8 KiB for 65,536 fragments) and was kept
    # per neighbour up to 2,048 offers: 256 neighbours could make a host hold 4 GiB. Here 20
    # addresses offer 100 each (16 MB sent); the host keeps what its budget allows.
    import tracemalloc

    budget = 4 << 20
    v = Node(NodeConfig(host_id="v", limits=Limits(max_remote_memory=budget)), random.Random(0))
    desc = {"id": "x", "deadline": "1000", "origin": "o", "date": "0", "size": "1",
            "zsize": str(65536 * 100), "frags": "65536", "fsize": "100", "zhash": "0" * 64,
            "priority": "4", "persistent": "true"}  # fmt: skip
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for s in range(20):
        for k in range(0, 100, 5):
            entries = []
            for i in range(k, k + 5):
                d = {**desc, "id": f"o-{s}-{i}"}
                zdesc = zstandard.ZstdCompressor().compress(wire.encode_attributes(d))
                have = (1 << 65535) | (1 << i)  # a different partial mask each
                entries.append(
                    wire.encode_catalog_entry(wire.CatalogEntry(d["id"], 65536, have, zdesc))
                )
            dg = wire.encode_announce(f"fake{s}", 1, False, 0, 0, (), entries)
            v.receive_datagram(dg, f"addr{s}", now=1.0)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert v.counters.get("datagrams_dropped", 0) == 0
    assert grown < 2 * budget, grown  # 16.6 MB of masks were kept before
    assert len(v._neighbours["fake19"].offers) == 100  # the latest keeps all it offered


def test_large_hostile_requests_are_not_kept_decoded() -> None:
    # Every distinct ~60 KB request stayed decoded in the shared decode cache (256 entries of
    # ~1.6 MB of range tuples): 21 MB sent took a victim from 63 to 409 MB, not released.
    import tracemalloc

    from dodwan.core import wire as w

    w.decode_cached.cache_clear()
    v = Node(NodeConfig(host_id="v"), rng=random.Random(0))
    v.receive_datagram(wire.encode_announce("evil", 1, False, 0, 0, (), ()), "evil", now=0.0)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for k in range(40):
        ranges = [(i % 500 + k, 1) for i in range(12_000)]
        v.receive_datagram(wire.encode_request("evil", "v", [(f"m{k}", ranges)]), "evil", 1.0)
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert grown < 4 << 20, grown  # 40 x ~1.3 MB when cached


# --- work peers can trigger: charged per source address and in all -------------------------


def _offers(count: int, tag: str) -> list[bytes]:
    """Catalog entries of ``count`` valid, distinct descriptors nobody subscribed to."""
    evil = Node(NodeConfig(host_id=f"o{tag}", cache_capacity=1 << 30), rng=random.Random(0))
    out = []
    for i in range(count):
        mid = evil.publish({"t": f"junk.{tag}.{i}"}, b"x", deadline=1000, now=0)
        zdesc = evil._cache[mid].meta.zdesc
        out.append(wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, zdesc)))
    return out


def test_a_flood_of_offers_from_one_socket_costs_a_bounded_number_of_decodes() -> None:
    # 40 sender names behind one address offering 6,000 new descriptors within a second:
    # each was decoded, checked and matched (tens of microseconds each, whatever the names).
    v = Node(NodeConfig(host_id="v"), rng=random.Random(2))
    v.subscribe({"t": "news"}, now=0.0)
    entries = _offers(6000, "a")
    for k in range(0, len(entries), 150):
        sender = f"evil{k // 150}"
        v.receive_datagram(
            wire.encode_announce(sender, 1, False, 0, 0, (), entries[k : k + 150]), "evil-addr", 1.0
        )
    budget = v._limits.max_descriptor_decodes
    assert len(v._zdesc_cache) <= budget  # one second's worth for that address
    assert v.counters["descriptors_deferred"] >= len(entries) - budget
    # a neighbour at another address is still heard: its offer is decoded and asked for
    friend = Node(NodeConfig(host_id="friend"), rng=random.Random(3))
    mid = friend.publish({"t": "news"}, b"hello", deadline=1000, now=0.0)
    zdesc = friend._cache[mid].meta.zdesc
    offer = wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, zdesc))
    v.receive_datagram(wire.encode_announce("friend", 1, False, 0, 0, (), [offer]), "f-addr", 1.1)
    assert mid in v._pending.get("friend", {})


def test_offers_from_ever_new_sockets_share_one_decode_budget() -> None:
    v = Node(NodeConfig(host_id="v"), rng=random.Random(2))
    entries = _offers(6000, "b")
    for k in range(0, len(entries), 100):  # 60 addresses, 100 new offers each, in a second
        sender = f"evil{k}"
        dg = wire.encode_announce(sender, 1, False, 0, 0, (), entries[k : k + 100])
        v.receive_datagram(dg, f"addr{k}", 1.0)
    decoded = len(v._zdesc_cache)
    assert decoded <= v._limits.max_descriptor_decodes_total
    # later the budget is back: the offers deferred are decoded when offered again
    again = wire.encode_announce("evil59", 2, False, 0, 0, (), entries[5900:])
    v.receive_datagram(again, "addr5900", 2.5)
    assert len(v._zdesc_cache) == decoded + 100


def test_sender_names_behind_one_socket_share_one_serving_budget() -> None:
    # 21 MB of requests from many names made a victim send 310 MB: the rate limit was per
    # name, and names are free.
    v = Node(NodeConfig(host_id="v", max_datagram=1400), rng=random.Random(0))
    mid = v.publish({"t": "x"}, os.urandom(1_000_000), deadline=1000, now=0)
    frags = v._cache[mid].header.frags
    v.handle_timer(0)
    sent = 0
    for k in range(40):  # 40 names, each asking for the whole message, within one second
        sender = f"evil{k}"
        now = 1.0 + k * 0.02
        v.receive_datagram(wire.encode_announce(sender, 1, False, 0, 0, (), ()), "evil-addr", now)
        v.receive_datagram(
            wire.encode_request(sender, "v", [(mid, [(0, frags)])]), "evil-addr", now
        )
        sent += sum(1 for dg, _ in v.datagrams_to_send(now) if dg[3] in wire.FRAGMENT_KINDS)
    per_second = v._limits.max_requests_per_second
    assert sent <= 2 * per_second  # one second's burst plus what refilled (< 1 s)
    assert v.counters["requests_rate_limited"] >= 1


# --- inflation on delivery -----------------------------------------------------------------


def _bomb(origin: Node, tag: str, size: int, now: float) -> list[bytes]:
    """Fragment datagrams of an all-zero message of ``size`` bytes (a few hundred on the air)."""
    mid = origin.publish({"t": "news", "n": tag}, bytes(size), deadline=now + 7200, now=now)
    c = origin._cache[mid]
    return [
        wire.encode_fragment(
            origin.host_id, mid, 1, i, c.meta.zdesc, origin._store.get_fragment(mid, i) or b""
        )
        for i in range(c.header.frags)
    ]


def _delivered(node: Node) -> list[str]:
    out = []
    while (ev := node.next_event()) is not None:
        if isinstance(ev, MessageDelivered):
            out.append(ev.descriptor["n"])
    return out


def test_what_one_origin_makes_a_host_inflate_counts_against_its_allowance() -> None:
    # All-zero messages of 8 MiB are ~1 KB on the air: every one was inflated and handed to
    # the sinks at once (a dir sink wrote 64 MiB per few KB received).
    MiB = 1 << 20
    limits = Limits(max_inflation_per_origin=20 * MiB)
    v = Node(NodeConfig(host_id="v", limits=limits), rng=random.Random(0))
    v.subscribe({"t": "news"}, now=0.0)
    origin = Node(NodeConfig(host_id="o", cache_capacity=1 << 30), rng=random.Random(1))
    other = Node(NodeConfig(host_id="p", cache_capacity=1 << 30), rng=random.Random(2))
    sent = [d for k in range(3) for d in _bomb(origin, f"o{k}", 8 * MiB, 0.0)]
    sent += _bomb(other, "p0", 8 * MiB, 0.0)
    assert sum(map(len, sent)) < 8 * 1024
    for d in sent:
        v.receive_datagram(d, "nbr", now=1.0)
    # two of o's fit in its 20 MiB, the third waits; another origin has its own allowance
    assert sorted(_delivered(v)) == ["o0", "o1", "p0"]
    assert v.counters["deliveries_deferred_inflation"] == 1
    assert v.cache_usage()["complete"] == 4  # nothing stored is dropped
    v.handle_timer(600.0)  # a sixth of the hour: not yet refilled enough
    assert _delivered(v) == []
    v.handle_timer(1.0 + 3600.0 * 0.4 + 20)  # 8 MiB of 20 MiB/h: refilled after ~24 min
    assert _delivered(v) == ["o2"]
    assert v.get_timer() is not None


def test_origins_share_one_inflation_allowance_in_all() -> None:
    MiB = 1 << 20
    limits = Limits(max_inflation_per_origin=64 * MiB, max_inflation_total=20 * MiB)
    v = Node(NodeConfig(host_id="v", limits=limits), rng=random.Random(0))
    v.subscribe({"t": "news"}, now=0.0)
    for k in range(4):  # four origins (names are free), one bomb each
        o = Node(NodeConfig(host_id=f"o{k}", cache_capacity=1 << 30), rng=random.Random(k))
        for d in _bomb(o, f"o{k}", 8 * MiB, 0.0):
            v.receive_datagram(d, f"addr{k}", now=1.0)
    assert len(_delivered(v)) == 2
    assert v.counters["deliveries_deferred_inflation"] == 2


def test_an_overheard_request_naming_a_host_that_will_not_answer_suppresses_nothing() -> None:
    # A host drops from its own pending requests what it overhears others ask for (the
    # answer is broadcast). A fake request naming a host that is not there, or that never
    # offered the message, made the victim wait request_timeout for nothing, again and again.
    a = Node(NodeConfig(host_id="a", max_datagram=1400), rng=random.Random(1))
    mid = a.publish({"t": "news"}, os.urandom(20_000), deadline=1000, now=0.0)
    zdesc = a._cache[mid].meta.zdesc
    frags = a._cache[mid].header.frags
    offer = wire.encode_catalog_entry(wire.CatalogEntry(mid, frags, None, zdesc))
    v = Node(NodeConfig(host_id="v"), rng=random.Random(2))
    v.subscribe({"t": "news"}, now=0.0)
    v.receive_datagram(wire.encode_announce("a", 1, False, 0, 0, (), [offer]), "a-addr", 1.0)
    assert v._pending["a"][mid]  # v is about to ask a for it
    for target in ("ghost", "evil"):  # not a neighbour; a neighbour that offered nothing
        fake = wire.encode_request("evil", target, [(mid, [(0, frags)])])
        v.receive_datagram(fake, "evil-addr", 1.01)
        assert v._pending["a"][mid] == (1 << frags) - 1, target
    assert v.counters.get("requests_suppressed", 0) == 0
    # a request to a, which offered it, is answered by broadcast: that one is suppressed
    c_asks = wire.encode_request("c", "a", [(mid, [(0, frags)])])
    v.receive_datagram(c_asks, "c-addr", 1.02)
    assert mid not in v._pending.get("a", {})
    assert v.counters["requests_suppressed"] == 1


def test_an_overheard_profile_request_naming_a_stranger_suppresses_nothing() -> None:
    a = Node(NodeConfig(host_id="a"), rng=random.Random(1))
    a.subscribe({"t": "news"}, now=0.0)
    version, pieces = a._own_profile.version, len(a._own_pieces)
    v = Node(NodeConfig(host_id="v"), rng=random.Random(2))
    v.receive_datagram(wire.encode_announce("a", 1, False, version, pieces, (), ()), "a", 1.0)
    assert ("a", version) in v._profiles._pending["a"]  # v is about to ask a for its profile
    fake = wire.encode_profile_request("evil", "ghost", [("a", version, [(0, pieces)])])
    v.receive_datagram(fake, "evil-addr", 1.01)
    assert ("a", version) in v._profiles._pending["a"]
    real = wire.encode_profile_request("c", "a", [("a", version, [(0, pieces)])])
    v.receive_datagram(real, "c-addr", 1.02)
    assert ("a", version) not in v._profiles._pending.get("a", {})


def _fragments(host: str, topic: str, size: int, priority: int, now: float) -> list[bytes]:
    node = Node(NodeConfig(host_id=host, cache_capacity=1 << 26), rng=random.Random(size))
    mid = node.publish({"t": topic}, random.Random(size).randbytes(size), deadline=1e5,
                       now=now, priority=priority)  # fmt: skip
    c = node._cache[mid]
    return [
        wire.encode_fragment(host, mid, 1, i, c.meta.zdesc, node._store.get_fragment(mid, i) or b"")
        for i in range(c.header.frags)
    ]


def test_partial_sets_of_origins_never_seen_complete_are_the_first_to_go() -> None:
    # A flood of top-priority fragments from an origin whose messages never complete here
    # used to outrank the partial set of an origin this host had completed messages from.
    v = Node(NodeConfig(host_id="v", altruistic=True, cache_capacity=1_000_000), random.Random(0))
    for d in _fragments("legit", "a", 500, 4, now=0.0):  # one complete message of legit
        v.receive_datagram(d, "legit", now=1.0)
    junk = _fragments("junk", "b", 400_000, 9, now=2.0)
    kept = _fragments("legit", "c", 400_001, 4, now=1.5)
    v.receive_datagram(junk[0], "junk", now=3.0)
    v.receive_datagram(kept[0], "legit", now=3.0)
    for d in junk[1:220] + kept[1:220]:
        v.receive_datagram(d, "x", now=3.5)
    partial = {e["descriptor"]["t"] for e in v.cache_listing() if not e["complete"]}
    assert partial == {"b", "c"}
    v.publish({"t": "mine"}, random.Random(9).randbytes(500_000), deadline=1e5, now=4.0)
    partial = {e["descriptor"]["t"] for e in v.cache_listing() if not e["complete"]}
    assert partial == {"c"}  # the junk origin's partial set went first


def _offer_of(host: str, topic: str, size: int, seed: int) -> tuple[str, bytes, bytes]:
    """(id, catalog entry, fragment 0) of a fresh incompressible message of ``host``."""
    node = Node(NodeConfig(host_id=host, cache_capacity=1 << 26), rng=random.Random(seed))
    mid = node.publish({"t": topic}, random.Random(seed).randbytes(size), deadline=1e5, now=0.0)
    c = node._cache[mid]
    entry = wire.encode_catalog_entry(wire.CatalogEntry(mid, c.header.frags, None, c.meta.zdesc))
    first = wire.encode_fragment(host, mid, 1, 0, c.meta.zdesc, node._store.get_fragment(mid, 0))
    return mid, entry, first


def test_one_neighbour_cannot_take_the_whole_reassembly_memory() -> None:
    # One socket, many names: offers of 400 kB messages the victim subscribed to, and the
    # first fragment of each, never the rest. The partial sets held the whole reassembly
    # memory (max_partial_bytes) for partial_timeout, so an honest neighbour's message
    # offered next was deferred ("deferred_reassembly_budget") for half an hour.
    limits = Limits(max_partial_bytes=4 << 20)
    v = Node(NodeConfig(host_id="v", cache_capacity=1 << 26, limits=limits), random.Random(0))
    v.subscribe({"t": "news"}, now=0.0)
    for k in range(12):
        name = f"evil{k}"
        mid, entry, first = _offer_of(name, "news", 400_000, seed=k)
        v.receive_datagram(wire.encode_announce(name, 1, False, 0, 0, (), ()), "evil-addr", 1.0)
        v.receive_datagram(wire.encode_catalog(name, 2, [entry]), "evil-addr", now=1.0)
        v.receive_datagram(first, "evil-addr", now=1.1)
    held = sum(1 for e in v.cache_listing() if not e["complete"])
    assert 0 < held * 400_000 <= limits.max_partial_share * limits.max_partial_bytes + 400_000
    assert v.counters["deferred_neighbour_share"] > 0
    mid, entry, _ = _offer_of("honest", "news", 400_000, seed=99)
    v.receive_datagram(wire.encode_announce("honest", 1, False, 0, 0, (), ()), "good-addr", 2.0)
    v.receive_datagram(wire.encode_catalog("honest", 2, [entry]), "good-addr", now=2.0)
    assert mid in v._reserved  # room was promised to it: it is being asked for
    assert v.counters.get("deferred_reassembly_budget", 0) == 0


def test_a_neighbour_that_offers_and_never_sends_is_not_asked_for_ever() -> None:
    # A neighbour offering what a host subscribed to and never sending it was asked again
    # every request_timeout for as long as it stayed (bench/attack.py: 650,000 retries in
    # 300 s, with the admin API seconds late).
    v = Node(NodeConfig(host_id="v", cache_capacity=1 << 26), random.Random(0))
    v.subscribe({"t": "news"}, now=0.0)
    _, entry, _ = _offer_of("liar", "news", 400_000, seed=5)
    v.receive_datagram(wire.encode_announce("liar", 1, False, 0, 0, (), ()), "liar-addr", 1.0)
    v.receive_datagram(wire.encode_catalog("liar", 2, [entry]), "liar-addr", now=1.0)
    t = 1.0
    while t < 60.0:
        t += 0.25
        if t % 2 == 0:  # it keeps announcing (without offering again): still a neighbour
            v.receive_datagram(wire.encode_announce("liar", 1, False, 0, 0, (), ()), "liar-addr", t)
        v.handle_timer(t)
        v.datagrams_to_send(t)
    assert "liar" in v.neighbours()
    assert v.counters["requests_sent"] <= 4  # asked, then asked again 3 times at most
    assert v.counters["requests_given_up"] == 1
    # offered again: asked again
    v.receive_datagram(wire.encode_catalog("liar", 3, [entry]), "liar-addr", now=t)
    v.handle_timer(t + 0.1)
    v.datagrams_to_send(t + 0.1)
    assert v.counters["requests_sent"] == 5


# --- forged descriptors under a genuine message id -----------------------------------------


def _forged_offer(mid: str, topic: str, deadline: float) -> bytes:
    """A catalog entry naming ``mid`` under a valid descriptor of the forger's choosing."""
    forger = Node(NodeConfig(host_id="evil"), rng=random.Random(5))
    forger.publish({"id": mid, "t": topic}, b"junk", deadline=deadline, now=0.0)
    zdesc = forger._cache[mid].meta.zdesc
    return wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, zdesc))


def _requests_from(v: Node, now: float) -> list[tuple[str, str]]:
    """(target, id) of every request ``v`` sends by ``now``."""
    v.handle_timer(now)
    out = []
    for dg, _ in v.datagrams_to_send(now):
        d = wire.decode(dg, v._limits)
        if isinstance(d, wire.Request):
            out += [(d.target, msg_id) for msg_id, _ in d.entries]
    return out


@pytest.mark.parametrize("topic", ["junk", "news"])
def test_a_forged_offer_of_an_id_does_not_stop_the_genuine_message(topic: str) -> None:
    # One catalog entry naming the id of a message the victim subscribed to, under a valid
    # descriptor it does not want ("junk") and a 7-day deadline: the victim remembered "not
    # wanted" for that id and never asked for the genuine message offered next. Forged
    # under a descriptor it does want ("news"), it must not stop the genuine one either.
    net = VirtualNetwork(seed=1)
    net.add("h", max_datagram=1400)
    net.add("v")
    net.subscribe("v", {"t": "news"})
    payload = random.Random(7).randbytes(30_000)  # 20+ fragments, most sent by digest
    mid = net.publish("h", {"t": "news"}, payload, ttl=3600)
    v = net.node("v")
    forged = _forged_offer(mid, topic, deadline=net.now + 7 * 86400 - 60)
    v.receive_datagram(wire.encode_announce("evil", 1, False, 0, 0, (), [forged]), "evil", 0.0)
    net.link("h", "v")
    net.run(60)
    [got] = net.deliveries("v")
    assert got.payload == payload
    assert got.descriptor["t"] == "news"  # the genuine descriptor, not the forged one
    [held] = v.cache_listing()
    assert held["complete"] and held["descriptor"]["t"] == "news"


@pytest.mark.parametrize("forged_first", [True, False])
def test_the_genuine_offer_is_asked_for_whatever_was_offered_under_its_id(
    forged_first: bool,
) -> None:
    h = Node(NodeConfig(host_id="h"), rng=random.Random(1))
    mid = h.publish({"t": "news"}, b"genuine", deadline=3600.0, now=0.0)
    c = h._cache[mid]
    genuine = wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, c.meta.zdesc))
    forged = _forged_offer(mid, "junk", deadline=7 * 86400 - 60)
    v = Node(NodeConfig(host_id="v"), rng=random.Random(2))
    v.subscribe({"t": "news"}, now=0.0)
    offers = [("evil", "evil-addr", forged), ("h", "h-addr", genuine)]
    for sender, address, entry in offers if forged_first else offers[::-1]:
        v.receive_datagram(wire.encode_announce(sender, 1, False, 0, 0, (), [entry]), address, 1.0)
    assert _requests_from(v, 2.0) == [("h", mid)]
    # offered again later, from either: the verdict does not flip
    for sender, address, entry in offers + offers:
        v.receive_datagram(wire.encode_catalog(sender, 2, [entry]), address, 5.0)
    v.receive_datagram(
        wire.encode_fragment("h", mid, 1, 0, c.meta.zdesc, h._store.get_fragment(mid, 0) or b""),
        "h-addr",
        5.5,
    )
    assert [e["descriptor"]["t"] for e in v.cache_listing()] == ["news"]
    assert [e.payload for e in iter(v.next_event, None) if isinstance(e, MessageDelivered)] == [
        b"genuine"
    ]


def test_descriptors_offered_under_one_id_are_remembered_one_at_a_time() -> None:
    # Many forged descriptors under one genuine id, before and after the genuine one: one
    # descriptor and one verdict are remembered for the id whatever is offered; each
    # forged one costs its sender's address a decode; only a descriptor wanted more (the
    # genuine one, subscribed here) takes the place of the one remembered.
    h = Node(NodeConfig(host_id="h"), rng=random.Random(1))
    mid = h.publish({"t": "news"}, b"genuine", deadline=3600.0, now=0.0)
    c = h._cache[mid]
    genuine = wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, c.meta.zdesc))

    def forged(attrs: dict[str, str]) -> bytes:
        desc = {**c.descriptor, "deadline": str(7 * 86400 - 60), **attrs}
        zdesc = zstandard.ZstdCompressor().compress(wire.encode_attributes(desc))
        return wire.encode_catalog_entry(wire.CatalogEntry(mid, 1, None, zdesc))

    v = Node(NodeConfig(host_id="v"), rng=random.Random(2))
    v.subscribe({"t": "news"}, now=0.0)
    junk = [forged({"t": f"junk{i}"}) for i in range(1200)]
    for k in range(0, len(junk), 100):
        v.receive_datagram(wire.encode_announce("evil", 1, False, 0, 0, (), junk[k : k + 100]),
                           "evil-addr", 1.0)  # fmt: skip
    assert v.counters["descriptors_deferred"] >= 100  # one decode each, within its budget
    assert len(v._zdesc_cache) == len(v._want_cache) == 1
    assert v._remote.owner_of("descriptor", mid) == "evil-addr"
    assert _requests_from(v, 1.5) == []
    v.receive_datagram(wire.encode_announce("h", 1, False, 0, 0, (), [genuine]), "h-addr", 2.0)
    assert _requests_from(v, 3.0) == [("h", mid)]
    assert v._zdesc_cache[mid][0] == c.meta.zdesc  # the genuine one now, charged to h
    assert v._remote.owner_of("descriptor", mid) == "h-addr"
    # forged ones wanted as much (the same topic) do not take its place, nor grow anything
    news = [forged({"x": str(i)}) for i in range(100)] + junk[:100]
    v.receive_datagram(wire.encode_catalog("evil", 2, news), "evil-addr", 4.0)
    assert len(v._zdesc_cache) == len(v._want_cache) == 1
    assert v._zdesc_cache[mid][0] == c.meta.zdesc
    assert v.counters["descriptors_displaced"] == 1


def test_an_offer_of_another_descriptor_under_a_held_id_is_not_asked_for() -> None:
    # A host reassembling a message asked any neighbour offering its id with the same
    # fragment count for the fragments it lacked, whatever descriptor the offer carried:
    # a forger's junk offer under that id held those fragments back for request_timeout.
    h = Node(NodeConfig(host_id="h", max_datagram=1400), rng=random.Random(1))
    mid = h.publish({"t": "news"}, random.Random(3).randbytes(20_000), deadline=3600.0, now=0.0)
    c = h._cache[mid]
    assert c.header.frags > 1
    forged = {**c.descriptor, "t": "junk"}
    zdesc = zstandard.ZstdCompressor().compress(wire.encode_attributes(forged))
    entry = wire.encode_catalog_entry(wire.CatalogEntry(mid, c.header.frags, None, zdesc))
    v = Node(NodeConfig(host_id="v"), rng=random.Random(2))
    v.subscribe({"t": "news"}, now=0.0)
    v.receive_datagram(wire.encode_announce("h", 1, False, 0, 0, (), ()), "h-addr", 1.0)
    first = wire.encode_fragment("h", mid, 1, 0, c.meta.zdesc, h._store.get_fragment(mid, 0) or b"")
    v.receive_datagram(first, "h-addr", 1.0)  # overheard: a partial copy of the genuine one
    assert [e["complete"] for e in v.cache_listing()] == [False]
    v.receive_datagram(wire.encode_announce("evil", 1, False, 0, 0, (), [entry]), "evil-addr", 1.1)
    assert ("evil", mid) not in _requests_from(v, 2.0)
    assert mid not in v._neighbours["evil"].offers  # nor is it taken to hold that message
