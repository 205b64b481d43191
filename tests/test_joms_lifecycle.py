"""The life cycle of JMS consumers and sessions in the Python API: closing, listeners,
acknowledging after a close, closed sessions (JMS 1.1 §4.3.5, §4.4.1, §4.5.2, §4.4.7)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest
from joms_support import LoopThread, start_hosts, wait_for

import joms
from joms.runtime import LoopbackHost


@pytest.fixture(scope="module")
def host() -> Iterator[LoopbackHost]:
    lt = LoopThread()
    (h,) = start_hosts(lt, 1, prefix="life")
    yield h
    lt.call(h.stop())
    lt.close()


_names = iter(range(1_000_000))


def _name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


def _blocked_receive(k: joms.MessageConsumer) -> tuple[threading.Thread, queue.Queue]:
    """A thread blocked in ``k.receive()`` (no timeout); its outcome goes to the queue."""
    out: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            out.put(("returned", k.receive()))
        except Exception as exc:  # reported to the test
            out.put(("raised", exc))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    # waiting on the buffer (no message will come): nothing to await but the wait itself
    assert wait_for(lambda: len(k._inbox.not_empty._waiters) > 0, 5.0)  # type: ignore[attr-defined]
    return th, out


def _alive(c: joms.Connection) -> None:
    """The connection still works (nothing closed it behind the caller's back)."""
    s = c.create_session()
    s.create_producer(s.create_topic(_name("alive"))).send(s.create_text_message("x"))
    s.close()


def _left_in(h: LoopbackHost, q: str, wait: float = 0.5) -> list[str]:
    """Texts a fresh consumer of queue ``q`` gets (until ``wait`` s without one)."""
    with joms.connect(h.stomp_url) as c:
        k = c.create_session().create_consumer(joms.Queue(q))
        out = []
        while (m := k.receive(wait)) is not None:
            out.append((m.text, m.redelivered))
        return out


# ---------------------------------------------------------------- D2: blocked receive


@pytest.mark.parametrize("how", ["consumer", "connection"])
def test_a_blocked_receive_returns_none_when_closed(host: LoopbackHost, how: str) -> None:
    c = joms.connect(host.stomp_url)
    s = c.create_session()
    k = s.create_consumer(s.create_topic(_name("quiet")))
    th, out = _blocked_receive(k)
    (k.close if how == "consumer" else c.close)()
    assert out.get(timeout=5) == ("returned", None)
    th.join(5)
    c.close()


def test_a_blocked_receive_on_a_stopped_connection_returns_none_when_closed(
    host: LoopbackHost,
) -> None:
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        k = s.create_consumer(s.create_topic(_name("quiet")))
        c.stop()
        out: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: out.put(k.receive()), daemon=True).start()
        with pytest.raises(queue.Empty):  # stopped: it waits
            out.get(timeout=0.2)
        k.close()
        assert out.get(timeout=5) is None


def test_receive_on_a_closed_consumer_or_connection_raises(host: LoopbackHost) -> None:
    c = joms.connect(host.stomp_url)
    s = c.create_session()
    k1 = s.create_consumer(s.create_topic(_name("t")))
    k2 = s.create_consumer(s.create_topic(_name("t")))
    k1.close()
    with pytest.raises(joms.IllegalStateException):
        k1.receive(0.1)
    c.close()
    with pytest.raises(joms.IllegalStateException):
        k2.receive(0.1)


# ---------------------------------------------------------------- D3: listener = None


def test_removing_the_listener_leaves_messages_to_receive(host: LoopbackHost) -> None:
    qn = _name("LQ")
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        q = s.create_queue(qn)
        k = s.create_consumer(q)
        got: queue.Queue = queue.Queue()
        k.message_listener = got.put
        p = s.create_producer(q)
        p.send(s.create_text_message("first"))
        assert got.get(timeout=5).text == "first"
        k.message_listener = None
        for i in range(3):
            p.send(s.create_text_message(f"m{i}"))
        texts = [m.text if (m := k.receive(5)) else None for _ in range(3)]
        assert texts == ["m0", "m1", "m2"]
        assert got.empty()
        # and a listener set again takes over
        k.message_listener = got.put
        p.send(s.create_text_message("again"))
        assert got.get(timeout=5).text == "again"
        _alive(c)


# ---------------------------------------------------------------- D4: close vs listener


