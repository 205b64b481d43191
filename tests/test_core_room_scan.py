"""Room checks share one walk of the eviction heap (``cache.RoomScan``): the offers of one
catalog, or the offers put off for want of room, are checked against one scan instead of
walking the heap for each. Every answer must be what walking the heap for it alone gives."""

from __future__ import annotations

import heapq
import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dodwan import Node, NodeConfig
from dodwan.core import cache
from dodwan.virtual import VirtualNetwork


def _walk(n: Node, rank: cache.EvictRank, needed: int) -> int:
    """The heap walk each check made before scans were shared (the reference)."""
    heap, c_of = n._evict_heap, n._cache
    todo = [(heap[0], 0)] if heap else []
    found, seen = 0, set[str]()
    while todo and found < needed:
        (vrank, vid), i = heapq.heappop(todo)
        if vrank >= rank:
            break
        if len(seen) >= cache._ROOM_SCAN:
            return needed
        c = c_of.get(vid)
        if c is not None and vid not in seen and c.rank() == vrank:
            seen.add(vid)
            found += c.nbytes
        for j in (2 * i + 1, 2 * i + 2):
            if j < len(heap):
                heapq.heappush(todo, (heap[j], j))
    return found


def _node_with_a_heap(seed: int, messages: int) -> Node:
    """A node whose eviction heap holds stale entries (purged messages), entries repeated
    (ranked again, same rank) and entries moved (handed on): what the walk must skip."""
    rng = random.Random(seed)
    n = Node(NodeConfig(host_id="h", cache_capacity=50_000_000), rng=random.Random(seed))
    ids = []
    for k in range(messages):
        now = float(k)
        ids.append(
            n.publish(
                {"topic": f"t{k}"},
                os.urandom(rng.randrange(10, 3000)),
                deadline=now + rng.choice((100.0, 1e4, 5e5)),
                now=now,
                priority=rng.randrange(0, 10),
                persistent=rng.random() < 0.5,
            )
        )
    for msg_id in rng.sample(ids, messages // 5):
        n.purge(msg_id, float(messages))
    for msg_id in rng.sample(ids, messages // 4):
        c = n._cache.get(msg_id)
        if c is None:
            continue
        if rng.random() < 0.5:
            c.handed = True  # as when its last fragment went out: ranked lower now
        heapq.heappush(n._evict_heap, (c.rank(), msg_id))
    return n


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    messages=st.integers(0, 160),
    checks=st.lists(st.tuples(st.integers(0, 200), st.integers(1, 400_000)), max_size=12),
)
def test_checks_sharing_a_scan_answer_as_walking_the_heap_for_each(
    seed: int, messages: int, checks: list[tuple[int, int]]
) -> None:
    n = _node_with_a_heap(seed, messages)
    # Ranks to check against: those of the entries, and some between and beyond them.
    ranks = sorted({r for r, _ in n._evict_heap}) or [(0, 0, 0, 0, 0.0)]
    asked = []
    for pick, needed in checks:
        r = ranks[pick % len(ranks)]
        if pick % 3 == 1:
            r = (*r[:4], r[4] + 0.5)
        elif pick % 7 == 2:
            r = (9, 0, 0, 0, 0.0)  # above every tier
        asked.append((r, needed))
    expected = [_walk(n, r, needed) for r, needed in asked]
    assert [n._evictable_below(r, needed) for r, needed in asked] == expected  # a scan each
    n._room_checks(True)
    try:
        assert [n._evictable_below(r, needed) for r, needed in asked] == expected  # one scan
    finally:
        n._room_checks(False)
    assert n._room_scan is None


def test_a_full_heap_stops_at_the_scan_limit_as_the_walk_did() -> None:
    n = _node_with_a_heap(3, 400)
    top = (9, 0, 0, 0, 0.0)
    everything = sum(c.nbytes for c in n._cache.values())
    assert len(n._cache) > cache._ROOM_SCAN
    n._room_checks(True)
    try:
        # Asking for more than all: past the limit the answer is "needed" (assume room).
        assert (
            n._evictable_below(top, everything + 1)
            == everything + 1
            == _walk(n, top, everything + 1)
        )
        scan = n._room_scan
        assert scan is not None
        walked = len(scan.ranks)
        assert sum(1 for s in scan.sizes if s >= 0) == cache._ROOM_SCAN
        assert not scan.more()  # nothing past the entry that answered
        assert len(scan.ranks) == walked
        assert n._evictable_below(top, 1) == _walk(n, top, 1)
    finally:
        n._room_checks(False)


def test_a_catalog_puts_off_the_offers_it_has_no_room_for_and_closes_its_scan() -> None:
    """A full altruistic carrier offered more messages than it has room for puts some off;
    no scan outlives the catalog that opened it (a scan kept would answer from a heap
    that has changed since)."""
    net = VirtualNetwork(seed=8)
    sources = [f"s{i}" for i in range(6)]  # one origin could fill only its share
    for s in sources:
        net.add(s)
    probe = net.add("probe")
    size = probe.cache_entry(probe.publish({"topic": "p"}, os.urandom(40_000), 1e5, 0.0))
    assert size is not None
    k = net.add("k", altruistic=True, cache_capacity=int(3.5 * size["stored_bytes"]))
    for i in range(12):
        net.publish(sources[i % 6], {"topic": f"t{i}"}, os.urandom(40_000), ttl=1e5)
    for s in sources:
        net.link("k", s)
    net.run(120)
    assert k._room_scan is None
    assert k.counters.get("deferred_no_room", 0) > 0
    assert len([c for c in k.cache_listing() if c["complete"]]) == 3
