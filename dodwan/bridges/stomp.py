"""STOMP 1.2 links (stomp.py): ``stomp://HOST:PORT/topic/NAME`` and ``/queue/NAME`` (ActiveMQ).

Outbound, a batch of messages is sent in one STOMP transaction whose COMMIT asks for a
receipt: the rows are marked sent once the receipt arrives, so a batch is on the broker
entirely or not at all. The transaction also writes the batch's ledger message
(:mod:`.ledger`) and acknowledges the older ones, which the link consumes; after a
reconnection the ledger is browsed (ActiveMQ's ``browser:true``) to learn whether the
batch whose receipt never came was committed. The COMMIT goes only once the ledger
message's receipt came with no ERROR before it; a batch answered with ERROR is
:class:`~.binding.Refused` (its messages are then sent alone, see :mod:`.refusals`).
Messages are persistent; application attributes are headers (which ActiveMQ keeps as JMS
string properties), with ``dodwan-id`` and the JMS headers STOMP names (``correlation-id``, ``type``, ``priority``, ``expires`` from the deadline).

Inbound, the binding subscribes with ``client-individual`` acknowledgement and acknowledges
a message after its DoDWAN publication; the broker's ``message-id`` (the same for every
subscriber) gives the DoDWAN id. A topic subscription is durable (ActiveMQ's
``client-id`` and ``activemq.subscriptionName``, :func:`durable_name`): what the topic gets
while the gateway is away waits at the broker, echoes of what another gateway sent
included. Two connections cannot hold one client id, so replacing such a binding is
break-before-make (see :meth:`~dodwan.bridges.manager.BridgeManager.add`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import socket
import threading
import time
from typing import Any

import stomp

from . import ledger
from .binding import Dropped, InboundHandler, LinkError, Refused, send_sendable
from .ids import client_base
from .mapping import Inbound, deadline_of, priority_of, user_properties
from .outbox import OutRow
from .uri import BindingSpec

# stomp.py logs a connection cut at the wrong moment as an error with a traceback; the
# binding's own warning says what failed (as for pika in amqp.py).
logging.getLogger("stomp.py").setLevel(logging.CRITICAL)

CONNECT_TIMEOUT = 10.0
RECEIPT_TIMEOUT = 30.0
CLOSE_HEARD = 5.0
"""Seconds a send that failed on a closed socket waits for the receiver thread to report
the close (and an ERROR frame before it)."""
STANDARD = frozenset(
    {"destination", "message-id", "subscription", "ack", "content-length", "content-type"}
    | {"expires", "priority", "persistent", "timestamp", "redelivered", "receipt"}
    | {"correlation-id", "type", "reply-to"}
)
PROVIDER_SET = frozenset(
    {"JMSXDeliveryCount", "JMSXUserID", "JMSXAppID", "JMSXProducerTXID", "JMSXConsumerTXID"}
    | {"JMSXRcvTimestamp", "JMSXState"}
)
"""JMS properties the provider sets on each delivery (a JOMS STOMP gateway adds
``JMSXDeliveryCount`` to every MESSAGE): not the message's own, never attributes."""
INBOUND_DROPPED = STANDARD | PROVIDER_SET
RESERVED = STANDARD | {"transaction"}
"""Header names with a meaning in a SEND frame: an application attribute of such a name
cannot be a header (it would be taken as that header, or overwritten)."""
INT32 = range(-(2**31), 2**31)
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
"""What Java's Integer.parseInt takes (within :data:`INT32`)."""


def left_out_names(descriptor: dict[str, str]) -> list[str]:
    """The application attributes a SEND frame cannot carry as headers: the names STOMP
    (or this link) gives a meaning (:data:`RESERVED`: ``type``, ``reply-to``,
    ``content-type``, ``transaction``, ...) and names holding ':' (STOMP 1.2 escapes it in
    names too, which stomp.py does not do). Earlier versions dropped the first and renamed
    the second (``a:b`` as ``a_b``) without a word; they are now reported."""
    return [k for k in user_properties(descriptor) if k in RESERVED or ":" in k]


def unsendable(descriptor: dict[str, str]) -> str:
    """Why ActiveMQ would refuse the message by closing the connection, without an ERROR
    frame ("" when it would not): ``JMSXGroupSeq`` must be a Java int."""
    seq = descriptor.get("JMSXGroupSeq")
    if seq is None or (_JAVA_INT.fullmatch(seq) and int(seq) in INT32):
        return ""
    return f"JMSXGroupSeq {seq[:40]!r} is not a 32-bit integer (ActiveMQ closes the connection)"


