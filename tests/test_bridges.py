"""Bridges between real DoDWAN daemons and real brokers (Mosquitto, ActiveMQ, RabbitMQ).

Every test runs a field host and a gateway host (separate ``dodwan daemon`` processes on one
UDP group); only the gateway has the binding, so what crosses goes through the DoDWAN
protocol and the broker. The brokers are private instances (tests/brokers.py) started once
per session; every test uses its own topic names. Absence (no loop, no duplicate) is checked
with a sentinel published after the fact: the outbox is FIFO, so anything looped would
reach the broker before the sentinel does.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from bridge_remotes import AmqpRemote, MqttRemote, Remote, StompRemote
from brokers import Broker, free_port, restart
from brokers import activemq as activemq
from brokers import mosquitto as mosquitto
from brokers import rabbitmq as rabbitmq
from cut_proxy import CutProxy
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons

ARGS = ["--announce-period", "0.5", "--cache-capacity", str(1 << 30)]
PROTOCOLS = ["mqtt", "stomp", "amqp"]
BROKER_OF = {"mqtt": "mosquitto", "stomp": "activemq", "amqp": "rabbitmq"}


def by_broker(names: Iterable[str]) -> list[Any]:
    """Parameters naming a protocol, each marked with the xdist group of its session broker:
    the broker is requested through ``getfixturevalue`` (invisible to conftest.py's
    grouping), and every test using it must run on the worker that started it."""
    return [pytest.param(n, marks=pytest.mark.xdist_group(BROKER_OF[n])) for n in names]


@dataclass
class Proto:
    name: str
    broker: Broker

    def destination(self, topic: str, queue: bool = False) -> tuple[str, Callable[[], Remote]]:
        """(binding URI, factory of the headquarters client) for ``topic``.

        ``queue``: a destination that keeps messages for an absent consumer (STOMP queue;
        MQTT and AMQP keep them anyway through the remote's session or queue)."""
        port = self.broker.port
        if self.name == "mqtt":
            return self.broker.url(f"{topic}/#"), lambda: MqttRemote(port, f"{topic}/#")
        if self.name == "stomp":
            kind = "queue" if queue else "topic"
            return self.broker.url(f"{kind}/{topic}"), lambda: StompRemote(port, f"/{kind}/{topic}")
        exchange = f"hq-{topic}"
        return self.broker.url(f"{exchange}/{topic}"), lambda: AmqpRemote(port, exchange, topic)


@pytest.fixture(params=by_broker(PROTOCOLS))
def proto(request: pytest.FixtureRequest) -> Iterator[Proto]:
    broker: Broker = request.getfixturevalue(BROKER_OF[request.param])
    restart(broker)  # a failed test may have left it stopped
    yield Proto(request.param, broker)
    restart(broker)


@pytest.fixture
def remotes() -> Iterator[Callable[[Callable[[], Remote]], Remote]]:
    made: list[Remote] = []

    def make(factory: Callable[[], Remote]) -> Remote:
        r = factory()
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def topic_name() -> str:
    return f"field{secrets.token_hex(4)}"


def publish(d: DaemonProc, topic: str, n: int, start: int = 0, **extra: str) -> list[str]:
    c = d.client()
    return [
        c.post(
            "/publish",
            {"attributes": {"topic": topic, "n": str(i), **extra}, "text": f"report {i}"},
        )["id"]
        for i in range(start, start + n)
    ]


def binding(d: DaemonProc, name: str) -> dict[str, Any]:
    rows = d.client().get("/bridges")
    return next(r for r in rows if r["name"] == name)


def add_binding(d: DaemonProc, uri: str, name: str, topic: str, **kw: Any) -> dict[str, Any]:
    body = {"uri": uri, "name": name, "attributes": {"topic": topic}, **kw}
    return d.client().post("/bridges", body)  # type: ignore[no-any-return]


def exactly_once(
    remote: Remote,
    ids: list[str],
    timeout: float = 60.0,
    gw: DaemonProc | None = None,
    in_flight: int = 0,
) -> None:
    """Wait until every id reached the broker, then check none came twice.

    ``in_flight``: how many may come twice because they were unconfirmed when the broker
    was stopped (the broker took them but its answer was lost; they are resent with the
    same ``dodwan-id``, which the remote side deduplicates on)."""
    want = set(ids)

    def missing() -> str:
        lost = [i for i in ids if i not in set(remote.dodwan_ids())]
        where = f"; gateway: {gw.client().get('/bridges')}" if gw is not None else ""
        return f"{len(lost)} of {len(want)} at the broker (missing {lost[:5]}){where}"

    wait_for(lambda: want <= set(remote.dodwan_ids()), timeout, what=missing)
    got = [i for i in remote.dodwan_ids() if i in want]
    dups = {i for i in got if got.count(i) > 1}
    assert len(dups) <= in_flight, f"{len(dups)} message(s) reached the broker twice"
    assert all(got.count(i) <= 2 for i in dups)


def field_sink(d: DaemonProc, topic: str, out: Path) -> None:
    d.client().post(
        "/subscribe",
        {"patterns": {"topic": topic}, "sink": {"kind": "dir", "target": str(out)}, "key": "hq"},
    )


def descriptors(out: Path) -> list[dict[str, str]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]


def pair(daemons: Callable[..., DaemonProc], *extra: str) -> tuple[DaemonProc, DaemonProc]:
    group = random_group()
    field = daemons("field", "--group", group, "--host-id", "field", *ARGS)
    gw = daemons("gw", "--group", group, "--host-id", "gw", *ARGS, *extra)
    return field, gw


# ---------------------------------------------------------------------- both ways


def test_field_to_broker_and_back_without_loop(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any, tmp_path: Path
) -> None:
    topic = topic_name()
    uri, make_remote = proto.destination(topic)
    hq = remotes(make_remote)
    field, gw = pair(daemons)
    st = add_binding(gw, uri, "hq", topic)
    assert st["direction"] == "both"
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")

    # field -> broker: published on the field host, carried by DoDWAN to the gateway.
    ids = publish(field, topic, 20, priority_class="high")
    exactly_once(hq, ids)
    by_id = {r.dodwan_id: r for r in hq.snapshot()}
    first = by_id[ids[0]]
    assert first.body == b"report 0"
    assert first.headers["topic"] == topic and first.headers["n"] == "0"
    assert first.headers["priority_class"] == "high"
    assert first.headers["dodwan-origin"] == "field"

    # broker -> field: headquarters publishes; the field host gets it, marked.
    out = tmp_path / "field-in"
    field_sink(field, topic, out)
    wait_for(lambda: len(descriptors(out)) == 20, 30, what="field's own messages in its sink")
    for i in range(5):
        hq.publish(f"order {i}".encode(), f"hq-{topic}-{i}", {"urgency": "now"})
    wait_for(
        lambda: len([d for d in descriptors(out) if "bridge_origin" in d]) == 5,
        30,
        what="headquarters' messages on the field host",
    )
    inbound = [d for d in descriptors(out) if "bridge_origin" in d]
    assert {d["urgency"] for d in inbound} == {"now"}
    assert all(d["topic"] == topic and d["origin"] == "gw" for d in inbound)
    assert all(d["bridge_origin"].startswith(f"{proto.name}://127.0.0.1:") for d in inbound)
    # Inbound messages become publications with the binding's deadline (ttl 3600 s).
    assert all(abs(float(d["deadline"]) - float(d["date"]) - 3600) < 5 for d in inbound)

    # No loop: the inbound messages are never sent back. A sentinel from the field proves
    # the outbox has drained past them.
    sentinel = publish(field, topic, 1, start=99)
    exactly_once(hq, sentinel)
    assert set(hq.dodwan_ids()) == set(ids) | set(sentinel)
    st = wait_for(lambda: (b := binding(gw, "hq"))["sent_total"] == 21 and b, 10, what="marked")
    assert st["loops_prevented"] == 5
    assert st["received_total"] == 5 and st["sent_total"] == 21 and st["backlog"] == 0
    metrics = gw.client().request("GET", "/metrics")
    assert 'dodwan_bridge_sent_total{binding="hq"} 21' in metrics
    assert 'dodwan_bridge_connected{binding="hq"} 1' in metrics
    status = gw.status()
    assert status["bridges"][0]["name"] == "hq"


def test_messages_carried_before_the_binding_existed_go_out(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    topic = topic_name()
    uri, make_remote = proto.destination(topic, queue=True)
    hq = remotes(make_remote)
    _field, gw = pair(daemons)
    ids = publish(gw, topic, 10)  # cached on the gateway before it has an uplink
    add_binding(gw, uri, "hq", topic, direction="out")
    exactly_once(hq, ids, gw=gw)


def test_a_joms_topic_mirrored_to_the_broker_both_ways(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """A JMS client of the field host's STOMP gateway and headquarters talk on one topic."""
    import queue

    import stomp
    from brokers import free_port, port_open

    topic = topic_name()
    uri, make_remote = proto.destination(topic)
    hq = remotes(make_remote)
    group = random_group()
    jms_port = free_port()
    daemons(
        "field", "--group", group, "--host-id", "field", *ARGS, "--stomp", f"127.0.0.1:{jms_port}"
    )
    gw = daemons("gw", "--group", group, "--host-id", "gw", *ARGS)
    gw.client().post("/bridges", {"uri": uri, "name": "hq", "joms_topic": "alerts"})
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    wait_for(lambda: port_open(jms_port), 20, what="the field's STOMP gateway")

    frames: queue.Queue[Any] = queue.Queue()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            frames.put(frame)

        def on_receipt(self, frame: Any) -> None:
            frames.put(frame.headers["receipt-id"])

    jms = stomp.Connection12([("127.0.0.1", jms_port)])
    jms.set_listener("l", Listener())
    jms.connect(wait=True)
    try:
        jms.subscribe("/topic/alerts", id="a", headers={"receipt": "sub"})
        assert frames.get(timeout=10) == "sub"
        jms.send("/topic/alerts", "river rising", headers={"severity": "high"})
        assert frames.get(timeout=10).body == "river rising"  # the local JMS subscriber
        wait_for(lambda: len(hq.dodwan_ids()) == 1, 30, what="the JMS message at the broker")
        sent = hq.snapshot()[0]
        assert sent.body == b"river rising" and sent.headers["severity"] == "high"
        assert sent.headers["destination_id"] == "alerts"

        hq.publish(b"evacuate", f"hq-{topic}-1", {"zone": "north"})
        got = frames.get(timeout=30)
        assert got.body == "evacuate" and got.headers["zone"] == "north"
        assert got.headers["bridge_origin"].startswith(f"{proto.name}://")
    finally:
        jms.disconnect()


def test_a_jms_selector_filters_both_ways(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any, tmp_path: Path
) -> None:
    topic = topic_name()
    uri, make_remote = proto.destination(topic)
    hq = remotes(make_remote)
    field, gw = pair(daemons)
    add_binding(gw, uri, "hq", topic, selector="severity IN ('high', 'critical')")
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    out = tmp_path / "field-in"
    field_sink(field, topic, out)

    low = publish(field, topic, 5, severity="low")
    high = publish(field, topic, 5, start=5, severity="high")
    exactly_once(hq, high)
    # The outbox is FIFO: had a low one been queued, it would be at the broker by now.
    assert not set(low) & set(hq.dodwan_ids())

    for i in range(3):
        hq.publish(f"low {i}".encode(), f"hq-{topic}-l{i}", {"severity": "low"})
    for i in range(3):
        hq.publish(f"critical {i}".encode(), f"hq-{topic}-c{i}", {"severity": "critical"})
    wait_for(
        lambda: len([d for d in descriptors(out) if "bridge_origin" in d]) >= 3,
        30,
        what="headquarters' critical messages on the field host",
    )
    st = wait_for(lambda: (b := binding(gw, "hq"))["filtered"] >= 8 and b, 10, what="filtered")
    assert {d["severity"] for d in descriptors(out) if "bridge_origin" in d} == {"critical"}
    assert st["filtered"] == 8 and st["received_total"] == 3 and st["sent_total"] == 5
    assert st["selector"] == "severity IN ('high', 'critical')"


# ---------------------------------------------------------------------- uplink cut


def test_uplink_cut_during_a_burst_every_message_arrives(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any, tmp_path: Path
) -> None:
    topic = topic_name()
    uri, make_remote = proto.destination(topic, queue=True)
    hq = remotes(make_remote)
    conf = tmp_path / "gw.toml"  # this binding comes from the config file
    conf.write_text(
        f'[[bridges]]\nname = "hq"\nuri = "{uri}"\ndirection = "out"\n'
        f'attributes = {{ topic = "{topic}" }}\n'
    )
    field, gw = pair(daemons, "--config", str(conf))
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    ids: list[str] = []
    done = threading.Event()

    def burst() -> None:
        try:
            ids.extend(publish(field, topic, 150))
        finally:
            done.set()

    t = threading.Thread(target=burst)
    t.start()
    wait_for(lambda: len(hq.dodwan_ids()) >= 20, 30, what="the burst reaching the broker")
    proto.broker.stop()  # the uplink is cut in the middle of the burst
    wait_for(lambda: not binding(gw, "hq")["connected"], 30, what="binding down")
    t.join(60)
    assert done.is_set() and len(ids) == 150
    wait_for(lambda: binding(gw, "hq")["backlog"] > 0, 30, what="a backlog while down")
    assert binding(gw, "hq")["errors"] >= 1
    proto.broker.start()
    # Exactly once: what the broker took before the cut, unconfirmed, is found in the
    # broker's ledger (STOMP, AMQP) or came back on the binding's own subscription (MQTT).
    exactly_once(hq, ids, timeout=90, gw=gw)
    wait_for(lambda: binding(gw, "hq")["backlog"] == 0, 30, what="backlog drained")
    assert binding(gw, "hq")["sent_total"] == 150


def test_uplink_cut_during_an_incoming_burst_every_message_arrives_once(
    proto: Proto,
    daemons: Callable[..., DaemonProc],
    remotes: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Broker -> field: the gateway's uplink is cut while it takes a burst in, and the
    broker is restarted meanwhile; what the gateway had not acknowledged comes again and
    is published once."""
    topic = topic_name()
    uri, make_remote = proto.destination(topic)
    hq = remotes(make_remote)
    uplink = CutProxy(proto.broker.port)  # an instant cut, in the middle of the burst
    request.addfinalizer(uplink.close)
    field, gw = pair(daemons)
    gw_uri = uri.replace(f":{proto.broker.port}/", f":{uplink.port}/")
    add_binding(gw, gw_uri, "hq", topic, direction="in")
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    out = tmp_path / "field-in"
    field_sink(field, topic, out)
    n = 400
    burst = [(f"order {i}".encode(), f"hq-{topic}-{i}", {"n": str(i)}) for i in range(n)]
    t = threading.Thread(target=hq.publish_many, args=(burst,))
    t.start()
    wait_for(lambda: binding(gw, "hq")["received"] >= 20, 30, what="the burst coming in")
    uplink.block()
    received = binding(gw, "hq")["received"]
    t.join(60)
    proto.broker.stop()
    proto.broker.start()
    uplink.unblock()

    def on_field() -> list[str]:
        return [d["n"] for d in descriptors(out) if "bridge_origin" in d]

    wait_for(lambda: len(set(on_field())) == n, 120, what=lambda: f"{len(on_field())} of {n}")
    if isinstance(hq, MqttRemote):
        wait_for(hq.client.is_connected, 30, what="headquarters' client reconnected")
    hq.publish_many([(b"end", f"hq-{topic}-end", {"n": "end"})])
    wait_for(lambda: "end" in on_field(), 60, what="the sentinel on the field")
    got = on_field()
    assert len(got) == n + 1, f"{len(got) - n - 1} message(s) reached the field twice"
    assert received < n, "the uplink was cut after the burst was in: nothing tested"


ACK_MARKER = {"mqtt": b"\x40", "amqp": b"\x00\x3c\x00\x50"}  # PUBACK, basic.ack


@pytest.mark.parametrize("name", by_broker(sorted(ACK_MARKER)))
def test_a_redelivered_message_without_an_id_is_published_once(
    name: str,
    request: pytest.FixtureRequest,
    daemons: Callable[..., DaemonProc],
    remotes: Any,
    tmp_path: Path,
) -> None:
    """The gateway's acknowledgement is lost (link cut): the broker delivers the message
    again, flagged. Without a broker id to derive the DoDWAN id from, the gateway knows it
    by its content (a persisted window) and does not publish it twice."""
    broker: Broker = request.getfixturevalue(BROKER_OF[name])
    restart(broker)
    topic = topic_name()
    uri, make_remote = Proto(name, broker).destination(topic)
    hq = remotes(make_remote)
    proxy = CutProxy(broker.port)
    request.addfinalizer(proxy.close)
    field, gw = pair(daemons)
    add_binding(gw, uri.replace(f":{broker.port}/", f":{proxy.port}/"), "hq", topic, direction="in")
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    out = tmp_path / "field-in"
    field_sink(field, topic, out)
    proxy.arm(ACK_MARKER[name], forward=False)
    hq.publish_many([(b"order", "", {"n": "0"})])
    assert proxy.cut_done.wait(30), "no acknowledgement went through the relay"
    wait_for(lambda: binding(gw, "hq")["connects"] >= 2, 30, what="binding reconnected")
    hq.publish_many([(b"end", "", {"n": "end"})])

    def on_field() -> list[str]:
        return [d["n"] for d in descriptors(out) if "bridge_origin" in d]

    wait_for(lambda: "end" in on_field(), 60, what="the last message on the field")
    st = binding(gw, "hq")
    assert st["received_total"] == 2, "the redelivered message was published again"
    assert st["duplicates"] == 1
    assert on_field().count("0") == 1


COMMIT_MARKER = {
    "stomp": b"COMMIT\n",
    "amqp": b"\x00\x5a\x00\x14",  # AMQP tx.commit
    "mqtt": b"report 5",  # MQTT has no commit: a PUBLISH whose PUBACK is lost
}


@pytest.mark.parametrize("name", by_broker(sorted(COMMIT_MARKER)))
def test_a_commit_whose_answer_is_lost_is_not_sent_again(
    name: str,
    request: pytest.FixtureRequest,
    daemons: Callable[..., DaemonProc],
    remotes: Any,
) -> None:
    """The broker commits a batch and the link breaks before its answer arrives (what a
    broker stopped at the wrong moment does): the ledger written in the same transaction
    tells the gateway, after reconnecting, that the batch is there already."""
    broker: Broker = request.getfixturevalue(BROKER_OF[name])
    restart(broker)
    topic = topic_name()
    uri, make_remote = Proto(name, broker).destination(topic, queue=True)
    hq = remotes(make_remote)
    proxy = CutProxy(broker.port)
    try:
        field, gw = pair(daemons)
        out_uri = uri.replace(f":{broker.port}/", f":{proxy.port}/")
        add_binding(gw, out_uri, "hq", topic, direction="out")
        wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
        proxy.arm(COMMIT_MARKER[name])
        ids = publish(field, topic, 40)
        assert proxy.cut_done.wait(30), "no commit went through the relay"
        st = wait_for(
            lambda: (b := binding(gw, "hq"))["backlog"] == 0 and b["connected"] and b,
            60,
            what="backlog settled after the reconnection",
        )
        # A sentinel behind everything the gateway sent: any copy would be there before it.
        sentinel = publish(field, topic, 1, start=99)
        exactly_once(hq, ids + sentinel, gw=gw)
        st = wait_for(lambda: (b := binding(gw, "hq"))["sent_total"] == 41 and b, 10, what="41")
        assert st["connects"] >= 2
        # Found in the ledger (STOMP, AMQP), or came back on the own subscription (MQTT).
        assert st["settled" if name != "mqtt" else "echoes"] >= 1
    finally:
        proxy.close()


LEDGERS = ["amqp", "stomp"]
"""The protocols whose exactly-once rests on a ledger written in the broker's transaction."""


@pytest.mark.parametrize("name", by_broker(LEDGERS))
def test_two_hosts_whose_ledger_names_clashed_each_send_their_own(
    name: str,
    request: pytest.FixtureRequest,
    daemons: Callable[..., DaemonProc],
    remotes: Any,
) -> None:
    """Hosts X.b and X_b, each with a binding hq to its own destination, both wrote the
    ledger queue dodwan.ledger.X_b.hq: after a restart, X_b found X.b's last batch there
    and marked it sent though its own destination never got it (data loss)."""
    broker: Broker = request.getfixturevalue(BROKER_OF[name])
    restart(broker)
    topic = topic_name()
    uri_a, make_a = Proto(name, broker).destination(f"{topic}a", queue=True)
    uri_b, make_b = Proto(name, broker).destination(f"{topic}b", queue=True)
    hq_a, hq_b = remotes(make_a), remotes(make_b)
    group = random_group()
    a = daemons("a", "--group", group, "--host-id", f"{topic}.b", *ARGS)
    b = daemons("b", "--group", group, "--host-id", f"{topic}_b", *ARGS)
    add_binding(a, uri_a, "hq", topic, direction="out")
    add_binding(b, uri_b, "hq", topic, direction="out", holdoff=10.0)  # b sends later
    for gw in (a, b):
        wait_for(lambda gw=gw: binding(gw, "hq")["connected"], 30, what="binding connected")
    ids = publish(a, topic, 3)
    exactly_once(hq_a, ids, gw=a)
    wait_for(lambda: binding(b, "hq")["backlog"] == 3, 10, what="b holding them off")
    b.kill(signal.SIGTERM)  # b's binding reads its ledger when it connects again
    b.start()
    exactly_once(hq_b, ids, timeout=40, gw=b)
    assert binding(b, "hq")["settled"] == 0


@pytest.mark.parametrize("name", by_broker([*LEDGERS, "mqtt"]))
def test_a_binding_removed_and_added_again_sends_the_cached_messages_once(
    name: str,
    request: pytest.FixtureRequest,
    daemons: Callable[..., DaemonProc],
    remotes: Any,
) -> None:
    """`bridge rm hq` then `bridge add ... --name hq`: the new binding sends the cached
    matching messages at once (it sent nothing before a restart), and the old binding's
    ledger entry, still on the broker, never marks the new one's messages sent (the last
    batch went missing: 2 or 3 of 5 arrived), whether the destination changed or not."""
    broker: Broker = request.getfixturevalue(BROKER_OF[name])
    restart(broker)
    topic = topic_name()
    uri1, make1 = Proto(name, broker).destination(f"{topic}a", queue=True)
    uri2, make2 = Proto(name, broker).destination(f"{topic}b", queue=True)
    hq1, hq2 = remotes(make1), remotes(make2)
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    add_binding(gw, uri1, "hq", topic, direction="out")
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    ids = publish(gw, topic, 5)
    exactly_once(hq1, ids, gw=gw)
    wait_for(lambda: binding(gw, "hq")["sent_total"] == 5, 10, what="5 marked sent")

    def again(uri: str) -> None:
        assert gw.client().delete("/bridges/hq")["unsent_dropped"] == 0
        add_binding(gw, uri, "hq", topic, direction="out")

    again(uri1)  # the same destination: the old ledger entry names these very messages
    want = sorted(ids * 2)

    def at_hq1() -> str:
        return f"{len(hq1.dodwan_ids())} of {len(want)}; gateway: {binding(gw, 'hq')}"

    wait_for(lambda: sorted(hq1.dodwan_ids()) == want, 30, what=at_hq1)
    st = wait_for(lambda: (b := binding(gw, "hq"))["backlog"] == 0 and b, 10, what="all sent")
    assert st["settled"] == 0 and st["sent_total"] == 5

    again(uri2)  # another destination
    exactly_once(hq2, ids, timeout=30, gw=gw)
    st = wait_for(lambda: (b := binding(gw, "hq"))["backlog"] == 0 and b, 10, what="all sent")
    assert st["settled"] == 0 and st["sent_total"] == 5
    # Kept across a restart, and sent once: a sentinel behind anything sent again.
    gw.kill(signal.SIGTERM)
    gw.start()
    sentinel = publish(gw, topic, 1, start=99)
    exactly_once(hq2, ids + sentinel, gw=gw)
    assert len(hq2.snapshot()) == 6 and sorted(hq1.dodwan_ids()) == want


# ---------------------------------------------------------------------- kill -9


def test_gateway_kill9_with_a_backlog_loses_nothing(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    topic = topic_name()
    uri, make_remote = proto.destination(topic, queue=True)
    hq = remotes(make_remote)
    field, gw = pair(daemons)
    add_binding(gw, uri, "hq", topic, direction="out")  # kept across the restart
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    proto.broker.stop()
    ids = publish(field, topic, 60)
    wait_for(lambda: binding(gw, "hq")["backlog"] == 60, 30, what="all 60 waiting in the outbox")
    assert gw.kill(signal.SIGKILL) == -signal.SIGKILL
    proto.broker.start()
    gw.start()
    exactly_once(hq, ids, timeout=90, gw=gw)
    # The broker's answer may reach the consumer before the gateway has marked the rows.
    wait_for(lambda: binding(gw, "hq")["backlog"] == 0, 30, what="backlog marked sent")
    assert binding(gw, "hq")["sent_total"] == 60


def test_outbox_rows_lost_in_a_crash_are_recovered_from_the_cache(
    mosquitto: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """A kill between the core's commit (delivered to the binding) and the outbox's."""
    import sqlite3

    restart(mosquitto)
    proto = Proto("mqtt", mosquitto)
    topic = topic_name()
    uri, make_remote = proto.destination(topic)
    hq = remotes(make_remote)
    field, gw = pair(daemons)
    add_binding(gw, uri, "hq", topic, direction="out")
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    mosquitto.stop()
    try:
        ids = publish(field, topic, 20)
        wait_for(lambda: binding(gw, "hq")["backlog"] == 20, 30, what="20 in the outbox")
        gw.kill(signal.SIGKILL)
        with sqlite3.connect(gw.state_dir / "bridges.db") as db:
            db.execute("DELETE FROM outbox WHERE rowid % 2 = 0")  # as if never committed
        mosquitto.start()
        gw.start()
        exactly_once(hq, ids, gw=gw)
    finally:
        restart(mosquitto)


# ---------------------------------------------------------------------- two gateways


def two_gateways(
    daemons: Callable[..., DaemonProc],
    uri: str,
    topic: str,
    primary_uri: str | None = None,
    **second: Any,
) -> tuple[DaemonProc, DaemonProc, DaemonProc]:
    """A field host and two gateways in one group, both bound (``hq``) to ``uri`` (the
    first to ``primary_uri`` if given), the second with ``second``'s settings; both
    connected."""
    group = random_group()
    field = daemons("field", "--group", group, "--host-id", "field", *ARGS)
    gw1 = daemons("gw1", "--group", group, "--host-id", "gw1", *ARGS)
    gw2 = daemons("gw2", "--group", group, "--host-id", "gw2", *ARGS)
    add_binding(gw1, primary_uri or uri, "hq", topic)
    add_binding(gw2, uri, "hq", topic, **second)
    for gw in (gw1, gw2):
        wait_for(lambda gw=gw: binding(gw, "hq")["connected"], 30, what="binding connected")
    return field, gw1, gw2


def test_two_gateways_on_one_topic_no_loop_no_duplicate(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any, tmp_path: Path
) -> None:
    topic = topic_name()
    uri, make_remote = proto.destination(topic)
    hq = remotes(make_remote)
    field, gw1, gw2 = two_gateways(daemons, uri, topic, holdoff=5.0)  # gw2: the standby
    out = tmp_path / "field-in"
    field_sink(field, topic, out)

    ids = publish(field, topic, 30)
    exactly_once(hq, ids)
    # The standby saw each one come back from the broker and dropped its own copy.
    wait_for(lambda: binding(gw2, "hq")["backlog"] == 0, 30, what="standby's outbox settled")
    assert binding(gw2, "hq")["sent_total"] == 0

    for i in range(10):
        hq.publish(f"order {i}".encode(), f"hq-{topic}-{i}", {})
    # Both gateways receive each; they publish it under the same DoDWAN id: one copy.
    wait_for(
        lambda: len([d for d in descriptors(out) if "bridge_origin" in d]) >= 10,
        30,
        what="headquarters' messages on the field host",
    )
    sentinel = publish(field, topic, 1, start=99)
    exactly_once(hq, sentinel, timeout=60)
    inbound = [d for d in descriptors(out) if "bridge_origin" in d]
    assert len(inbound) == 10, "a message from headquarters reached the field twice"
    # Nothing went back to the broker: it holds the field's 31 messages once each and
    # headquarters' own 10, nothing else.
    assert sorted(hq.dodwan_ids()) == sorted(ids + sentinel)
    assert len(hq.snapshot()) == 31 + 10
    echoes = binding(gw1, "hq")["echoes"] + binding(gw2, "hq")["echoes"]
    assert echoes >= 31


def test_a_primary_that_stood_still_past_the_hold_off_sends_none_the_standby_sent(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """A primary stopped (SIGSTOP) longer than the standby's hold-off, its connection up:
    the standby sent what the field published meanwhile, and the primary, resumed, sent
    those again (a probe: 64-191 of 300 twice), for the standby's copies waited unread in
    its socket while it sent its outbox; only a reconnection read them first. A binding
    whose loop stood still now reads what came before it sends."""
    topic = topic_name()
    uri, make_remote = proto.destination(topic)
    hq = remotes(make_remote)
    field, gw1, gw2 = two_gateways(daemons, uri, topic, standby=True, holdoff=2.0)
    first = publish(field, topic, 5)
    exactly_once(hq, first, gw=gw1)
    wait_for(lambda: binding(gw2, "hq")["backlog"] == 0, 30, what="standby's outbox settled")
    before = publish(field, topic, 5, start=5)  # some reach the primary, unsent
    assert gw1.proc is not None
    gw1.proc.send_signal(signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        during = publish(field, topic, 15, start=10)
        exactly_once(hq, first + before + during, gw=gw2)  # the standby, after its hold-off
        # the stall under test: well past STALLED (3 s) whatever the machine's speed
        time.sleep(max(0.0, stopped + 8.0 - time.monotonic()))
    finally:
        gw1.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: binding(gw1, "hq")["backlog"] == 0, 60, what="primary's outbox settled")
    sentinel = publish(field, topic, 1, start=98)
    exactly_once(hq, first + before + during + sentinel, gw=gw1)


def test_the_standby_gateway_takes_over_and_the_primary_comes_back_without_copies(
    proto: Proto,
    daemons: Callable[..., DaemonProc],
    remotes: Any,
    request: pytest.FixtureRequest,
) -> None:
    topic = topic_name()
    uri, make_remote = proto.destination(topic)
    hq = remotes(make_remote)
    uplink1 = CutProxy(proto.broker.port)  # the primary's uplink, which the test cuts
    request.addfinalizer(uplink1.close)
    primary = uri.replace(f":{proto.broker.port}/", f":{uplink1.port}/")
    # A hold-off well above the primary's send-and-echo time even on a loaded machine.
    field, gw1, gw2 = two_gateways(daemons, uri, topic, primary, standby=True, holdoff=8.0)
    st = binding(gw2, "hq")
    assert st["standby"] and st["holdoff"] == 8.0

    first = publish(field, topic, 10)
    exactly_once(hq, first)
    wait_for(lambda: binding(gw2, "hq")["backlog"] == 0, 30, what="standby's outbox settled")
    assert binding(gw2, "hq")["sent_total"] == 0  # the primary sent them all

    # The primary's uplink is cut: it keeps what the field publishes; after its hold-off
    # the standby sends it. When the uplink is back, what the broker kept for the primary
    # (the standby's messages) is taken in before it sends: it sends none of them again.
    uplink1.block()
    wait_for(lambda: not binding(gw1, "hq")["connected"], 30, what="primary's uplink down")
    second = publish(field, topic, 10, start=10)
    exactly_once(hq, first + second, timeout=60, gw=gw2)
    wait_for(lambda: binding(gw1, "hq")["backlog"] == 10, 30,
             what=lambda: f"primary holding 10: {binding(gw1, 'hq')}")  # fmt: skip
    uplink1.unblock()
    wait_for(lambda: binding(gw1, "hq")["backlog"] == 0, 60, what="primary's backlog settled")
    sentinel = publish(field, topic, 1, start=98)
    exactly_once(hq, first + second + sentinel, timeout=60, gw=gw1)
    wait_for(lambda: binding(gw1, "hq")["sent_total"] == 11, 10, what="primary sent 11")

    # The primary is gone: after its hold-off the standby sends what the field publishes.
    assert gw1.kill(signal.SIGKILL) == -signal.SIGKILL
    third = publish(field, topic, 10, start=20)
    exactly_once(hq, first + second + sentinel + third, timeout=60, gw=gw2)
    wait_for(
        lambda: binding(gw2, "hq")["sent_total"] == 20,
        10,
        what=lambda: f"standby marked 20 sent: {binding(gw2, 'hq')}",
    )

    # The primary comes back; DoDWAN carries it what it missed (its subscription was kept).
    # What the broker kept for it while it was away tells it the standby sent those.
    gw1.start()
    wait_for(lambda: binding(gw1, "hq")["connected"], 30, what="primary reconnected")

    def carried() -> bool:
        cached = {e["id"] for e in gw1.client().get("/cache")}
        return set(third) <= cached

    wait_for(carried, 60, what="the missed messages carried to the primary")
    last = publish(field, topic, 1, start=99)
    exactly_once(hq, first + second + sentinel + third + last, timeout=60, gw=gw1)
    # (The broker's consumer may see the last one before the primary has marked it.)
    st1 = wait_for(lambda: (b := binding(gw1, "hq"))["backlog"] == 0 and b, 10, what="marked")
    assert st1["echoes"] >= 10


def test_stomp_durable_subscriptions_of_two_gateways_never_collide(
    activemq: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """Host a-b's binding c and host a's binding b-c, on two topics, were both client id and
    durable subscription dodwan-a-b-c: while A was away, B's connection replaced A's
    subscription (the messages waiting in it for A were deleted), and with B up, A could
    not connect again."""
    restart(activemq)
    one, two = topic_name(), topic_name()
    uri_one, hq_one = Proto("stomp", activemq).destination(one)
    uri_two, hq_two = Proto("stomp", activemq).destination(two)
    a = daemons("a", "--group", random_group(), "--host-id", "a-b", *ARGS)
    add_binding(a, uri_one, "c", one, direction="in")
    wait_for(lambda: binding(a, "c")["connected"], 30, what="A connected")
    a.kill(signal.SIGTERM)  # A's gateway is away: what topic one gets waits for it
    remotes(hq_one).publish_many([(b"for A", f"a-{i}", {}) for i in range(5)])
    b = daemons("b", "--group", random_group(), "--host-id", "a", *ARGS)
    add_binding(b, uri_two, "b-c", two, direction="in")
    wait_for(lambda: binding(b, "b-c")["connected"], 30, what="B connected")
    a.start()
    wait_for(
        lambda: binding(a, "c")["received_total"] == 5,
        30,
        what=lambda: f"A's waiting messages: {binding(a, 'c')}",
    )
    remotes(hq_two).publish_many([(b"for B", f"b-{i}", {}) for i in range(3)])
    wait_for(lambda: binding(b, "b-c")["received_total"] == 3, 30, what="B's messages")
    assert binding(a, "c")["connected"] and binding(b, "b-c")["connected"]
    assert binding(a, "c")["received_total"] == 5


def test_a_stomp_link_that_cannot_connect_says_why(activemq: Broker) -> None:
    """stomp.py's ConnectFailedException has no text: an unreachable broker and a client id
    in use both read 'cannot connect to HOST:PORT: ' with nothing after the colon."""
    import stomp

    from dodwan.bridges.binding import LinkError
    from dodwan.bridges.stomp import StompLink, durable_name
    from dodwan.bridges.uri import BindingSpec

    restart(activemq)

    def link(uri: str) -> StompLink:
        spec = BindingSpec.from_dict({"uri": uri, "name": "hq", "direction": "in"})
        return StompLink(spec, "gw", lambda _m: True)

    with pytest.raises(LinkError, match=r"cannot connect to 127.0.0.1:\d+: Connection refused"):
        link(f"stomp://127.0.0.1:{free_port()}/topic/x").connect()
    held = link(activemq.url(f"topic/{topic_name()}"))
    holder = stomp.Connection12([("127.0.0.1", activemq.port)])
    holder.connect(wait=True, headers={"client-id": durable_name(held.spec, "gw")})
    try:
        with pytest.raises(LinkError, match=r"cannot connect to .*: broker error: .*already conn"):
            held.connect()
    finally:
        holder.disconnect()
        held.close()


def test_a_message_the_stomp_broker_refuses_is_kept_and_reported_and_the_others_go(
    activemq: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """An attribute of 7000 ':' is fine for DoDWAN, but STOMP escapes each ':' as two bytes:
    a 14000-byte header, over ActiveMQ's 10240. The broker's ERROR cost the whole batch,
    which was sent again at once, for ever (27 reconnections in 8 s): the messages behind
    it never went, and the status said only 'connection closed'."""
    restart(activemq)
    topic = topic_name()
    uri, make_remote = Proto("stomp", activemq).destination(topic, queue=True)
    hq = remotes(make_remote)
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    # In the outbox before the binding exists: one batch, the refused message first.
    big = publish(gw, topic, 1, note=":" * 7000)
    ids = publish(gw, topic, 5, start=1)
    add_binding(gw, uri, "hq", topic, direction="out")
    exactly_once(hq, ids, gw=gw)
    # The outbox's order need not be the publications': the others may all have gone
    # before the refused one is sent alone and held.
    st: dict[str, Any] = wait_for(
        lambda: (b := binding(gw, "hq"))["sent_total"] == 5 and b["refused"] == 1 and b,
        10,
        what=lambda: f"5 marked sent, 1 held: {binding(gw, 'hq')}",
    )
    assert st["backlog"] == 1, st  # kept, not dropped, not counted sent
    assert f"STOMP broker refused 1 message(s) on /queue/{topic}: " in st["last_error"], st
    assert "header" in st["last_error"], st  # the broker's reason
    assert st["connects"] <= 4, st  # the batch, the refused message alone, the others
    assert big[0] not in hq.dodwan_ids()


def _held_back(gw: DaemonProc, sent: int) -> dict[str, Any]:
    """Wait until ``sent`` messages are marked sent and one is held back; its status."""
    st: dict[str, Any] = wait_for(
        lambda: (b := binding(gw, "hq"))["sent_total"] == sent and b["refused"] == 1 and b,
        30,
        what=lambda: f"{sent} marked sent, 1 held: {binding(gw, 'hq')}",
    )
    assert st["backlog"] == 1, st  # kept, not dropped, not counted sent
    return st


def test_a_jmsxgroupseq_activemq_cannot_read_is_held_back_and_the_others_go(
    activemq: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """ActiveMQ answers a SEND whose JMSXGroupSeq is not an int by closing the connection,
    without an ERROR frame: the batch was sent again after each reconnection, for ever
    (about 1.4 reconnections a second), and the messages batched with it or behind it never
    went. It is now kept from the broker, held back and reported; the others go."""
    restart(activemq)
    topic = topic_name()
    uri, make_remote = Proto("stomp", activemq).destination(topic, queue=True)
    hq = remotes(make_remote)
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    before = publish(gw, topic, 2)
    poison = publish(gw, topic, 1, start=2, JMSXGroupSeq="abc")
    after = publish(gw, topic, 2, start=3)
    ok = publish(gw, topic, 1, start=5, JMSXGroupSeq="7")
    add_binding(gw, uri, "hq", topic, direction="out")
    exactly_once(hq, before + after + ok, gw=gw)
    st = _held_back(gw, 5)
    assert "JMSXGroupSeq 'abc' is not a 32-bit integer" in st["last_error"], st
    assert st["connects"] == 1, st
    assert poison[0] not in hq.dodwan_ids()


def test_a_message_the_stomp_broker_refuses_by_closing_the_connection_is_held_back(
    activemq: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """A broker may refuse a frame by closing the connection without a word. Only an ERROR
    frame made a refusal: the batch holding that message was sent again after each
    reconnection, for ever, and nothing behind it went. Now the messages of a batch lost
    that way are sent one at a time, and one whose sending alone is followed by such a
    close three times in a row is held back; the others go. (A relay in front of ActiveMQ
    closes every connection that sends the marker, as ActiveMQ does for a header it cannot
    read, without forwarding it.)"""
    restart(activemq)
    proxy = CutProxy(activemq.port)
    try:
        marker = f"poison{secrets.token_hex(6)}"
        proxy.poison(marker.encode())
        topic = topic_name()
        hq = remotes(lambda: StompRemote(activemq.port, f"/queue/{topic}"))
        gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
        before = publish(gw, topic, 2)
        bad = publish(gw, topic, 1, start=2, note=marker)
        after = publish(gw, topic, 2, start=3)
        uri = f"stomp://127.0.0.1:{proxy.port}/queue/{topic}"
        add_binding(gw, uri, "hq", topic, direction="out")
        exactly_once(hq, before + after, gw=gw)
        st = _held_back(gw, 4)
        assert "STOMP connection lost while sending 1 message(s)" in st["last_error"], st
        assert proxy.poisoned == 4, st  # the batch, then the message alone three times
        assert bad[0] not in hq.dodwan_ids()
    finally:
        proxy.close()


def test_stomp_attributes_named_like_headers_are_left_out_and_reported(
    activemq: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """Attributes named like STOMP headers (type, reply-to, content-type, transaction) were
    dropped without a word and 'a:b' renamed 'a_b'; they are now left out and reported
    (``left_out`` in the status, a warning naming them)."""
    restart(activemq)
    topic = topic_name()
    uri, make_remote = Proto("stomp", activemq).destination(topic, queue=True)
    hq = remotes(make_remote)
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    add_binding(gw, uri, "hq", topic, direction="out")
    odd = {"type": "t", "reply-to": "r", "content-type": "c", "transaction": "x", "a:b": "1"}
    body = {"attributes": {"topic": topic, "kept": "k", **odd}, "text": "z"}
    named = gw.client().post("/publish", body)["id"]
    exactly_once(hq, [named], gw=gw)
    got = {r.dodwan_id: r for r in hq.snapshot()}[named]
    assert got.headers.get("kept") == "k" and "a_b" not in got.headers, got.headers
    st = wait_for(lambda: (b := binding(gw, "hq"))["left_out"] == 1 and b, 10, what="left_out")
    assert st["refused"] == 0 and st["backlog"] == 0, st
    assert any(
        "sent without its attribute(s) 'type', 'reply-to', 'content-type', 'transaction', "
        "'a:b'" in line
        for line in gw.log.read_text(errors="replace").splitlines()
    ), "the attributes left out are not named in the log"


def test_an_empty_payload_reaches_activemq_as_a_bytes_message(
    activemq: Broker, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    """An empty payload went without content-length, and ActiveMQ made it a TextMessage
    (delivered over STOMP without content-length); it is a BytesMessage, as documented."""
    restart(activemq)
    topic = topic_name()
    uri, make_remote = Proto("stomp", activemq).destination(topic, queue=True)
    hq = remotes(make_remote)
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    add_binding(gw, uri, "hq", topic, direction="out")
    body = {"attributes": {"topic": topic}, "text": ""}
    empty = gw.client().post("/publish", body)["id"]
    exactly_once(hq, [empty], gw=gw)
    got = {r.dodwan_id: r for r in hq.snapshot()}[empty]
    assert got.body == b"" and got.headers.get("content-length") == "0", got.headers


# ---------------------------------------------------------------------- replace


def test_binding_replaced_under_load_loses_nothing(
    proto: Proto, daemons: Callable[..., DaemonProc], remotes: Any
) -> None:
    topic = topic_name()
    uri, make_remote = proto.destination(topic, queue=True)
    hq = remotes(make_remote)
    field, gw = pair(daemons)
    add_binding(gw, uri, "hq", topic, direction="out")
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    ids: list[str] = []
    t = threading.Thread(target=lambda: ids.extend(publish(field, topic, 200)))
    t.start()
    wait_for(lambda: len(hq.dodwan_ids()) >= 30, 30, what="load reaching the broker")
    # Replace through the CLI, changing the deadline given to incoming messages.
    cmd = [sys.executable, "-m", "dodwan.cli", "bridge", "add", uri, "--name", "hq"]
    res = subprocess.run(
        [*cmd, "--direction", "out", "--attr", f"topic={topic}", "--ttl", "600", "--replace"],
        env={"DODWAN_STATE_DIR": str(gw.state_dir), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("replaced hq ->")
    t.join(60)
    assert len(ids) == 200
    st = binding(gw, "hq")
    assert st["ttl"] == 600.0 and st["connects"] == 1
    exactly_once(hq, ids, timeout=60, gw=gw)
    wait_for(lambda: binding(gw, "hq")["backlog"] == 0, 30, what="backlog marked sent")
    assert binding(gw, "hq")["sent_total"] == 200


def test_a_durable_stomp_topic_binding_is_replaced_without_loss(
    activemq: Broker, daemons: Callable[..., DaemonProc], remotes: Any, tmp_path: Path
) -> None:
    """One client id holds a durable subscription: break-before-make, nothing lost."""
    restart(activemq)
    topic = topic_name()
    uri, make_remote = Proto("stomp", activemq).destination(topic)
    hq = remotes(make_remote)
    field, gw = pair(daemons)
    add_binding(gw, uri, "hq", topic)
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    out = tmp_path / "field-in"
    field_sink(field, topic, out)
    ids: list[str] = []
    t = threading.Thread(target=lambda: ids.extend(publish(field, topic, 100)))
    t.start()
    wait_for(lambda: len(hq.dodwan_ids()) >= 20, 30, what="load reaching the broker")
    orders = threading.Thread(
        target=lambda: [hq.publish(b"order", f"hq-{topic}-{i}", {}) for i in range(10)]
    )
    orders.start()
    body = {"uri": uri, "name": "hq", "attributes": {"topic": topic}, "ttl": 600, "replace": True}
    st = gw.client().post("/bridges", body)
    assert st["ttl"] == 600.0
    t.join(60)
    orders.join(60)
    exactly_once(hq, ids, timeout=60, gw=gw)
    wait_for(
        lambda: len([d for d in descriptors(out) if "bridge_origin" in d]) == 10,
        30,
        what="every order of headquarters on the field host",
    )
