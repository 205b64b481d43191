"""The Python JMS-shaped API end to end, against loopback hosts (one and two daemons)."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from joms_support import LoopThread, RawStomp, start_hosts, wait_for

import joms
from joms.runtime import LoopbackHost
from joms.stomp.frame import Frame


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="module")
def pair(loop: LoopThread) -> Iterator[list[LoopbackHost]]:
    hosts = start_hosts(loop, 2, prefix="api")
    yield hosts
    for h in hosts:
        loop.call(h.stop())


def test_issue_example_chat_with_durable_subscriber(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url, client_id="app1") as conn:
        session = conn.create_session(transacted=False, ack_mode=joms.AUTO_ACKNOWLEDGE)
        topic = session.create_topic("ChatRoom1")
        hello = session.create_text_message("Hello", properties={"language": "English"})
        session.create_producer(topic).send(hello)
        sent_id = hello.message_id
        assert sent_id is not None and sent_id.startswith("ID:api1-")
        sub = session.create_durable_subscriber(
            topic, "chat", selector="language IN ('English','French')"
        )
        msg = sub.receive(timeout=5.0)
        assert isinstance(msg, joms.TextMessage)
        assert msg.text == "Hello"
        assert msg.message_id == sent_id
        assert msg.get_property("language") == "English"
        assert msg.destination == topic
        sub.close()
        session.unsubscribe("chat")


def test_a_network_filtered_durable_gets_what_waited_in_each_producers_order(
    loop: LoopThread, pair: list[LoopbackHost]
) -> None:
    """A selector the network filters on turns the reorder window off, and DoDWAN offers
    the newest message first: what waited for the subscriber while it was away came in
    reverse. It is handed over in each producer's sending order (docs/joms.md)."""
    from joms.service import model as mdl

    a, b = pair
    topic_name, sel = "ordered-backlog", "language = 'English'"
    with joms.connect(b.stomp_url, client_id="bob-order") as c:
        s = c.create_session()
        s.create_durable_subscriber(s.create_topic(topic_name), "d", selector=sel).close()
    with (
        joms.connect(a.stomp_url, client_id="alice-order") as ca,
        joms.connect(a.stomp_url, client_id="carl-order") as cc,
    ):
        sa, sc = ca.create_session(), cc.create_session()
        pa = sa.create_producer(sa.create_topic(topic_name))
        pc = sc.create_producer(sc.create_topic(topic_name))
        for i in range(8):
            pa.send(sa.create_text_message(f"a{i}", properties={"language": "English"}))
            if i % 2:
                pc.send(sc.create_text_message(f"c{i // 2}", properties={"language": "English"}))

    def stored() -> list[str]:
        assert b.service is not None
        bodies = (mdl.thaw(v) for _, v in b.service.store.items("dpending"))
        return [m.body.decode() for m in bodies if m.destination.name == topic_name]

    deadline = time.monotonic() + 20
    while len(loop.run(stored)) < 12:
        assert time.monotonic() < deadline, loop.run(stored)
        time.sleep(0.05)  # the store has no event to await from this thread
    with joms.connect(b.stomp_url, client_id="bob-order") as c:
        s = c.create_session()
        sub = s.create_durable_subscriber(s.create_topic(topic_name), "d", selector=sel)
        got = []
        while len(got) < 12 and (m := sub.receive(timeout=10)) is not None:
            assert isinstance(m, joms.TextMessage) and m.text is not None
            got.append(m.text)
        sub.close()
        s.unsubscribe("d")
    assert [x for x in got if x[0] == "a"] == [f"a{i}" for i in range(8)], got
    assert [x for x in got if x[0] == "c"] == [f"c{i}" for i in range(4)], got


def test_topic_across_daemons_with_typed_properties_and_priority(pair: list[LoopbackHost]) -> None:
    a, b = pair
    with joms.connect(b.stomp_url) as cb, joms.connect(a.stomp_url) as ca:
        sb = cb.create_session()
        t = sb.create_topic("sensors")
        cons = sb.create_consumer(t, selector="temp > 20.5 AND site = 'north'")
        sa = ca.create_session()
        prod = sa.create_producer(t)
        prod.priority = 7
        prod.delivery_mode = joms.NON_PERSISTENT
        m1 = sa.create_map_message({"x": 1, "blob": b"\x00\x01"}, properties={"site": "north"})
        m1.set_double_property("temp", 25.0)
        m2 = sa.create_text_message("cold", properties={"site": "north", "temp": 3.5})
        prod.send(m2)
        prod.send(m1)
        got = cons.receive(timeout=10)
        assert isinstance(got, joms.MapMessage)
        assert got.map == {"x": 1, "blob": b"\x00\x01"}
        assert got.item_type("x") == "int"
        assert got.get_property("temp") == 25.0
        assert got.property_type("temp") == "double"
        assert got.priority == 7
        assert got.delivery_mode == joms.NON_PERSISTENT
        assert got.message_id and got.message_id.startswith("ID:api1-")
        assert cons.receive(timeout=0.3) is None


