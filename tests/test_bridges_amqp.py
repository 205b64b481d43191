"""AMQP bindings against a real RabbitMQ where the broker's answers and names matter:
publications it refuses, queues declared with arguments, the names of two gateways'
queues, and a message's own expiration."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pika
import pika.exceptions
import pytest
from brokers import PACKAGES, Broker, RabbitMQ, restart
from brokers import rabbitmq as rabbitmq
from test_bridges import ARGS, binding, descriptors, field_sink, publish, topic_name
from test_daemon_helpers import DaemonProc, random_group, wait_for
from test_daemon_helpers import daemons as daemons

from dodwan.bridges.amqp import AmqpLink
from dodwan.bridges.ids import inbound_queue
from dodwan.bridges.mapping import Inbound
from dodwan.bridges.uri import BindingSpec, SpecError


@pytest.fixture
def rabbit(rabbitmq: Broker) -> Iterator[Broker]:
    restart(rabbitmq)
    yield rabbitmq


def _conn(broker: Broker) -> Any:
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.port, connection_attempts=1)
    )


def rabbitmqctl(broker: Broker, *args: str) -> None:
    """Run rabbitmqctl against the session's private node."""
    assert isinstance(broker, RabbitMQ)
    ctl = Path(PACKAGES["rabbitmq"][1]).with_name("rabbitmqctl")
    res = subprocess.run(
        [str(ctl), "-n", broker.node, *args],
        env={**os.environ, **broker.env()},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def take_all(broker: Broker, queue: str) -> list[str]:
    """Consume what the queue holds now; the messages' DoDWAN ids."""
    conn = _conn(broker)
    try:
        ch = conn.channel()
        ids = []
        while True:
            method, props, _body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return ids
            ids.append(str((props.headers or {}).get("dodwan-id")))
    finally:
        conn.close()


def queue_depth(broker: Broker, queue: str) -> int:
    conn = _conn(broker)
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        conn.close()


def _all_once(rabbit: Broker, queue: str, gw: DaemonProc, ids: list[str]) -> None:
    """Take what reaches ``queue`` until the binding's outbox is empty and every one of
    ``ids`` came (the queue may not exist yet), then check none came twice."""
    got: list[str] = []

    def arrived() -> bool:
        with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):  # no queue yet
            got.extend(take_all(rabbit, queue))
        return binding(gw, "hq")["backlog"] == 0 and set(ids) <= set(got)

    wait_for(arrived, 60, interval=0.2, what=lambda: f"{len(got)} of {len(ids)} in the queue")
    got.extend(take_all(rabbit, queue))
    assert sorted(got) == sorted(ids), "a message was lost or sent twice"