def durable_name(spec: BindingSpec, host_id: str) -> str | None:
    """Client id and subscription name of a durable topic subscription (None: not one).

    The stem of MQTT's client ids (:func:`.ids.client_base`): ``dodwan-HOST-NAME`` was
    shared by host a-b's binding c and host a's binding b-c; while one was away, the other
    connecting on its own topic replaced its subscription, and what waited in it was lost."""
    if not (spec.inbound and spec.endpoint.kind == "topic"):
        return None
    return client_base(host_id, spec.name)


def _error_text(frame: Any) -> str:
    """The reason an ERROR frame gives: its ``message`` header, else its body's first line
    (ActiveMQ's body is a Java stack trace)."""
    text = str(frame.headers.get("message", "")).strip()
    if not text:
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body or "").encode()
        text = body.decode("utf-8", "replace").strip().split("\n", 1)[0]
    return (text or "no reason given")[:250]


def _tcp_failure(host: str, port: int) -> str:
    """Why a TCP connection to the broker fails (stomp.py only logs it)."""
    try:
        socket.create_connection((host, port), CONNECT_TIMEOUT).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return "the connection failed (the port answered a second attempt)"


def _abandon(conn: Any) -> None:
    """Close a connection that never became one (stomp.py sends no DISCONNECT then, and
    leaves its socket and thread running)."""
    with contextlib.suppress(Exception):
        conn.disconnect()
    with contextlib.suppress(Exception):
        conn.transport.disconnect_socket()


class _Listener(stomp.ConnectionListener):  # type: ignore[misc]
    """Reports one connection's events; a late one from an older connection is ignored."""

    def __init__(self, link: StompLink, generation: int) -> None:
        self.link = link
        self.generation = generation

    def on_connected(self, frame: Any) -> None:
        if self.generation == self.link._generation:
            self.link._up.set()

    def on_receipt(self, frame: Any) -> None:
        self.link._receipt(frame.headers.get("receipt-id", ""))

    def on_error(self, frame: Any) -> None:
        self.link._broker_error(_error_text(frame), self.generation)

    def on_disconnected(self) -> None:
        self.link._failed("connection closed", self.generation)

    def on_message(self, frame: Any) -> None:
        self.link._message(frame)