def test_close_waits_for_the_running_listener(host: LoopbackHost) -> None:
    qn = _name("SLQ")
    c = joms.connect(host.stomp_url)
    s = c.create_session()
    q = s.create_queue(qn)
    k = s.create_consumer(q)
    started, release = threading.Event(), threading.Event()
    done: list[str] = []

    def slow(m: joms.Message) -> None:
        started.set()
        release.wait(10)
        done.append(m.text)  # type: ignore[attr-defined]

    k.message_listener = slow
    s.create_producer(q).send(s.create_text_message("job"))
    assert started.wait(5)
    closer = threading.Thread(target=k.close, daemon=True)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() returned while the listener was running"
    release.set()
    closer.join(5)
    assert not closer.is_alive() and done == ["job"]
    _alive(c)
    assert c._transport.failed is None
    c.close()
    assert _left_in(host, qn) == []  # processed and acknowledged once


def test_a_listener_may_close_its_own_consumer(host: LoopbackHost) -> None:
    qn = _name("SCQ")
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        q = s.create_queue(qn)
        k = s.create_consumer(q)
        done: queue.Queue = queue.Queue()

        def once(m: joms.Message) -> None:
            k.close()  # returns at once; the close completes when this listener returns
            done.put(m.text)  # type: ignore[attr-defined]

        k.message_listener = once
        p = s.create_producer(q)
        p.send(s.create_text_message("one"))
        assert done.get(timeout=5) == "one"
        assert wait_for(lambda: k._listener_thread is None or not k._listener_thread.is_alive())
        p.send(s.create_text_message("two"))
        _alive(c)
    assert _left_in(host, qn) == [("two", False)]


def _job_to_a_listener_that_closes(
    c: joms.Connection, mode: str, qn: str, closing: str
) -> tuple[joms.Session, joms.Message]:
    """Queue ``qn`` holds one message "job"; a consumer of a ``mode`` session (transacted
    or CLIENT_ACKNOWLEDGE) gets it in a listener that closes its ``closing`` ("consumer"
    or "session") first. Returns once the listener has ended: the session and message."""
    s = c.create_session(transacted=mode == "transacted", ack_mode=joms.CLIENT_ACKNOWLEDGE)
    q = s.create_queue(qn)
    s.create_producer(q).send(s.create_text_message("job"))
    if s.transacted:
        s.commit()
    k = s.create_consumer(q)
    done: queue.Queue = queue.Queue()

    def once(m: joms.Message) -> None:
        (k if closing == "consumer" else s).close()
        done.put(m)

    k.message_listener = once
    m = done.get(timeout=5)
    assert wait_for(lambda: k._listener_thread is None or not k._listener_thread.is_alive())
    return s, m


@pytest.mark.parametrize("mode", ["transacted", "client"])
def test_a_listener_closing_its_own_consumer_leaves_its_message_to_the_session(
    host: LoopbackHost, mode: str
) -> None:
    """The message a listener got before closing its own consumer is the session's to
    settle, as after a close from another thread: it used to be given back at once (the
    commit then found nothing, the acknowledge named a gone subscription and killed the
    connection), and came again."""
    qn = _name("LCQ")
    with joms.connect(host.stomp_url) as c:
        s, m = _job_to_a_listener_that_closes(c, mode, qn, "consumer")
        if s.transacted:
            s.commit()
        else:
            m.acknowledge()
        _alive(c)
    assert _left_in(host, qn) == []


@pytest.mark.parametrize("mode", ["transacted", "client"])
def test_a_listener_closing_its_session_gives_its_message_back_as_redelivered(
    host: LoopbackHost, mode: str
) -> None:
    """Closing the session from a listener sends the message it holds back for redelivery
    (JMSRedelivered, counted), as a close from another thread does; it used to go back as
    never delivered."""
    qn = _name("LSQ")
    with joms.connect(host.stomp_url) as c:
        _, m = _job_to_a_listener_that_closes(c, mode, qn, "session")
        assert m.text == "job"  # type: ignore[attr-defined]
        _alive(c)
    assert _left_in(host, qn) == [("job", True)]


def test_closing_the_connection_from_a_listener_raises(host: LoopbackHost) -> None:
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        t = s.create_topic(_name("t"))
        k = s.create_consumer(t)
        out: queue.Queue = queue.Queue()

        def closes(m: joms.Message) -> None:
            try:
                c.close()
                out.put(None)
            except joms.JMSException as exc:
                out.put(exc)

        k.message_listener = closes
        s.create_producer(t).send(s.create_text_message("x"))
        assert isinstance(out.get(timeout=5), joms.IllegalStateException)
        _alive(c)


