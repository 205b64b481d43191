"""CPU a hostile flood costs the protocol core, per MiB received, attack by attack.

    python bench/attack_cpu.py [--mib 2] [--addresses 4] [--baseline REV]

Feeds the datagrams of each attack of ``bench/attack.py`` (same forging code) into one
core ``Node`` set up as that benchmark's victim (subscribed to ``legit.*`` and ``news.*``),
in process, paced as a 1 MiB/s flood from ``--addresses`` source addresses, and prints the
CPU time (``time.process_time``) per MiB of attack. Without sockets, an event loop or other
processes in the measurement it is stable on a shared machine, where the daemon figures of
``bench/attack.py`` are not. With ``--baseline REV`` the same runs with that revision's core
(a temporary git worktree), in a child process each, side by side.
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
KINDS = ("huge_offers", "padded", "crowd", "ranges", "junk", "eternal", "regex", "reserve")


def measure(
    root: Path, mib: float, addresses: int, kinds: tuple[str, ...] = KINDS
) -> dict[str, float]:
    """CPU seconds per MiB of each attack, with the core found under ``root``."""
    sys.path[:0] = [str(root / "bench"), str(root)]
    import attack

    from dodwan.core import Node, NodeConfig

    templates = attack.templates()
    now = time.time()
    out = {}
    for kind in kinds:
        victim = Node(NodeConfig(host_id="v", max_datagram=1400), rng=random.Random(1))
        victim.subscribe({"topic": "legit\\..*"}, now)
        victim.subscribe({"topic": "news\\..*"}, now)
        big_id = victim.publish({"topic": "own"}, random.Random(0).randbytes(1_000_000),
                                deadline=now + 3000, now=now)  # fmt: skip
        bursts = getattr(attack.Attacks("x", big_id, templates, [], 1e9), kind)()
        datagrams: list[bytes] = []
        while sum(map(len, datagrams)) < mib * (1 << 20):
            datagrams.extend(next(bursts))
        total = sum(map(len, datagrams))
        sent = 0
        start = time.process_time()
        for i, dg in enumerate(datagrams):
            at = now + sent / (1 << 20)  # 1 MiB/s
            sent += len(dg)
            victim.receive_datagram(dg, (f"10.0.0.{i % addresses}", 9), at)
            if i % 16 == 0:
                victim.handle_timer(at)
                victim.datagrams_to_send(at)
        out[kind] = (time.process_time() - start) / (total / (1 << 20))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=2.0, help="MiB of each attack (default 2)")
    ap.add_argument("--addresses", type=int, default=4, help="source addresses (default 4)")
    ap.add_argument("--baseline", help="also measure this git revision's core")
    ap.add_argument("--only", help=f"comma-separated attacks (default all: {','.join(KINDS)})")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    kinds = tuple(a.only.split(",")) if a.only else KINDS
    if not set(kinds) <= set(KINDS):
        ap.error(f"--only: unknown attack(s) {', '.join(sorted(set(kinds) - set(KINDS)))}")
    if a.child:
        print(json.dumps(measure(Path(a.child), a.mib, a.addresses, kinds)))
        return
    sys.path.insert(0, str(BENCH))
    from trees import trees

    results = {}
    with trees(a.baseline) as roots:
        for name, root in roots:
            cmd = [sys.executable, str(BENCH / "attack_cpu.py"), "--child", str(root),
                   "--mib", str(a.mib), "--addresses", str(a.addresses),
                   "--only", ",".join(kinds)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root)
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    names = list(results)
    print(
        f"CPU seconds per MiB of attack (1 MiB/s from {a.addresses} addresses, {a.mib:g} MiB each)"
    )
    print(f"{'attack':<12}" + "".join(f"{n:>14}" for n in names))
    for kind in kinds:
        print(f"{kind:<12}" + "".join(f"{results[n][kind]:>14.3f}" for n in names))


if __name__ == "__main__":
    main()