def test_a_publication_the_broker_refuses_stays_in_the_outbox_and_is_reported(
    rabbit: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """A policy limits the queue to 5 messages and refuses more (overflow reject-publish).
    The refused ones were marked sent (their transaction failed with 'partial tx
    completion', but the ledger message of the batch was committed and named them): 7 of
    12 lost, no error. Now they wait in the outbox, said so, and go once there is room."""
    tag = secrets.token_hex(4)
    queue = f"pfull{tag}"
    policy = '{"max-length": 5, "overflow": "reject-publish"}'
    rabbitmqctl(rabbit, "set_policy", f"pfull{tag}", f"^{queue}$", policy, "--apply-to", "queues")
    try:
        gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
        topic = topic_name()
        uri = rabbit.url(f"queue/{queue}")
        body = {"uri": uri, "name": "hq", "direction": "out", "attributes": {"topic": topic}}
        gw.client().post("/bridges", body)
        wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
        ids = []
        for i in range(5):  # one at a time: the queue is full after exactly these
            ids += publish(gw, topic, 1, start=i)
            wait_for(lambda i=i: binding(gw, "hq")["sent_total"] == i + 1, 30, what=f"{i} sent")
        ids += publish(gw, topic, 7, start=5)
        # Refused, then tried again after a reconnection (which reads the ledger): still
        # there, still refused.
        st = wait_for(
            lambda: (b := binding(gw, "hq"))["errors"] >= 2 and b["connects"] >= 3 and b,
            30,
            what=lambda: f"the refusal reported twice: {binding(gw, 'hq')}",
        )
        assert st["sent_total"] == 5 and st["backlog"] == 7, st
        assert f"AMQP broker refused 1 message(s) on 'queue/{queue}'" in st["last_error"], st
        assert "partial tx completion" in st["last_error"], st
        assert queue_depth(rabbit, queue) == 5

        # Room again: the binding retries (with its back-off) until every one has gone.
        _all_once(rabbit, queue, gw, ids)
        assert binding(gw, "hq")["sent_total"] == 12
    finally:
        rabbitmqctl(rabbit, "clear_policy", f"pfull{tag}")


@pytest.mark.parametrize("direction", ["out", "in"])
def test_a_queue_declared_with_arguments_can_be_bridged(
    direction: str, rabbit: Broker, daemons: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """Its owner declared the queue with a length limit, a TTL and a dead-letter exchange:
    declaring it again without them was refused ('inequivalent arg'), the binding down for
    good. An existing queue is now only checked (a passive declare)."""
    queue = f"owned{secrets.token_hex(4)}"
    conn = _conn(rabbit)
    args = {"x-max-length": 1000, "x-message-ttl": 600000, "x-dead-letter-exchange": "dlx"}
    conn.channel().queue_declare(queue, durable=True, arguments=args)
    conn.close()
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    topic = topic_name()
    body = {
        "uri": rabbit.url(f"queue/{queue}"),
        "name": "hq",
        "direction": direction,
        "attributes": {"topic": topic},
    }
    gw.client().post("/bridges", body)
    wait_for(
        lambda: binding(gw, "hq")["connected"],
        30,
        what=lambda: f"binding connected: {binding(gw, 'hq')}",
    )
    if direction == "out":
        ids = publish(gw, topic, 3)
        got: list[str] = []
        wait_for(lambda: got.extend(take_all(rabbit, queue)) or len(got) >= 3, 30, what="3")
        assert sorted(got) == sorted(ids)
    else:
        out = tmp_path / "in"
        field_sink(gw, topic, out)
        conn = _conn(rabbit)
        conn.channel().basic_publish("", queue, b"order", pika.BasicProperties(delivery_mode=2))
        conn.close()
        wait_for(lambda: descriptors(out), 30, what="the queue's message in DoDWAN")
    assert binding(gw, "hq")["errors"] == 0


def test_a_missing_queue_is_declared(rabbit: Broker, daemons: Callable[..., DaemonProc]) -> None:
    queue = f"new{secrets.token_hex(4)}"
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    body = {"uri": rabbit.url(f"queue/{queue}"), "name": "hq", "direction": "out"}
    gw.client().post("/bridges", {**body, "attributes": {"topic": "x"}})
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    assert queue_depth(rabbit, queue) == 0  # it exists (durable: declared by the binding)


def test_two_gateways_whose_queue_names_would_clash_each_get_their_own(
    rabbit: Broker, daemons: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """Host a.b's binding c and host a's binding b.c both consumed from dodwan.a.b.c,
    bound to both exchanges: each took (about half of) the other's messages, and published
    them in its own network as if they came from its own exchange."""
    tag = secrets.token_hex(3)
    gateways = []
    for host, name in (("a.b", f"c{tag}"), ("a", f"b.c{tag}")):
        gw = daemons(host, "--group", random_group(), "--host-id", host, *ARGS)
        exchange = f"ex-{host}-{tag}"
        uri = rabbit.url(f"{exchange}/k")
        body = {"uri": uri, "name": name, "direction": "in", "attributes": {"topic": "t"}}
        gw.client().post("/bridges", body)
        out = tmp_path / f"sink-{host}"
        field_sink(gw, "t", out)
        gateways.append((gw, name, exchange, uri, out))
    for gw, name, *_ in gateways:
        wait_for(lambda gw=gw, name=name: binding(gw, name)["connected"], 30, what="connected")
    conn = _conn(rabbit)
    ch = conn.channel()
    ch.confirm_delivery()
    for _gw, _name, exchange, _uri, _out in gateways:
        for i in range(10):
            props = pika.BasicProperties(message_id=f"{exchange}-{i}", delivery_mode=2)
            ch.basic_publish(exchange, "k", exchange.encode(), props)
    conn.close()
    for gw, name, exchange, _uri, out in gateways:
        wait_for(lambda out=out: len(descriptors(out)) >= 10, 30, what=f"{exchange}'s 10")
        bodies = [out.joinpath(d["id"]).read_bytes() for d in descriptors(out)]
        assert bodies == [exchange.encode()] * 10, f"{name} took another's messages"
        assert binding(gw, name)["received_total"] == 10


def test_inbound_queue_names() -> None:
    from dodwan.bridges.amqp import inbound_queue

    # Names that split one way only keep the form of earlier versions (and their queues).
    assert inbound_queue("gw", "hq") == "dodwan.gw.hq"
    assert inbound_queue("gw-1", "hq_2") == "dodwan.gw-1.hq_2"
    clash = {inbound_queue("a.b", "c"), inbound_queue("a", "b.c"), inbound_queue("a", "b")}
    assert len(clash) == 3
    q = inbound_queue("a.b", "c")
    assert q.startswith("dodwan.a.b.c.") and q == inbound_queue("a.b", "c")
    assert len(inbound_queue("h" * 250, "n" * 64).encode()) <= 255


def test_an_incoming_message_expiration_gives_its_deadline(
    rabbit: Broker, daemons: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """AMQP's ``expiration`` (ms, a string) is the message's time to live: the DoDWAN
    deadline is that much after its receipt when sooner than the binding's ttl."""
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    topic = topic_name()
    exchange = f"hq-{topic}"
    body = {"uri": rabbit.url(f"{exchange}/k"), "name": "hq", "direction": "in"}
    gw.client().post("/bridges", {**body, "attributes": {"topic": topic}})
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    out = tmp_path / "in"
    field_sink(gw, topic, out)
    conn = _conn(rabbit)
    ch = conn.channel()
    ch.confirm_delivery()
    for n, expiration in (("short", "60000"), ("none", None), ("long", str(10**9))):
        props = pika.BasicProperties(delivery_mode=2, expiration=expiration, headers={"n": n})
        ch.basic_publish(exchange, "k", n.encode(), props)
    conn.close()
    got = wait_for(
        lambda: len(d := descriptors(out)) == 3 and {x["n"]: x for x in d}, 30, what="3 in"
    )
    life = {n: float(d["deadline"]) - float(d["date"]) for n, d in got.items()}
    assert 55 < life["short"] <= 61, life
    assert 3595 < life["none"] <= 3601 and 3595 < life["long"] <= 3601, life


@pytest.mark.parametrize("expiration", ["soon", "-5", "1.5", " 7", "1e3"])
def test_a_malformed_expiration_is_ignored_with_a_warning(
    expiration: str, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[Inbound] = []
    spec = BindingSpec.from_dict(
        {"uri": "amqp://127.0.0.1/hq/k", "name": "hq", "direction": "in"}, 86400.0
    )
    link = AmqpLink(spec, "gw", lambda m: got.append(m) or True)
    props = pika.BasicProperties(expiration=expiration, headers={})
    method = SimpleNamespace(routing_key="k", redelivered=False, delivery_tag=1)
    acked: list[int] = []
    ch = SimpleNamespace(basic_ack=acked.append)
    with caplog.at_level(logging.WARNING, logger="dodwan.bridges"):
        link._deliver(ch, method, props, b"x")
    assert acked == [1], "not acknowledged: the message would come back for ever"
    assert got[0].expires is None and got[0].body == b"x"
    assert any("expiration" in r.getMessage() for r in caplog.records)


def test_a_message_for_a_deleted_queue_is_not_marked_sent_and_goes_once_it_is_back(
    rabbit: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """The queue of a queue binding is deleted while the binding is up. Its messages went
    to the default exchange without ``mandatory``: RabbitMQ dropped them (no queue of that
    name) and the transaction committed, the ledger message naming them: all marked sent,
    none anywhere, no error. Now RabbitMQ returns them (NO_ROUTE), they are not marked
    sent, the ledger is rewritten without them, and they go once the binding has declared
    the queue again at its reconnection: each exactly once."""
    queue = f"gone{secrets.token_hex(4)}"
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    topic = topic_name()
    body = {"uri": rabbit.url(f"queue/{queue}"), "name": "hq", "direction": "out"}
    gw.client().post("/bridges", {**body, "attributes": {"topic": topic}})
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    ids = publish(gw, topic, 1)
    wait_for(lambda: binding(gw, "hq")["sent_total"] == 1, 30, what="the first one sent")
    assert take_all(rabbit, queue) == ids
    conn = _conn(rabbit)
    conn.channel().queue_delete(queue)
    conn.close()

    later = publish(gw, topic, 3, start=1)
    wait_for(
        lambda: (b := binding(gw, "hq"))["errors"] >= 1 or b["sent_total"] == 4,
        30,
        what=lambda: f"the 3 sent or refused: {binding(gw, 'hq')}",
    )
    st = binding(gw, "hq")
    assert st["errors"] >= 1, f"marked sent although RabbitMQ dropped them: {st}"
    error = st["last_error"]
    assert re.search(rf"AMQP broker returned [123] message\(s\) on 'queue/{queue}'", error), st
    assert "NO_ROUTE" in error, st

    _all_once(rabbit, queue, gw, later)  # the queue declared again
    assert binding(gw, "hq")["sent_total"] == 4


@pytest.mark.parametrize(
    ("kind", "durable"), [("direct", True), ("fanout", True), ("topic", False)]
)
def test_an_existing_exchange_of_another_type_or_durability_is_used_as_it_is(
    kind: str, durable: bool, rabbit: Broker, daemons: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """Its owner declared the exchange direct, fanout or not durable: declaring it again as
    a durable topic exchange was refused (PRECONDITION_FAILED, 'inequivalent arg'), the
    binding down for good. An existing exchange is now only checked (a passive declare),
    and used both ways: outbound with the routing key as given, inbound through the
    binding's queue bound with its key."""
    exchange = f"own{kind}{secrets.token_hex(4)}"
    conn = _conn(rabbit)
    ch = conn.channel()
    ch.exchange_declare(exchange, exchange_type=kind, durable=durable)
    mine = ch.queue_declare("", exclusive=True).method.queue  # what the exchange routes out
    ch.queue_bind(mine, exchange, routing_key="ko")
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    t_out, t_in = topic_name(), topic_name()
    client = gw.client()
    client.post(
        "/bridges",
        {
            "uri": rabbit.url(f"{exchange}/ko"),
            "name": "ho",
            "direction": "out",
            "attributes": {"topic": t_out},
        },
    )
    client.post(
        "/bridges",
        {
            "uri": rabbit.url(f"{exchange}/ki"),
            "name": "hi",
            "direction": "in",
            "attributes": {"topic": t_in},
        },
    )
    for name in ("ho", "hi"):
        wait_for(
            lambda name=name: binding(gw, name)["connected"],
            30,
            what=lambda name=name: f"binding {name} connected: {binding(gw, name)}",
        )
    ids = publish(gw, t_out, 2)
    got: list[str] = []

    def taken() -> bool:
        while (m := ch.basic_get(mine, auto_ack=True))[0] is not None:
            got.append(str((m[1].headers or {}).get("dodwan-id")))
        return set(ids) <= set(got)

    wait_for(taken, 30, interval=0.1, what=lambda: f"{len(got)} of 2 through the exchange")
    out = tmp_path / "in"
    field_sink(gw, t_in, out)
    ch.basic_publish(exchange, "ki", b"from the broker", pika.BasicProperties(delivery_mode=2))
    conn.close()

    def came_in() -> bool:
        return any(
            out.joinpath(d["id"]).read_bytes() == b"from the broker" for d in descriptors(out)
        )

    wait_for(came_in, 30, what="the broker's message in DoDWAN")
    assert binding(gw, "ho")["errors"] == 0 and binding(gw, "hi")["errors"] == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"jms_type": "t" * 300},
        {"jms_correlation_id": "c" * 300},
        {"\U0001f600" * 64: "v"},  # 64 characters, 256 bytes: a valid attribute name
    ],
    ids=["type", "correlation", "name"],
)
def test_a_message_amqp_cannot_encode_is_held_back_and_the_others_go(
    bad: dict[str, str], rabbit: Broker, daemons: Callable[..., DaemonProc]
) -> None:
    """A field over AMQP's 255-byte short string (``type``, ``correlation_id``, a header's
    name) made pika raise inside the transaction: the link was dropped and the batch sent
    again at each reconnection, for ever, the others behind it never sent. Now it is found
    before publishing, left out of its batch, held back and reported; the rest goes, on
    the same connection."""
    queue = f"short{secrets.token_hex(4)}"
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    topic = topic_name()
    c = gw.client()
    ids = publish(gw, topic, 2)
    poison = c.post("/publish", {"attributes": {"topic": topic, **bad}, "text": "p"})["id"]
    ids += publish(gw, topic, 2, start=2)
    body = {"uri": rabbit.url(f"queue/{queue}"), "name": "hq", "direction": "out"}
    c.post("/bridges", {**body, "attributes": {"topic": topic}})
    _all_once_but(rabbit, queue, gw, ids)
    st: dict[str, Any] = wait_for(
        lambda: (b := binding(gw, "hq"))["sent_total"] == 4 and b["refused"] == 1 and b,
        30,
        what=lambda: f"4 sent, 1 held: {binding(gw, 'hq')}",
    )
    assert st["backlog"] == 1 and st["connects"] == 1, st
    assert f"AMQP cannot carry message {poison}: " in st["last_error"], st
    assert "over 255 (AMQP short string)" in st["last_error"], st


def _all_once_but(rabbit: Broker, queue: str, gw: DaemonProc, ids: list[str]) -> None:
    """Every one of ``ids`` reached ``queue`` once (the binding keeps one back)."""
    got: list[str] = []

    def arrived() -> bool:
        with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):  # no queue yet
            got.extend(take_all(rabbit, queue))
        return set(ids) <= set(got)

    wait_for(arrived, 60, interval=0.2, what=lambda: f"{len(got)} of {len(ids)}: {got}")
    assert sorted(got) == sorted(ids), "a message was lost or sent twice"


@pytest.mark.parametrize(
    "uri",
    [
        "amqp://127.0.0.1/{}/k".format("x" * 256),
        "amqp://127.0.0.1/ex/{}".format("k" * 256),
        "amqp://127.0.0.1/queue/{}".format("\u00e9" * 128),
    ],
    ids=["exchange", "routing-key", "queue"],
)
def test_an_amqp_name_over_255_bytes_is_refused_when_the_binding_is_added(uri: str) -> None:
    """It was accepted, and every connection then failed with pika's ShortStringTooLong."""
    with pytest.raises(SpecError, match=r"is 256 bytes long \(UTF-8\); AMQP 0-9-1 allows"):
        BindingSpec.from_dict({"uri": uri, "name": "hq", "direction": "in"})
    ok = uri.replace("x" * 256, "x" * 255).replace("k" * 256, "k" * 255)
    if ok != uri:
        BindingSpec.from_dict({"uri": ok, "name": "hq", "direction": "in"})


def _queue_exists(broker: Broker, queue: str) -> bool:
    conn = _conn(broker)
    try:
        conn.channel().queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.mark.parametrize("how", ["replace", "rm-add"])
def test_an_inbound_binding_moved_to_another_exchange_no_longer_takes_the_old_one(
    how: str, rabbit: Broker, daemons: Callable[..., DaemonProc], tmp_path: Path
) -> None:
    """The binding's queue is named after the host and the binding, and each connection only
    added a queue.bind: after ``--replace`` (or ``bridge rm`` and ``add``) with another
    exchange, the queue stayed bound to the old one, whose messages came in labelled with
    the new binding's origin and attributes. Now the queue is bound to exactly what the
    binding names (what was bound is recorded on the broker), and ``bridge rm`` deletes
    it."""
    tag = secrets.token_hex(4)
    old, new = f"exA{tag}", f"exB{tag}"
    gw = daemons("gw", "--group", random_group(), "--host-id", "gw", *ARGS)
    c = gw.client()
    body = {"name": "hq", "direction": "in"}
    c.post("/bridges", {**body, "uri": rabbit.url(f"{old}/k"), "attributes": {"topic": "A"}})
    wait_for(lambda: binding(gw, "hq")["connected"], 30, what="binding connected")
    queue = inbound_queue("gw", "hq")
    assert _queue_exists(rabbit, queue)
    moved = {**body, "uri": rabbit.url(f"{new}/k"), "attributes": {"topic": "B"}}
    if how == "replace":
        c.post("/bridges", {**moved, "replace": True})
    else:
        assert c.delete("/bridges/hq")["removed"] == "hq"
        assert not _queue_exists(rabbit, queue), "bridge rm left the queue bound, filling"
        c.post("/bridges", moved)
    wait_for(
        lambda: (b := binding(gw, "hq"))["connected"] and new in b["uri"],
        30,
        what="the new binding connected",
    )
    out = tmp_path / "in"
    c.post(
        "/subscribe",
        {
            "patterns": {"bridge_origin": ".*"},
            "sink": {"kind": "dir", "target": str(out)},
            "key": "in",
        },
    )
    conn = _conn(rabbit)
    ch = conn.channel()
    ch.confirm_delivery()
    # One queue, in order: the old exchange's message would come in before the new one's.
    ch.basic_publish(old, "k", b"to the old exchange", pika.BasicProperties(delivery_mode=2))
    ch.basic_publish(new, "k", b"to the new exchange", pika.BasicProperties(delivery_mode=2))
    conn.close()
    bodies: list[bytes] = []

    def came_in() -> bool:
        bodies[:] = [out.joinpath(d["id"]).read_bytes() for d in descriptors(out)]
        return b"to the new exchange" in bodies

    wait_for(came_in, 30, what=lambda: f"the new exchange's message in DoDWAN: {bodies}")
    assert bodies == [b"to the new exchange"], "the old exchange's message came in too"
    assert binding(gw, "hq")["errors"] == 0
    assert c.delete("/bridges/hq")["removed"] == "hq"
    assert not _queue_exists(rabbit, queue), "bridge rm left the queue bound, filling"
