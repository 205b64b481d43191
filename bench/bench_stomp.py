"""Benchmark: 1 KB messages, publisher -> subscriber on one machine, through a STOMP broker.

Measures the JOMS STOMP gateway (a loopback JOMS host: gateway + service + DoDWAN core,
``python -m joms.runtime``) and a pure-Python STOMP broker from the package registry
(coilmq) in the same run, with the same client (stomp.py) and the same workload, and
reports their ratio:

* throughput: N messages sent back to back on a topic, one subscriber; messages/s from the
  first send to the last reception;
* latency: M messages sent one at a time (each waits for its reception); median and p95.

Each broker runs in its own process. Usage::

    .venv/bin/python bench/bench_stomp.py [--count 2000] [--latency 300] [--size 1024]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import stomp

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"broker on port {port} did not start")


def start(kind: str, port: int) -> subprocess.Popen[bytes]:
    if kind == "joms":
        cmd = [
            sys.executable,
            "-m",
            "joms.runtime",
            "--host-id",
            "bench",
            "--stomp",
            f"127.0.0.1:{port}",
        ]
    else:
        exe = shutil.which("coilmq") or str(Path(sys.executable).parent / "coilmq")
        cmd = [exe, "-b", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc


class Sink(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.cond = threading.Condition()
        self.receipts: set[str] = set()

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.times[frame.headers["seq"]] = time.perf_counter()
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def wait(self, pred: Any, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(pred, timeout)


def nodelay(conn: Any) -> None:
    """Disable Nagle on stomp.py's socket (it writes header and body separately)."""
    sock = getattr(conn.transport, "socket", None)
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def measure(port: int, count: int, lat_count: int, size: int, window: int) -> dict[str, float]:
    body = b"x" * size
    sub = stomp.Connection10([("127.0.0.1", port)], auto_decode=False)
    sink = Sink()
    sub.set_listener("s", sink)
    sub.connect(wait=True)
    nodelay(sub)
    sub.subscribe("/topic/bench", id="1", ack="auto", headers={"receipt": "sub"})
    assert sink.wait(lambda: "sub" in sink.receipts, 10), "no subscription receipt"
    pub = stomp.Connection10([("127.0.0.1", port)], auto_decode=False)
    pub.set_listener("p", sink)
    pub.connect(wait=True)
    nodelay(pub)
    # warm-up
    for i in range(20):
        pub.send("/topic/bench", body, headers={"seq": f"w{i}"})
    sink.wait(lambda: sum(1 for k in sink.times if k.startswith("w")) >= 20, 10)
    # throughput: a window of ``window`` sends, the last with a receipt waited for
    t0 = time.perf_counter()
    for i in range(count):
        h = {"seq": f"t{i}"}
        last = (i + 1) % window == 0 or i == count - 1
        if last:
            h["receipt"] = f"p{i}"
        pub.send("/topic/bench", body, headers=h)
        if last:
            assert sink.wait(lambda r=f"p{i}": r in sink.receipts, 10), "publisher receipt lost"
    ok = sink.wait(lambda: sum(1 for k in sink.times if k.startswith("t")) >= count, 120)
    received = sum(1 for k in sink.times if k.startswith("t"))
    t_last = max(v for k, v in sink.times.items() if k.startswith("t")) if received else t0
    rate = received / (t_last - t0) if received else 0.0
    # latency
    lats = []
    for i in range(lat_count):
        key = f"l{i}"
        t = time.perf_counter()
        pub.send("/topic/bench", body, headers={"seq": key})
        if sink.wait(lambda k=key: k in sink.times, 10):
            lats.append(sink.times[key] - t)
    pub.disconnect()
    sub.disconnect()
    lats.sort()
    return {
        "sent": count,
        "received": received,
        "complete": float(ok),
        "msgs_per_s": rate,
        "lat_median_ms": statistics.median(lats) * 1000 if lats else float("nan"),
        "lat_p95_ms": lats[int(len(lats) * 0.95) - 1] * 1000 if lats else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--latency", type=int, default=300)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument(
        "--window",
        type=int,
        default=3,
        help="sends per publisher receipt (coilmq 1.1 mis-parses frames split across reads, "
        "so large bursts break it)",
    )
    args = ap.parse_args()
    results = {}
    for kind in ("joms", "coilmq"):
        port = free_port()
        proc = start(kind, port)
        try:
            results[kind] = measure(port, args.count, args.latency, args.size, args.window)
        finally:
            proc.terminate()
            proc.wait(10)
    j, c = results["joms"], results["coilmq"]
    print(
        f"{args.size}-byte messages, {args.count} for throughput (a receipt every "
        f"{args.window} sends), {args.latency} for latency\n"
    )
    print("| broker | received | msgs/s | latency median (ms) | latency p95 (ms) |")
    print("|---|---|---|---|---|")
    for k, r in results.items():
        print(
            f"| {k} | {r['received']}/{r['sent']} | {r['msgs_per_s']:.0f} | "
            f"{r['lat_median_ms']:.2f} | {r['lat_p95_ms']:.2f} |"
        )
    ratio_t = j["msgs_per_s"] / c["msgs_per_s"] if c["msgs_per_s"] else float("nan")
    ratio_l = j["lat_median_ms"] / c["lat_median_ms"] if c["lat_median_ms"] else float("nan")
    print(f"\nJOMS / coilmq: throughput x{ratio_t:.2f}, median latency x{ratio_l:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
