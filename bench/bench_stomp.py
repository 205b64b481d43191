"""Benchmark: JOMS against Apache ActiveMQ 5.x, 1 KB messages, one producer -> one subscriber.

Both brokers run on this machine in the same run, each in its own process, with the same
client (raw STOMP 1.2 frames on sockets, encoded once, written in batches, read by one
thread per connection, TCP_NODELAY) and the same workload:

* JOMS: ``python -m joms.runtime`` with a state directory (the STOMP gateway, the JOMS
  service with its SQLite store, a DoDWAN core node);
* ActiveMQ: a private broker from the Debian package ``activemq`` (KahaDB in a temporary
  directory, STOMP on a free loopback port; tests/activemq.py starts it);
* optionally ``joms-memory`` (``--brokers joms,joms-memory,activemq``): JOMS without a
  state directory (memory cache and store, nothing survives a restart), as a reference;
* optionally ``joms-daemon``: the JOMS gateway in a real ``dodwan daemon --stomp`` (what
  users run: the daemon's ServiceHost, its SQLite cache ``dodwan.db``, its UDP transport
  on a private multicast group);
* optionally coilmq (``--coilmq``), the pure-Python broker of earlier measurements.

Two modes:

* ``non-persistent``: a topic, a plain subscription, ``persistent:false``;
* ``persistent``: a durable subscription (client id + ``activemq.subscriptionName``),
  ``persistent:true`` — each message is written to the broker's store (KahaDB / SQLite)
  before the subscriber gets it, and deleted when it is acknowledged (``ack:auto``).

Throughput: N messages sent back to back, a publisher receipt every ``--window`` sends
(flow control), messages/s from the first send to the last reception, and the broker
process's CPU time (user + system, all threads, from /proc) per 1000 of those messages —
the figure to compare on a shared machine, where throughput follows the other jobs' load.
Latency: M messages
sent one at a time, each waiting for its reception; median and p99.

Usage::

    .venv/bin/python bench/bench_stomp.py [--count 5000] [--latency 500] [--size 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from joms.stomp.frame import Frame, FrameLimits, FrameParser, encode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import activemq  # noqa: E402  (tests/activemq.py: the private-broker starter)


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


class Running:
    def __init__(self, port: int, stop: Any, pid: int | None = None) -> None:
        self.port = port
        self.stop = stop
        self.pid = pid


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from /proc; NaN when
    unknown. Less sensitive than throughput to other jobs on a shared machine."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(kind: str, workdir: Path) -> Running:
    if kind == "activemq":
        broker = activemq.start_broker(workdir / "activemq")
        return Running(broker.port, broker.stop, broker.proc.pid)
    port = free_port()
    if kind == "joms-daemon":
        rnd = random.SystemRandom()
        group = f"239.255.{rnd.randrange(1, 255)}.{rnd.randrange(1, 255)}:{free_port()}"
        cmd = [sys.executable, "-m", "dodwan.cli", "daemon", "--state-dir",
               str(workdir / "daemon"), "--group", group, "--stomp", f"127.0.0.1:{port}"]  # fmt: skip
    elif kind in ("joms", "joms-memory"):
        cmd = [sys.executable, "-m", "joms.runtime", "--host-id", "bench",
               "--stomp", f"127.0.0.1:{port}"]  # fmt: skip
        if kind == "joms":  # SQLite stores, as in the daemon
            state = workdir / "joms"
            state.mkdir()
            cmd += ["--state-dir", str(state)]
    else:
        exe = shutil.which("coilmq") or str(Path(sys.executable).parent / "coilmq")
        cmd = [exe, "-b", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, 30.0)

    def stop() -> None:
        proc.terminate()
        proc.wait(10)

    return Running(port, stop, proc.pid)


class Peer:
    """A raw STOMP 1.2 connection with a reader thread (the client must not be the
    bottleneck: frames are encoded once and written in batches)."""

    def __init__(self, port: int, **headers: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.cond = threading.Condition()
        self.receipts: set[str] = set()
        self.messages = 0
        self.last_message = 0.0
        self.arrived: dict[str, float] = {}
        self.errors: list[str] = []
        self.connected = False
        self.sock.sendall(encode(Frame("CONNECT", {"accept-version": "1.2", "host": "localhost",
                                                    **headers})))  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        assert self.wait(lambda: self.connected, 10), f"no CONNECTED {self.errors}"

    def _read(self) -> None:
        parser = FrameParser(FrameLimits())
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            now = time.perf_counter()
            frames = parser.feed(data)
            with self.cond:
                for f in frames:
                    if f.command == "MESSAGE":
                        self.messages += 1
                        self.last_message = now
                        seq = f.headers.get("seq", "")
                        if seq.startswith("l"):
                            self.arrived[seq] = now
                    elif f.command == "RECEIPT":
                        self.receipts.add(f.headers.get("receipt-id", ""))
                    elif f.command == "CONNECTED":
                        self.connected = True
                    elif f.command == "ERROR":
                        self.errors.append(f.headers.get("message", ""))
                self.cond.notify_all()

    def wait(self, pred: Any, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(pred, timeout)

    def send(self, frames: list[Frame]) -> None:
        self.sock.sendall(b"".join(encode(f) for f in frames))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send([Frame("DISCONNECT", {"receipt": "bye"})])
            self.wait(lambda: "bye" in self.receipts, 5)
        self.sock.close()


def measure(
    port: int,
    mode: str,
    count: int,
    lat_count: int,
    size: int,
    window: int,
    pid: int | None = None,
) -> dict[str, float]:
    body = b"x" * size
    topic = f"/topic/bench.{mode}"
    persistent = "true" if mode == "persistent" else "false"
    sub_headers = {"destination": topic, "id": "1", "ack": "auto", "receipt": "sub"}
    conn_headers: dict[str, str] = {}
    if mode == "persistent":
        conn_headers["client-id"] = f"bench-{time.monotonic_ns()}"
        sub_headers["activemq.subscriptionName"] = "bench"
    sub = Peer(port, **conn_headers)
    sub.send([Frame("SUBSCRIBE", sub_headers)])
    assert sub.wait(lambda: "sub" in sub.receipts, 10), f"no subscription receipt {sub.errors}"
    pub = Peer(port)

    def frame(seq: str, receipt: str | None = None) -> Frame:
        h = {"destination": topic, "seq": seq, "persistent": persistent,
             "content-type": "application/octet-stream"}  # fmt: skip
        if receipt:
            h["receipt"] = receipt
        return Frame("SEND", h, body)

    warm = min(2000, count)  # the JVM compiles its hot paths; JOMS warms its caches
    for start_i in range(0, warm, window):
        n = min(window, warm - start_i)
        pub.send([frame("w", f"w{start_i}" if k == n - 1 else None) for k in range(n)])
        assert pub.wait(lambda r=f"w{start_i}": r in pub.receipts, 30), "warm-up receipt lost"
    assert sub.wait(lambda: sub.messages >= warm, 60), "warm-up messages lost"
    base = sub.messages
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    for start_i in range(0, count, window):
        n = min(window, count - start_i)
        pub.send([frame("t", f"p{start_i}" if k == n - 1 else None) for k in range(n)])
        assert pub.wait(lambda r=f"p{start_i}": r in pub.receipts, 60), "publisher receipt lost"
    ok = sub.wait(lambda: sub.messages - base >= count, 300)
    cpu = cpu_seconds(pid) - cpu0
    received = sub.messages - base
    rate = received / (sub.last_message - t0) if received else 0.0
    lats = []
    for i in range(lat_count):
        key = f"l{i}"
        t = time.perf_counter()
        pub.send([frame(key)])
        if sub.wait(lambda k=key: k in sub.arrived, 10):
            lats.append(sub.arrived[key] - t)
    pub.close()
    sub.close()
    lats.sort()
    return {
        "sent": count,
        "received": received,
        "complete": float(ok),
        "msgs_per_s": rate,
        "cpu_ms_per_1k": cpu * 1000 / received * 1000 if received else float("nan"),
        "lat_median_ms": statistics.median(lats) * 1000 if lats else float("nan"),
        "lat_p99_ms": lats[max(0, int(len(lats) * 0.99) - 1)] * 1000 if lats else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--latency", type=int, default=500)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--window", type=int, default=50, help="sends per publisher receipt")
    ap.add_argument("--coilmq", action="store_true", help="also measure coilmq")
    ap.add_argument("--modes", default="non-persistent,persistent")
    ap.add_argument("--brokers", default="joms,activemq", help="which brokers to measure")
    ap.add_argument("--port", type=int, default=0, help="measure a broker already running here")
    args = ap.parse_args()
    if args.port:  # e.g. a JOMS runtime started under a profiler
        for mode in args.modes.split(","):
            print(mode, measure(args.port, mode, args.count, args.latency, args.size, args.window))
        return 0
    kinds = args.brokers.split(",") + (["coilmq"] if args.coilmq else [])
    modes = args.modes.split(",")
    results: dict[tuple[str, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-stomp-") as tmp:
        for kind in kinds:
            running = start(kind, Path(tmp))
            try:
                for mode in modes:
                    if kind in ("coilmq", "joms-memory") and mode == "persistent":
                        continue  # no durable subscriptions / nothing is persistent
                    results[kind, mode] = measure(
                        running.port, mode, args.count, args.latency, args.size, args.window,
                        running.pid,
                    )  # fmt: skip
            finally:
                running.stop()
    print(
        f"{args.size}-byte messages, {args.count} for throughput (a receipt every "
        f"{args.window} sends), {args.latency} for latency\n"
    )
    print(
        "| broker | mode | received | msgs/s | broker CPU ms per 1000 msgs | "
        "latency median (ms) | latency p99 (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for (kind, mode), r in results.items():
        print(
            f"| {kind} | {mode} | {r['received']:.0f}/{r['sent']:.0f} | {r['msgs_per_s']:.0f} | "
            f"{r['cpu_ms_per_1k']:.0f} | {r['lat_median_ms']:.3f} | {r['lat_p99_ms']:.3f} |"
        )
    print()
    for mode in modes:
        a = results.get(("activemq", mode))
        for kind in ("joms", "joms-daemon"):
            j = results.get((kind, mode))
            if j and a and a["msgs_per_s"]:
                print(
                    f"{kind} / ActiveMQ, {mode}: throughput "
                    f"x{j['msgs_per_s'] / a['msgs_per_s']:.2f}, "
                    f"CPU per message x{j['cpu_ms_per_1k'] / a['cpu_ms_per_1k']:.2f}, "
                    f"median latency x{j['lat_median_ms'] / a['lat_median_ms']:.2f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
