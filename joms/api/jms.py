"""The JMS-shaped Python API: connections, sessions, producers and consumers over STOMP.

Mirrors JMS 1.1 (``javax.jms``) with Python names: ``connect()`` gives a
:class:`Connection`; a :class:`Session` creates destinations, messages, producers and
consumers; acknowledge modes AUTO, CLIENT and DUPS_OK and transacted sessions map onto
STOMP ack modes and transactions as described in docs/joms.md. Selectors and property names
are checked locally first, so a bad one raises without closing the connection.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .. import selector as selector_lang
from ..errors import IllegalStateException, InvalidDestinationException, JMSException
from ..service.wildcards import is_wildcard
from ..stomp.frame import Frame
from .messages import (
    NON_PERSISTENT,
    PERSISTENT,
    BytesMessage,
    Destination,
    MapMessage,
    Message,
    Queue,
    StreamMessage,
    TemporaryQueue,
    TemporaryTopic,
    TextMessage,
    Topic,
    from_frame,
    to_frame,
)
from .transport import StompTransport, parse_url

log = logging.getLogger(__name__)

AUTO_ACKNOWLEDGE = 1
CLIENT_ACKNOWLEDGE = 2
DUPS_OK_ACKNOWLEDGE = 3
SESSION_TRANSACTED = 0
DEFAULT_PRIORITY = 4
DEFAULT_TIME_TO_LIVE = 0.0

_CLOSED = object()
_WAKE = object()  # wakes a listener thread that is told to stop
_DUPS_OK_BATCH = 64
"""DUPS_OK_ACKNOWLEDGE acknowledges lazily: at most this many messages handed over before
one (cumulative) ACK, sooner when nothing more waits in the consumer's buffer."""
_local = threading.local()  # .consumer: the consumer whose listener runs on this thread


def connect(
    url: str = "stomp://127.0.0.1:61613",
    *,
    client_id: str | None = None,
    login: str | None = None,
    passcode: str | None = None,
    timeout: float = 10.0,
    start: bool = True,
) -> Connection:
    """Open a connection to a JOMS daemon's STOMP gateway (started unless ``start=False``)."""
    host, port = parse_url(url)
    conn = Connection(
        host, port, client_id=client_id, login=login, passcode=passcode, timeout=timeout
    )
    if start:
        conn.start()
    return conn


