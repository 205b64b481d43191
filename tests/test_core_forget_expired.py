"""What a host learns about messages it does not hold (descriptors decoded from offers, the
verdict on whether to fetch them, the other hosts seen holding them) goes when those
messages expire: a host's memory follows what it holds and what is still alive, not
every message ever offered to it."""

from __future__ import annotations

import random

from dodwan import Node, NodeConfig
from dodwan.core import wire
from dodwan.core.limits import Limits
from dodwan.virtual import VirtualNetwork

TTL = 100.0


def _catalog(sender: str, node: Node, ids: list[str]) -> bytes:
    entries = []
    for msg_id in ids:
        c = node._cache[msg_id]
        entries.append(
            wire.encode_catalog_entry(
                wire.CatalogEntry(msg_id, c.header.frags, None, c.meta.zdesc, 0)
            )
        )
    return wire.encode_catalog(sender, 1, entries)


def _knowledge(node: Node, ids: list[str]) -> dict[str, int]:
    return {
        "descriptors": sum(i in node._zdesc_cache for i in ids),
        "wants": sum(i in node._want_cache for i in ids),
        "holders": sum(i in node._copies_seen for i in ids),
    }


def _origin(ttls: list[float]) -> tuple[Node, list[str]]:
    origin = Node(NodeConfig(host_id="o"), rng=random.Random(1))
    rnd = random.Random(2)
    ids = [origin.publish({"topic": "t"}, rnd.randbytes(3_000), ttl, 0.0) for ttl in ttls]
    return origin, ids


def test_what_was_learnt_from_offers_goes_when_the_messages_expire() -> None:
    origin, ids = _origin([TTL] * 20 + [10 * TTL] * 5)
    short, long = ids[:20], ids[20:]
    # not altruistic, no subscription: it decodes each offer, decides not to fetch it, and
    # counts the origin as one holder of each
    k = Node(NodeConfig(host_id="k"), rng=random.Random(3))
    k.receive_datagram(_catalog("o", origin, ids), "o", 1.0)
    assert _knowledge(k, ids) == {"descriptors": 25, "wants": 25, "holders": 25}
    held = k.remote_memory_usage()["bytes"]
    assert k._cache == {}  # nothing fetched: all of that is knowledge, not cache

    k.handle_timer(TTL / 2)  # none expired yet: all kept
    assert _knowledge(k, ids) == {"descriptors": 25, "wants": 25, "holders": 25}

    k.handle_timer(TTL + 1)
    assert _knowledge(k, short) == {"descriptors": 0, "wants": 0, "holders": 0}
    assert _knowledge(k, long) == {"descriptors": 5, "wants": 5, "holders": 5}
    assert k.remote_memory_usage()["bytes"] < held  # the descriptors' charges released

    k.handle_timer(10 * TTL + 1)
    assert _knowledge(k, long) == {"descriptors": 0, "wants": 0, "holders": 0}


def test_holders_of_a_cached_message_are_kept_while_it_is_and_forgotten_at_its_deadline() -> None:
    net = VirtualNetwork(seed=3)
    net.add("o")
    k = net.add("k", altruistic=True)
    msg_id = net.publish("o", {"topic": "t"}, random.Random(2).randbytes(3_000), ttl=TTL)
    net.link("o", "k")
    net.run(TTL / 4, stop=lambda: (k.cache_entry(msg_id) or {}).get("complete") is True)
    net.unlink("o", "k")
    assert (k.cache_entry(msg_id) or {}).get("complete") is True
    origin = net.node("o")
    k.receive_datagram(_catalog("p", origin, [msg_id]), "p", net.now)  # another holder
    assert sorted(k._copies_seen[msg_id]) == ["o", "p"]
    k._give_up_remote("descriptor", msg_id)  # the budget may give the descriptor up...
    net.run(TTL / 2 - net.now)
    assert sorted(k._copies_seen[msg_id]) == ["o", "p"]  # ...the holders stay while cached
    net.run(TTL / 2 + 1)
    assert k.cache_entry(msg_id) is None
    assert _knowledge(k, [msg_id]) == {"descriptors": 0, "wants": 0, "holders": 0}


def test_offers_given_up_leave_no_deadline_behind() -> None:
    """Peers offering ever new long-lived ids, each decoded and then given up by the
    remote-memory budget, do not grow what the host keeps to forget them on time."""
    k = Node(NodeConfig(host_id="k", limits=Limits(max_remote_memory=20_000)), rng=random.Random(3))
    for r in range(60):
        origin = Node(NodeConfig(host_id=f"o{r}"), rng=random.Random(r))
        rnd = random.Random(r)
        ids = [origin.publish({"topic": "t"}, rnd.randbytes(500), 10 * TTL, 0.0) for _ in range(5)]
        k.receive_datagram(_catalog(f"o{r}", origin, ids), f"o{r}", 1.0 + r)
    assert k.remote_memory_usage()["evicted"] > 200  # most were given up
    live = len(k._zdesc_cache) + len(k._copies_seen)
    assert len(k._known_deadlines) <= 2 * live + 64


def test_a_descriptor_learnt_again_under_the_same_id_keeps_its_own_deadline() -> None:
    """An id given up early by the budget and then offered with a later deadline (another
    descriptor under it: unsigned, anyone can make one) is kept until that deadline."""
    first, (msg_id,) = _origin([TTL])
    second = Node(NodeConfig(host_id="o"), rng=random.Random(1))
    assert second.publish({"topic": "t"}, b"x" * 3_000, 10 * TTL, 0.0) == msg_id
    k = Node(NodeConfig(host_id="k"), rng=random.Random(3))
    k.receive_datagram(_catalog("o", first, [msg_id]), "o", 1.0)
    k._give_up_remote("descriptor", msg_id)  # as the remote-memory budget does
    assert _knowledge(k, [msg_id]) == {"descriptors": 0, "wants": 0, "holders": 0}
    k.receive_datagram(_catalog("o", second, [msg_id]), "o", 2.0)
    k.handle_timer(TTL + 1)  # the first descriptor's deadline
    assert _knowledge(k, [msg_id]) == {"descriptors": 1, "wants": 1, "holders": 1}
    k.handle_timer(10 * TTL + 1)
    assert _knowledge(k, [msg_id]) == {"descriptors": 0, "wants": 0, "holders": 0}
