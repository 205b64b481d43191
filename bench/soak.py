"""Soak: three real daemons on loopback under continuous mixed load for a bounded time.

Usage: python bench/soak.py [--duration 300] [--seed 1] [--json report.json]

Load: each daemon publishes messages of mixed sizes (100 B to 200 KB) through its admin API;
every daemon holds a ``--dir`` subscription to all of them; a churn thread subscribes and
unsubscribes short-lived subscriptions; a hostile thread sends random and truncated
datagrams to the group. RSS (``/proc/PID/status`` VmRSS, and RssAnon: the same without
file-backed pages, which the kernel may drop at any time) and open file descriptors
(``/proc/PID/fd``) of each daemon are sampled every ``--sample`` seconds.

At the end the load stops and the run waits until every publication has reached every
daemon's directory. The report (printed as JSON) says what was published, delivered, lost
(publications missing from a directory) and duplicated (directory deliveries beyond one per
message, from the daemons' ``sink_deliveries_dir`` counters), RSS / fd figures after
warm-up, and the descriptors left open once the load's connections and writes have closed
(``fds_end``, with ``fd_kinds_end`` saying what they are). ``tests/test_soak.py`` runs it briefly and asserts on the report; figures of
longer runs are in ``docs/reliability.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dodwan.daemon.client import AdminClient, ClientError  # noqa: E402
from dodwan.daemon.memdebug import rss_kb  # noqa: E402

SIZES = (100, 1_000, 10_000, 50_000, 200_000)
TTL = 120.0


class Daemon:
    """One ``dodwan daemon`` subprocess."""

    def __init__(
        self, name: str, workdir: Path, args: list[str], env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.env = env
        self.state_dir = workdir / name
        self.out = workdir / f"out-{name}"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "dodwan.cli", "daemon", "--state-dir", str(self.state_dir)]
        with open(self.state_dir.parent / f"{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, *self.args],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=None if self.env is None else {**os.environ, **self.env},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon {self.name} exited with {self.proc.returncode}")
            try:
                info = json.loads((self.state_dir / "admin.json").read_text())
                if info["pid"] == self.proc.pid and self.client().get("/status"):
                    return
            except (OSError, ValueError, KeyError, ClientError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"daemon {self.name} not ready after {timeout} s")

    def client(self) -> AdminClient:
        return AdminClient.for_state_dir(self.state_dir, timeout=20.0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def rss_kb(self, field: str = "VmRSS") -> int:
        """``VmRSS``, or ``RssAnon``: the process's own memory, without the file-backed pages
        (libraries) that the kernel may drop and reload at any time."""
        assert self.proc is not None
        return rss_kb(field, self.proc.pid)

    def fds(self) -> int:
        assert self.proc is not None
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def fd_kinds(self) -> dict[str, int]:
        """Open descriptors by what they point at (``socket``, ``pipe``, or the file's name
        without its directory), to tell a leak from admin connections and sink writes that
        happen to be open at the moment of the sample."""
        assert self.proc is not None
        kinds: dict[str, int] = {}
        base = f"/proc/{self.proc.pid}/fd"
        for fd in os.listdir(base):
            try:
                target = os.readlink(f"{base}/{fd}")
            except OSError:  # closed since the listing
                continue
            kind = (
                target.split(":", 1)[0]
                if target.startswith(("socket:", "pipe:"))
                else (target.rsplit("/", 1)[-1])
            )
            kinds[kind] = kinds.get(kind, 0) + 1
        return kinds

    def settled_fds(self, ceiling: int, timeout: float = 10.0) -> int:
        """The descriptor count once the connections and sink writes of the load have
        closed: waits (up to ``timeout``) for it to come down to ``ceiling`` (the floor seen
        under load, plus the WAL checkpointer's connection, opened once when first needed);
        a leak never does, and the count it stayed at is returned."""
        deadline = time.monotonic() + timeout
        while (n := self.fds()) > ceiling and time.monotonic() < deadline:
            time.sleep(0.05)
        return n

    def disk_kb(self) -> dict[str, int]:
        """Sizes of the SQLite database and its write-ahead log, in kB."""
        out = {}
        for key, name in (("db", "dodwan.db"), ("wal", "dodwan.db-wal")):
            try:
                out[key] = (self.state_dir / name).stat().st_size // 1024
            except OSError:
                out[key] = 0
        return out


def _group(rnd: random.Random) -> str:
    return f"239.255.{rnd.randrange(1, 255)}.{rnd.randrange(1, 255)}:{rnd.randrange(20000, 32768)}"


def _hostile(group: str, stop: threading.Event, rnd: random.Random, counts: dict[str, int]) -> None:
    """Random bytes, bytes with our magic, and oversized junk to the group, ~100 per second."""
    host, port = group.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        while not stop.is_set():
            kind = rnd.randrange(3)
            if kind == 0:
                data = rnd.randbytes(rnd.randrange(0, 1500))
            elif kind == 1:
                data = b"DW\x01" + bytes([rnd.randrange(1, 6)]) + rnd.randbytes(rnd.randrange(60))
            else:
                data = rnd.randbytes(rnd.randrange(1500, 9000))
            try:
                s.sendto(data, (host, int(port)))
                counts["hostile_datagrams"] += 1
            except OSError:
                pass
            stop.wait(0.01)


def _publisher(
    d: Daemon,
    stop: threading.Event,
    rnd: random.Random,
    published: dict[str, str],
    lock: threading.Lock,
    rate: float,
) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        size = rnd.choice(SIZES)
        try:
            res = d.client().publish_bytes(
                rnd.randbytes(size), attributes={"topic": f"soak.{d.name}.{n}"}, ttl=TTL
            )
            with lock:
                published[res["id"]] = d.name
        except ClientError as exc:
            print(f"publish on {d.name} failed: {exc}", file=sys.stderr)
        stop.wait(rnd.expovariate(rate))


def _churn(
    daemons: list[Daemon], stop: threading.Event, rnd: random.Random, counts: dict[str, int]
) -> None:
    """Subscribe and unsubscribe short-lived subscriptions (patterns nobody publishes to)."""
    live: list[tuple[Daemon, str]] = []
    while not stop.is_set():
        d = rnd.choice(daemons)
        try:
            if len(live) < 6 and rnd.random() < 0.6:
                key = d.client().post(
                    "/subscribe",
                    {"patterns": [{"topic": f"churn\\.{rnd.randrange(1000)}", "x": "y|z"}],
                     "sink": {"kind": "dir", "target": str(d.out.parent / "churn")}},
                )["key"]  # fmt: skip
                live.append((d, key))
                counts["subscribes"] += 1
            elif live:
                d2, key = live.pop(rnd.randrange(len(live)))
                d2.client().delete(f"/subscriptions/{key}")
                counts["unsubscribes"] += 1
        except ClientError as exc:
            print(f"churn on {d.name} failed: {exc}", file=sys.stderr)
        stop.wait(0.3)


def _delivered(out: Path) -> set[str]:
    return {p.name[:-5] for p in out.glob("*.json") if not p.name.startswith(".")}


def run_soak(
    duration: float,
    workdir: Path,
    seed: int = 1,
    rate: float = 4.0,
    sample: float = 2.0,
    converge_timeout: float = 120.0,
    memtrace: Path | None = None,
    memtrace_period: float = 30.0,
    tracemalloc_frames: int = 0,
) -> dict[str, Any]:
    """Run the soak in ``workdir``; returns the report (see the module docstring).

    With ``memtrace``, every daemon samples its memory into ``memtrace/<name>/mem.jsonl``
    (see :mod:`dodwan.daemon.memdebug`); with ``tracemalloc_frames``, daemon a also runs
    tracemalloc (which slows it and adds to its RSS).
    """
    group = _group(random.Random())
    args = ["--group", group, "--announce-period", "1.0", "--fragment-cache", str(4 << 20)]
    envs: dict[str, dict[str, str] | None] = {n: None for n in ("a", "b", "c")}
    if memtrace is not None:
        for n in envs:
            envs[n] = {
                "DODWAN_MEMTRACE": str(memtrace / n),
                "DODWAN_MEMTRACE_PERIOD": str(memtrace_period),
                "DODWAN_TRACEMALLOC": str(tracemalloc_frames) if n == "a" else "0",
            }
    daemons = [Daemon(n, workdir, [*args, "--host-id", n], envs[n]) for n in ("a", "b", "c")]
    stop = threading.Event()
    published: dict[str, str] = {}
    lock = threading.Lock()
    counts = {"hostile_datagrams": 0, "subscribes": 0, "unsubscribes": 0}
    samples: list[dict[str, Any]] = []
    threads: list[threading.Thread] = []
    try:
        for d in daemons:
            d.start()
            d.client().post(
                "/subscribe",
                {"patterns": [{"topic": "soak\\..*"}], "key": "all",
                 "sink": {"kind": "dir", "target": str(d.out)}},
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(len(d.client().get("/status")["neighbours"]) == 2 for d in daemons):
                break
            time.sleep(0.1)
        start = time.monotonic()
        for i, d in enumerate(daemons):
            threads.append(
                threading.Thread(
                    target=_publisher,
                    args=(d, stop, random.Random(seed * 10 + i), published, lock, rate / 3),
                    daemon=True,
                )
            )
        threads.append(
            threading.Thread(target=_churn, args=(daemons, stop, random.Random(seed + 7), counts))
        )
        threads.append(
            threading.Thread(target=_hostile, args=(group, stop, random.Random(seed + 9), counts))
        )
        for t in threads:
            t.start()
        while (elapsed := time.monotonic() - start) < duration:
            samples.append(
                {
                    "t": round(elapsed, 1),
                    "rss_kb": {d.name: d.rss_kb() for d in daemons},
                    "rss_anon_kb": {d.name: d.rss_kb("RssAnon") for d in daemons},
                    "fds": {d.name: d.fds() for d in daemons},
                    "disk_kb": {d.name: d.disk_kb() for d in daemons},
                }
            )
            stop.wait(min(sample, max(0.0, duration - elapsed)))
        stop.set()
        for t in threads:
            t.join(30)
        load_seconds = time.monotonic() - start
        with lock:
            ids = dict(published)
        converge_start = time.monotonic()
        while time.monotonic() - converge_start < converge_timeout:
            if all(set(ids) <= _delivered(d.out) for d in daemons):
                break
            time.sleep(0.2)
        converge = time.monotonic() - converge_start
        final = {d.name: d.client().get("/status")["counters"] for d in daemons}
        samples.append(
            {
                "t": round(time.monotonic() - start, 1),
                "rss_kb": {d.name: d.rss_kb() for d in daemons},
                "rss_anon_kb": {d.name: d.rss_kb("RssAnon") for d in daemons},
                "fds": {d.name: d.fds() for d in daemons},
                "disk_kb": {d.name: d.disk_kb() for d in daemons},
            }
        )
        warm_samples = [s for s in samples if s["t"] >= duration * 0.25] or samples
        fds_floor = {d.name: min(s["fds"][d.name] for s in warm_samples) for d in daemons}
        fds_end = {d.name: d.settled_fds(fds_floor[d.name] + 2) for d in daemons}
        fd_kinds_end = {d.name: d.fd_kinds() for d in daemons}
        alive = all(d.proc is not None and d.proc.poll() is None for d in daemons)
    finally:
        stop.set()
        for d in daemons:
            d.stop()
    lost = {d.name: sorted(set(ids) - _delivered(d.out)) for d in daemons}
    duplicates = {
        d.name: final[d.name].get("sink_deliveries_dir", 0) - len(_delivered(d.out) & set(ids))
        for d in daemons
    }
    warm = [s for s in samples if s["t"] >= duration * 0.25] or samples
    report: dict[str, Any] = {
        "duration_s": round(load_seconds, 1),
        "seed": seed,
        "published": len(ids),
        "published_bytes_sizes": list(SIZES),
        "hostile_datagrams": counts["hostile_datagrams"],
        "subscribes": counts["subscribes"],
        "unsubscribes": counts["unsubscribes"],
        "converge_s": round(converge, 1),
        "lost": {k: len(v) for k, v in lost.items()},
        "lost_ids": {k: v[:10] for k, v in lost.items() if v},
        "duplicates": duplicates,
        "alive": alive,
        "datagrams_dropped": {k: v.get("datagrams_dropped", 0) for k, v in final.items()},
        "internal_errors": {k: v.get("internal_errors", 0) for k, v in final.items()},
        "rss_kb_after_warmup": {
            d.name: [warm[0]["rss_kb"][d.name], max(s["rss_kb"][d.name] for s in warm)]
            for d in daemons
        },
        "rss_kb_end": samples[-1]["rss_kb"],
        "rss_anon_kb_after_warmup": {
            d.name: [warm[0]["rss_anon_kb"][d.name], max(s["rss_anon_kb"][d.name] for s in warm)]
            for d in daemons
        },
        "rss_anon_kb_end": samples[-1]["rss_anon_kb"],
        "fds_after_warmup": {
            d.name: [min(s["fds"][d.name] for s in warm), max(s["fds"][d.name] for s in warm)]
            for d in daemons
        },
        "fds_end": fds_end,
        "fd_kinds_end": fd_kinds_end,
        "wal_kb_max": {d.name: max(s["disk_kb"][d.name]["wal"] for s in samples) for d in daemons},
        "db_kb_end": {d.name: samples[-1]["disk_kb"][d.name]["db"] for d in daemons},
        "samples": samples,
    }
    return report


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load (default 300)")
    ap.add_argument("--rate", type=float, default=4.0, help="publications per second, all hosts")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sample", type=float, default=2.0, help="seconds between RSS/fd samples")
    ap.add_argument("--json", help="also write the report to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument(
        "--memtrace",
        help="directory for memory samples of each daemon (DODWAN_MEMTRACE)",
    )
    ap.add_argument("--memtrace-period", type=float, default=30.0)
    ap.add_argument(
        "--tracemalloc", type=int, default=0, help="with --memtrace: frames traced on daemon a"
    )
    a = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dodwan-soak-"))
    try:
        report = run_soak(
            a.duration,
            workdir,
            a.seed,
            a.rate,
            a.sample,
            memtrace=Path(a.memtrace).resolve() if a.memtrace else None,
            memtrace_period=a.memtrace_period,
            tracemalloc_frames=a.tracemalloc,
        )
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