class Connection:
    """A client connection (JMS Connection): creates sessions; start/stop gate delivery."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str | None = None,
        login: str | None = None,
        passcode: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.client_id = client_id
        self._subs: dict[str, MessageConsumer] = {}
        self._sessions: list[Session] = []
        self._ids = itertools.count(1)
        self._started = threading.Event()
        self._wake = threading.Condition()  # notified on start, close and consumer close
        self._closed = False
        self.exception_listener: Callable[[JMSException], None] | None = None
        self._transport = StompTransport(
            host, port, on_message=self._on_message, on_error=self._on_error, timeout=timeout
        )
        headers: dict[str, str] = {}
        if client_id:
            headers["client-id"] = client_id
        if login is not None:
            headers["login"] = login
            headers["passcode"] = passcode or ""
        connected = self._transport.connect(headers)
        self.host_id: str | None = connected.headers.get("joms-host") or None
        """The host of the gateway (its CONNECTED ``joms-host``; None from another server)."""

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def create_session(self, transacted: bool = False, ack_mode: int = AUTO_ACKNOWLEDGE) -> Session:
        self._check()
        s = Session(self, transacted, SESSION_TRANSACTED if transacted else ack_mode)
        self._sessions.append(s)
        return s

    def destinations(self, timeout: float = 10.0) -> dict[str, list[str]]:
        """Queues (``Name@HOST``) and topics the connected host knows (its directory)."""
        self._check()
        sid = self._next_id("dir")
        box: queue.Queue[Frame] = queue.Queue()

        class _Once:
            def _arrived(self, f: Frame) -> None:
                box.put(f)

        self._subs[sid] = _Once()  # type: ignore[assignment]
        try:
            self._transport.request(
                Frame("SUBSCRIBE", {"id": sid, "destination": "/joms/destinations"})
            )
            f = box.get(timeout=timeout)
            self._transport.send(Frame("UNSUBSCRIBE", {"id": sid}))
        except queue.Empty:
            raise JMSException("no directory answer from the daemon") from None
        finally:
            self._subs.pop(sid, None)
        data = json.loads(f.body)
        return {"queues": list(data.get("queues", [])), "topics": list(data.get("topics", []))}

    def start(self) -> None:
        """Start (or resume) delivery to consumers."""
        self._check()
        self._started.set()
        self._notify()

    def stop(self) -> None:
        """Pause delivery; messages wait in the consumers' buffers (JMS 1.1 §4.3.4).

        Blocks until every ``receive()`` hand-over and message listener of this connection
        in progress has completed; once it returns no listener is called and ``receive()``
        hands nothing over until ``start()``. Calling it from a message listener of this
        connection raises IllegalStateException (it would wait for that very listener)."""
        self._check()
        running = getattr(_local, "consumer", None)
        if running is not None and running.session.connection is self:
            raise IllegalStateException("a message listener may not stop its own connection")
        self._started.clear()
        for s in list(self._sessions):
            for c in list(s._consumers):
                with c._handing:  # waits for a hand-over in progress; the next sees stopped
                    pass

    def close(self) -> None:
        """Close the sessions (waiting for listeners in progress), then the connection.

        Blocked ``receive()`` calls return None. Calling it from a message listener of this
        connection raises IllegalStateException (it would wait for that very listener)."""
        if self._closed:
            return
        running = getattr(_local, "consumer", None)
        if running is not None and running.session.connection is self:
            raise IllegalStateException("a message listener may not close its own connection")
        for s in list(self._sessions):
            s.close()
        self._closed = True
        self._started.set()
        self._notify()
        self._transport.close()

    def _durable_in_use(self, name: str) -> bool:
        """Whether a consumer of this connection still holds durable subscription ``name``
        (open, or closed but its subscription kept for messages its session holds)."""
        return any(
            c._durable == name for s in list(self._sessions) for c in [*s._consumers, *s._lingering]
        )

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def _check(self) -> None:
        if self._closed:
            raise IllegalStateException("the connection is closed")
        if self._transport.failed is not None:
            raise self._transport.closed_error()

    def _on_message(self, f: Frame) -> None:
        cons = self._subs.get(f.headers.get("subscription", ""))
        if cons is not None:
            cons._arrived(f)

    def _on_error(self, exc: JMSException) -> None:
        for cons in list(self._subs.values()):
            cons._inbox.put(_CLOSED)
        if self.exception_listener is not None:
            self.exception_listener(exc)


class Session:
    """A single-threaded context for producing and consuming (JMS Session)."""

    def __init__(self, conn: Connection, transacted: bool, ack_mode: int) -> None:
        if ack_mode not in (
            AUTO_ACKNOWLEDGE,
            CLIENT_ACKNOWLEDGE,
            DUPS_OK_ACKNOWLEDGE,
            SESSION_TRANSACTED,
        ):
            raise JMSException(f"unknown acknowledge mode {ack_mode}")
        self.connection = conn
        self.transacted = transacted
        self.ack_mode = ack_mode
        self._consumers: list[MessageConsumer] = []
        self._unacked: list[tuple[str, str]] = []  # (subscription, ack id), CLIENT mode
        self._tx_acks: dict[str, list[str]] = {}  # subscription -> ack ids, this transaction
        self._mids: dict[str, str] = {}  # ack id -> message id, of _unacked and _tx_acks
        self._lingering: list[MessageConsumer] = []
        """Consumers closed while this session still held messages of theirs (CLIENT mode
        unacknowledged, or acknowledged in the open transaction): their UNSUBSCRIBE waits
        until acknowledge/recover, commit/rollback or close settles those messages."""
        self._closed = False
        self._lock = threading.RLock()
        self._tx: str | None = None
        if transacted:
            self._begin()

    # ------------------------------------------------------------------ factories
    def create_queue(self, name: str) -> Queue:
        """A queue reference: ``Name`` (managed by the connected host, which creates it on
        first send or subscribe) or ``Name@HOST`` (managed by HOST)."""
        from ..service.model import check_destination_name

        self._check_open()
        check_destination_name(name if "@" in name else f"{name}@local", queue=True)
        return Queue(name)

    def create_topic(self, name: str) -> Topic:
        from ..service.model import check_destination_name

        self._check_open()
        check_destination_name(name, queue=False)
        return Topic(name)

    def create_temporary_queue(self) -> TemporaryQueue:
        self._check()
        tq = TemporaryQueue(self.connection._next_id(f"tmp-{id(self):x}-"), self._delete_temp)
        # subscribing creates it; the subscription is the connection's own receiver
        return tq

    def create_temporary_topic(self) -> TemporaryTopic:
        """A topic of this connection (JMS TemporaryTopic): others may publish to it (e.g. as
        JMSReplyTo), only this connection may subscribe; gone with the connection."""
        self._check()
        return TemporaryTopic(self.connection._next_id(f"tmpt-{id(self):x}-"), self._delete_temp)

    def _delete_temp(self, tq: TemporaryQueue | TemporaryTopic) -> None:
        # JMS: "If there are existing receivers still using it, a JMSException will be
        # thrown". Only this connection may consume it, so what it knows is the whole story.
        self._check()
        for c in self.connection._subs.values():
            if isinstance(c, MessageConsumer) and not c._closed and c.destination == tq:
                raise IllegalStateException(f"{tq} still has a consumer: close it first")

    def create_text_message(
        self, text: str | None = None, properties: dict[str, Any] | None = None
    ) -> TextMessage:
        self._check_open()
        return TextMessage(text, properties)

    def create_bytes_message(
        self, data: bytes = b"", properties: dict[str, Any] | None = None
    ) -> BytesMessage:
        self._check_open()
        return BytesMessage(data, properties)

    def create_map_message(
        self, values: dict[str, Any] | None = None, properties: dict[str, Any] | None = None
    ) -> MapMessage:
        self._check_open()
        return MapMessage(values, properties)

    def create_stream_message(
        self, items: list[Any] | None = None, properties: dict[str, Any] | None = None
    ) -> StreamMessage:
        self._check_open()
        return StreamMessage(items, properties)

    def create_message(self, properties: dict[str, Any] | None = None) -> BytesMessage:
        self._check_open()
        return BytesMessage(b"", properties)

    def create_producer(self, destination: Destination | None = None) -> MessageProducer:
        self._check()
        return MessageProducer(self, destination)

    def create_consumer(
        self, destination: Destination, selector: str | None = None, no_local: bool = False
    ) -> MessageConsumer:
        return self._consumer(destination, selector, no_local, None)

    def create_durable_subscriber(
        self, topic: Topic, name: str, selector: str | None = None, no_local: bool = False
    ) -> MessageConsumer:
        self._check()
        if not isinstance(topic, Topic):
            raise InvalidDestinationException("durable subscriptions are for topics")
        if not self.connection.client_id:
            raise IllegalStateException("durable subscriptions need a connection client_id")
        if self.connection._durable_in_use(name):
            # refused here: the gateway's ERROR would close the connection (STOMP)
            raise JMSException(
                f"durable subscription {name!r} already has an active subscriber on this "
                "connection: close it first"
            )
        return self._consumer(topic, selector, no_local, name)

    def create_browser(self, queue_: Queue, selector: str | None = None) -> QueueBrowser:
        """A JMS QueueBrowser: look at the messages waiting in a queue without consuming
        them (the connected host must be the queue's manager)."""
        self._check()
        if not isinstance(queue_, Queue):
            raise InvalidDestinationException("a browser is for queues")
        if selector:
            selector_lang.parse(selector)  # raises InvalidSelectorException locally
        _, at, manager = queue_.name.rpartition("@")
        here = self.connection.host_id
        if at and here is not None and manager != here:
            # refused here: the gateway's ERROR would close the connection (STOMP)
            raise InvalidDestinationException(
                f"{queue_} is managed by {manager}: browse it through that host's gateway"
            )
        return QueueBrowser(self, queue_, selector)

    def unsubscribe(self, name: str) -> None:
        """Delete durable subscription ``name`` of this client id."""
        self._check()
        if not self.connection.client_id:
            raise IllegalStateException("durable subscriptions need a connection client_id")
        if self.connection._durable_in_use(name):
            # JMS: an active subscriber (or unacknowledged messages of it) is an error;
            # refused here: the gateway's ERROR would close the connection (STOMP)
            raise IllegalStateException(
                f"durable subscription {name!r} has an active subscriber (or messages not "
                "acknowledged yet) on this connection: close it (and acknowledge) first"
            )
        sid = self.connection._next_id("u")
        self._request(Frame("UNSUBSCRIBE", {"id": sid, "durable-subscription-name": name}))

    def _consumer(
        self, dest: Destination, selector: str | None, no_local: bool, durable: str | None
    ) -> MessageConsumer:
        self._check()
        if not isinstance(dest, Destination):
            raise InvalidDestinationException("create_consumer needs a Topic or a Queue")
        if selector:
            selector_lang.parse(selector)  # raises InvalidSelectorException locally
        _, at, manager = dest.name.rpartition("@")
        here = self.connection.host_id
        if (
            isinstance(dest, Queue)
            and not isinstance(dest, TemporaryQueue)
            and dest.name.startswith("tmp.")
            and at
            and here is not None
            and manager != here
        ):
            # a temporary queue of a connection of another host (its name learnt from a
            # JMSReplyTo): refused here, the gateway's ERROR would close the connection
            raise InvalidDestinationException(
                "a temporary queue can only be consumed by the connection that created it"
            )
        sid = self.connection._next_id("sub")
        cons = MessageConsumer(self, dest, sid, selector, no_local)
        cons._durable = durable
        self.connection._subs[sid] = cons
        # DUPS_OK: cumulative acks, sent lazily (STOMP auto would lose what the client
        # buffered but never handed to the application when the consumer closes)
        ack = "client" if self.ack_mode == DUPS_OK_ACKNOWLEDGE else "client-individual"
        h = {"id": sid, "destination": str(dest), "ack": ack}
        if selector:
            h["selector"] = selector
        if no_local:
            h["no-local"] = "true"
        if durable:
            h["durable-subscription-name"] = durable
        try:
            self._request(Frame("SUBSCRIBE", h))
        except JMSException:
            self.connection._subs.pop(sid, None)
            raise
        self._consumers.append(cons)
        return cons

    # ------------------------------------------------------------------ plumbing
    def _check(self) -> None:
        self._check_open()
        self.connection._check()

    def _check_open(self) -> None:
        """For what needs no gateway (messages, destination objects): only a close by the
        application raises here, not a lost connection."""
        if self._closed:
            raise IllegalStateException("the session is closed")
        if self.connection._closed:
            raise IllegalStateException("the connection is closed")

    def _request(self, frame: Frame) -> Frame | None:
        return self.connection._transport.request(frame)

    def _begin(self) -> None:
        self._tx = self.connection._next_id("tx")
        self._request(Frame("BEGIN", {"transaction": self._tx}))

    def _delivered(self, cons: MessageConsumer, f: Frame, msg: Message) -> None:
        """Called when a message is handed to the application."""
        ack_id = f.headers.get("ack")
        if ack_id is None:
            return
        if self.ack_mode == DUPS_OK_ACKNOWLEDGE:
            cons._dups_ok_handed(ack_id)
        elif self.transacted:
            assert self._tx is not None
            self.connection._transport.send(Frame("ACK", {"id": ack_id, "transaction": self._tx}))
            with self._lock:
                self._tx_acks.setdefault(cons._sid, []).append(ack_id)
                self._mids[ack_id] = f.headers.get("message-id", "")
        elif self.ack_mode == AUTO_ACKNOWLEDGE:
            self.connection._transport.send(Frame("ACK", {"id": ack_id}))
        else:
            with self._lock:
                self._unacked.append((cons._sid, ack_id))
                self._mids[ack_id] = f.headers.get("message-id", "")
            msg._ack = self.acknowledge

    def _holds(self, sid: str) -> bool:
        """Whether this session holds messages of consumer ``sid`` that only it can settle
        (CLIENT mode unacknowledged, or acknowledged in the open transaction)."""
        with self._lock:
            if self.transacted:
                return bool(self._tx_acks.get(sid))
            return any(s == sid for s, _ in self._unacked)

    def _end_lingering(self, settled: bool) -> None:
        """UNSUBSCRIBE the consumers closed while this session held messages of theirs:
        ``settled`` (acknowledged or committed), the gateway gives back all it sent them as
        never delivered; otherwise the held ones go back for redelivery."""
        lingering, self._lingering = self._lingering, []
        for c in lingering:
            c._unsubscribe([] if settled else c._delivered_unacked())

    def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message consumed by this session so far,
        including those of its consumers closed since (JMS 1.1 §4.5.2)."""
        self._check()
        with self._lock:
            pending, self._unacked = self._unacked, []
            for _, ack_id in pending:
                self._mids.pop(ack_id, None)
        for i, (_, ack_id) in enumerate(pending):
            f = Frame("ACK", {"id": ack_id})
            if i == len(pending) - 1:
                self._request(f)
            else:
                self.connection._transport.send(f)
        self._end_lingering(settled=True)

    def commit(self) -> None:
        """Publish the sends and acknowledge every message consumed in this transaction
        (also by consumers closed since: JMS 1.1 §4.4.7)."""
        self._check()
        if not self.transacted:
            raise IllegalStateException("commit() on a non-transacted session")
        assert self._tx is not None
        self._request(Frame("COMMIT", {"transaction": self._tx}))
        with self._lock:
            self._tx_acks, self._mids = {}, {}
        self._end_lingering(settled=True)
        self._begin()

    def rollback(self) -> None:
        """Drop the sends and redeliver the messages consumed in this transaction."""
        self._check()
        if not self.transacted:
            raise IllegalStateException("rollback() on a non-transacted session")
        assert self._tx is not None
        self._end_lingering(settled=False)  # (before the ABORT: it needs their acks)
        with self._lock:
            mids, self._mids = set(self._mids.values()), {}
        held = self._hold_buffered()
        try:
            self._request(Frame("ABORT", {"transaction": self._tx}))
        finally:
            self._redelivered_first(held, mids)
        with self._lock:
            self._tx_acks = {}
        self._begin()

    def recover(self) -> None:
        """CLIENT_ACKNOWLEDGE: redeliver every unacknowledged message of this session."""
        self._check()
        if self.transacted:
            raise IllegalStateException("recover() on a transacted session; use rollback()")
        self._end_lingering(settled=False)  # their messages go back with the UNSUBSCRIBE
        with self._lock:
            pending, self._unacked = self._unacked, []
            mids, self._mids = set(self._mids.values()), {}
        live = {c._sid for c in self.connection._subs.values() if isinstance(c, MessageConsumer)}
        held = self._hold_buffered()
        try:
            for sid, ack_id in pending:
                if sid in live:
                    self._request(Frame("NACK", {"id": ack_id}))
        finally:
            self._redelivered_first(held, mids)

    def _hold_buffered(self) -> list[tuple[MessageConsumer, list[Any]]]:
        """Take out what this session's consumers buffered and the application has not
        received yet (see :meth:`_redelivered_first`)."""
        held = []
        for c in list(self._consumers):
            with c._inbox.mutex:
                held.append((c, list(c._inbox.queue)))
                c._inbox.queue.clear()
        return held

    def _redelivered_first(
        self, held: list[tuple[MessageConsumer, list[Any]]], mids: set[str]
    ) -> None:
        """After recover()/rollback() (JMS 1.1 §4.4.11, §4.4.7): delivery restarts with the
        oldest unacknowledged message. The gateway sends the redelivered messages (before
        its receipt of the NACK / ABORT) after what a consumer had buffered already, so
        each consumer's buffer becomes: the redelivered ones (``mids``) in the order they
        came, then what it had buffered (``held``), then anything newer."""
        for c, before in held:
            with c._inbox.mutex:
                since = list(c._inbox.queue)
                frames = [x for x in [*before, *since] if isinstance(x, Frame)]
                first = [x for x in since if isinstance(x, Frame) and x.get("message-id") in mids]
                moved = {id(x) for x in first}
                c._inbox.queue.clear()
                c._inbox.queue.extend(first)
                c._inbox.queue.extend(x for x in frames if id(x) not in moved)
                c._inbox.queue.extend(x for x in [*before, *since] if not isinstance(x, Frame))
                if c._inbox.queue:
                    c._inbox.not_empty.notify_all()

    def close(self) -> None:
        """Close the consumers (waiting for listeners in progress); what the session holds
        unacknowledged, or consumed in its open transaction, goes back for redelivery."""
        if self._closed:
            return
        for c in list(self._consumers):
            c._close(linger=False)
        alive = self.connection._transport.failed is None and not self.connection._closed
        if alive:
            with contextlib.suppress(JMSException):
                self._end_lingering(settled=False)
        self._lingering = []
        if self.transacted and self._tx is not None and alive:
            with contextlib.suppress(JMSException):
                self._request(Frame("ABORT", {"transaction": self._tx}))
        self._closed = True
        with self._lock:
            self._unacked, self._tx_acks, self._mids = [], {}, {}
        if self in self.connection._sessions:
            self.connection._sessions.remove(self)


class MessageProducer:
    """Sends messages (JMS MessageProducer) with default delivery mode, priority and TTL."""

    def __init__(self, session: Session, destination: Destination | None) -> None:
        self.session = session
        self.destination = destination
        self.delivery_mode = PERSISTENT
        self.priority = DEFAULT_PRIORITY
        self.time_to_live = DEFAULT_TIME_TO_LIVE
        """Seconds; 0 = the daemon's default lifetime."""
        self.disable_message_timestamp = False
        self.sync = True
        """Wait for the daemon's receipt on each send (errors raise at the send). False: no
        wait, and ``message.message_id`` stays None (the daemon assigns JMSMessageID and
        reports it only in the receipt; docs/joms.md)."""
        self._closed = False

    def send(
        self,
        message: Message,
        destination: Destination | None = None,
        *,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: float | None = None,
    ) -> None:
        if self._closed:
            raise IllegalStateException("the producer is closed")
        s = self.session
        s._check()
        dest = destination or self.destination
        if dest is None:
            raise InvalidDestinationException("no destination given to send()")
        # checked here, like selectors and names: a refusal by the gateway would close the
        # connection (STOMP ERROR)
        if isinstance(dest, Topic) and is_wildcard(dest.name):
            raise InvalidDestinationException(
                f"cannot send to wildcard topic {dest.name!r}: wildcards are for subscriptions"
            )
        mode = self.delivery_mode if delivery_mode is None else delivery_mode
        if mode not in (PERSISTENT, NON_PERSISTENT) or isinstance(mode, bool):
            raise JMSException("delivery_mode must be PERSISTENT or NON_PERSISTENT")
        prio = self.priority if priority is None else priority
        if isinstance(prio, bool) or not isinstance(prio, int) or not 0 <= prio <= 9:
            raise JMSException(f"priority must be an int between 0 and 9, not {prio!r}")
        ttl = self.time_to_live if time_to_live is None else time_to_live
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl >= 0:
            raise JMSException(f"time_to_live must be a number >= 0 (seconds), not {ttl!r}")
        message.destination = dest
        message.delivery_mode = mode
        message.priority = prio
        message.timestamp = int(time.time() * 1000)
        message.expiration = int((time.time() + ttl) * 1000) if ttl else 0
        frame = to_frame(message, dest)
        if s.transacted:
            frame.headers["transaction"] = s._tx or ""
        if self.sync:
            receipt = s._request(frame)
            if receipt is not None:
                message.message_id = receipt.headers.get("message-id")
        else:
            message.message_id = None
            s.connection._transport.send(frame)

    def close(self) -> None:
        """Close the producer: a later ``send()`` raises IllegalStateException."""
        self._closed = True


class QueueBrowser:
    """JMS QueueBrowser: ``messages()`` is a snapshot of what waits in the queue, in the
    order it would be handed out (STOMP ``browser:true``); nothing is consumed."""

    def __init__(self, session: Session, queue_: Queue, selector: str | None) -> None:
        self.session = session
        self.queue = queue_
        self.message_selector = selector
        self._closed = False

    def messages(self, timeout: float = 10.0) -> list[Message]:
        if self._closed:
            raise IllegalStateException("the queue browser is closed")
        conn = self.session.connection
        self.session._check()
        sid = conn._next_id("browse")
        box: queue.Queue[Frame] = queue.Queue()

        class _Collect:
            def _arrived(self, f: Frame) -> None:
                box.put(f)

        conn._subs[sid] = _Collect()  # type: ignore[assignment]
        h = {"id": sid, "destination": str(self.queue), "browser": "true"}
        if self.message_selector:
            h["selector"] = self.message_selector
        out: list[Message] = []
        try:
            self.session._request(Frame("SUBSCRIBE", h))
            while True:
                f = box.get(timeout=timeout)
                if f.headers.get("browser") == "end":
                    break
                out.append(from_frame(f))
            conn._transport.send(Frame("UNSUBSCRIBE", {"id": sid}))
        except queue.Empty:
            raise JMSException("the queue browser got no end-of-browse frame") from None
        finally:
            conn._subs.pop(sid, None)
        return out

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def close(self) -> None:
        """Close the browser: a later ``messages()`` raises IllegalStateException."""
        self._closed = True


class MessageConsumer:
    """Receives messages (JMS MessageConsumer): ``receive``, or a ``message_listener``."""

    def __init__(
        self,
        session: Session,
        destination: Destination,
        sid: str,
        selector: str | None,
        no_local: bool,
    ) -> None:
        self.session = session
        self.destination = destination
        self.message_selector = selector
        self.no_local = no_local
        self._sid = sid
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._listener: Callable[[Message], None] | None = None
        self._listener_thread: threading.Thread | None = None
        self._closed = False
        # held while a message is handed over (a receive, or a listener running): close()
        # and setting the listener wait for it; re-entrant, so a listener may call them
        self._handing = threading.RLock()
        self._in_listener = False
        self._close_pending = False  # closed by its own listener: finished when it returns
        self._close_linger = False  # ... left to the session then if it holds messages
        self._unconsumed: list[str] = []
        self._dups_last: str | None = None  # DUPS_OK: last handed over, not acknowledged yet
        self.expired = 0
        """Messages that expired in this consumer's buffer: dropped, never handed over."""
        self._dups_count = 0
        self._durable: str | None = None  # the durable subscription name, if one

    def _arrived(self, f: Frame) -> None:
        self._inbox.put(f)

    def _take(
        self, timeout: float | None, stop: Callable[[], bool] | None = None
    ) -> tuple[Frame, Message] | None:
        """Next frame and its message, not yet marked delivered (see Session._delivered);
        None at the deadline, once the consumer is closed, or once ``stop()`` is true."""
        conn = self.session.connection
        deadline = None if timeout is None else time.monotonic() + timeout

        def done() -> bool:
            return self._closed or (stop is not None and stop())

        while True:
            if done():
                return None
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not conn._started.is_set():
                with conn._wake:
                    conn._wake.wait_for(lambda: conn._started.is_set() or done(), remaining)
                late = deadline is not None and time.monotonic() >= deadline
                if late and not conn._started.is_set():
                    return None
                continue
            try:
                item = (
                    self._inbox.get(timeout=remaining)
                    if remaining != 0
                    else self._inbox.get_nowait()
                )
            except queue.Empty:
                return None
            if item is _WAKE:
                continue
            if item is _CLOSED:
                self._inbox.put(_CLOSED)
                if conn._transport.failed is not None and not self._closed:
                    raise conn._transport.closed_error()
                return None
            if not conn._started.is_set():  # stopped meanwhile: keep it for later
                self._inbox.queue.appendleft(item)
                continue
            msg = from_frame(item)
            if msg.expiration and msg.expiration <= time.time() * 1000:
                self._drop_expired(item)
                continue
            return item, msg

    def _drop_expired(self, f: Frame) -> None:
        """A buffered message expired before the application took it (JMS 1.1 §3.4.9: not
        delivered): acknowledged at once, outside any transaction, so the service forgets
        it rather than redeliver it; counted in :attr:`expired`."""
        self.expired += 1
        ack_id = f.headers.get("ack")
        if ack_id is None:
            return
        with contextlib.suppress(JMSException):  # (the connection failing: it comes back)
            if self.session.ack_mode == DUPS_OK_ACKNOWLEDGE and not self.session.transacted:
                self._dups_ok_handed(ack_id)  # (cumulative: after those handed over before)
            else:
                self.session.connection._transport.send(Frame("ACK", {"id": ack_id}))

    def receive(self, timeout: float | None = None) -> Message | None:
        """Next message; waits ``timeout`` seconds (None or 0 = until one comes or close,
        as JMS ``receive(0)``: a zero timeout never expires; see :meth:`receive_no_wait`).

        A receive blocked when the consumer (or its session or connection) closes returns
        None; one called after the close raises IllegalStateException."""
        return self._receive(None if timeout == 0 else timeout)

    def _receive(self, timeout: float | None) -> Message | None:
        if self._closed:
            raise IllegalStateException("the consumer is closed")
        self.session._check()
        if self._listener is not None:
            raise IllegalStateException("this consumer has a message listener")
        conn = self.session.connection
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            taken = self._take(left)
            if taken is None:
                return None
            frame, msg = taken
            with self._handing:
                if self._closed:
                    return None  # closed meanwhile: it goes back as never delivered
                if conn._started.is_set():
                    self.session._delivered(self, frame, msg)
                    return msg
                # stopped meanwhile (stop() returned): it waits for start()
                self._inbox.queue.appendleft(frame)

    def receive_no_wait(self) -> Message | None:
        """The next message if one is buffered (and the connection started), else None."""
        return self._receive(0)

    @property
    def message_listener(self) -> Callable[[Message], None] | None:
        if self._closed:
            raise IllegalStateException("the consumer is closed")
        return self._listener

    @message_listener.setter
    def message_listener(self, listener: Callable[[Message], None] | None) -> None:
        """Set (start asynchronous delivery) or None (stop it: once this returns, no message
        is taken by the listener any more; the rest stay for ``receive()``)."""
        if self._closed:
            raise IllegalStateException("the consumer is closed")
        with self._handing:  # a listener in progress completes first
            self._listener = listener
            old = self._listener_thread
            if listener is None:
                self._listener_thread = None
            elif old is None:
                self._listener_thread = threading.Thread(
                    target=self._listen, daemon=True, name="joms-listener"
                )
                self._listener_thread.start()
        if listener is None and old is not None:
            self._inbox.put(_WAKE)
            self.session.connection._notify()
            if old is not threading.current_thread():
                old.join()

    def set_message_listener(self, listener: Callable[[Message], None] | None) -> None:
        self.message_listener = listener

    def _listen(self) -> None:
        # AUTO_ACKNOWLEDGE acknowledges when the listener returns; other modes hand the
        # message over first (so the listener may call acknowledge()).
        after = self.session.ack_mode == AUTO_ACKNOWLEDGE and not self.session.transacted
        me = threading.current_thread()

        def replaced() -> bool:
            return self._listener_thread is not me

        _local.consumer = self
        try:
            while not self._closed and not replaced():
                try:
                    taken = self._take(0.5, replaced)
                except JMSException:
                    return
                if taken is None:
                    continue
                frame, msg = taken
                with self._handing:
                    listener = self._listener
                    if self._closed or replaced() or listener is None:
                        # not handed over: it stays for receive() (or goes back at close)
                        self._inbox.queue.appendleft(frame)
                        return
                    if not self.session.connection._started.is_set():
                        self._inbox.queue.appendleft(frame)  # stopped: waits for start()
                        continue
                    if not self._run_listener(listener, frame, msg, after):
                        return
        finally:
            _local.consumer = None

    def _run_listener(
        self, listener: Callable[[Message], None], frame: Frame, msg: Message, after: bool
    ) -> bool:
        """Hand one message to the listener (``_handing`` held); False: stop listening."""
        self._in_listener = True
        try:
            if not after:
                self.session._delivered(self, frame, msg)
            try:
                listener(msg)
            except Exception:  # JMS: a listener's exception must not stop delivery
                log.exception("message listener failed")
            if after:
                self.session._delivered(self, frame, msg)
        except JMSException:
            return False
        finally:
            self._in_listener = False
            if self._close_pending:  # the listener closed its consumer: finish that now,
                self._settle_close(self._close_linger)  # (still pending while it does)
                self._close_pending = False
        return True

    def _dups_ok_handed(self, ack_id: str) -> None:
        """DUPS_OK_ACKNOWLEDGE: ``ack_id`` was handed over; acknowledge (cumulatively) every
        ``_DUPS_OK_BATCH`` messages, or when nothing more waits in the buffer."""
        self._dups_last = ack_id
        self._dups_count += 1
        if self._dups_count >= _DUPS_OK_BATCH or self._inbox.empty():
            self._dups_ok_flush()

    def _dups_ok_flush(self) -> None:
        ack_id, self._dups_last, self._dups_count = self._dups_last, None, 0
        if ack_id is not None:
            self.session.connection._transport.send(Frame("ACK", {"id": ack_id}))

    def _delivered_unacked(self) -> list[str] | None:
        """Ack ids of messages handed to the application that the session still holds
        (unacknowledged, or acknowledged in its open transaction): what goes back for
        redelivery when this consumer's subscription ends. None when not known exactly."""
        s = self.session
        if s._closed and self._close_pending:
            return None  # the session closed under a running listener
        with s._lock:
            if s.transacted:
                return list(s._tx_acks.get(self._sid, []))
            if s.ack_mode == CLIENT_ACKNOWLEDGE:
                return [ack for sid, ack in s._unacked if sid == self._sid]
        return []  # AUTO: acknowledged as handed over; DUPS_OK: acknowledged at close

    def close(self) -> None:
        """Close the consumer; blocks until a receive or a listener in progress completes.

        A blocked ``receive()`` returns None. Called from this consumer's own listener, it
        returns at once and the close completes when the listener returns. Messages the
        session still holds (CLIENT_ACKNOWLEDGE unacknowledged, or consumed in the open
        transaction) stay the session's: ``acknowledge()``/``commit()`` settle them,
        ``recover()``/``rollback()``/``close()`` send them back."""
        self._close(linger=True)

    def _close(self, linger: bool) -> None:
        with self._handing:
            if self._closed:
                return
            self._closed = True
            conn = self.session.connection
            conn._subs.pop(self._sid, None)
            if self in self.session._consumers:
                self.session._consumers.remove(self)
            # messages the gateway sent that the application never received: given back as
            # never delivered (no JMSRedelivered, no redelivery counted; JOMS extension)
            with contextlib.suppress(queue.Empty):
                while True:
                    item = self._inbox.get_nowait()
                    if item is not _CLOSED and item is not _WAKE and item.headers.get("ack"):
                        self._unconsumed.append(item.headers["ack"])
            self._inbox.put(_CLOSED)  # wakes a blocked receive()
            conn._notify()
            if self._in_listener and threading.current_thread() is self._listener_thread:
                self._close_pending = True
                self._close_linger = linger
                return
        self._settle_close(linger)

    def _settle_close(self, linger: bool) -> None:
        """End the subscription, or (``linger``) leave it to the session while it holds
        messages of this consumer (see :meth:`close`)."""
        if linger and not self.session._closed and self.session._holds(self._sid):
            self.session._lingering.append(self)
            return
        self._finish_close()

    def _finish_close(self) -> None:
        conn = self.session.connection
        if conn._transport.failed is not None or conn._closed:
            return
        with contextlib.suppress(JMSException):
            if self._dups_last is not None:
                self._dups_ok_flush()
            self._unsubscribe(self._delivered_unacked())

    def _unsubscribe(self, delivered: list[str] | None) -> None:
        headers = {"id": self._sid}
        if self._unconsumed:
            headers["joms-unconsumed"] = ",".join(self._unconsumed)
        if delivered is not None:
            # what the application holds unacknowledged; the gateway also gives back as never
            # delivered what it sent that has not reached this client yet
            headers["joms-delivered"] = ",".join(delivered)
        self.session.connection._transport.request(Frame("UNSUBSCRIBE", headers))
