"""The console's link to the daemon: one JOMS connection, its subscriptions, and recovery.

Owns the connection (made on first need), one session for sending and receiving and one
per background subscription, and the subscriptions themselves. When the connection is
lost (daemon stopped, or it closed the connection after refusing a request) the loss is
reported, a background thread reconnects with a growing delay, and every subscription is
made again on the new connection; messages already shown are not shown twice.

A subscription acknowledges a message only once it is printed (CLIENT_ACKNOWLEDGE, one
session per subscription): one that could not be printed (stdout's reader gone) stays the
daemon's, so a queue or a durable subscription still has it for the next reader.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import joms
from dodwan.textsafe import safe
from joms.api import (
    CLIENT_ACKNOWLEDGE,
    Connection,
    Destination,
    Message,
    MessageConsumer,
    Queue,
    Session,
    Topic,
)
from joms.errors import JMSException
from joms.stomp.server import STOPPING

from .output import OutputClosed, Printer, describe
from .selection import PropertyPattern, accepts

_SEEN_MAX = 10000
_LOSS = ("connection lost", "the STOMP server closed", "bad frame", "no CONNECTED", STOPPING)
"""How the transport words a lost connection (anything else is the gateway's ERROR that
refused a request). The gateway's ERROR saying it is stopping (daemon stopped or
restarting) refuses nothing: it announces the loss."""
TIMEOUT = 5.0
"""Seconds the daemon has to answer a request (its receipt) or a connection."""
_UNREACHABLE = ("cannot connect to STOMP", "no CONNECTED", *_LOSS)
"""How the transport words a daemon it could not talk to at all."""


class NotConnected(Exception):
    """The daemon cannot be reached right now (or refused the connection)."""


def plural(n: int, word: str) -> str:
    """``1 message``, ``2 messages``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class Subscription:
    """A background subscription of the console."""

    number: int
    destination: Destination
    selector: str | None
    """Sent to the gateway (``-sel`` AND the translated ``-ssl`` patterns)."""
    patterns: list[PropertyPattern]
    """Also checked here on each arrival."""
    durable: str | None = None
    no_local: bool = False
    count: int | None = None
    received: int = 0
    filtered: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)
    session: Session | None = None
    consumer: MessageConsumer | None = None

    def describe(self) -> str:
        what = f"{'topic' if isinstance(self.destination, Topic) else 'queue'} "
        what += self.destination.name
        parts = [what]
        if self.patterns:
            parts.append("-ssl " + " ".join(f"{p.key}={p.regex}" for p in self.patterns))
        if self.selector:
            parts.append(f"selector: {safe(self.selector)}")  # a clause may hold a line feed
        if self.durable:
            parts.append(f"durable {self.durable}")
        if self.count is not None:
            parts.append(f"until {plural(self.count, 'message')}")
        return ", ".join(parts)


