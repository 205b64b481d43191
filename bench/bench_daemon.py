"""Goodput of two real daemons on loopback, against a plain Python UDP sender/receiver.

Usage: python bench/bench_daemon.py [--messages 200] [--size 524288] [--max-datagram 1400]

1. Baseline: a sender process pushes the same bytes (messages × size) as datagrams of the
   same size to a receiver process over the same loopback multicast medium; goodput =
   bytes received / time from first send to last datagram received.
2. DoDWAN, live: daemon A publishes the messages (incompressible random payloads) through
   its admin API, daemon B's ``--dir`` subscription receives them; goodput = payload bytes
   delivered / time from the first publication to the last delivery.
3. DoDWAN, cached: a third daemon C then subscribes and fetches all the messages A and B
   carry; goodput = bytes delivered / time from its subscription to its last delivery.
4. Storage floor: the daemon's SQLite store alone takes the same bytes the way a receiver
   stores them (no network, no protocol), compared with the time a ratio of 0.5 allows.

Prints both goodputs and their ratio (goal: ≥ 0.5). Results are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dodwan.daemon.client import AdminClient, ClientError  # noqa: E402


def _group() -> tuple[str, int]:
    rnd = random.SystemRandom()
    return f"239.255.{rnd.randrange(1, 255)}.{rnd.randrange(1, 255)}", rnd.randrange(20000, 32768)


# ---------------------------------------------------------------------- baseline


def _receiver(group: str, port: int, total: int, ready: Any, result: Any) -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        rx.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
    except OSError:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind((group, port))
    mreq = socket.inet_aton(group) + socket.inet_aton("127.0.0.1")
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    rx.settimeout(2.0)
    ready.set()
    got = 0
    last = time.time()
    while got < total:
        try:
            data = rx.recv(65535)
        except TimeoutError:
            break
        got += len(data)
        last = time.time()
    result.put((got, last))


def baseline(total: int, dgram: int) -> dict[str, float]:
    group, port = _group()
    ctx = mp.get_context("fork")
    ready, result = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(group, port, total, ready, result))
    proc.start()
    ready.wait(10)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    payload = random.Random(1).randbytes(dgram)
    sent = 0
    start = time.time()
    while sent < total:
        n = min(dgram, total - sent)
        try:
            tx.sendto(payload[:n], (group, port))
        except BlockingIOError:  # pragma: no cover - blocking socket
            continue
        sent += n
    got, last = result.get(timeout=60)
    proc.join(10)
    elapsed = max(last - start, 1e-9)
    return {"bytes": got, "seconds": elapsed, "goodput": got / elapsed, "loss": 1 - got / total}


# ---------------------------------------------------------------------- storage floor


def store_floor(messages: int, size: int, dgram: int, workdir: Path) -> dict[str, float]:
    """Time the daemon's SQLite store alone taking the same bytes as a receiver does: a row
    per fragment, the message's row and its history entry committed per message, the
    background checkpoints included. No network, no protocol: a lower bound for the
    receiver (and, for a publication, the sender)."""
    from dodwan.core.store import MessageMeta
    from dodwan.daemon.sqlite_store import SqliteStore

    store = SqliteStore(workdir / "floor.db", commit_delay=0.25)
    rnd = random.Random(3)
    payloads = [rnd.randbytes(size) for _ in range(messages)]
    fsize = dgram - 100  # about what a fragment datagram leaves for the chunk
    start = time.perf_counter()
    for m, payload in enumerate(payloads):
        store.put_message(MessageMeta(f"m{m}", b"z" * 100, 1, False, 0.0))
        store.put_fragments(f"m{m}", [payload[i : i + fsize] for i in range(0, size, fsize)])
        store.add_history(f"m{m}", "", 1e12)
        store.commit()
    loop = time.perf_counter() - start
    if store._checkpointer is not None:
        store._checkpointer.wait_idle(120)
    total = time.perf_counter() - start
    store.close()
    for f in workdir.glob("floor.db*"):
        f.unlink()
    return {"seconds_in_loop": loop, "seconds": total}


# ---------------------------------------------------------------------- daemons


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = pred()
        except (ClientError, OSError, ValueError, KeyError):
            v = None
        if v:
            return v
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daemons(
    messages: int, size: int, dgram: int, workdir: Path, config: str | None
) -> dict[str, float]:
    group, port = _group()
    procs: list[subprocess.Popen[bytes]] = []

    def start_daemon(name: str) -> AdminClient:
        state = workdir / name
        prof = os.environ.get("BENCH_PROFILE_DIR")  # cProfile each daemon into this directory
        py = (
            [sys.executable, "-m", "cProfile", "-o", f"{prof}/{name}.prof"]
            if prof
            else [sys.executable]
        )
        cmd = [*py, "-m", "dodwan.cli", "daemon", "--state-dir", str(state),
               "--group", f"{group}:{port}", "--host-id", name, "--max-datagram", str(dgram),
               "--cache-capacity", str(4 * messages * size), "--log-level", "warning"]  # fmt: skip
        if config:
            cmd += ["--config", config]
        with open(workdir / f"{name}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, cwd=ROOT))
        return _wait(  # type: ignore[no-any-return]
            lambda: (
                AdminClient.for_state_dir(state, 60).get("/status")
                and AdminClient.for_state_dir(state, 60)
            ),
            30,
            f"daemon {name}",
        )

    def delivered(c: AdminClient) -> int:
        return int(c.get("/status")["counters"].get("messages_delivered", 0))

    def subscribe(c: AdminClient, out: str) -> None:
        c.post("/subscribe", {"patterns": [{"topic": "bench"}],
                              "sink": {"kind": "dir", "target": str(workdir / out)}})  # fmt: skip

    try:
        a, b = start_daemon("a"), start_daemon("b")
        subscribe(b, "out-b")
        _wait(lambda: "b" in a.get("/profile")["known"], 30, "a learns b's profile")
        rnd = random.Random(2)
        payloads = [rnd.randbytes(size) for _ in range(messages)]
        # Phase 1, live: a publishes while b receives.
        cpu0 = [_cpu_seconds(p.pid) for p in procs]
        start = time.time()
        for i, payload in enumerate(payloads):
            a.publish_bytes(payload, attributes={"topic": "bench", "n": str(i)}, ttl=3600)
        published = time.time()
        _wait(lambda: delivered(b) >= messages, 600, "all deliveries to b")
        end = time.time()
        cpu_a, cpu_b = (_cpu_seconds(p.pid) - c0 for p, c0 in zip(procs, cpu0, strict=True))
        sa, sb = a.get("/status")["counters"], b.get("/status")["counters"]
        files = [p for p in (workdir / "out-b").iterdir() if not p.name.endswith(".json")]
        live_bytes = sum(p.stat().st_size for p in files)
        # Phase 2, cached: a newcomer c subscribes and fetches everything a and b hold.
        c = start_daemon("c")
        _wait(lambda: {"a", "b"} <= set(c.get("/status")["neighbours"]), 30, "c meets a, b")
        c_start = time.time()
        subscribe(c, "out-c")
        _wait(lambda: delivered(c) >= messages, 600, "all deliveries to c")
        c_end = time.time()
        files = [p for p in (workdir / "out-c").iterdir() if not p.name.endswith(".json")]
        cached_bytes = sum(p.stat().st_size for p in files)
        if os.environ.get("BENCH_DEBUG"):
            sc = c.get("/status")["counters"]
            print(json.dumps({"a": sa, "b": sb, "c": sc}, indent=1), file=sys.stderr)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    elapsed = end - start
    return {
        "bytes": live_bytes,
        "seconds": elapsed,
        "publish_seconds": published - start,
        "cpu_seconds_a": cpu_a,
        "cpu_seconds_b": cpu_b,
        "goodput": live_bytes / elapsed,
        "cached_bytes": cached_bytes,
        "cached_seconds": c_end - c_start,
        "cached_goodput": cached_bytes / (c_end - c_start),
        "datagrams_sent_a": sa.get("datagrams_sent", 0),
        "bytes_sent_a": sa.get("bytes_sent", 0),
        "fragments_resent": max(0, sa.get("fragments_sent", 0) - sb.get("fragments_stored", 0)),
        "requests_b": sb.get("requests_sent", 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--size", type=int, default=512 * 1024)
    ap.add_argument("--max-datagram", type=int, default=1400)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument(
        "--config",
        default=str(Path(__file__).with_name("loopback.toml")),
        help="TOML config file given to both daemons (default: bench/loopback.toml)",
    )
    args = ap.parse_args()
    total = args.messages * args.size
    workdir = Path(tempfile.mkdtemp(prefix="dodwan-bench-"))
    try:
        base = baseline(total, args.max_datagram)
        dw = daemons(args.messages, args.size, args.max_datagram, workdir, args.config)
        floor = store_floor(args.messages, args.size, args.max_datagram, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = dw["goodput"] / base["goodput"]
    result = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPU, Python {platform.python_version()}",
        "messages": args.messages,
        "size": args.size,
        "max_datagram": args.max_datagram,
        "baseline": base,
        "dodwan": dw,
        "store_floor": floor,
        "ratio": ratio,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    mb = 1024 * 1024
    print(f"{args.messages} messages x {args.size} B, {args.max_datagram}-byte datagrams, loopback")
    print(f"plain UDP : {base['goodput'] / mb:8.1f} MiB/s  ({base['bytes'] / mb:.1f} MiB in "
          f"{base['seconds']:.2f} s, loss {base['loss']:.1%})")  # fmt: skip
    print(f"dodwan    : {dw['goodput'] / mb:8.1f} MiB/s  ({dw['bytes'] / mb:.1f} MiB in "
          f"{dw['seconds']:.2f} s; publishing took {dw['publish_seconds']:.2f} s)")  # fmt: skip
    print(f"            CPU busy during it: sender {dw['cpu_seconds_a']:.2f} s, "
          f"receiver {dw['cpu_seconds_b']:.2f} s")  # fmt: skip
    print(f"ratio     : {ratio:.2f}  (goal >= 0.5)")
    budget = total / (0.5 * base["goodput"])
    print(f"store     : the SQLite store alone takes {floor['seconds']:.2f} s for the same bytes "
          f"({floor['seconds_in_loop']:.2f} s in the writing thread); ratio 0.5 allows "
          f"{budget:.2f} s for everything")  # fmt: skip
    print(f"cached    : {dw['cached_goodput'] / mb:8.1f} MiB/s  (a newcomer fetches the "
          f"{dw['cached_bytes'] / mb:.1f} MiB its neighbours carry in {dw['cached_seconds']:.2f} s;"
          f" ratio {dw['cached_goodput'] / base['goodput']:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
