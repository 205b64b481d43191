"""Control traffic against delivered data (issue 13), ours next to a baseline revision.

Two measurements, each run on this tree and — with ``--baseline REV`` — on a checkout of
REV in a temporary git worktree, in the same invocation:

* ``islands``: ``scenarios/islands.toml`` (or ``--until`` seconds of it) through the
  simulator; control bytes (everything but fragments) per delivered byte, and delivery.
* ``cache``: two hosts on the in-memory network; host ``a`` holds N cached messages
  (N = 1,000, 10,000, 100,000), ``b`` subscribes to one topic matching 10 of them, the
  link comes up for a 60 s contact: control bytes ``a`` sends, and the time until ``b``
  has a message ``a`` publishes 5 s into the contact.

    .venv/bin/python bench/bench_control.py --baseline f922dea
    .venv/bin/python bench/bench_control.py --until 7200 --sizes 1000,10000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from trees import trees as source_trees

ROOT = Path(__file__).resolve().parent.parent

ISLANDS = r"""
import collections, json, sys, tempfile
from pathlib import Path
import pyarrow.parquet as pq
from sim.runner import simulate
from sim.scenario import load
until = float(sys.argv[2]) if float(sys.argv[2]) > 0 else None
with tempfile.TemporaryDirectory() as d:
    r = simulate(load(sys.argv[1]), Path(d), until=until)
    by = collections.Counter()
    for row in pq.read_table(Path(d) / "datagrams.parquet").to_pylist():
        if row["direction"] == "sent":
            by[row["kind"]] += row["bytes"]
    msgs = pq.read_table(Path(d) / "messages.parquet").to_pylist()
    delivered = sum(x["bytes"] for x in msgs if x["event"] == "delivered")
    pairs = len({(x["msg_id"], x["host"]) for x in msgs if x["event"] == "delivered"})
    targets = pq.read_table(Path(d) / "targets.parquet").num_rows
print(json.dumps({"by_kind": by, "delivered_bytes": delivered, "pairs": pairs,
                  "targets": targets, "wall": r.wall_time}))
"""

CACHE = r"""
import json, random, sys
from dodwan.virtual import VirtualNetwork
n = int(sys.argv[1])
net = VirtualNetwork(seed=7)
a = net.add("a", cache_capacity=1 << 31)
net.add("b", cache_capacity=1 << 31)
rng = random.Random(3)
for i in range(n):
    topic = "wanted" if i % (n // 10) == 0 else f"other.{i % 997}"
    a.publish({"topic": topic}, rng.randbytes(24), deadline=5e5, now=0.0)
net.subscribe("b", {"topic": "wanted|fresh"})
net.run(1.0)
sent0 = dict(a.counters)
net.link("a", "b")
net.run(5.0)
mid = net.publish("a", {"topic": "fresh"}, b"new", ttl=3600)
t0 = net.now
got = None
def done():
    return any(d.descriptor["id"] == mid for d in net.deliveries("b"))
net.run(55.0, stop=done)
got = net.now - t0 if done() else None
net.run_until(61.0)
frag = 0
c = a.counters
sent = c.get("bytes_sent", 0) - sent0.get("bytes_sent", 0)
print(json.dumps({"sent": sent, "fragments": c.get("fragments_sent", 0) - sent0.get("fragments_sent", 0),
                  "delivered": len(net.deliveries("b")), "latency": got}))
"""


def run(tree: Path, script: str, *args: str) -> dict[str, object]:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=tree, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def islands(tree: Path, until: float) -> str:
    r = run(tree, ISLANDS, str(ROOT / "scenarios" / "islands.toml"), str(until))
    if "error" in r:
        return f"failed: {r['error']}"
    by = r["by_kind"]
    assert isinstance(by, dict)
    control = sum(v for k, v in by.items() if k != "fragment")
    delivered = float(r["delivered_bytes"])  # type: ignore[arg-type]
    if not delivered:
        return f"nothing delivered yet ({control:,} control bytes sent); use a longer --until"
    return (
        f"control/delivered {control / delivered:6.2f}  all/delivered "
        f"{sum(by.values()) / delivered:6.2f}  delivered pairs {r['pairs']}/{r['targets']}"
    )


def cache(tree: Path, n: int) -> str:
    r = run(tree, CACHE, str(n))
    if "error" in r:
        return f"failed: {r['error']}"
    lat = r["latency"]
    latency = f"{lat:.2f} s" if isinstance(lat, float) else "not delivered"
    return f"a sent {r['sent']:>9,} B in the contact, delivered {r['delivered']}, new message after {latency}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", help="git revision to compare with (e.g. f922dea)")
    ap.add_argument("--until", type=float, default=0.0, help="islands: simulated s (0: all)")
    ap.add_argument("--sizes", default="1000,10000,100000", help="cache sizes")
    args = ap.parse_args()
    with source_trees(args.baseline) as trees:
        print(f"== islands ({args.until or 'whole'} simulated s)")
        for name, tree in trees:
            print(f"  {name:<10} {islands(tree, args.until)}")
        for n in (int(x) for x in args.sizes.split(",")):
            print(f"== cache of {n:,} messages, 60 s contact")
            for name, tree in trees:
                print(f"  {name:<10} {cache(tree, n)}")


if __name__ == "__main__":
    main()
