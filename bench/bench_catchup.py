"""How fast a host back in range catches up on a backlog of one busy origin (real daemons).

Usage: python bench/bench_catchup.py [--messages 1000] [--sizes 100,1000,5000,30000]
                                     [--quick-restart] [--tree DIR] [--repeat 1]

Two ``dodwan daemon`` processes on loopback multicast (no pacing): ``b`` subscribes with a
``--dir`` sink and stops; ``a`` publishes the messages (random payloads, sizes drawn from
``--sizes``) once it noticed b is gone; ``b`` starts again. Printed: the time from b's restart to its last delivery,
messages and payload kilobytes per second, and the announcement rounds ``a`` made meanwhile
(offers per round = messages / rounds).

``--quick-restart``: b comes back before a notices it left (a's neighbour timeout is 600 s):
a offered it messages meanwhile, to nobody.

``--tree DIR`` runs the daemons from another checkout (e.g. a git worktree of an older
revision, with or without its own native build) to compare in the same session: run both
back to back on a quiet machine. Results are in docs/performance.md ("Catching up").
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_daemon import _wait  # noqa: E402  (its polling wait, same errors tolerated)

from dodwan.daemon.client import AdminClient  # noqa: E402


class Daemon:
    def __init__(self, tree: Path, workdir: Path, name: str, args: list[str]) -> None:
        self.tree, self.state, self.name, self.args = tree, workdir / name, name, args
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AdminClient:
        cmd = [sys.executable, "-m", "dodwan.cli", "daemon", "--state-dir", str(self.state),
               "--host-id", self.name, "--log-level", "warning", *self.args]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(self.tree)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=self.tree, env=env)
        pid = self.proc.pid
        return _wait(  # type: ignore[return-value]
            lambda: (
                (c := AdminClient.for_state_dir(self.state, 60)).get("/status")["pid"] == pid and c
            ),
            30,
            f"daemon {self.name}",
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def run(tree: Path, messages: int, sizes: list[int], quick: bool) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-catchup-"))
    rnd = random.SystemRandom()
    group = f"239.255.{rnd.randrange(1, 255)}.{rnd.randrange(1, 255)}:{rnd.randrange(20000, 32768)}"
    args = ["--group", group, "--announce-period", "0.5", "--cache-capacity", str(1 << 30)]
    if quick:  # b comes back before a would notice it was gone
        args += ["--neighbour-timeout", "600"]
    a, b = Daemon(tree, workdir, "a", args), Daemon(tree, workdir, "b", args)
    out = workdir / "out-b"
    try:
        ca, cb = a.start(), b.start()
        cb.post("/subscribe", {"patterns": [{"topic": "t"}], "key": "dir-b",
                               "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
        _wait(lambda: "b" in ca.get("/profile")["known"], 30, "a learns b's profile")
        # b has been in range a while (a host restarted after its first announcement cannot
        # be told from itself: its announcements start over at the number a last heard)
        _wait(lambda: cb.get("/status")["counters"]["announcements_sent"] >= 4, 30, "b runs")
        b.stop()
        if not quick:
            _wait(lambda: "b" not in ca.get("/status")["neighbours"], 30, "a notices b is gone")
        data = random.Random(1)
        total = 0
        for i in range(messages):
            payload = data.randbytes(data.choice(sizes))
            total += len(payload)
            ca.publish_bytes(payload, attributes={"topic": "t", "n": str(i)}, ttl=3600)
        rounds0 = ca.get("/status")["counters"]["announcements_sent"]
        start = time.monotonic()
        b.start()
        _wait(lambda: len(list(out.glob("*.json"))) >= messages, 600, "b caught up")
        took = time.monotonic() - start
        rounds = ca.get("/status")["counters"]["announcements_sent"] - rounds0
        if os.environ.get("BENCH_COUNTERS"):
            print("b", AdminClient.for_state_dir(b.state).get("/status")["counters"])
            print("a", ca.get("/status")["counters"])
        return {"seconds": took, "bytes": total, "rounds": rounds}
    finally:
        a.stop()
        b.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=1000)
    p.add_argument("--sizes", default="100,1000,5000,30000")
    p.add_argument("--tree", type=Path, default=ROOT, help="checkout the daemons run from")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument(
        "--quick-restart",
        action="store_true",
        help="b restarts within a's neighbour timeout (600 s here): a never notices it left",
    )
    ns = p.parse_args()
    sizes = [int(s) for s in ns.sizes.split(",")]
    print(f"tree {ns.tree.resolve()}; {ns.messages} messages of sizes {sizes} bytes")
    for _ in range(ns.repeat):
        r = run(ns.tree.resolve(), ns.messages, sizes, ns.quick_restart)
        s = r["seconds"]
        print(
            f"caught up in {s:.1f} s: {ns.messages / s:.0f} messages/s, "
            f"{r['bytes'] / s / 1e3:.0f} kB/s; {r['rounds']:.0f} announcement rounds "
            f"({ns.messages / max(r['rounds'], 1):.1f} offers a round)"
        )


if __name__ == "__main__":
    main()
