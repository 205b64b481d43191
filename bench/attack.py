"""Attack: a victim daemon flooded by every known hostile-neighbour attack at once, side by
side with the same run unattacked, in one invocation.

Usage: python bench/attack.py [--duration 300] [--rate 1048576] [--senders 4] [--netkey]
                              [--no-baseline] [--settle 15] [--only regex,zeros,...]
                              [--json report.json]

Each run starts two real daemons on loopback (multicast bound to 127.0.0.1, a random group):
a victim ``v`` subscribed to ``legit.*`` and ``news.*`` (both into ``--dir`` sinks) and
holding a 1 MB message of its own, and a legitimate publisher ``p`` that publishes one small
``legit.N`` message every second. In the attack run, ``--senders`` fake senders (one UDP
socket and thread each, many sender names each) send datagrams built with
``dodwan.core.wire`` to the group at ``--rate`` bytes per second all together, cycling
through the attacks of the issue "a hostile neighbour cannot exhaust a host":

* ``regex``: profiles of 16 pieces x 64 patterns like ``.{999}`` x 7;
* ``huge_offers``: announcements offering 200 ids that declare 65,536 fragments each, from
  400 sender names;
* ``padded``: catalogs of 256 valid descriptors padded to ~7 KB (small once compressed);
* ``crowd``: ever new sender names, each with 512 offers, alternating with one-pattern
  profile announcements;
* ``ranges``: requests for the victim's own 1 MB message repeating one range 15,000 times
  (a different range in each request);
* ``junk``: fragment 0 of ever new 22-fragment messages matching the victim's subscription;
* ``eternal``: descriptors whose deadline is ``inf`` or ``1e300``;
* ``zeros``: legal 64 MiB all-zero messages (a few KB of fragments), one at the start and
  then evenly spread, at most 10 per run;
* ``jumps`` (with ``--netkey``, where every datagram is sealed with the network key the
  attacker holds): sealed datagrams whose counter jumps to 2^33 and then 2^62.

Measured on the victim: RSS (``/proc/PID/status``: start, peak of samples every 0.2 s,
VmHWM, and after ``--settle`` seconds without attack), latency of ``GET /status`` polled
every 0.2 s (p50/p99/max, failures), legitimate deliveries (delivered/published, median and
p99 latency from the publish call to the file in the victim's sink), bytes its ``news`` sink
wrote, whether it still holds its own message and every legitimate one it delivered (their
TTL outlives the run), and its counters (every one that is non-zero in either run). ``--only`` runs some
attacks alone, to see which one costs what. Every flood is bounded
in time (``--duration``) and rate, and goes to a loopback multicast group only.
``tests/test_bench_attack.py`` runs it briefly; figures of a full run are in
``docs/reliability.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import zstandard

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from soak import Daemon  # noqa: E402

from dodwan.core import Node, NodeConfig, wire  # noqa: E402
from dodwan.core import message as m  # noqa: E402
from dodwan.core.patterns import Profile  # noqa: E402
from dodwan.daemon import netkey as nk  # noqa: E402
from dodwan.daemon.client import AdminClient, ClientError  # noqa: E402
from dodwan.daemon.memdebug import rss_kb  # noqa: E402
from dodwan.daemon.sinks import file_name  # noqa: E402

VICTIM = "v"
Burst = list[bytes]
MAX_ZERO_BOMBS = 10
ZERO_SIZE = 64 * 1024 * 1024


# ---------------------------------------------------------------- forging


def forge(host: str, payload: bytes, attrs: dict[str, str], seed: int) -> tuple[
    str, dict[str, str], list[bytes]
]:  # fmt: skip
    """A message as ``host`` would publish it: id, descriptor, fragments."""
    node = Node(NodeConfig(host_id=host, max_datagram=1400), rng=random.Random(seed))
    now = time.time()
    msg_id = node.publish(attrs, payload, deadline=now + 3600, now=now)
    c = node._cache[msg_id]
    frags = [node._store.get_fragment(msg_id, i) for i in range(c.header.frags)]
    return msg_id, dict(c.descriptor), [f for f in frags if f is not None]


def announce(
    sender: str, version: int = 0, pieces: int = 0, entries: Sequence[bytes] = ()
) -> bytes:
    return wire.encode_announce(sender, 1, False, version, pieces, (), list(entries))


def entry(desc: dict[str, str], frags: int, z: zstandard.ZstdCompressor) -> bytes:
    zdesc = z.compress(wire.encode_attributes(desc))
    return wire.encode_catalog_entry(wire.CatalogEntry(desc["id"], frags, None, zdesc))


class Attacks:
    """The bursts of every attack, for one fake sender (``tag`` keeps its names apart)."""

    def __init__(self, tag: str, big_id: str, templates: dict[str, Any], zeros: list[Burst],
                 zero_period: float) -> None:  # fmt: skip
        self.tag = tag
        self.big_id = big_id
        self.t = templates
        self.zeros = list(zeros)
        self.zero_period = zero_period
        self.next_zero = time.monotonic()
        self.z = zstandard.ZstdCompressor(level=3)
        """Its own compressor: ``message.compress_descriptor`` shares one, not thread-safe."""

    def regex(self) -> Iterator[Burst]:
        for k in itertools.count():
            sender = f"{self.tag}rx{k % 64}"
            specs = [
                tuple(((("topic", ".{999}" * 7 + f"{k}-{i}-{j}"),)) for j in range(64))
                for i in range(16)
            ]
            pieces = [wire.encode_profile_piece(sender, sender, k, 16, i, s)
                      for i, s in enumerate(specs)]  # fmt: skip
            yield [announce(sender, k, 16), *pieces]

    def _offers(self, template: str, frags: int, changes: list[dict[str, str]]) -> list[bytes]:
        """Catalog entries of the ``template`` descriptor, one per item of ``changes`` (the
        attributes that entry changes: a new id at least)."""
        desc = dict(self.t[template])
        out = []
        for change in changes:
            desc.update(change)
            out.append(entry(desc, frags, self.z))
        return out

    def huge_offers(self) -> Iterator[Burst]:
        for k in itertools.count():
            origin = f"{self.tag}ho{k % 400}"
            entries = self._offers(
                "huge", 65536, [{"id": f"{self.tag}h{k}-{i}", "origin": origin} for i in range(200)]
            )
            yield [announce(f"{self.tag}big{k % 400}", entries=entries)]

    def padded(self) -> Iterator[Burst]:
        for k in itertools.count():
            sender = f"{self.tag}pad{k % 32}"
            entries = self._offers("small", 1, [
                {"id": f"{self.tag}p{k}-{i}", "pad": f"{k:07d}{i:03d}" * 700} for i in range(256)
            ])  # fmt: skip
            yield [announce(sender), wire.encode_catalog(sender, k, entries)]

    def crowd(self) -> Iterator[Burst]:
        pool: list[bytes] = self.t["offers"]
        for k in itertools.count():
            sender = f"{self.tag}crowd{k}"
            if k % 2:
                start = (k * 512) % len(pool)
                offers = (pool + pool)[start : start + 512]  # 512 offers: two datagrams
                yield [
                    announce(sender, entries=offers[:300]),
                    wire.encode_catalog(sender, 1, offers[300:]),
                ]
            else:
                specs = ((("topic", f"crowd\\.{self.tag}{k}"),),)
                version = Profile.from_patterns([dict(s) for s in specs]).version
                piece = wire.encode_profile_piece(sender, sender, version, 1, 0, specs)
                yield [announce(sender, version, 1), piece]

    def ranges(self) -> Iterator[Burst]:
        for k in itertools.count():
            sender = f"{self.tag}req{k % 8}"
            first = k % 64  # every request a different datagram: none is a cache hit
            request = wire.encode_request(
                sender, VICTIM, [(self.big_id, [(first, 65535)] * 15_000)]
            )
            yield [announce(sender), request]

    def junk(self) -> Iterator[Burst]:
        desc = dict(self.t["multi"])
        chunk = self.t["multi_frag0"]
        for k in itertools.count():
            sender = f"{self.tag}junk{k % 16}"
            burst = [announce(sender)]
            for i in range(20):
                desc["id"] = f"{self.tag}j{k}-{i}"
                desc["origin"] = f"{self.tag}jo{k % 50}"
                desc["topic"] = f"news.junk.{k}.{i}"
                zdesc = self.z.compress(wire.encode_attributes(desc))
                burst.append(wire.encode_fragment(sender, desc["id"], 1, 0, zdesc, chunk))
            yield burst

    def eternal(self) -> Iterator[Burst]:
        desc = dict(self.t["small"])
        chunk = self.t["small_frag0"]
        for k in itertools.count():
            sender = f"{self.tag}eter{k % 8}"
            burst = [announce(sender)]
            for i, deadline in enumerate(("inf", "1e300") * 5):
                desc["id"] = f"{self.tag}e{k}-{i}"
                desc["deadline"] = deadline
                desc["topic"] = f"news.eternal.{k}.{i}"
                zdesc = self.z.compress(wire.encode_attributes(desc))
                burst.append(wire.encode_fragment(sender, desc["id"], 1, 0, zdesc, chunk))
            yield burst

    def reserve(self) -> Iterator[Burst]:
        """Offers of new two-fragment messages the victim subscribed to, never sent: each
        makes it promise room (a reservation held 2 x request_timeout), and the check of
        every next offer used to sum all the reservations held."""
        for k in itertools.count():
            entries = self._offers("tiny2", 2, [
                {"id": f"{self.tag}r{k}-{i}", "topic": f"news.reserve.{k}.{i}"} for i in range(200)
            ])  # fmt: skip
            yield [announce(f"{self.tag}res{k % 16}", entries=entries)]

    def zero_bombs(self) -> Iterator[Burst]:
        while True:
            if self.zeros and time.monotonic() >= self.next_zero:
                self.next_zero += self.zero_period
                yield self.zeros.pop(0)
            else:
                yield []

    def kinds(self, netkey: bool) -> dict[str, Iterator[Burst]]:
        out = {
            "zeros": self.zero_bombs(),  # first: the first bomb goes at once
            "regex": self.regex(),
            "huge_offers": self.huge_offers(),
            "padded": self.padded(),
            "crowd": self.crowd(),
            "ranges": self.ranges(),
            "junk": self.junk(),
            "eternal": self.eternal(),
            "reserve": self.reserve(),
        }
        if netkey:
            out["jumps"] = iter(lambda: [announce(f"{self.tag}jump")], None)
        return out


KINDS = (
    "regex", "huge_offers", "padded", "crowd", "ranges", "junk", "eternal", "reserve", "zeros",
    "jumps",
)  # fmt: skip


def templates() -> dict[str, Any]:
    """Descriptors and fragments the attacks vary (ids, topics, deadlines, padding)."""
    _, small, [small_frag0] = forge("evil", b"x", {"topic": "news.small"}, seed=1)
    _, multi, multi_frags = forge(
        "evil", random.Random(2).randbytes(30_000), {"topic": "news.junk"}, seed=2
    )
    _, tiny2, _ = forge("evil", random.Random(3).randbytes(1800), {"topic": "news.reserve"}, seed=3)
    assert tiny2["frags"] == "2", tiny2["frags"]
    huge = {**small, "size": "1", "zsize": str(65536 * 100), "frags": "65536",
            "fsize": "100", "zhash": "0" * 64}  # fmt: skip
    offers = []
    z = zstandard.ZstdCompressor(level=3)
    desc = dict(small)
    for i in range(2000):
        desc["id"] = f"offer-{i}"
        desc["topic"] = f"nobody.{i}"
        offers.append(entry(desc, 1, z))
    return {"small": small, "small_frag0": small_frag0, "multi": multi,
            "multi_frag0": multi_frags[0], "huge": huge, "offers": offers,
            "tiny2": tiny2}  # fmt: skip


def zero_bombs(count: int) -> list[Burst]:
    """All the fragments of ``count`` legal 64 MiB all-zero messages (new ids each)."""
    bombs = []
    zeros = bytes(ZERO_SIZE)
    for i in range(count):
        msg_id, desc, frags = forge("zorigin", zeros, {"topic": f"news.zero.{i}"}, seed=100 + i)
        zdesc = m.compress_descriptor(desc)
        bombs.append([wire.encode_fragment("zsender", msg_id, 1, j, zdesc, f)
                      for j, f in enumerate(frags)])  # fmt: skip
    return bombs


# ---------------------------------------------------------------- threads


class Sender(threading.Thread):
    """One fake sender: its own socket, round-robin over the attacks, paced to ``rate``."""

    def __init__(self, group: str, attacks: Attacks, rate: float, stop: threading.Event,
                 key: bytes | None, only: frozenset[str]) -> None:  # fmt: skip
        super().__init__(daemon=True)
        host, port = group.rsplit(":", 1)
        self.dest = (host, int(port))
        self.kinds = {k: v for k, v in attacks.kinds(key is not None).items() if k in only}
        self.rate = rate
        self.stop = stop
        self.key = key
        self.seal = nk.NetKey(key).seal if key is not None else None
        self.sent = {k: [0, 0] for k in self.kinds}
        self.errors = 0

    def _sealed(self, kind: str, data: bytes) -> list[bytes]:
        if self.key is None or self.seal is None:
            return [data]
        if kind != "jumps":
            return [self.seal(data)]
        jumper = nk.NetKey(self.key)  # a new boot id, then two counter jumps
        jumper._counter = 2**33
        first = jumper.seal(data)
        jumper._counter = 2**62
        return [first, jumper.seal(data)]

    def run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            start = time.monotonic()
            total = 0
            for kind in itertools.cycle(list(self.kinds)):
                if self.stop.is_set():
                    return
                burst = next(self.kinds[kind])
                if not burst and len(self.kinds) == 1:
                    self.stop.wait(0.1)  # zeros alone: nothing to send until the next bomb
                for data in burst:
                    for d in self._sealed(kind, data):
                        try:
                            s.sendto(d, self.dest)
                        except OSError:
                            self.errors += 1
                            continue
                        self.sent[kind][0] += 1
                        self.sent[kind][1] += len(d)
                        total += len(d)
                        delay = start + total / self.rate - time.monotonic()
                        if delay > 0 and self.stop.wait(delay):
                            return


def _poll_status(client: AdminClient, stop: threading.Event, out: list[float]) -> None:
    """Time ``GET /status`` every 0.2 s; a failure counts as its time (at least the timeout)."""
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            client.get("/status")
        except (ClientError, OSError):
            out.append(-(time.monotonic() - t0))  # negative: failed
        else:
            out.append(time.monotonic() - t0)
        stop.wait(max(0.0, 0.2 - (time.monotonic() - t0)))


def _sample_rss(pids: dict[str, int], stop: threading.Event, peaks: dict[str, int]) -> None:
    while not stop.is_set():
        for name, pid in pids.items():
            peaks[name] = max(peaks.get(name, 0), rss_kb("VmRSS", pid))
        stop.wait(0.2)


def _publish(client: AdminClient, stop: threading.Event, published: dict[str, float]) -> None:
    for n in itertools.count():
        t0 = time.monotonic()
        try:
            res = client.publish_bytes(
                f"legit {n}".encode(), attributes={"topic": f"legit.{n}"}, ttl=600
            )
            published[res["id"]] = t0
        except (ClientError, OSError) as exc:
            print(f"legit publish failed: {exc}", file=sys.stderr)
        if stop.wait(max(0.0, 1.0 - (time.monotonic() - t0))):
            return


def _watch(outdir: Path, stop: threading.Event, seen: dict[str, float]) -> None:
    """First time each delivered file (``<name>.json``, written last) appears in ``outdir``."""
    while not stop.is_set():
        try:
            names = [p.name for p in outdir.iterdir()]
        except OSError:
            names = []
        now = time.monotonic()
        for name in names:
            if name.endswith(".json") and not name.startswith("."):
                seen.setdefault(name[:-5], now)
        stop.wait(0.05)


def _dir_bytes(path: Path) -> int:
    try:
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    except OSError:
        return 0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]  # type: ignore[index]


# ---------------------------------------------------------------- one run


def run_once(
    workdir: Path,
    attack: bool,
    duration: float,
    rate: float,
    senders: int,
    settle: float,
    netkey: bool,
    kinds: frozenset[str] = frozenset(KINDS),
    seed: int = 1,
) -> dict[str, Any]:
    """One run (with or without the attacks) in ``workdir``; returns its figures."""
    group = f"239.255.{random.randrange(1, 255)}.{random.randrange(1, 255)}:" \
            f"{random.randrange(20000, 32768)}"  # fmt: skip
    args = ["--group", group]
    key: bytes | None = None
    if netkey:
        key = nk.generate_key()
        nk.write_secret_file(workdir / "net.key", nk.encode_key(key))
        args += ["--network-key", str(workdir / "net.key")]
    victim = Daemon(VICTIM, workdir, [*args, "--host-id", VICTIM])
    pub = Daemon("p", workdir, [*args, "--host-id", "p"])
    legit_out, news_out = workdir / "out-legit", workdir / "out-news"
    stop, stop_attack, stop_pub = threading.Event(), threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    attackers: list[Sender] = []
    latencies: list[float] = []
    peaks: dict[str, int] = {}
    published: dict[str, float] = {}
    seen: dict[str, float] = {}
    try:
        victim.start()
        pub.start()
        vc, pc = victim.client(), pub.client()
        for key_name, pattern, out in (("legit", "legit\\..*", legit_out),
                                       ("news", "news\\..*", news_out)):  # fmt: skip
            vc.post("/subscribe", {"patterns": [{"topic": pattern}], "key": key_name,
                                   "sink": {"kind": "dir", "target": str(out)}})  # fmt: skip
        big_id = vc.publish_bytes(
            random.Random(seed).randbytes(1_000_000), attributes={"topic": "local.big"}, ttl=3600
        )["id"]
        deadline = time.monotonic() + 60
        while "p" not in vc.get("/status")["neighbours"]:
            if time.monotonic() > deadline:
                raise RuntimeError("the victim never heard the publisher")
            time.sleep(0.1)
        assert victim.proc is not None and pub.proc is not None
        rss_start = victim.rss_kb()
        status_client = AdminClient.for_state_dir(victim.state_dir, timeout=10.0)
        threads += [
            threading.Thread(target=_poll_status, args=(status_client, stop, latencies)),
            threading.Thread(
                target=_sample_rss,
                args=({"victim": victim.proc.pid, "publisher": pub.proc.pid}, stop, peaks),
            ),
            threading.Thread(target=_watch, args=(legit_out, stop, seen)),
            threading.Thread(target=_publish, args=(pc, stop_pub, published)),
        ]
        if attack:
            tmpl = templates()
            bombs = zero_bombs(
                min(MAX_ZERO_BOMBS, 1 + int(duration // 30)) if "zeros" in kinds else 0
            )
            for i in range(senders):
                attacks = Attacks(f"s{i}", big_id, tmpl, bombs if i == 0 else [],
                                  duration / max(1, len(bombs)))  # fmt: skip
                attackers.append(Sender(group, attacks, rate / senders, stop_attack, key, kinds))
        for t in [*threads, *attackers]:
            t.daemon = True
            t.start()
        stop_attack.wait(duration)
        stop_attack.set()
        stop_pub.set()
        for t in attackers:
            t.join(30)
        # settle: no more attacks nor publications; wait for late legitimate deliveries
        time.sleep(settle)
        stop.set()
        for t in threads:
            t.join(30)
        ids = {file_name(i): t for i, t in published.items()}  # the publisher has finished
        rss_end = victim.rss_kb()
        hwm = victim.rss_kb("VmHWM")
        counters = vc.get("/status")["counters"]
        cached = {e["id"] for e in vc.get("/cache")}
        kept = big_id in cached and all(i in cached for i in published if file_name(i) in seen)
        alive = victim.proc.poll() is None
    finally:
        stop.set()
        stop_attack.set()
        stop_pub.set()
        victim.stop()
        pub.stop()
    log = (workdir / f"{VICTIM}.log").read_text(errors="replace")
    ok = [x for x in latencies if x >= 0]
    delays = sorted(seen[n] - t for n, t in ids.items() if n in seen)
    sent: dict[str, list[int]] = {}
    for a in attackers:
        for kind, (count, size) in a.sent.items():
            sent.setdefault(kind, [0, 0])
            sent[kind][0] += count
            sent[kind][1] += size
    return {
        "attack": attack,
        "alive": alive,
        "kept": kept,
        "tracebacks": log.count("Traceback"),
        "rss_start_kb": rss_start,
        "rss_peak_kb": peaks.get("victim", 0),
        "rss_hwm_kb": hwm,
        "rss_end_kb": rss_end,
        "publisher_rss_peak_kb": peaks.get("publisher", 0),
        "status_polls": len(latencies),
        "status_failures": len(latencies) - len(ok),
        "status_p50_ms": _pct(ok, 50) * 1000,
        "status_p99_ms": _pct(ok, 99) * 1000,
        "status_max_ms": max((abs(x) for x in latencies), default=float("nan")) * 1000,
        "published": len(ids),
        "delivered": len(delays),
        "delivery_median_s": _pct(delays, 50),
        "delivery_p99_s": _pct(delays, 99),
        "news_sink_bytes": _dir_bytes(news_out),
        "sent": sent,
        "sent_datagrams": sum(c for c, _ in sent.values()),
        "sent_bytes": sum(b for _, b in sent.values()),
        "send_errors": sum(a.errors for a in attackers),
        "counters": counters,
    }


# ---------------------------------------------------------------- report

ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("victim RSS start (MB)", lambda r: f"{r['rss_start_kb'] / 1024:.1f}"),
    ("victim RSS peak (MB)", lambda r: f"{r['rss_peak_kb'] / 1024:.1f}"),
    ("victim VmHWM (MB)", lambda r: f"{r['rss_hwm_kb'] / 1024:.1f}"),
    ("victim RSS after settle (MB)", lambda r: f"{r['rss_end_kb'] / 1024:.1f}"),
    ("publisher RSS peak (MB)", lambda r: f"{r['publisher_rss_peak_kb'] / 1024:.1f}"),
    ("admin /status p50 (ms)", lambda r: f"{r['status_p50_ms']:.1f}"),
    ("admin /status p99 (ms)", lambda r: f"{r['status_p99_ms']:.1f}"),
    ("admin /status max (ms)", lambda r: f"{r['status_max_ms']:.1f}"),
    ("admin /status failed/polls", lambda r: f"{r['status_failures']}/{r['status_polls']}"),
    ("legit delivered/published", lambda r: f"{r['delivered']}/{r['published']}"),
    ("legit latency median (s)", lambda r: f"{r['delivery_median_s']:.2f}"),
    ("legit latency p99 (s)", lambda r: f"{r['delivery_p99_s']:.2f}"),
    ("news sink written (MB)", lambda r: f"{r['news_sink_bytes'] / 1e6:.1f}"),
    ("attack datagrams sent", lambda r: str(r["sent_datagrams"])),
    ("attack MB sent", lambda r: f"{r['sent_bytes'] / 1e6:.1f}"),
    ("attack send errors", lambda r: str(r["send_errors"])),
    ("victim kept own + delivered", lambda r: "yes" if r["kept"] else "NO"),
    ("victim alive, tracebacks", lambda r: f"{'yes' if r['alive'] else 'NO'},{r['tracebacks']}"),
]


def render(runs: list[dict[str, Any]], title: str) -> str:
    names = ["baseline" if not r["attack"] else "attack" for r in runs]
    lines = [title, f"{'':44}" + "".join(f"{n:>16}" for n in names)]
    for label, fmt in ROWS:
        lines.append(f"{label:44}" + "".join(f"{fmt(r):>16}" for r in runs))
    counters = sorted({k for r in runs for k, v in r["counters"].items() if v})
    for k in counters:
        lines.append(
            f"{'counter ' + k:44}" + "".join(f"{r['counters'].get(k, 0):>16}" for r in runs)
        )
    for r in runs:
        if r["attack"]:
            lines.append("")
            lines.append(f"{'sent per attack':44}{'datagrams':>16}{'MB':>16}")
            for kind, (count, size) in r["sent"].items():
                lines.append(f"{kind:44}{count:>16}{size / 1e6:>16.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of attack (300)")
    ap.add_argument("--rate", type=float, default=float(1 << 20),
                    help="bytes per second of all the fake senders together (1 MiB/s)")  # fmt: skip
    ap.add_argument("--senders", type=int, default=4, help="fake senders (sockets) (4)")
    ap.add_argument("--settle", type=float, default=15.0,
                    help="seconds measured after the attack stops (15)")  # fmt: skip
    ap.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                    help="also run unattacked first (default on)")  # fmt: skip
    ap.add_argument("--netkey", action="store_true",
                    help="daemons use a network key; the attacker holds it (adds 'jumps')")  # fmt: skip
    ap.add_argument(
        "--only", help=f"comma-separated attacks to run (default all: {','.join(KINDS)})"
    )
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    if a.duration <= 0 or a.rate <= 0 or a.senders < 1 or a.settle < 0:
        ap.error("--duration and --rate must be positive, --senders >= 1, --settle >= 0")
    kinds = frozenset(a.only.split(",")) if a.only else frozenset(KINDS)
    if not kinds <= set(KINDS):
        ap.error(f"--only: unknown attack(s) {', '.join(sorted(kinds - set(KINDS)))}")
    if kinds == {"jumps"} and not a.netkey:
        ap.error("--only jumps needs --netkey")
    workdir = Path(tempfile.mkdtemp(prefix="dodwan-attack-"))
    runs = []
    try:
        for attack in ([False] if a.baseline else []) + [True]:
            sub = workdir / ("attack" if attack else "baseline")
            sub.mkdir()
            runs.append(
                run_once(sub, attack, a.duration, a.rate, a.senders, a.settle, a.netkey, kinds)
            )
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work directory kept: {workdir}", file=sys.stderr)
    title = (f"attack bench: {a.duration:g} s, {a.rate:g} B/s from {a.senders} senders, "
             f"network key {'on' if a.netkey else 'off'}, settle {a.settle:g} s"
             + (f", only {','.join(sorted(kinds))}" if a.only else ""))  # fmt: skip
    print(render(runs, title))
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
