"""Shared by the real-daemon hardening tests: a victim daemon on a random loopback group, a
socket to send it hand-crafted datagrams (built with ``dodwan.core.wire``), and the checks
every row of the hostile-neighbour table makes (admin API at once, RSS growth, its own
message kept, a legitimate message in time).

Not a test module itself: ``test_hardening_limits.py`` and ``test_hardening_rows.py`` import it.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from test_daemon_helpers import DaemonProc, random_group, wait_for

from dodwan.core import Node, NodeConfig, wire


def forge(host: str, payload: bytes, attrs: dict[str, str], seed: int):  # type: ignore[no-untyped-def]
    """A message as ``host`` would publish it: id, compressed descriptor, descriptor, fragments."""
    node = Node(NodeConfig(host_id=host, max_datagram=1400), rng=random.Random(seed))
    msg_id = node.publish(attrs, payload, deadline=time.time() + 600, now=time.time())
    c = node._cache[msg_id]
    frags = [node._store.get_fragment(msg_id, i) for i in range(c.header.frags)]
    return msg_id, c.meta.zdesc, dict(c.descriptor), frags


def announce(sender: str = "evil", pieces=0, relayed=(), entries=()) -> bytes:  # type: ignore[no-untyped-def]
    return wire.encode_announce(sender, 1, False, 1, pieces, list(relayed), list(entries))


class Victim:
    def __init__(self, proc: DaemonProc, group: str) -> None:
        self.proc = proc
        self.group = group
        host, port = group.rsplit(":", 1)
        self.dest = (host, int(port))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(
            socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1")
        )

    def counters(self) -> dict[str, int]:
        return self.proc.status()["counters"]  # type: ignore[no-any-return]

    def provoke(self, datagrams: list[bytes], counter: str, at_least: int = 1) -> None:
        before = self.counters().get(counter, 0)
        for d in datagrams:
            self.sock.sendto(d, self.dest)
            time.sleep(0.001)  # a paced burst: we count refusals, not socket overflows
        wait_for(
            lambda: self.counters().get(counter, 0) - before >= at_least, what=f"{counter} counted"
        )
        metrics = self.proc.client().get("/metrics")
        assert f'dodwan_events_total{{name="{counter}"}}' in metrics


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@dataclass
class NewsVictim:
    """A victim daemon subscribed to ``news.*`` (into a dir sink) holding a message of its
    own, with a legitimate publisher ready on another socket (started by :meth:`legit`)."""

    proc: DaemonProc
    pub: DaemonProc
    v: Victim
    own: str
    rss_before: float

    def admin_answers_at_once(self) -> None:
        started = time.monotonic()
        self.proc.status()
        assert time.monotonic() - started < 1.0

    def rss_growth(self) -> float:
        assert self.proc.proc is not None
        return rss_mb(self.proc.proc.pid) - self.rss_before

    def legit_arrives_within_5_s(self, payload: bytes) -> None:
        """A legitimate publication (another socket) is complete at the victim within 5 s,
        and nothing the victim stored was lost."""
        self.pub.start()
        client = self.proc.client()
        mid = self.pub.client().publish_bytes(payload, attributes={"topic": "news.legit"},
                                              ttl=600)["id"]  # fmt: skip
        wait_for(lambda: mid in {e["id"] for e in client.get("/cache") if e["complete"]},
                 timeout=5.0, what="legitimate message at the victim")  # fmt: skip
        assert self.own in {e["id"] for e in client.get("/cache")}


@contextmanager
def news_victim(
    tmp_path: Path, tag: str, config: str | None = None, args: Sequence[str] = ()
) -> Iterator[NewsVictim]:
    """The victim (``config``: its TOML file's text) and its publisher, both started with
    ``args`` too (a network key, say); the victim must never log a traceback."""
    group = random_group()
    extra = list(args)
    if config is not None:
        conf = tmp_path / "v.toml"
        conf.write_text(config)
        extra += ["--config", str(conf)]
    proc = DaemonProc(tmp_path / "d", ["--group", group, "--host-id", f"v{tag}", *extra,
                                       "--announce-period", "0.5"])  # fmt: skip
    proc.start()
    pub = DaemonProc(tmp_path / "pub", ["--group", group, "--host-id", f"pub{tag}", *args,
                                        "--announce-period", "0.5"])  # fmt: skip
    try:
        client = proc.client()
        client.post("/subscribe", {"patterns": [{"topic": "news.*"}],
                                   "sink": {"kind": "dir", "target": str(tmp_path / "out")}})  # fmt: skip
        own = client.publish_bytes(b"mine", attributes={"topic": "own"}, ttl=600)["id"]
        assert proc.proc is not None
        victim = NewsVictim(proc, pub, Victim(proc, group), own, rss_mb(proc.proc.pid))
        try:
            yield victim
        finally:
            victim.v.sock.close()
    finally:
        pub.kill()
        proc.kill()
    assert "Traceback" not in proc.log.read_text()
