"""JMS 1.1 behaviours of the Python API a Java developer porting an application relies on:
stop() waits for listeners, closed objects raise, property names are selector
identifiers, local refusals keep the connection, receive(0) blocks (one loopback daemon)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from joms_support import LoopThread, RawStomp, start_hosts

import joms
from joms.runtime import LoopbackHost


@pytest.fixture(scope="module")
def conformance_loop() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="module")
def host(conformance_loop: LoopThread) -> Iterator[LoopbackHost]:
    (h,) = start_hosts(conformance_loop, 1, prefix="conf")
    yield h
    conformance_loop.call(h.stop())


def test_stop_waits_for_a_listener_in_progress_and_none_runs_after(host: LoopbackHost) -> None:
    """JMS 1.1 §4.3.4: stop() blocks until listeners in progress complete."""
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("stop-waits")
        running = threading.Event()
        release = threading.Event()
        finished = threading.Event()
        calls: list[str] = []

        def slow(m: joms.Message) -> None:
            calls.append(m.text if isinstance(m, joms.TextMessage) else "?")
            running.set()
            release.wait(10)
            finished.set()

        s.create_consumer(t).message_listener = slow
        p = c.create_session().create_producer(t)
        p.send(s.create_text_message("first"))
        assert running.wait(5)
        stopper = threading.Thread(target=c.stop)
        stopper.start()
        stopper.join(0.3)
        assert stopper.is_alive()  # waits for the listener
        release.set()
        stopper.join(5)
        assert not stopper.is_alive() and finished.is_set()
        running.clear()
        p.send(s.create_text_message("second"))
        assert not running.wait(0.3)  # stopped: the listener is not called again
        assert calls == ["first"]
        c.start()
        assert running.wait(5) and calls == ["first", "second"]


def test_stop_from_a_listener_of_its_own_connection_raises(host: LoopbackHost) -> None:
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("stop-self")
        outcome: list[BaseException | None] = []
        done = threading.Event()

        def listener(_m: joms.Message) -> None:
            try:
                c.stop()
                outcome.append(None)
            except joms.JMSException as exc:
                outcome.append(exc)
            done.set()

        s.create_consumer(t).message_listener = listener
        s.create_producer(t).send(s.create_text_message("x"))
        assert done.wait(5)
        assert isinstance(outcome[0], joms.IllegalStateException)


def _raises_illegal_state(call: Callable[[], Any]) -> None:
    with pytest.raises(joms.IllegalStateException):
        call()


def test_every_method_of_a_closed_object_raises_illegal_state(host: LoopbackHost) -> None:
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("closed-objects")
        q = s.create_queue("closed-objects-q")
        cons = s.create_consumer(t)
        p = s.create_producer(t)
        p.close()
        p.close()  # idempotent
        _raises_illegal_state(lambda: p.send(s.create_text_message("after close")))
        browser = s.create_browser(q)
        browser.close()
        browser.close()
        _raises_illegal_state(browser.messages)
        _raises_illegal_state(lambda: list(browser))
        assert cons.receive(0.3) is None  # the closed producer sent nothing

        s2 = c.create_session()
        s2.close()
        s2.close()
        for call in (
            lambda: s2.create_text_message("x"),
            lambda: s2.create_bytes_message(b"x"),
            lambda: s2.create_map_message({}),
            lambda: s2.create_stream_message([]),
            lambda: s2.create_message(),
            lambda: s2.create_topic("x"),
            lambda: s2.create_queue("x"),
            lambda: s2.create_producer(t),
            lambda: s2.create_consumer(t),
            lambda: s2.create_browser(q),
            lambda: s2.create_temporary_queue(),
            lambda: s2.create_durable_subscriber(t, "d"),
            lambda: s2.unsubscribe("d"),
            s2.acknowledge,
            s2.recover,
        ):
            _raises_illegal_state(call)
    c.close()  # idempotent
    for call in (c.stop, c.start, lambda: c.create_session(), c.destinations):
        _raises_illegal_state(call)
    _raises_illegal_state(lambda: s.create_text_message("x"))
    _raises_illegal_state(lambda: cons.receive(0.1))
    _raises_illegal_state(lambda: cons.message_listener)


_NOT_IDENTIFIERS = ["AND", "or", "NULL", "TRUE", "false", "ESCAPE", "a-b", "1abc", "a.b", "x y"]


@pytest.mark.parametrize("name", _NOT_IDENTIFIERS)
def test_a_property_name_that_is_not_a_selector_identifier_is_refused(name: str) -> None:
    """JMS 1.1 §3.5.1: property names obey the selector identifier rules (``a-b = 1``
    would read as arithmetic, ``AND`` as the operator)."""
    m = joms.TextMessage("x")
    with pytest.raises(joms.MessageFormatException):
        m.set_property(name, 1)
    with pytest.raises(joms.MessageFormatException):
        m.set_string_property(name, "v")
    with pytest.raises(joms.MessageFormatException):
        joms.TextMessage("x", properties={name: 1})
    assert m.properties == {}
    for ok in ("a_b", "$x", "été", "JMSXGroupID"):
        m.set_property(ok, "v")


def test_a_raw_stomp_header_that_is_no_identifier_still_arrives_as_a_property(
    host: LoopbackHost,
) -> None:
    """STOMP header names are free: what a raw client or a bridge sends is carried (readable
    with get_property, though no selector can name it)."""
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("raw-names")
        cons = s.create_consumer(t)
        with RawStomp(host.stomp_address) as raw:
            raw.send(
                "SEND",
                {"destination": "/topic/raw-names", "a-b": "1", "x.y": "2", "receipt": "r"},
                b"hi",
            )
            raw.receipt("r")
        got = cons.receive(5)
        assert got is not None
        assert got.get_property("a-b") == "1" and got.get_property("x.y") == "2"


def test_a_raw_send_without_content_type_is_bytes_whatever_its_body(host: LoopbackHost) -> None:
    """STOMP 1.2: no content-type means a binary blob. The type no longer depends on
    whether the bytes happen to decode as UTF-8; ``text/*`` (or joms-body-type) says text."""
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        cons = s.create_consumer(s.create_topic("no-ctype"))
        with RawStomp(host.stomp_address) as raw:
            raw.send("SUBSCRIBE", {"id": "1", "destination": "/topic/no-ctype"})
            sent = [
                ({}, b"\x00\x01\x02\x03"),
                ({}, b"\x00\x01\x02\xff"),
                ({}, b"plain text"),
                ({"content-type": "text/plain"}, "été".encode()),
                ({"joms-null-text": "true"}, b""),
            ]
            for i, (headers, body) in enumerate(sent):
                h = {"destination": "/topic/no-ctype", "receipt": f"r{i}", **headers}
                raw.send("SEND", h, body)
                raw.receipt(f"r{i}")
            got = [cons.receive(5) for _ in sent]
            raw_got = [raw.next("MESSAGE") for _ in sent]
        for m in got[:3]:
            assert isinstance(m, joms.BytesMessage)
        assert [m.data for m in got[:3]] == [body for _, body in sent[:3]]  # type: ignore[union-attr]
        assert isinstance(got[3], joms.TextMessage) and got[3].text == "été"
        assert isinstance(got[4], joms.TextMessage) and got[4].text is None
        assert [f.get("content-type") for f in raw_got[:3]] == ["application/octet-stream"] * 3


@pytest.mark.parametrize("case", ["unsubscribe active", "duplicate durable"])
def test_a_refusal_the_client_can_see_raises_locally_and_keeps_the_connection(
    host: LoopbackHost, case: str
) -> None:
    """Unsubscribing a durable subscription that a consumer of this connection uses
    (IllegalStateException, JMS javadoc), or a second subscriber of one durable name on
    this connection (JMSException), raise without a frame: no ERROR, the connection, its
    other consumers and the exception listener are untouched."""
    with joms.connect(host.stomp_url, client_id=f"conf-{case.replace(' ', '-')}") as c:
        errors: list[joms.JMSException] = []
        c.exception_listener = errors.append
        s = c.create_session()
        other_topic = s.create_topic(f"other-{case.replace(' ', '-')}")
        other = s.create_consumer(other_topic)
        t = s.create_topic("durable-local")
        sub = s.create_durable_subscriber(t, "dur")
        if case == "unsubscribe active":
            with pytest.raises(joms.IllegalStateException):
                s.unsubscribe("dur")
        else:
            with pytest.raises(joms.JMSException):
                s.create_durable_subscriber(t, "dur")
            with pytest.raises(joms.JMSException):
                c.create_session().create_durable_subscriber(t, "dur")
        s.create_producer(other_topic).send(s.create_text_message("alive"))
        got = other.receive(5)
        assert got is not None and got.text == "alive"  # type: ignore[attr-defined]
        sub.close()
        again = s.create_durable_subscriber(t, "dur")  # free once closed
        again.close()
        s.unsubscribe("dur")
        assert errors == []


def test_receive_zero_blocks_like_receive_none(host: LoopbackHost) -> None:
    """JMS: a timeout of zero never expires; receive_no_wait() is the non-blocking call."""
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic("receive-zero")
        cons = s.create_consumer(t)
        assert cons.receive_no_wait() is None
        got: list[joms.Message | None] = []
        receiver = threading.Thread(target=lambda: got.append(cons.receive(0)))
        receiver.start()
        receiver.join(0.3)
        assert receiver.is_alive() and got == []  # still waiting
        s.create_producer(t).send(s.create_text_message("late"))
        receiver.join(5)
        assert not receiver.is_alive()
        assert got[0] is not None and got[0].text == "late"  # type: ignore[attr-defined]


def test_a_new_stream_message_is_write_only_until_reset() -> None:
    m = joms.StreamMessage([1, "x"])
    with pytest.raises(joms.MessageNotReadableException):
        m.read()
    m.reset()
    assert [m.read(), m.read()] == [1, "x"]
    with pytest.raises(joms.MessageNotWriteableException):
        m.write(2)  # reset made the body read-only
    m.clear_body()
    m.write(3)
    with pytest.raises(joms.MessageNotReadableException):
        m.read()


@pytest.mark.parametrize("name", [1, "", None, b"k"])
def test_a_map_name_must_be_a_non_empty_str(name: Any) -> None:
    with pytest.raises(joms.MessageFormatException, match="map name"):
        joms.MapMessage({name: "a"})
    with pytest.raises(joms.MessageFormatException, match="map name"):
        joms.MapMessage().set(name, "a")


def test_a_none_map_or_stream_value_is_refused_naming_what_it_is() -> None:
    with pytest.raises(joms.MessageFormatException, match="map value"):
        joms.MapMessage({"k": None})
    with pytest.raises(joms.MessageFormatException, match="stream value"):
        joms.StreamMessage([None])


@pytest.mark.parametrize("value", [1e300, -3.5e38, 10**40])
def test_a_float_beyond_a_java_float_is_refused(value: float) -> None:
    m = joms.TextMessage("x")
    with pytest.raises(joms.MessageFormatException, match="float"):
        m.set_float_property("f", value)
    with pytest.raises(joms.MessageFormatException, match="float"):
        joms.MapMessage().set("f", value, "float")
    m.set_double_property("d", value)  # a double holds it
    m.set_float_property("f", 3.4028234663852886e38)
    m.set_float_property("inf", float("inf"))
    assert m.get_property("d") == value and m.property_type("f") == "float"


def test_typed_property_getters_convert_as_jms_1_1_3_5_4() -> None:
    m = joms.TextMessage("x", properties={"flag": True, "n": 7, "d": 2.5, "s": "42"})
    m.set_property("b", 3, "byte")
    m.set_float_property("f", 1.5)
    assert m.get_int_property("n") == 7 and m.get_long_property("b") == 3
    assert m.get_short_property("b") == 3 and m.get_int_property("s") == 42
    assert m.get_double_property("f") == 1.5 and m.get_float_property("f") == 1.5
    assert m.get_string_property("flag") == "true" and m.get_string_property("d") == "2.5"
    assert m.get_boolean_property("flag") is True and m.get_boolean_property("s") is False
    assert m.get_object_property("n") == 7 and m.get_object_property("none") is None
    assert m.property_exists("s") and not m.property_exists("none")
    assert m.get_string_property("none") is None and m.get_boolean_property("none") is False
    for getter, name in [
        (m.get_int_property, "d"),  # double -> int: no such conversion
        (m.get_int_property, "flag"),
        (m.get_float_property, "d"),  # double -> float narrows
        (m.get_boolean_property, "n"),
        (m.get_long_property, "f"),
        (m.get_byte_property, "n"),  # int -> byte narrows
    ]:
        with pytest.raises(joms.MessageFormatException) as exc:
            getter(name)
        assert not isinstance(exc.value, joms.NumberFormatException)
    for getter, name in [(m.get_int_property, "none"), (m.get_double_property, "none")]:
        with pytest.raises(joms.NumberFormatException):
            getter(name)


def test_string_properties_from_a_raw_stomp_client_read_as_numbers_and_booleans(
    host: LoopbackHost,
) -> None:
    """Properties a raw STOMP client sends without joms-types arrive as strings; the typed
    getters parse them as Java does (Integer.valueOf, Double.valueOf, Boolean.valueOf)."""
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        cons = s.create_consumer(s.create_topic("typed-raw"))
        props = {
            "count": "-12",
            "ratio": "2.5e3",
            "ok": "TRUE",
            "big": "9999999999",
            "word": "4x",
            "spaced": " 5",
            "single": "1.5f",
        }
        with RawStomp(host.stomp_address) as raw:
            raw.send("SEND", {"destination": "/topic/typed-raw", "receipt": "r", **props}, b"")
            raw.receipt("r")
        m = cons.receive(5)
        assert m is not None and m.property_type("count") == "string"
        assert m.get_int_property("count") == -12 and m.get_long_property("big") == 9999999999
        assert m.get_double_property("ratio") == 2500.0 and m.get_float_property("single") == 1.5
        assert m.get_boolean_property("ok") is True and m.get_boolean_property("word") is False
        for getter, name in [
            (m.get_int_property, "big"),  # beyond an int
            (m.get_int_property, "word"),
            (m.get_int_property, "spaced"),  # Integer.valueOf does not trim
            (m.get_double_property, "word"),
            (m.get_int_property, "ratio"),
        ]:
            with pytest.raises(joms.NumberFormatException):
                getter(name)
        with pytest.raises(ValueError):
            m.get_long_property("word")
