"""The gateway hosted by a real ``dodwan daemon --stomp`` process (the daemon's ServiceHost)."""

from __future__ import annotations

import queue
import signal
import socket
from typing import Any

import pytest
import stomp
from test_daemon_helpers import daemons as daemons
from test_daemon_helpers import random_group, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Listener(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.receipts: queue.Queue[str] = queue.Queue()

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Any) -> None:
        self.receipts.put(frame.headers["receipt-id"])


def _connect(port: int, client_id: str) -> tuple[Any, Listener]:
    c = stomp.Connection12([("127.0.0.1", port)])
    lst = Listener()
    c.set_listener("l", lst)
    c.connect(wait=True, headers={"client-id": client_id})
    return c, lst


def test_durable_subscription_in_a_daemon_survives_its_restart(daemons) -> None:
    pytest.importorskip("dodwan.daemon.runner")
    port = _free_port()
    group = random_group()
    d = daemons("s", "--group", group, "--stomp", f"127.0.0.1:{port}")

    def up() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True

    wait_for(up, what="STOMP port")
    sub, sl = _connect(port, "keeper")
    sub.subscribe("/topic/log", id="d", headers={"durable-subscription-name": "k", "receipt": "s"})
    assert sl.receipts.get(timeout=10) == "s"
    sub.send("/topic/log", "live", headers={"level": "info"})
    assert sl.messages.get(timeout=10).body == "live"
    sub.disconnect()
    pub, pl = _connect(port, "writer")
    pub.send("/topic/log", "while away", headers={"receipt": "p"})
    assert pl.receipts.get(timeout=10) == "p"
    pub.disconnect()
    assert d.kill(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert (d.state_dir / "joms.sqlite").exists()
    d.start()
    wait_for(up, what="STOMP port after restart")
    sub, sl = _connect(port, "keeper")
    sub.subscribe("/topic/log", id="d", headers={"durable-subscription-name": "k"})
    f = sl.messages.get(timeout=10)
    assert f.body == "while away"
    sub.disconnect()


def test_a_daemon_keeps_non_persistent_messages_in_memory_only(daemons) -> None:
    """JMS NON_PERSISTENT, at most once across a crash: after ``kill -9`` the daemon still
    holds the persistent message it confirmed, not the non-persistent one."""
    port = _free_port()
    d = daemons("v", "--group", random_group(), "--stomp", f"127.0.0.1:{port}")

    def up() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True

    def cached() -> dict[str, str]:
        return {
            e["descriptor"]["jms_message_id"]: e["descriptor"]["delivery_mode"]
            for e in d.client().get("/cache")
            if e["descriptor"].get("destination_id") == "vol"
        }

    wait_for(up, what="STOMP port")
    c, lst = _connect(port, "writer")
    c.subscribe("/topic/vol", id="s", headers={"receipt": "s"})
    assert lst.receipts.get(timeout=10) == "s"
    c.send("/topic/vol", "np", headers={"persistent": "false", "receipt": "a"})
    c.send("/topic/vol", "p", headers={"persistent": "true", "receipt": "b"})
    assert {lst.receipts.get(timeout=10), lst.receipts.get(timeout=10)} == {"a", "b"}
    got = {f.body: f.headers["message-id"] for f in (lst.messages.get(timeout=10) for _ in "ab")}
    assert set(got) == {"np", "p"}
    assert set(cached()) == {got["np"], got["p"]}  # both carried while the daemon runs
    assert d.kill(signal.SIGKILL) == -signal.SIGKILL
    d.start()
    wait_for(up, what="STOMP port after kill -9")
    assert cached() == {got["p"]: "PERSISTENT"}


def test_queue_and_transaction_through_a_daemon(daemons) -> None:
    port = _free_port()
    daemons("q", "--group", random_group(), "--stomp", f"127.0.0.1:{port}")

    def up() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True

    wait_for(up, what="STOMP port")
    c, lst = _connect(port, "worker")
    c.subscribe("/queue/jobs", id="w", ack="client-individual", headers={"receipt": "s"})
    assert lst.receipts.get(timeout=10) == "s"
    tx = c.begin()
    for i in range(3):
        c.send("/queue/jobs", f"job{i}", transaction=tx)
    c.commit(tx)
    got = [lst.messages.get(timeout=10) for _ in range(3)]
    assert sorted(f.body for f in got) == ["job0", "job1", "job2"]
    assert all(f.headers["destination"].startswith("/queue/jobs@") for f in got)
    for f in got:
        c.ack(f.headers["ack"])
    c.disconnect()


def test_python_api_across_two_daemons(daemons) -> None:
    joms = pytest.importorskip("joms")
    group = random_group()
    ports = [_free_port(), _free_port()]
    names = ["d1", "d2"]
    for name, port in zip(names, ports, strict=True):
        daemons(
            name,
            "--host-id", name,
            "--group", group,
            "--stomp", f"127.0.0.1:{port}",
            "--announce-period", "0.2",
        )  # fmt: skip

    def up(port: int) -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True

    for p in ports:
        wait_for(lambda p=p: up(p), what="STOMP port")
    with (
        joms.connect(f"stomp://127.0.0.1:{ports[1]}", client_id="reader") as c2,
        joms.connect(f"stomp://127.0.0.1:{ports[0]}") as c1,
    ):
        s2 = c2.create_session()
        news = s2.create_durable_subscriber(s2.create_topic("news"), "n", selector="lang = 'en'")
        jobs = s2.create_consumer(s2.create_queue("jobs"))  # jobs@d2, managed by d2
        s1 = c1.create_session()
        p = s1.create_producer(s1.create_topic("news"))
        p.send(s1.create_text_message("hello", properties={"lang": "en"}))
        p.send(s1.create_text_message("bonjour", properties={"lang": "fr"}))
        s1.create_producer(s1.create_queue("jobs@d2")).send(s1.create_text_message("job"))
        m = news.receive(20)
        assert m is not None and m.text == "hello"
        assert m.message_id.startswith("ID:d1-")
        j = jobs.receive(20)
        assert j is not None and j.text == "job"
        assert news.receive(0.5) is None


def test_300_topic_subscriptions_on_one_host_all_work_across_daemons(daemons) -> None:
    """The host profile is not limited by a datagram: 300 distinct topics through the gateway
    (the 8th used to fail with 'the host profile would not fit in an announcement')."""
    group = random_group()
    pa, pb = _free_port(), _free_port()
    daemons("ta", "--group", group, "--stomp", f"127.0.0.1:{pa}", "--announce-period", "1")
    daemons("tb", "--group", group, "--stomp", f"127.0.0.1:{pb}", "--announce-period", "1")
    for port in (pa, pb):
        wait_for(lambda p=port: bool(socket.create_connection(("127.0.0.1", p), timeout=2)),
                 what="STOMP port")  # fmt: skip
    sub, sl = _connect(pb, "many")
    for i in range(300):
        sub.subscribe(f"/topic/field.t{i}", id=f"s{i}", headers={"receipt": f"r{i}"})
    assert [sl.receipts.get(timeout=20) for _ in range(300)] == [f"r{i}" for i in range(300)]
    pub, pl = _connect(pa, "sender")
    for i in range(300):
        pub.send(f"/topic/field.t{i}", f"m{i}")
    pub.send("/topic/field.t0", "last", headers={"receipt": "done"})
    assert pl.receipts.get(timeout=20) == "done"
    got: dict[str, str] = {}
    while len(got) < 301:
        frame = sl.messages.get(timeout=60)
        got[frame.body] = frame.headers["destination"]
    assert all(got[f"m{i}"] == f"/topic/field.t{i}" for i in range(300))
    sub.disconnect()
    pub.disconnect()
