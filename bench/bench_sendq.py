"""CPU the protocol core spends per fragment it serves: requests for many distinct messages
(one fragment each) against requests for a few messages of many fragments.

    python bench/bench_sendq.py [--messages 1000,8000] [--baseline REV | --baseline-tree DIR]

A core ``Node`` holds the messages; requesters on four addresses ask for them (within the
serving budgets: ``max_served_per_second``), 250 entries per request datagram, then the
node drains its send queue on a paced link (12,500 bytes a call: 0.05 s at 2 Mbit/s), as
a daemon does. Printed: CPU microseconds (``time.process_time``) per fragment sent, for
each case, and the baseline's figure over ours. Every message being asked for is cheap
since ``_next_to_send`` keeps the queue in a heap (docs/performance.md, "Serving many
messages"): before, each choice walked the whole queue, O(M) per fragment.

``--baseline REV`` checks that revision out in a temporary git worktree (pure Python: it
has no native build); ``--baseline-tree DIR`` uses a checkout at hand (with its own native
build, if it has a current one). Each tree runs in a child process; the ``core`` row says
whether it ran compiled. Run old and new back to back on a quiet machine, or compare the
ratio rather than the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
BUDGET = 12_500  # bytes per datagrams_to_send call


def _drain(node: object, now: float) -> tuple[int, float]:
    """Fragments sent and CPU seconds to empty ``node``'s send queue."""
    sent = 0
    start = time.process_time()
    while node.fragments_queued:  # type: ignore[attr-defined]
        sent += len(node.datagrams_to_send(now, BUDGET))  # type: ignore[attr-defined]
    return sent, time.process_time() - start


def measure(root: Path, counts: list[int]) -> dict[str, object]:
    """µs of CPU per fragment served, per case, with the core found under ``root``."""
    sys.path[:0] = [str(root)]
    from dodwan import native
    from dodwan.core import Node, NodeConfig, wire

    now = 1000.0
    out: dict[str, object] = {"core": "compiled" if native.active() else "pure Python"}
    for count in counts:
        v = Node(NodeConfig(host_id="v"), rng=random.Random(1))
        rnd = random.Random(2)
        ids = [v.publish({"topic": "t"}, rnd.randbytes(60), deadline=now + 3000, now=now)
               for _ in range(count)]  # fmt: skip
        v.datagrams_to_send(now)
        for k, i in enumerate(range(0, count, 250)):
            entries = [(mid, [(0, 1)]) for mid in ids[i : i + 250]]
            v.receive_datagram(wire.encode_request(f"asker{k % 4}", "v", entries),
                               (f"10.0.0.{k % 4}", 9), now)  # fmt: skip
        queued = v.fragments_queued
        sent, cpu = _drain(v, now)
        assert sent == queued == count, (sent, queued, count)  # all within the budgets
        out[f"{count} messages x 1 fragment"] = 1e6 * cpu / sent
    # the common case: few messages, many fragments each
    v = Node(NodeConfig(host_id="v"), rng=random.Random(1))
    rnd = random.Random(2)
    big = [v.publish({"topic": "t"}, rnd.randbytes(1000 * 1300), deadline=now + 3000, now=now)
           for _ in range(8)]  # fmt: skip
    v.datagrams_to_send(now)
    for k, mid in enumerate(big):
        for first in range(0, v._cache[mid].header.frags, 250):
            v.receive_datagram(wire.encode_request(f"asker{k}", "v", [(mid, [(first, 250)])]),
                               (f"10.0.0.{k % 4}", 9), now + k)  # fmt: skip
    sent, cpu = _drain(v, now + 10)
    out[f"8 messages x {sent // 8} fragments"] = 1e6 * cpu / sent
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", default="1000,8000",
                    help="message counts of the distinct case (default 1000,8000)")  # fmt: skip
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--baseline", help="also measure this git revision's core")
    group.add_argument("--baseline-tree", type=Path, help="also measure the core in this checkout")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    counts = [int(x) for x in a.messages.split(",")]
    if a.child:
        print(json.dumps(measure(Path(a.child), counts)))
        return
    sys.path.insert(0, str(BENCH))
    from trees import trees

    results: dict[str, dict[str, object]] = {}
    with trees(a.baseline) as roots:
        if a.baseline_tree:
            roots = [*roots, (str(a.baseline_tree), a.baseline_tree.resolve())]
        for name, root in roots:
            cmd = [sys.executable, str(BENCH / "bench_sendq.py"), "--child", str(root),
                   "--messages", a.messages]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root)
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    names = list(results)
    print("CPU microseconds per fragment served (requests from 4 addresses, paced drain)")
    head = f"{'case':<34}" + "".join(f"{n[-14:]:>16}" for n in names)
    print(head + (f"{'baseline/ours':>16}" if len(names) > 1 else ""))
    print(f"{'core':<34}" + "".join(f"{results[n]['core']:>16}" for n in names))
    for case in [k for k in results["ours"] if k != "core"]:
        row = [float(results[n][case]) for n in names]  # type: ignore[arg-type]
        line = f"{case:<34}" + "".join(f"{x:>16.1f}" for x in row)
        if len(row) > 1:
            line += f"{row[1] / row[0]:>16.1f}"
        print(line)


if __name__ == "__main__":
    main()