class StompLink:
    def __init__(self, spec: BindingSpec, host_id: str, on_message: InboundHandler) -> None:
        self.spec = spec
        self.on_message = on_message
        self.conn: Any = None
        self._generation = 0
        self._up = threading.Event()
        self._lost = threading.Event()
        self._why = ""
        """Why the connection was lost: the first reason (the broker's ERROR, not the
        closing of the connection that follows it)."""
        self._error = ""
        """The message of the broker's ERROR frame on this connection, if one came."""
        self._receipts: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        ep = spec.endpoint
        self.destination = f"/{ep.kind}/{ep.destination}"
        self.durable = durable_name(spec, host_id)
        self.ledger = f"/queue/{ledger.queue_name(host_id, spec.name)}"
        self._ledger_acks: list[str] = []
        """Ack ids of ledger messages received: acknowledged in the next transaction."""
        self._browsed: set[str] | None = None
        self._browse_done = threading.Event()
        self._left: list[tuple[str, list[str], str]] = []
        """What the last send left out (see :meth:`left_out`)."""

    # ------------------------------------------------------------------ listener side

    def _receipt(self, rid: str) -> None:
        with self._lock:
            ev = self._receipts.get(rid)
        if ev is not None:
            ev.set()

    def _broker_error(self, text: str, generation: int) -> None:
        if generation == self._generation and not self._error:
            self._error = text
        self._failed(f"broker error: {text}", generation)

    def _failed(self, why: str, generation: int) -> None:
        if generation != self._generation:
            return
        if not self._lost.is_set():
            self._why = why
        self._lost.set()

    def _message(self, frame: Any) -> None:
        h = {str(k): str(v) for k, v in frame.headers.items()}
        sub = h.get("subscription")
        if sub == "ledger-browse":
            if h.get("browser") == "end":
                self._browse_done.set()
            else:
                self._browsed = ledger.decode(self.spec, bytes(frame.body or b""))
            return
        if sub == "ledger":
            with self._lock:
                self._ledger_acks.append(h.get("ack", ""))
            return
        expires = None
        with contextlib.suppress(ValueError):
            if int(h.get("expires", "0")) > 0:
                expires = int(h["expires"]) / 1000.0
        priority = None
        with contextlib.suppress(ValueError):
            priority = int(h["priority"]) if "priority" in h else None
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
        msg = Inbound(
            body=body,
            headers={k: v for k, v in h.items() if k not in INBOUND_DROPPED},
            remote_id=h.get("message-id"),
            expires=expires,
            correlation_id=h.get("correlation-id"),
            jms_type=h.get("type"),
            priority=priority,
            redelivered=h.get("redelivered") == "true",
        )
        if self.on_message(msg) and "ack" in h and self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.ack(h["ack"])

    # ------------------------------------------------------------------ link

    def connect(self) -> None:
        ep = self.spec.endpoint
        self._generation += 1
        self._up.clear()
        self._lost.clear()
        self._why = ""
        self._error = ""
        conn = stomp.Connection12(
            [(ep.host, ep.port)],
            reconnect_attempts_max=1,
            heartbeats=(10000, 10000),
            auto_decode=False,
            timeout=CONNECT_TIMEOUT,
        )
        conn.set_listener("dodwan", _Listener(self, self._generation))
        extra = {"client-id": self.durable} if self.durable else {}
        started = time.monotonic()
        try:
            # Not wait=True: stomp.py would wait for CONNECTED without a deadline.
            conn.connect(ep.user, ep.password, wait=False, headers=extra)
        except Exception as exc:  # stomp.py's ConnectFailedException has no text
            if str(exc):
                why = str(exc)
            elif time.monotonic() - started >= CONNECT_TIMEOUT:
                why = "timed out"
            else:
                why = _tcp_failure(ep.host, ep.port)
        else:
            why = self._await_connected()
        if why:
            _abandon(conn)
            raise LinkError(f"cannot connect to {ep.host}:{ep.port}: {why}")
        self.conn = conn
        with self._lock:
            self._ledger_acks.clear()
        if self.spec.inbound:
            # The receipt proves the subscription is in place before we report "connected".
            sub = {"activemq.subscriptionName": self.durable} if self.durable else {}
            self._wait_receipt(
                lambda rid: conn.subscribe(
                    self.destination,
                    id="dodwan",
                    ack="client-individual",
                    headers={"receipt": rid, **sub},
                )
            )

    def _await_connected(self) -> str:
        """Wait for the broker's CONNECTED; the reason when it refused or never answered."""
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while not self._up.wait(0.05):
            if self._lost.is_set():
                return f"broker error: {self._error}" if self._error else "closed before CONNECTED"
            if time.monotonic() > deadline:
                return f"no CONNECTED frame within {CONNECT_TIMEOUT:g} s"
        return ""

    def _wait_receipt(self, frame: Any) -> None:
        rid = f"r-{secrets.token_hex(6)}"
        ev = threading.Event()
        with self._lock:
            self._receipts[rid] = ev
        try:
            frame(rid)
            deadline = time.monotonic() + RECEIPT_TIMEOUT
            while not ev.wait(0.05):
                if self._lost.is_set():
                    raise LinkError(f"STOMP connection lost: {self._why}")
                if time.monotonic() > deadline:
                    raise LinkError("STOMP broker sent no receipt in time")
        finally:
            with self._lock:
                self._receipts.pop(rid, None)

    def committed(self) -> set[str]:
        """The ids of the last batch the broker committed, from the ledger (browsed).

        Called once after every connection of an outbound binding, before any send."""
        conn = self.conn
        if conn is None:
            raise LinkError(f"STOMP connection lost: {self._why}")
        self._browsed = None
        self._browse_done.clear()
        conn.subscribe(self.ledger, id="ledger-browse", headers={"browser": "true"})
        deadline = time.monotonic() + RECEIPT_TIMEOUT
        while not self._browse_done.wait(0.05):
            if self._lost.is_set():
                raise LinkError(f"STOMP connection lost: {self._why}")
            if time.monotonic() > deadline:
                raise LinkError("STOMP broker did not finish browsing the ledger in time")
        with contextlib.suppress(Exception):
            conn.unsubscribe("ledger-browse")
        # Only now consume the ledger (to acknowledge its older messages in the next
        # transactions): a message dispatched to a consumer could be hidden from a browser.
        self._wait_receipt(
            lambda rid: conn.subscribe(
                self.ledger, id="ledger", ack="client-individual", headers={"receipt": rid}
            )
        )
        return self._browsed or set()

    def left_out(self) -> list[tuple[str, list[str], str]]:
        left, self._left = self._left, []
        return left

    def send(self, rows: list[OutRow]) -> None:
        """Send the batch in one transaction (see the module's docstring); messages ActiveMQ
        is known to refuse (:func:`unsendable`) are left out of it and, once the others
        are committed, raised as :class:`~.binding.Unsendable`."""
        self._left = []

        def why_not(r: OutRow) -> str:
            why = unsendable(r.descriptor)
            return why and f"message {r.msg_id}: {why}"

        send_sendable(rows, why_not, self._send_batch)

    def _send_batch(self, rows: list[OutRow]) -> None:
        conn = self.conn
        if conn is None or self._lost.is_set():
            raise LinkError(f"STOMP connection lost: {self._why}")
        what = "1 message(s)" if len(rows) == 1 else f"a batch of {len(rows)} message(s)"
        try:
            left = self._send(conn, rows)
        except Exception as exc:
            if isinstance(exc, (OSError, stomp.exception.StompException)):
                # stomp.py forgets the socket (NotConnectedException), or the kernel refuses
                # the write, before its receiver thread has reported the close and what the
                # broker said before it: wait for that report to tell a refusal from a cut.
                self._lost.wait(CLOSE_HEARD)
            if self._error:
                # The broker answered a frame of the batch with ERROR (e.g. ActiveMQ: a
                # header over its 10240-byte limit): nothing of the batch is committed.
                raise Refused(
                    f"STOMP broker refused {what} on {self.destination}: {self._error}"
                ) from None
            if self._lost.is_set():
                # Closed without a word: a cut, or ActiveMQ refusing a frame of the batch
                # (e.g. JMSXGroupSeq:abc) by closing the connection. The binding isolates
                # the message (see :class:`~.binding.Dropped`).
                raise Dropped(
                    f"STOMP connection lost while sending {what} on {self.destination}, "
                    f"no reason given ({self._why})"
                ) from None
            if isinstance(exc, LinkError):
                raise
            raise LinkError(f"STOMP send failed: {type(exc).__name__} {exc}") from None
        self._left = left

    def _send(self, conn: Any, rows: list[OutRow]) -> list[tuple[str, list[str], str]]:
        """The transaction of the batch; what it left out of each message."""
        left: list[tuple[str, list[str], str]] = []
        tx = f"tx-{secrets.token_hex(6)}"
        conn.begin(transaction=tx)
        for row in rows:
            d = row.descriptor
            names = left_out_names(d)
            if names:
                left.append((row.msg_id, names, "STOMP header names with a meaning or a ':'"))
            headers = {k: v for k, v in user_properties(d).items() if k not in names}
            headers["persistent"] = "true"
            headers["priority"] = str(priority_of(d))
            headers["expires"] = str(int(deadline_of(d, time.time() + 3600) * 1000))
            if d.get("jms_correlation_id"):
                headers["correlation-id"] = d["jms_correlation_id"]
            if d.get("jms_type"):
                headers["type"] = d["jms_type"]
            headers["transaction"] = tx
            # Always, even 0: without it ActiveMQ makes an empty body a TextMessage.
            headers["content-length"] = str(len(row.payload))
            conn.send(self.destination, row.payload, headers=headers)
        with self._lock:
            acks, self._ledger_acks = self._ledger_acks, []
        for ack in acks:  # the older ledger messages go as this one comes
            conn.ack(ack, transaction=tx)
        # The ledger message asks for a receipt, and the COMMIT goes only once it came
        # without an ERROR before it: ActiveMQ may refuse a frame of the batch (a header
        # over its limit) yet read on and commit the rest with the ledger message, which
        # would then name a message the broker does not have.
        self._wait_receipt(
            lambda rid: conn.send(
                self.ledger,
                ledger.encode(self.spec, [r.msg_id for r in rows]),
                headers={
                    "persistent": "true",
                    ledger.HEADER: "1",
                    "transaction": tx,
                    "receipt": rid,
                },
            )
        )
        if self._error or self._lost.is_set():
            raise LinkError(f"STOMP connection lost: {self._why}")
        self._wait_receipt(lambda rid: conn.commit(transaction=tx, headers={"receipt": rid}))
        return left

    def poll(self, timeout: float, wake: threading.Event) -> None:
        end = time.monotonic() + timeout
        while True:
            if self._lost.is_set():
                raise LinkError(f"STOMP connection lost: {self._why}")
            left = end - time.monotonic()
            if left <= 0 or wake.wait(min(left, 0.1)):
                return

    def disconnect(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()

    def close(self) -> None:
        self.disconnect()