# ---------------------------------------------------------------- D5: after a close


def test_acknowledge_after_the_consumer_closed(host: LoopbackHost) -> None:
    qn = _name("AQ")
    with joms.connect(host.stomp_url) as c:
        s = c.create_session(ack_mode=joms.CLIENT_ACKNOWLEDGE)
        q = s.create_queue(qn)
        s.create_producer(q).send(s.create_text_message("x"))
        k = s.create_consumer(q)
        m = k.receive(5)
        assert m is not None
        k.close()
        m.acknowledge()  # JMS 1.1 §4.5.2: the session acknowledges what it consumed
        _alive(c)
    assert _left_in(host, qn) == []


def test_recover_after_the_consumer_closed(host: LoopbackHost) -> None:
    qn = _name("RQ")
    with joms.connect(host.stomp_url) as c:
        s = c.create_session(ack_mode=joms.CLIENT_ACKNOWLEDGE)
        q = s.create_queue(qn)
        s.create_producer(q).send(s.create_text_message("x"))
        k = s.create_consumer(q)
        assert k.receive(5) is not None
        k.close()
        s.recover()
        _alive(c)
    assert _left_in(host, qn) == [("x", True)]


@pytest.mark.parametrize(
    "op", ["acknowledge", "message.acknowledge", "recover", "commit", "rollback"]
)
def test_a_closed_session_raises_locally(host: LoopbackHost, op: str) -> None:
    with joms.connect(host.stomp_url) as c:
        tx = op in ("commit", "rollback")
        s = c.create_session(transacted=tx, ack_mode=joms.CLIENT_ACKNOWLEDGE)
        t = s.create_topic(_name("cs"))
        k = s.create_consumer(t)
        s.create_producer(t).send(s.create_text_message("x"))
        if tx:
            s.commit()
        m = k.receive(5)
        assert m is not None
        s.close()
        call = m.acknowledge if op == "message.acknowledge" else getattr(s, op)
        with pytest.raises(joms.IllegalStateException):
            call()
        _alive(c)


# ---------------------------------------------------------------- D6: transactions


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_a_transaction_covers_messages_of_a_closed_consumer(host: LoopbackHost, end: str) -> None:
    qn = _name("TQ")
    with joms.connect(host.stomp_url) as c:
        s = c.create_session(transacted=True)
        q = s.create_queue(qn)
        s.create_producer(q).send(s.create_text_message("job"))
        s.commit()
        k = s.create_consumer(q)
        m = k.receive(5)
        assert m is not None and not m.redelivered
        k.close()
        getattr(s, end)()
        _alive(c)
    assert _left_in(host, qn) == ([] if end == "commit" else [("job", True)])


# ---------------------------------------------------------------- D7: DUPS_OK


def test_dups_ok_gives_back_what_it_buffered(host: LoopbackHost) -> None:
    qn = _name("DQ")
    with joms.connect(host.stomp_url) as c:
        s = c.create_session(ack_mode=joms.DUPS_OK_ACKNOWLEDGE)
        q = s.create_queue(qn)
        p = s.create_producer(q)
        for i in range(5):
            p.send(s.create_text_message(f"m{i}"))
        k = s.create_consumer(q)
        m = k.receive(5)
        assert m is not None and m.text == "m0"
        assert wait_for(lambda: k._inbox.qsize() >= 4)
        k.close()
    assert _left_in(host, qn) == [(f"m{i}", False) for i in range(1, 5)]


# ---------------------------------------------------------------- D10: temporary


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_deleting_a_temporary_destination_in_use_raises(host: LoopbackHost, kind: str) -> None:
    with joms.connect(host.stomp_url) as c:
        s = c.create_session()
        tmp = s.create_temporary_queue() if kind == "queue" else s.create_temporary_topic()
        k = c.create_session().create_consumer(tmp)  # another session of the connection
        with pytest.raises(joms.JMSException):
            tmp.delete()
        s.create_producer(tmp).send(s.create_text_message("still here"))
        m = k.receive(5)
        assert m is not None and m.text == "still here"  # type: ignore[attr-defined]
        k.close()
        tmp.delete()
        _alive(c)
