"""Core memory check: three nodes on the in-memory medium under soak-like load (4 publications/s,
TTL 120 s); tracemalloc growth between virtual t=300 s and t=900 s.

Run: .venv/bin/python bench/core_memory.py (figures in docs/reliability.md)."""

import gc
import random
import tracemalloc

from dodwan.virtual import VirtualNetwork

net = VirtualNetwork(seed=1)
for h in "abc":
    net.add(h, cache_capacity=64 << 20)
net.connect_all("a", "b", "c")
for h in "abc":
    net.subscribe(h, {"topic": "soak.*"})
rng = random.Random(1)


def load(until):
    n = 0
    while net.now < until:
        h = rng.choice("abc")
        size = rng.choice([100, 1000, 10000, 50000])
        net.publish(h, {"topic": f"soak.{h}.{n}"}, rng.randbytes(size), ttl=120)
        n += 1
        net.run(0.25)
        for x in "abc":
            net.events(x).clear()


tracemalloc.start(5)
load(300)
gc.collect()
s1 = tracemalloc.take_snapshot()
load(900)
gc.collect()
s2 = tracemalloc.take_snapshot()
for st in s2.compare_to(s1, "lineno")[:12]:
    print(st)
n = net.node("a")
print(
    {
        k: len(getattr(n, k))
        for k in [
            "_cache",
            "_zdesc_cache",
            "_want_cache",
            "_history",
            "_requested",
            "_entry_cache",
            "_bad_zdesc",
            "_reserved",
            "_evict_heap",
            "_deadlines",
            "_history_heap",
        ]
    }
)
print(
    len(n._matcher.fresh),
    len(n._matcher._descriptors),
    len(n._store._history),
    len(n._store._fragments),
)
