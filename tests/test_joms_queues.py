"""Queues through the gateway: quasi-central managers, fair dispatch, exactly-once, restarts."""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp
from joms_support import LoopThread, mesh, start_hosts, wait_for

from joms.runtime import HostConfig, LoopbackHost


class Collector(stomp.ConnectionListener):
    """Receives queue messages, acknowledging each (client-individual)."""

    def __init__(self, name: str, sink: list[tuple[str, str]], lock: threading.Lock) -> None:
        self.name = name
        self.sink = sink
        self.lock = lock
        self.conn: Any = None
        self.errors: queue.Queue[Any] = queue.Queue()
        self.receipts: queue.Queue[str] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.sink.append((self.name, frame.body))
        self.conn.ack(frame.headers["ack"])

    def on_error(self, frame: Any) -> None:
        self.errors.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame.headers["receipt-id"])


def receiver(
    h: LoopbackHost, dest: str, name: str, sink: list, lock: threading.Lock, **sub: Any
) -> Any:
    c = stomp.Connection12([h.stomp_address])
    col = Collector(name, sink, lock)
    col.conn = c
    c.set_listener("c", col)
    c.connect(wait=True)
    c.subscribe(dest, id=name, ack="client-individual", headers={"receipt": f"r-{name}", **sub})
    assert col.receipts.get(timeout=5) == f"r-{name}"
    return c


def sender(h: LoopbackHost) -> Any:
    c = stomp.Connection12([h.stomp_address])
    c.connect(wait=True)
    return c


def qstatus(lt: LoopThread, h: LoopbackHost, name: str) -> dict[str, Any]:
    """Manager state, read on the loop thread (empty before the queue exists)."""

    def read() -> dict[str, Any]:
        try:
            return h.service.queue_status(name)
        except KeyError:
            return {"receivers": {}, "pending": -1, "assigned": 0}

    return lt.run(read)


@pytest.fixture()
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


def test_local_queue_competing_receivers_exactly_once(loop: LoopThread) -> None:
    [h] = start_hosts(loop, 1, prefix="q")
    got: list[tuple[str, str]] = []
    lock = threading.Lock()
    try:
        r1 = receiver(h, "/queue/work", "r1", got, lock)
        r2 = receiver(h, "/queue/work", "r2", got, lock)
        s = sender(h)
        for i in range(20):
            s.send("/queue/work", f"job{i}")
        assert wait_for(lambda: len(got) >= 20)
        assert sorted(b for _, b in got) == sorted(f"job{i}" for i in range(20))
        per = collections.Counter(n for n, _ in got)
        assert per["r1"] == per["r2"] == 10  # round-robin
        status = qstatus(loop, h, "work@q1")
        assert wait_for(lambda: qstatus(loop, h, "work@q1")["pending"] == 0)
        assert len(status["receivers"]) == 2
        for c in (r1, r2, s):
            c.disconnect()
    finally:
        loop.call(h.stop())


def test_queue_selector_routes_to_matching_receiver(loop: LoopThread) -> None:
    [h] = start_hosts(loop, 1, prefix="s")
    got: list[tuple[str, str]] = []
    lock = threading.Lock()
    try:
        en = receiver(h, "/queue/mail", "en", got, lock, selector="lang = 'en'")
        fr = receiver(h, "/queue/mail", "fr", got, lock, selector="lang = 'fr'")
        s = sender(h)
        for i in range(6):
            s.send("/queue/mail", f"{i}", headers={"lang": "en" if i % 3 else "fr"})
        assert wait_for(lambda: len(got) >= 6)
        assert {b for n, b in got if n == "fr"} == {"0", "3"}
        assert {b for n, b in got if n == "en"} == {"1", "2", "4", "5"}
        for c in (en, fr, s):
            c.disconnect()
    finally:
        loop.call(h.stop())


def test_queue_waits_for_a_receiver(loop: LoopThread) -> None:
    [h] = start_hosts(loop, 1, prefix="w")
    got: list[tuple[str, str]] = []
    lock = threading.Lock()
    try:
        s = sender(h)
        for i in range(3):
            s.send("/queue/later", f"m{i}", headers={"receipt": f"s{i}"})
        assert wait_for(lambda: qstatus(loop, h, "later@w1")["pending"] == 3)
        r = receiver(h, "/queue/later", "r", got, lock)
        assert wait_for(lambda: len(got) == 3)
        assert sorted(b for _, b in got) == ["m0", "m1", "m2"]
        r.disconnect()
        s.disconnect()
    finally:
        loop.call(h.stop())


def test_three_hosts_300_messages_each_exactly_once_every_receiver_served(
    loop: LoopThread,
) -> None:
    hosts = start_hosts(
        loop, 3, prefix="m", node={"announce_period": 0.1, "max_catalog_datagrams": 16}
    )
    got: list[tuple[str, str]] = []
    lock = threading.Lock()
    try:
        rs = [receiver(h, "/queue/jobs@m1", f"r{i}", got, lock) for i, h in enumerate(hosts)]
        # the manager learns of all three receivers before traffic starts
        assert wait_for(lambda: len(qstatus(loop, hosts[0], "jobs@m1")["receivers"]) == 3)
        s = sender(hosts[1])
        for i in range(300):
            s.send("/queue/jobs@m1", f"{i}")
        assert wait_for(lambda: len(got) >= 300, timeout=40)
        bodies = collections.Counter(b for _, b in got)
        assert set(bodies) == {str(i) for i in range(300)}
        assert max(bodies.values()) == 1
        per = collections.Counter(n for n, _ in got)
        assert set(per) == {"r0", "r1", "r2"}
        assert min(per.values()) >= 50
        assert wait_for(lambda: qstatus(loop, hosts[0], "jobs@m1")["pending"] == 0, 20)
        for c in [*rs, s]:
            c.disconnect()
    finally:
        for h in hosts:
            loop.call(h.stop())


def test_manager_restart_mid_stream(loop: LoopThread, tmp_path: Path) -> None:
    hosts = start_hosts(loop, 2, state_root=tmp_path, prefix="k")
    got: list[tuple[str, str]] = []
    lock = threading.Lock()
    try:
        manager, other = hosts
        # the queue is created on the manager; its receiver sits on the other host
        mc = sender(manager)
        mc.send("/queue/q", "first", headers={"receipt": "x"})
        r = receiver(other, "/queue/q@k1", "r", got, lock)
        s = sender(other)
        for i in range(20):
            s.send("/queue/q@k1", f"a{i}")
        assert wait_for(lambda: len(got) >= 5, 20)
        mc.disconnect()
        loop.call(manager.stop())
        for i in range(20):
            s.send("/queue/q@k1", f"b{i}")
        restarted = loop.call(LoopbackHost(HostConfig("k1", state_dir=tmp_path / "k1")).start())
        hosts[0] = restarted
        mesh(loop, hosts)
        expected = {"first"} | {f"a{i}" for i in range(20)} | {f"b{i}" for i in range(20)}
        assert wait_for(lambda: {b for _, b in got} >= expected, 40)
        bodies = collections.Counter(b for _, b in got)
        assert max(bodies.values()) == 1, [b for b, n in bodies.items() if n > 1]
        r.disconnect()
        s.disconnect()
    finally:
        for h in hosts:
            loop.call(h.stop())