class Link:
    """Connection to the daemon's STOMP gateway, with background reconnection."""

    def __init__(
        self,
        url: str | None,
        printer: Printer,
        *,
        client_id: str | None = None,
        login: str | None = None,
        passcode: str | None = None,
        on_arrival: Callable[[Message], None] | None = None,
        locate: Callable[[], str] | None = None,
        explain: Callable[[str], str | None] | None = None,
    ) -> None:
        """``url`` is the gateway; without it ``locate()`` finds it at each connection (from
        the daemon's state directory) and raises :class:`NotConnected` saying why it cannot.
        ``explain(url)`` may add why ``url`` cannot be reached (what the daemon serves)."""
        self.url = url or ""
        self._locate = locate
        self._explain = explain
        self.client_id = client_id
        self.login = login
        self.passcode = passcode
        self.printer = printer
        self.on_arrival = on_arrival
        self.subscriptions: dict[int, Subscription] = {}
        self._next_number = 1
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._session: Session | None = None
        self._retrying = False
        self._was_connected = False
        self._refused = False
        self._closed = False
        self._wake = threading.Event()
        self.last_error: str | None = None

    # ------------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and conn._transport.failed is None

    def connect(self) -> None:
        """Connect now (no-op when connected); raise NotConnected with the reason."""
        with self._lock:
            if self.connected:
                return
            if self._locate is not None:
                try:
                    self.url = self._locate()
                except NotConnected as exc:
                    self.last_error = str(exc)
                    raise
            try:
                conn = joms.connect(
                    self.url,
                    client_id=self.client_id,
                    login=self.login,
                    passcode=self.passcode,
                    timeout=TIMEOUT,
                )
            except JMSException as exc:
                self.last_error = str(exc)
                if str(exc).startswith(_UNREACHABLE):
                    why = self._explain(self.url) if self._explain is not None else None
                    hint = f" ({why})" if why else ""
                    raise NotConnected(
                        f"cannot reach the daemon at {self.url}: {exc}{hint}"
                    ) from None
                # reached: the gateway answered with an ERROR (client id in use, login...)
                raise NotConnected(
                    f"the daemon at {self.url} refused the connection: {exc}"
                ) from None
            conn.exception_listener = self._lost
            self._conn = conn
            self._was_connected = True
            self._session = conn.create_session()
            self.last_error = None
            for sub in self.subscriptions.values():
                if not sub.done.is_set():
                    self._open(sub)

    def loss(self, exc: JMSException) -> str | None:
        """How the connection was lost, when ``exc`` (raised by a request) comes from a
        loss rather than from the daemon's refusal (an ERROR frame); None otherwise."""
        conn = self._conn
        failed = conn._transport.failed if conn is not None else None
        text = str(failed if failed is not None else exc)
        return text if text.startswith(_LOSS) else None

    def session(self) -> Session:
        """The session for sending and receiving; connects first if needed."""
        with self._lock:
            if not self.connected:
                self.connect()
            assert self._session is not None
            return self._session

    def start_retrying(self) -> None:
        """Reconnect in the background until it works (reported when it does)."""
        with self._lock:
            if self._retrying or self._closed:
                return
            self._retrying = True
        threading.Thread(target=self._retry_loop, name="joms-console-retry", daemon=True).start()

    def _lost(self, exc: JMSException) -> None:
        # called on the transport's reader thread: report, then retry elsewhere
        if self._closed:
            return
        text = self.last_error = str(exc)
        # the gateway closes the connection after an ERROR frame: the command that caused
        # it reports the refusal, so only a real loss is announced here
        self._refused = not text.startswith(_LOSS)
        if not self._refused:
            self.printer.notice(f"connection to the daemon lost ({exc}); reconnecting")
        self.start_retrying()

    def _retry_loop(self) -> None:
        delay = 0.2
        try:
            while not self._closed:
                again = "reconnected" if self._was_connected else "connected"
                try:
                    self.connect()
                except NotConnected:
                    self._wake.wait(delay)
                    self._wake.clear()
                    delay = min(delay * 2, 5.0)
                    continue
                except JMSException as exc:  # connected, but a subscription was refused
                    self.printer.notice(f"reconnected, but: {exc}")
                    return
                active = len(self.active())
                restored = f"; {plural(active, 'subscription')} restored" if active else ""
                if not self._refused:
                    self.printer.notice(f"{again} to the daemon at {self.url}{restored}")
                elif active:
                    self.printer.notice(f"connection renewed after the refusal{restored}")
                return
        finally:
            with self._lock:
                self._retrying = False

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.exception_listener = None
            with contextlib.suppress(JMSException, OSError):
                conn.close()

    # ------------------------------------------------------------------ subscriptions
    def subscribe(
        self,
        destination: Destination,
        selector: str | None,
        patterns: list[PropertyPattern],
        *,
        durable: str | None = None,
        no_local: bool = False,
        count: int | None = None,
        announce: Callable[[Subscription], None] | None = None,
    ) -> Subscription:
        """Subscribe in the background; ``announce(sub)`` runs before the first arrival."""
        with self._lock:
            self.session()  # connected
            sub = Subscription(
                self._next_number, destination, selector, patterns, durable, no_local, count
            )
            self._open(sub, announce)  # a refused subscription does not use up its number
            self._next_number += 1
            self.subscriptions[sub.number] = sub
            return sub

    def _open(
        self, sub: Subscription, announce: Callable[[Subscription], None] | None = None
    ) -> None:
        assert self._conn is not None
        session = self._conn.create_session(ack_mode=CLIENT_ACKNOWLEDGE)  # once printed
        try:
            if sub.durable:
                assert isinstance(sub.destination, Topic)
                consumer = session.create_durable_subscriber(
                    sub.destination, sub.durable, selector=sub.selector, no_local=sub.no_local
                )
            else:
                consumer = session.create_consumer(
                    sub.destination, selector=sub.selector, no_local=sub.no_local
                )
        except JMSException:
            with contextlib.suppress(JMSException):
                session.close()
            raise
        sub.session, sub.consumer = session, consumer
        if announce is not None:
            announce(sub)
        consumer.message_listener = lambda msg: self._arrived(sub, msg)

    def _arrived(self, sub: Subscription, msg: Message) -> None:
        if sub.done.is_set():
            return  # not acknowledged: it goes back to the daemon as the session closes
        try:
            shown = self._show(sub, msg)
        except OutputClosed:  # nobody reads stdout any more: not acknowledged, stop here
            self.end(sub)
            return
        with contextlib.suppress(JMSException):  # (connection lost: redelivered, deduplicated)
            msg.acknowledge()
        if shown and sub.count is not None and sub.received >= sub.count:
            self.printer.notice(f"subscription {sub.number} got its {plural(sub.count, 'message')}")
            self.end(sub)

    def _show(self, sub: Subscription, msg: Message) -> bool:
        """Print ``msg`` unless already shown or filtered out (False then)."""
        if msg.message_id and msg.message_id in sub.seen:
            return False
        # a queue's patterns are all in the selector (commands._only_server_side): what the
        # manager handed out is shown, never consumed and dropped here
        if isinstance(sub.destination, Topic) and not accepts(sub.patterns, msg):
            sub.filtered += 1
            return False
        self.printer.line(describe(msg, sub.number))
        sub.received += 1
        if msg.message_id:
            sub.seen[msg.message_id] = None
            if len(sub.seen) > _SEEN_MAX:
                sub.seen.popitem(last=False)
        if self.on_arrival is not None:
            self.on_arrival(msg)
        return True

    def end(self, sub: Subscription) -> None:
        """Close a subscription (a durable one is kept by the daemon; see delete_durable)."""
        sub.done.set()
        with self._lock:
            self.subscriptions.pop(sub.number, None)
        if sub.session is not None:
            with contextlib.suppress(JMSException, OSError):
                sub.session.close()

    def delete_durable(self, name: str) -> None:
        for sub in list(self.subscriptions.values()):
            if sub.durable == name:
                self.end(sub)
        self.session().unsubscribe(name)

    def active(self) -> list[Subscription]:
        return [s for s in self.subscriptions.values() if not s.done.is_set()]

    def wait_counted(self, stop: threading.Event | None = None) -> None:
        """Block until every subscription with a ``count`` has received it (or nobody
        reads stdout any more)."""
        for sub in list(self.subscriptions.values()):
            if sub.count is not None:
                while not sub.done.wait(0.2):
                    if (stop is not None and stop.is_set()) or self.printer.reader_gone():
                        return

    def receive(self, queue: Queue, selector: str | None, timeout: float) -> Message | None:
        """One message from ``queue`` matching ``selector``, or None after ``timeout``. The
        selector holds every ``-ssl`` pattern (commands._only_server_side): the manager
        hands out only matching messages, so none is taken and then dropped here."""
        session = self.session()
        consumer = session.create_consumer(queue, selector=selector)
        try:
            return consumer.receive(timeout) if timeout > 0 else consumer.receive_no_wait()
        finally:
            with contextlib.suppress(JMSException, OSError):
                consumer.close()
