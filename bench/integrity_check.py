"""Cost of the start-up integrity check (``PRAGMA quick_check``) and of ``dodwan check``
(integrity_check + every message verified) on a database of a given size.

    .venv/bin/python bench/integrity_check.py --megabytes 64
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from dodwan.core import Node, NodeConfig
from dodwan.daemon import repair
from dodwan.daemon.sqlite_store import SqliteStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--megabytes", type=int, default=64)
    ap.add_argument("--message-size", type=int, default=64 * 1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dodwan.db"
        store = SqliteStore(path)
        node = Node(
            NodeConfig(host_id="bench", cache_capacity=4 * args.megabytes << 20),
            rng=random.Random(1),
            store=store,
        )
        n = (args.megabytes << 20) // args.message_size
        now = time.time()
        for _ in range(n):
            node.publish({"t": "x"}, os.urandom(args.message_size), deadline=now + 3600, now=now)
        store.close()
        size = path.stat().st_size
        t0 = time.perf_counter()
        SqliteStore(path).close()  # opening runs the quick check
        t_open = time.perf_counter() - t0
        t0 = time.perf_counter()
        SqliteStore(path, quick_check=False).close()
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = repair.check(path)
        t_check = time.perf_counter() - t0
        print(f"database: {size / 2**20:.1f} MiB, {n} messages of {args.message_size} bytes")
        print(f"open with quick_check: {t_open * 1000:.0f} ms (without: {t_plain * 1000:.0f} ms)")
        print(f"dodwan check (integrity_check + every message verified): {t_check:.2f} s, "
              f"{report.complete} complete, problems: {report.problems or 'none'}")  # fmt: skip


if __name__ == "__main__":
    main()