def test_stream_and_bytes_bodies_and_receive_no_wait(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("bodies")
        cons = s.create_consumer(t)
        assert cons.receive_no_wait() is None
        p = s.create_producer(t)
        p.send(s.create_stream_message([True, 3, 2.5, "x", b"\xff"]))
        p.send(s.create_bytes_message(b"\x00raw\x00"))
        m = cons.receive(5)
        assert isinstance(m, joms.StreamMessage)
        assert [m.read() for _ in range(5)] == [True, 3, 2.5, "x", b"\xff"]
        with pytest.raises(joms.MessageEOFException):
            m.read()
        b = cons.receive(5)
        assert isinstance(b, joms.BytesMessage) and b.data == b"\x00raw\x00"


def test_listener_stop_start_and_no_local(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c, joms.connect(a.stomp_url) as other:
        s = c.create_session()
        t = s.create_topic("listen")
        got: list[str] = []
        done = threading.Event()

        def on_message(m: joms.Message) -> None:
            assert isinstance(m, joms.TextMessage)
            got.append(m.text or "")
            if len(got) == 2:
                done.set()

        cons = s.create_consumer(t, no_local=True)
        cons.message_listener = on_message
        c.stop()
        s.create_producer(t).send(s.create_text_message("own"))
        os_ = other.create_session()
        op = os_.create_producer(t)
        op.send(os_.create_text_message("one"))
        assert not done.wait(0.3) and got == []  # stopped: nothing delivered
        c.start()
        op.send(os_.create_text_message("two"))
        assert done.wait(5)
        assert got == ["one", "two"]


def test_bad_selector_raises_locally_and_connection_survives(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        with pytest.raises(joms.InvalidSelectorException):
            s.create_consumer(s.create_topic("x"), selector="a = = 2")
        with pytest.raises(joms.MessageFormatException):
            s.create_text_message("x", properties={"JMSBad": 1})
        with pytest.raises(joms.InvalidDestinationException):
            s.create_queue("a@b@c")
        with pytest.raises(joms.InvalidDestinationException):
            s.create_topic("has space")
        cons = s.create_consumer(s.create_topic("x"))
        s.create_producer(s.create_topic("x")).send(s.create_text_message("ok"))
        assert cons.receive(5).text == "ok"


def test_a_temporary_queue_is_consumed_only_by_its_connection_across_hosts(
    pair: list[LoopbackHost],
) -> None:
    """JMS 1.1 §4.4.3: a connection on another host that learnt the temporary queue's real
    name from JMSReplyTo may send to it but not consume from it (API and raw STOMP)."""
    a, b = pair
    with joms.connect(a.stomp_url) as ca, joms.connect(b.stomp_url) as cb:
        sa = ca.create_session()
        tmp = sa.create_temporary_queue()
        owner = sa.create_consumer(tmp)
        sb = cb.create_session()
        svc = sb.create_consumer(sb.create_queue(f"tmpsvc{next(_fresh)}"))
        req = sa.create_text_message("req")
        req.reply_to = tmp
        sa.create_producer(sa.create_queue(f"{svc.destination.name}@api2")).send(req)
        got = svc.receive(10)
        assert got is not None and got.reply_to is not None
        real = got.reply_to
        assert real.name.startswith("tmp.") and real.name.endswith("@api1")
        with pytest.raises(joms.InvalidDestinationException):
            sb.create_consumer(sb.create_queue(real.name))
        with RawStomp(b.stomp_address) as raw:
            raw.send("SUBSCRIBE", {"id": "t", "destination": f"/queue/{real.name}"})
            err = raw.next("ERROR")
            assert err.get("joms-exception") == "InvalidDestinationException"
        prod = sb.create_producer(real)
        for i in range(6):
            prod.send(sb.create_text_message(f"reply{i}"))
        replies = [owner.receive(10) for _ in range(6)]
        assert [m.text if m else None for m in replies] == [f"reply{i}" for i in range(6)]
        assert owner.receive(0.3) is None


def test_client_acknowledge_and_recover(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url, client_id="cack") as c:
        s = c.create_session(ack_mode=joms.CLIENT_ACKNOWLEDGE)
        q = s.create_queue("acks")
        cons = s.create_consumer(q)
        p = s.create_producer(q)
        for i in range(2):
            p.send(s.create_text_message(f"m{i}"))
        m0, m1 = cons.receive(5), cons.receive(5)
        assert (m0.text, m1.text) == ("m0", "m1")
        s.recover()
        r0, r1 = cons.receive(5), cons.receive(5)
        assert {r0.text, r1.text} == {"m0", "m1"}
        assert r0.redelivered and r1.redelivered
        r1.acknowledge()
        assert cons.receive(0.3) is None


def test_transacted_session_commit_and_rollback(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session(transacted=True)
        q = s.create_queue("txq")
        cons = s.create_consumer(q)
        p = s.create_producer(q)
        p.send(s.create_text_message("held"))
        assert cons.receive(0.3) is None  # not sent before commit
        s.commit()
        m = cons.receive(5)
        assert m.text == "held" and not m.redelivered
        s.rollback()
        again = cons.receive(5)
        assert again.text == "held" and again.redelivered
        s.commit()
        assert cons.receive(0.3) is None


def test_work_queue_across_daemons_and_request_reply(pair: list[LoopbackHost]) -> None:
    a, b = pair
    with joms.connect(a.stomp_url) as ca, joms.connect(b.stomp_url) as cb:
        # a service on host b answers requests sent to queue "svc" managed by b
        sb = cb.create_session()
        svc_q = sb.create_queue("svc")
        server = sb.create_consumer(svc_q)
        replier = sb.create_producer()
        # the client on host a addresses svc@api2 and waits on a temporary queue
        sa = ca.create_session()
        tmp = sa.create_temporary_queue()
        replies = sa.create_consumer(tmp)
        req = sa.create_text_message("2+2")
        req.reply_to = tmp
        req.correlation_id = "c-1"
        sa.create_producer(sa.create_queue("svc@api2")).send(req)
        got = server.receive(10)
        assert got.text == "2+2" and got.reply_to is not None
        ans = sb.create_text_message("4")
        ans.correlation_id = got.correlation_id
        replier.send(ans, got.reply_to)
        r = replies.receive(10)
        assert r.text == "4" and r.correlation_id == "c-1"


def test_durable_subscription_requires_client_id(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        with pytest.raises(joms.IllegalStateException):
            s.create_durable_subscriber(s.create_topic("t"), "n")


def test_client_id_conflict_raises(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with (
        joms.connect(a.stomp_url, client_id="only-one"),
        pytest.raises(joms.InvalidClientIDException),
    ):
        joms.connect(a.stomp_url, client_id="only-one")


def test_destinations_lists_the_directory(pair: list[LoopbackHost]) -> None:
    a, b = pair
    with joms.connect(a.stomp_url) as ca:
        s = ca.create_session()
        s.create_consumer(s.create_queue("catalogue"))  # creates catalogue@api1
        s.create_producer(s.create_topic("weather")).send(s.create_text_message("sunny"))
        assert "catalogue@api1" in ca.destinations()["queues"]
        with joms.connect(b.stomp_url) as cb:
            deadline = time.monotonic() + 10
            known = cb.destinations()
            while time.monotonic() < deadline and not (
                "catalogue@api1" in known["queues"] and "weather" in known["topics"]
            ):
                time.sleep(0.1)  # adverts travel by DoDWAN; no event to wait on here
                known = cb.destinations()
            assert "catalogue@api1" in known["queues"]
            assert "weather" in known["topics"]


def test_listener_survives_an_undecodable_map_body(pair: list[LoopbackHost]) -> None:
    # A MESSAGE whose map body does not decode (e.g. from a host whose gateway did not
    # check it) reaches the listener, reading its body raises; later messages still come.
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("undecodable")
        got: queue.Queue[joms.Message] = queue.Queue()
        cons = s.create_consumer(t)
        cons.message_listener = got.put
        bad = Frame(
            "MESSAGE",
            {
                "subscription": cons._sid,
                "message-id": "ID:bad-1",
                "destination": "/topic/undecodable",
                "joms-body-type": "map",
            },
            b"notjson",
        )
        c._transport._dispatch(bad)
        s.create_producer(t).send(s.create_text_message("later"))
        first = got.get(timeout=5)
        assert isinstance(first, joms.MapMessage) and first.message_id == "ID:bad-1"
        with pytest.raises(joms.MessageFormatException):
            first.get("a")
        with pytest.raises(joms.MessageFormatException):
            _ = first.map
        second = got.get(timeout=5)
        assert isinstance(second, joms.TextMessage) and second.text == "later"


def test_typed_value_that_does_not_fit_its_type_raises_on_read(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        cons = s.create_consumer(s.create_topic("badtyped"))
        c._transport._dispatch(
            Frame(
                "MESSAGE",
                {
                    "subscription": cons._sid,
                    "destination": "/topic/badtyped",
                    "joms-body-type": "stream",
                },
                b'[{"t": "int", "v": "zz"}]',
            )
        )
        m = cons.receive(5)
        assert isinstance(m, joms.StreamMessage)
        with pytest.raises(joms.MessageFormatException):
            m.read()


_fresh = itertools.count()


@pytest.mark.parametrize(
    "options",
    [
        {"priority": 10},
        {"priority": -1},
        {"priority": True},
        {"delivery_mode": 7},
        {"time_to_live": -1},
    ],
)
def test_bad_send_options_raise_locally_and_connection_survives(
    pair: list[LoopbackHost], options: dict[str, Any]
) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        # a topic of its own: a new subscriber also gets messages still in the cache
        t = s.create_topic(f"sendopts{next(_fresh)}")
        cons = s.create_consumer(t)
        p = s.create_producer(t)
        with pytest.raises(joms.JMSException):
            p.send(s.create_text_message("bad"), **options)
        p.send(s.create_text_message("good"))
        assert cons.receive(5).text == "good"
        assert cons.receive(0.2) is None  # the refused one was never sent


@pytest.mark.parametrize("wildcard", ["news.*", "news.>", "news.#"])
def test_sending_to_a_wildcard_topic_raises_locally_and_connection_survives(
    pair: list[LoopbackHost], wildcard: str
) -> None:
    """docs/joms.md: destination names are checked locally, so a bad one raises without
    closing the connection (the gateway's ERROR would close it)."""
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic(f"wild{next(_fresh)}")
        cons = s.create_consumer(t)
        with pytest.raises(joms.InvalidDestinationException, match="wildcard"):
            s.create_producer(s.create_topic(wildcard)).send(s.create_text_message("bad"))
        with pytest.raises(joms.InvalidDestinationException, match="wildcard"):
            s.create_producer(None).send(s.create_text_message("bad"), s.create_topic(wildcard))
        s.create_producer(t).send(s.create_text_message("good"))
        assert cons.receive(5).text == "good"


def test_unsubscribe_without_client_id_raises_locally(pair: list[LoopbackHost]) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        with pytest.raises(joms.IllegalStateException):
            s.unsubscribe("nope")
        t = s.create_topic("after-unsub")
        cons = s.create_consumer(t)
        s.create_producer(t).send(s.create_text_message("alive"))
        assert cons.receive(5).text == "alive"


def test_after_the_server_closes_later_calls_say_connection_closed(
    pair: list[LoopbackHost],
) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        with pytest.raises(joms.InvalidDestinationException) as first:
            s.create_consumer(s.create_queue("nosuchqueue@*"))
        reason = str(first.value)
        assert "nosuchqueue" in reason
        t = s.create_topic("x")
        for call in (
            lambda: s.create_producer(t).send(s.create_text_message("x")),
            lambda: s.create_consumer(t),
            lambda: c.create_session(),
        ):
            with pytest.raises(joms.IllegalStateException) as later:
                call()
            assert str(later.value) == f"connection closed: {reason}"


@pytest.mark.parametrize(
    "make",
    [
        lambda s: s.create_text_message(b"x"),
        lambda s: s.create_text_message("\ud800"),
        lambda s: s.create_text_message("x", properties={"p": "a\0b"}),
        lambda s: s.create_text_message("x", properties={"p": "\udfff"}),
        lambda s: s.create_text_message("x").set_string_property("p", "a\0b"),
        lambda s: setattr(s.create_text_message("x"), "text", 5),
        lambda s: s.create_bytes_message("not bytes"),
    ],
)
def test_bad_message_values_raise_message_format_exception_at_once(
    pair: list[LoopbackHost], make: Any
) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        with pytest.raises(joms.MessageFormatException):
            make(s)


@pytest.mark.parametrize("field", ["correlation_id", "type"])
def test_bad_header_field_raises_message_format_exception_at_send(
    pair: list[LoopbackHost], field: str
) -> None:
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("hdrfields")
        m = s.create_text_message("x")
        setattr(m, field, "a\0b")
        with pytest.raises(joms.MessageFormatException):
            s.create_producer(t).send(m)
        s.create_producer(t).send(s.create_text_message("still open"))


@pytest.mark.parametrize(
    "url", ["stomp://127.0.0.1:abc", "stomp://127.0.0.1:99999", "stomp://[::1"]
)
def test_bad_url_raises_jms_exception(url: str) -> None:
    with pytest.raises(joms.JMSException):
        joms.connect(url)


def test_a_text_body_may_hold_a_nul_character(pair: list[LoopbackHost]) -> None:
    """A body travels with its content-length, so unlike a header it may hold NUL (JMS
    text is any string); only what UTF-8 cannot encode is refused."""
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("nulbody")
        sub = s.create_consumer(t)
        s.create_producer(t).send(s.create_text_message("a\0b"))
        got = sub.receive(timeout=10)
        assert isinstance(got, joms.TextMessage) and got.text == "a\0b"


# ---------------------------------------------------------------- property names and frame headers
# Every name the gateway uses as a SEND or MESSAGE header (and every joms- name): as a user
# property it would redirect, overwrite or lose the message (docs/joms.md, docs/stomp.md).
_HEADER_NAMES = [
    "destination",
    "type",
    "expires",
    "reply-to",
    "correlation-id",
    "transaction",
    "content-length",
    "content-type",
    "receipt",
    "timestamp",
    "ack",
    "subscription",
    "message-id",
    "redelivered",
    "original-destination",
    "dlq-reason",
    "joms-types",
    "joms-body-type",
    "joms-null-text",
    "joms-anything",
]


@pytest.mark.parametrize("name", _HEADER_NAMES)
def test_a_property_named_like_a_frame_header_is_refused_where_it_is_set(
    pair: list[LoopbackHost], name: str
) -> None:
    """JMS 1.1 §3.5: user properties are independent of the header fields. A property
    called ``destination`` once sent the message to the topic it named, ``expires`` lost
    it, ``content-length`` closed the connection; now set_property refuses the name."""
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic(f"pname{next(_fresh)}")
        cons = s.create_consumer(t)
        m = s.create_text_message("x")
        with pytest.raises(joms.MessageFormatException, match="reserved"):
            m.set_property(name, "/topic/elsewhere")
        if name in ("original-destination", "dlq-reason"):  # set by the provider: a copy
            assert s.create_text_message("x", properties={name: "1"}).properties == {}
        else:  # of a received message's properties leaves them out (the provider's to set)
            with pytest.raises(joms.MessageFormatException, match="reserved"):
                s.create_text_message("x", properties={name: "1"})
        m.set_property("kept", "yes")
        s.create_producer(t).send(m)
        got = cons.receive(5)
        assert got is not None and got.text == "x" and got.get_property("kept") == "yes"
        assert got.get_property(name) is None and got.destination == t


@pytest.mark.parametrize(
    "name",
    ["message-id", "timestamp", "subscription", "ack", "redelivered", "original-destination",
     "dlq-reason", "joms-anything"],
)  # fmt: skip
def test_a_raw_send_with_a_message_frame_header_is_refused_with_an_error(
    pair: list[LoopbackHost], name: str
) -> None:
    """docs/stomp.md: a SEND header the gateway sets itself on MESSAGE frames cannot be a
    user property (it would be overwritten or lost on delivery): ERROR, not silence."""
    a, _ = pair
    dest = f"/topic/rawpname{next(_fresh)}"
    with RawStomp(a.stomp_address) as sub, RawStomp(a.stomp_address) as pub:
        sub.send("SUBSCRIBE", {"id": "1", "destination": dest, "receipt": "s"})
        sub.receipt("s")
        pub.send("SEND", {"destination": dest, name: "mine", "receipt": "p"}, b"x")
        err = pub.next("ERROR")
        assert err.get("joms-exception") == "MessageFormatException"
        assert name in (err.get("message") or "") and err.get("receipt-id") == "p"
        assert [f.command for f in sub.quiet(0.5)] == []  # nothing was published


# ---------------------------------------------------------------- raw STOMP acknowledgements
@pytest.mark.parametrize("end", ["COMMIT", "ABORT"])
def test_a_raw_client_s_ack_in_a_transaction_outlives_its_unsubscribe(
    pair: list[LoopbackHost], end: str
) -> None:
    """ACK in a transaction, UNSUBSCRIBE, COMMIT: the commit once found the message given
    back with the closed subscription (the service dropped acks of a gone consumer), so
    the next receiver of the queue got it again. The close now waits for the transaction:
    COMMIT consumes it, ABORT gives it back (redelivered); a message sent meanwhile goes to
    the next receiver, not to the closed subscription."""
    a, _ = pair
    dest = f"/queue/txunsub{next(_fresh)}"
    with RawStomp(a.stomp_address) as c, RawStomp(a.stomp_address) as p:
        c.send("SUBSCRIBE", {"id": "1", "destination": dest, "ack": "client-individual",
                             "receipt": "s"})  # fmt: skip
        c.receipt("s")
        p.send("SEND", {"destination": dest, "receipt": "p1"}, b"once")
        p.receipt("p1")
        m = c.next("MESSAGE")
        c.send("BEGIN", {"transaction": "t"})
        c.send("ACK", {"id": m.headers["ack"], "transaction": "t"})
        c.send("UNSUBSCRIBE", {"id": "1", "receipt": "u"})
        c.receipt("u")
        p.send("SEND", {"destination": dest, "receipt": "p2"}, b"meanwhile")
        p.receipt("p2")
        c.send(end, {"transaction": "t", "receipt": "e"})
        c.receipt("e")
        assert [f.body for f in c.frames if f.command == "MESSAGE"] == []
        with RawStomp(a.stomp_address) as nxt:
            nxt.send("SUBSCRIBE", {"id": "2", "destination": dest, "receipt": "s2"})
            nxt.receipt("s2")
            p.send("SEND", {"destination": dest, "receipt": "p3"}, b"sentinel")
            p.receipt("p3")
            got: dict[bytes, str | None] = {}
            while b"sentinel" not in got:
                f = nxt.next("MESSAGE")
                got[f.body] = f.get("redelivered")
    expected: dict[bytes, str | None] = {b"meanwhile": None, b"sentinel": None}
    if end == "ABORT":
        expected[b"once"] = "true"
    assert got == expected


@pytest.mark.parametrize("version", ["1.1", "1.0"])
@pytest.mark.parametrize("command", ["ACK", "NACK"])
def test_stomp_10_and_11_acks_name_the_copy_of_each_subscription(
    pair: list[LoopbackHost], version: str, command: str
) -> None:
    """STOMP 1.1 names the message to ACK/NACK by ``subscription`` + ``message-id``; one
    connection with two subscriptions to a topic gets the same message-id on both. The
    gateway once kept one ack id per message-id: ACK of the s2 copy took the s1 one, and
    the next ACK was an ERROR that closed the connection. (1.0 has no ``subscription``:
    each ACK by message-id takes one copy.)"""
    a, _ = pair
    dest = f"/topic/twosubs{next(_fresh)}"
    with RawStomp(a.stomp_address, version=version) as c, RawStomp(a.stomp_address) as p:
        assert c.version == version
        for sid in ("s1", "s2"):
            c.send("SUBSCRIBE", {"id": sid, "destination": dest, "ack": "client-individual",
                                 "receipt": sid})  # fmt: skip
            c.receipt(sid)
        p.send("SEND", {"destination": dest, "receipt": "p"}, b"M")
        p.receipt("p")
        copies = [c.next("MESSAGE", subscription=sid) for sid in ("s2", "s1")]
        assert copies[0].headers["message-id"] == copies[1].headers["message-id"]
        for m in copies:
            sid, mid = m.headers["subscription"], m.headers["message-id"]
            ack = {"message-id": mid, "receipt": f"a-{sid}"}
            if version == "1.1":
                ack["subscription"] = sid
            c.send(command, ack)
            c.receipt(f"a-{sid}")
        frames = c.quiet(1.0)
        assert [f.command for f in frames if f.command == "ERROR"] == []
        again = sorted(f.headers["subscription"] for f in frames if f.command == "MESSAGE")
        assert again == ([] if command == "ACK" else ["s1", "s2"])  # NACK: each copy again
        if command == "NACK":
            assert all(f.get("redelivered") == "true" for f in frames if f.command == "MESSAGE")


def test_a_stomp_10_ack_by_message_id_skips_copies_a_cumulative_ack_settled(
    pair: list[LoopbackHost],
) -> None:
    """STOMP 1.0 ACKs by message-id alone, meaning the oldest copy not yet acknowledged
    (docs/stomp.md). Two ``client`` subscriptions get M1 and M2; ACK M2 takes one
    subscription's copy and, cumulatively, its M1 too; ACK M1 then means the other
    subscription's copy. The gateway once took the settled copy and answered an ERROR that
    closed the connection."""
    a, _ = pair
    dest = f"/topic/cumul{next(_fresh)}"
    with RawStomp(a.stomp_address, version="1.0") as c, RawStomp(a.stomp_address) as p:
        for sid in ("A", "B"):
            c.send("SUBSCRIBE", {"id": sid, "destination": dest, "ack": "client",
                                 "receipt": sid})  # fmt: skip
            c.receipt(sid)
        for body in (b"m1", b"m2"):
            p.send("SEND", {"destination": dest, "receipt": "p"}, body)
            p.receipt("p")
        msgs = [c.next("MESSAGE") for _ in range(4)]
        mid = {m.body: m.headers["message-id"] for m in msgs}
        c.send("ACK", {"message-id": mid[b"m2"], "receipt": "a1"})
        c.receipt("a1")
        c.send("ACK", {"message-id": mid[b"m1"], "receipt": "a2"})
        c.receipt("a2")
        frames = c.quiet(1.0)
        assert [f for f in frames if f.command == "ERROR"] == [] and not c.closed, frames


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_nack_in_client_mode_is_cumulative(pair: list[LoopbackHost], kind: str) -> None:
    """STOMP 1.2: ``client-individual`` works like ``client`` except that its ACK and NACK
    are not cumulative, so a ``client`` NACK gives back every earlier unacknowledged
    message too (it once gave back only the one named, the earlier one stayed
    unacknowledged and never came again)."""
    a, _ = pair
    dest = f"/{kind}/nackclient{next(_fresh)}"
    with RawStomp(a.stomp_address) as c, RawStomp(a.stomp_address) as p:
        c.send("SUBSCRIBE", {"id": "1", "destination": dest, "ack": "client", "receipt": "s"})
        c.receipt("s")
        for i in range(2):
            p.send("SEND", {"destination": dest, "receipt": f"p{i}"}, f"m{i}".encode())
            p.receipt(f"p{i}")
        first = [c.next("MESSAGE") for _ in range(2)]
        assert [f.body for f in first] == [b"m0", b"m1"]
        c.send("NACK", {"id": first[1].headers["ack"], "receipt": "n"})
        c.receipt("n")
        again = [c.next("MESSAGE", redelivered="true") for _ in range(2)]
        assert [f.body for f in again] == [b"m0", b"m1"]
        c.send("ACK", {"id": again[1].headers["ack"], "receipt": "a"})  # cumulative too
        c.receipt("a")
        assert [f.command for f in c.quiet(1.0)] == []


def test_a_text_message_sent_with_null_text_arrives_with_null_text(
    pair: list[LoopbackHost],
) -> None:
    """JMS getText() returns null for a message sent with null text, and "" for "": the
    two once arrived alike (""). Across daemons, so the mark travels through DoDWAN."""
    a, b = pair
    with joms.connect(b.stomp_url) as cb, joms.connect(a.stomp_url) as ca:
        sb = cb.create_session()
        t = sb.create_topic(f"nulltext{next(_fresh)}")
        cons = sb.create_consumer(t)
        sa = ca.create_session()
        prod = sa.create_producer(t)
        for text in (None, "", "x"):
            prod.send(sa.create_text_message(text))
        got = [cons.receive(10) for _ in range(3)]
        assert [m.text for m in got] == [None, "", "x"]
    with RawStomp(a.stomp_address) as raw:  # a raw client may send null text too
        dest = f"/topic/rawnull{next(_fresh)}"
        raw.send("SUBSCRIBE", {"id": "1", "destination": dest, "receipt": "s"})
        raw.receipt("s")
        raw.send("SEND", {"destination": dest, "joms-null-text": "true", "receipt": "p"})
        raw.receipt("p")
        m = raw.next("MESSAGE")
        assert m.get("joms-null-text") == "true" and m.body == b""
        raw.send("SEND", {"destination": dest, "joms-null-text": "true", "receipt": "q"}, b"x")
        err = raw.next("ERROR")  # null text has no body
        assert "joms-null-text" in (err.get("message") or "")


def test_a_received_message_s_properties_can_be_copied_to_forward_it(
    pair: list[LoopbackHost],
) -> None:
    """``properties=msg.properties`` (forwarding a message) keeps the user properties and
    leaves out those the provider set (JMSXDeliveryCount): it once raised
    MessageFormatException for JMSXDeliveryCount, a name a client may not set."""
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session()
        first, then = s.create_queue(f"fwd{next(_fresh)}"), s.create_queue(f"fwd{next(_fresh)}")
        s.create_producer(first).send(s.create_text_message("x", properties={"k": 7}))
        got = s.create_consumer(first).receive(5)
        assert got.properties == {"k": 7, "JMSXDeliveryCount": 1}
        s.create_producer(then).send(s.create_text_message(got.text, properties=got.properties))
        again = s.create_consumer(then).receive(5)
        assert again.text == "x" and again.properties == {"k": 7, "JMSXDeliveryCount": 1}
        with pytest.raises(joms.MessageFormatException):  # set by name: still refused
            s.create_text_message("y").set_property("JMSXDeliveryCount", 3)


def test_message_group_properties_can_be_set_selected_and_forwarded(
    pair: list[LoopbackHost],
) -> None:
    """JMS 1.1 §3.5.9: JMSXGroupID and JMSXGroupSeq are the properties a client sets to
    group messages, and every provider must support them. set_property refused them (every
    name starting JMS was reserved). Now they travel with their JMS types (string, int),
    selectors see them, forwarding keeps them, and a value of another type is refused."""
    a, _ = pair
    with joms.connect(a.stomp_url) as ca:
        sa, sb = ca.create_session(), ca.create_session()
        t = sa.create_topic(f"groups{next(_fresh)}")
        later = sb.create_consumer(t, selector="JMSXGroupID = 'g1' AND JMSXGroupSeq >= 2")
        prod = sa.create_producer(t)
        for seq in (1, 2):
            m = sa.create_text_message(f"m{seq}")
            m.set_property("JMSXGroupID", "g1")
            m.set_int_property("JMSXGroupSeq", seq)
            prod.send(m)
        got = later.receive(10)
        assert got.text == "m2" and got.get_property("JMSXGroupSeq") == 2
        assert got.property_type("JMSXGroupSeq") == "int"
        assert got.get_property("JMSXGroupID") == "g1"
        assert later.receive(0.3) is None
        fwd = sb.create_text_message("again", properties=got.properties)
        assert fwd.get_property("JMSXGroupSeq") == 2 and fwd.get_property("JMSXGroupID") == "g1"
        for name, value in (("JMSXGroupSeq", "2"), ("JMSXGroupSeq", 1 << 40), ("JMSXGroupID", 3)):
            with pytest.raises(joms.MessageFormatException, match=name):
                sa.create_text_message("y").set_property(name, value)
        with pytest.raises(joms.MessageFormatException):  # the other JMSX names stay the provider's
            sa.create_text_message("y").set_property("JMSXUserID", "me")


def test_jmsx_delivery_count_counts_each_delivery_and_selectors_see_it(
    pair: list[LoopbackHost],
) -> None:
    """JMS 1.1 §3.5.9 (and the mapping in docs/joms.md): JMSXDeliveryCount is set by the
    provider on receive, 1 the first time, one more at each redelivery; it once never
    reached the client (None, and NULL in selectors)."""
    a, _ = pair
    with joms.connect(a.stomp_url) as c:
        s = c.create_session(transacted=True)
        q = s.create_queue(f"dcount{next(_fresh)}")
        s.create_producer(q).send(s.create_text_message("x"))
        s.commit()
        cons = s.create_consumer(q)
        seen = []
        for _ in range(3):
            m = cons.receive(5)
            seen.append((m.redelivered, m.get_property("JMSXDeliveryCount")))
            assert m.property_type("JMSXDeliveryCount") == "int"
            s.rollback()
        assert seen == [(False, 1), (True, 2), (True, 3)]
        assert cons.receive(5).get_property("JMSXDeliveryCount") == 4
        s.commit()
    with joms.connect(a.stomp_url) as c:
        s = c.create_session(ack_mode=joms.CLIENT_ACKNOWLEDGE)
        t = s.create_topic(f"dcount{next(_fresh)}")
        first = s.create_consumer(t, selector="JMSXDeliveryCount = 1")
        later = s.create_consumer(t, selector="JMSXDeliveryCount > 1")
        s.create_producer(t).send(s.create_text_message("y"))
        assert first.receive(5).get_property("JMSXDeliveryCount") == 1
        assert later.receive(0.3) is None
        s.recover()
        again = first.receive(5)
        assert again.redelivered and again.get_property("JMSXDeliveryCount") == 2
        again.acknowledge()
        # a queue's manager chooses the receiver by the count the message will have
        q = s.create_queue(f"dcount{next(_fresh)}")
        retry = s.create_consumer(q, selector="JMSXDeliveryCount > 1")
        s2 = c.create_session(ack_mode=joms.CLIENT_ACKNOWLEDGE)
        plain = s2.create_consumer(q)
        s.create_producer(q).send(s.create_text_message("z"))
        m = plain.receive(5)
        assert m.get_property("JMSXDeliveryCount") == 1 and retry.receive(0.3) is None
        # unacknowledged when its session closes (JMS 1.1 §4.5.2: a consumer's close alone
        # leaves it to the session): handed out again, to the retry consumer
        plain.close()
        s2.close()
        m = retry.receive(5)
        assert m.text == "z" and m.redelivered and m.get_property("JMSXDeliveryCount") == 2
        m.acknowledge()


def test_a_durable_consumer_closing_without_ack_counts_towards_the_dead_letter_limit(
    pair: list[LoopbackHost],
) -> None:
    """docs/joms.md "Poison messages": a consumer closing without acknowledging is a
    redelivery like a NACK — JMSXDeliveryCount goes up each time, and after
    max_redeliveries (6) the message goes to DLQ@H instead of an 8th delivery."""
    a, _ = pair
    n = next(_fresh)
    topic, client = f"/topic/dpoison{n}", f"dpoison{n}"
    sub = {"id": "d", "destination": topic, "ack": "client-individual",
           "durable-subscription-name": "keep"}  # fmt: skip

    def session() -> RawStomp:
        raw = RawStomp(a.stomp_address, headers={"client-id": client})
        raw.send("SUBSCRIBE", {**sub, "receipt": "sub"})
        raw.receipt("sub")
        return raw

    def leave(raw: RawStomp) -> None:  # DISCONNECT without acknowledging
        raw.send("DISCONNECT", {"receipt": "bye"})
        raw.receipt("bye")
        raw.close()

    leave(session())  # the subscription exists before the message is sent
    with RawStomp(a.stomp_address) as p:
        p.send("SEND", {"destination": topic, "receipt": "s"}, b"poison")
        p.receipt("s")
    counts = []
    for _ in range(7):
        raw = session()
        m = raw.next("MESSAGE")
        assert m.body == b"poison"
        counts.append((m.get("redelivered"), m.get("JMSXDeliveryCount")))
        leave(raw)
    assert counts == [(None, "1"), *(("true", str(i)) for i in range(2, 8))]
    with RawStomp(a.stomp_address) as d:
        d.send("SUBSCRIBE", {"id": "dlq", "destination": "/queue/DLQ"})
        dead = d.next("MESSAGE", **{"original-destination": topic})
        assert dead.body == b"poison"
    raw = session()
    assert [f.command for f in raw.quiet(0.5)] == []  # not an 8th time
    raw.send("UNSUBSCRIBE", {"id": "d", "durable-subscription-name": "keep", "receipt": "u"})
    leave(raw)


def test_redeliveries_on_a_receiving_host_count_at_the_queue_s_manager(
    pair: list[LoopbackHost],
) -> None:
    """Queue Q@api1 consumed on api2: the NACKs there raise JMSXDeliveryCount on api2; the
    consumer leaving without acknowledging gives the message back to the manager, which
    goes on counting from there (not from its own hand-outs), and dead-letters it after
    max_redeliveries (6) — docs/joms.md "JMSXDeliveryCount", "Poison messages"."""
    a, b = pair
    name = f"qpoison{next(_fresh)}"
    with RawStomp(a.stomp_address) as p:
        p.send("SEND", {"destination": f"/queue/{name}", "receipt": "s"}, b"poison")
        p.receipt("s")
    seen: list[str | None] = []
    for round_ in range(3):
        with RawStomp(b.stomp_address) as c:
            c.send("SUBSCRIBE", {"id": "q", "destination": f"/queue/{name}@api1",
                                 "ack": "client-individual"})  # fmt: skip
            for k in range(3 if round_ < 2 else 1):
                m = c.next("MESSAGE", timeout=15)
                assert m.body == b"poison"
                seen.append(m.get("JMSXDeliveryCount"))
                if k < 2:  # the last one of the round is left unacknowledged
                    c.send("NACK", {"id": m.get("ack") or "", "receipt": f"n{k}"})
                    c.receipt(f"n{k}")
            if round_ == 2:  # its 7th delivery, refused once more: dead-lettered
                assert [f.command for f in c.quiet(0.5)] == []
            c.send("DISCONNECT", {"receipt": "bye"})
            c.receipt("bye")
    assert seen == [str(i) for i in range(1, 8)]
    with RawStomp(a.stomp_address) as d:
        d.send("SUBSCRIBE", {"id": "dlq", "destination": "/queue/DLQ"})
        dead = d.next("MESSAGE", **{"original-destination": f"/queue/{name}@api1"})
        assert dead.body == b"poison"


@pytest.mark.parametrize("end", ["recover", "rollback"])
def test_after_recover_or_rollback_delivery_restarts_with_the_oldest_unacknowledged(
    pair: list[LoopbackHost], end: str
) -> None:
    """JMS 1.1 §4.4.11 / §4.4.7: after Session.recover() (rollback()) the consumer gets the
    messages it had received again first, in order, then those it had buffered but not
    received yet — each once."""
    a, b = pair
    with joms.connect(a.stomp_url) as ca, joms.connect(b.stomp_url) as cb:
        sa = ca.create_session()
        q = sa.create_queue(f"reorder{next(_fresh)}")
        prod = sa.create_producer(q)
        s = cb.create_session(
            transacted=end == "rollback",
            ack_mode=joms.CLIENT_ACKNOWLEDGE if end == "recover" else joms.AUTO_ACKNOWLEDGE,
        )
        cons = s.create_consumer(s.create_queue(f"{q.name}@api1"))
        prod.send(sa.create_text_message("warm"))  # the receiver is known to the manager
        warm = cons.receive(10)
        assert warm is not None and warm.text == "warm"
        s.commit() if end == "rollback" else warm.acknowledge()
        for i in range(6):
            prod.send(sa.create_text_message(f"m{i}"))
        first = [cons.receive(10) for _ in range(3)]
        assert [m.text if m else None for m in first] == ["m0", "m1", "m2"]
        # m3..m5 reach the consumer's buffer; the application has not received them
        assert wait_for(lambda: cons._inbox.qsize() >= 3)
        s.recover() if end == "recover" else s.rollback()
        again = [cons.receive(10) for _ in range(6)]
        got = [(m.text, m.redelivered, m.get_property("JMSXDeliveryCount")) for m in again if m]
        assert got == [
            *((f"m{i}", True, 2) for i in range(3)),
            *((f"m{i}", False, 1) for i in range(3, 6)),
        ]
        assert cons.receive(0.3) is None
        s.commit() if end == "rollback" else again[-1].acknowledge()


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_message_that_expires_in_the_consumer_s_buffer_is_not_received(
    loop: LoopThread, pair: list[LoopbackHost], kind: str
) -> None:
    """JMS 1.1 §3.4.9: a message whose expiration passed while it waited in the client's
    buffer is not handed to the application; it is settled (not redelivered later)."""
    a, b = pair
    with joms.connect(a.stomp_url) as ca, joms.connect(b.stomp_url) as cb:
        sa, sb = ca.create_session(), cb.create_session(ack_mode=joms.CLIENT_ACKNOWLEDGE)
        name = f"expiring{next(_fresh)}"
        if kind == "queue":
            dest, there = sa.create_queue(name), sb.create_queue(f"{name}@api1")
        else:
            dest, there = sa.create_topic(name), sb.create_topic(name)
        cons = sb.create_consumer(there)
        prod = sa.create_producer(dest)
        prod.send(sa.create_text_message("warm"))  # the consumer is known everywhere
        warm = cons.receive(10)
        assert warm is not None and warm.text == "warm"
        warm.acknowledge()
        short = sa.create_text_message("short-lived")
        prod.send(short, time_to_live=0.5)
        assert wait_for(lambda: cons._inbox.qsize() >= 1)  # buffered, not received
        assert wait_for(lambda: time.time() * 1000 > short.expiration + 50, timeout=5)
        prod.send(sa.create_text_message("fresh"))
        got = cons.receive(10)
        assert got is not None and got.text == "fresh" and cons.expired == 1
        got.acknowledge()

        def unacked() -> int:  # at the gateway's service: the expired one was settled
            svc = b.service
            infos = [svc.consumer_info(c) for c in list(svc._consumers)]
            mine = [i["unacked"] for i in infos if i["destination"] == str(there)]
            return sum(mine) if mine else -1  # (-1: the consumer is not found)

        assert wait_for(lambda: loop.run(unacked) == 0)
        assert cons.receive(0.3) is None
        if kind == "queue":
            assert wait_for(
                lambda: loop.run(lambda: a.service.queue_status(f"{name}@api1")["pending"]) == 0
            )
