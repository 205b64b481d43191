"""AMQP 0-9-1 links (pika): ``amqp://HOST:PORT/EXCHANGE/ROUTING_KEY`` or ``/queue/NAME``.

Written for RabbitMQ. An exchange binding uses the exchange as its owner declared it (a
passive declare: a direct, fanout or non-durable exchange too) and declares a durable topic
exchange only when it is missing; outbound messages are published to it with the routing
key; inbound, the binding consumes from its own durable queue (:func:`inbound_queue`:
``dodwan.HOST.NAME``, with a hash of the pair when either holds a '.') bound to the
exchange with the routing key (which may hold ``*`` and ``#``, wildcards for a topic
exchange only; a fanout exchange ignores the key), so what arrives while the gateway is
away waits in that queue. A queue binding
sends to and consumes from the durable queue NAME, used as its owner declared it (a passive
declare; declared only when missing, at each connection). It publishes to the default
exchange with ``mandatory``: RabbitMQ returns a message for a queue deleted meanwhile
(``basic.return`` NO_ROUTE) instead of dropping it. It routes a transaction's messages at
the commit, so a return comes before ``tx.commit-ok`` with the rest committed, the ledger
message too: the returned messages are not marked sent, the ledger is rewritten without
them, and the link is dropped; the reconnection declares the queue again and they are sent
again (:meth:`AmqpLink._fail_returned`).

Outbound batches are published in one AMQP transaction (``tx.commit`` answers once RabbitMQ
has taken the whole batch), together with the batch's ledger message (:mod:`.ledger`) in
the binding's ledger queue, which holds only the newest one (``x-max-length`` 1); after a
reconnection the ledger is read (``basic.get``, then requeued) to learn whether the batch
whose ``tx.commit-ok`` never came was committed; messages are persistent, carry ``message_id`` = the DoDWAN id,
the application attributes as headers, and priority, timestamp, correlation id and type in
the AMQP properties. Inbound messages are acknowledged after their DoDWAN publication; the
publisher's ``message_id``, when set, gives the DoDWAN id; its ``expiration`` (ms) an
earlier deadline.

A refusal (a queue full with ``overflow reject-publish``): RabbitMQ commits what it took of
the transaction, the ledger message included, and closes the channel with ``406
PRECONDITION_FAILED - partial tx completion``, without saying which messages it refused.
Nothing of the batch is marked sent, the ledger is rewritten (until then its ids are not
trusted), and the messages are sent again one per transaction, so that a refusal names one
message. Publisher confirms would say which message was refused, but a batch would no
longer be atomic with its ledger message: a link cut in the middle of a batch would leave
part of it on the broker and no ledger naming it, sent twice after the reconnection. The
transaction keeps exactly-once for cuts and kills; the price is that the messages of a
batch the broker took only in part may reach it twice (it does not say which).

pika's blocking connection is not thread-safe: everything here runs on the binding's thread,
including the consumer callbacks (from ``process_data_events`` in :meth:`poll`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from typing import Any

import pika
import pika.exceptions

from . import ledger
from .binding import InboundHandler, LinkError, send_sendable
from .ids import inbound_queue
from .mapping import Inbound, priority_of, user_properties
from .outbox import OutRow
from .uri import BindingSpec, Endpoint

PREFETCH = 64

# pika logs every connection attempt at INFO and a refused one with a traceback; the
# binding's own warning says what failed.
logging.getLogger("pika").setLevel(logging.CRITICAL)
log = logging.getLogger("dodwan.bridges")

SHORT_STR = 255
"""Most UTF-8 bytes of an AMQP 0-9-1 short string (names, ``type``, ``correlation_id``)."""

_EXPIRATION = re.compile(r"[0-9]{1,15}")
"""AMQP ``expiration``: a time to live in ms, as a string of digits (RabbitMQ's form)."""


def bound_record(queue: str) -> str:
    """The durable queue recording what an exchange binding's ``queue`` is bound to
    (``QUEUE.bound``: never an inbound queue's name, whose hashed form it would need; see
    :meth:`AmqpLink._unbind_stale`)."""
    return f"{queue}.bound"


def connection_parameters(ep: Endpoint, **extra: Any) -> pika.ConnectionParameters:
    """How to reach the endpoint's broker: one attempt, 5 s to connect, its credentials
    (RabbitMQ's default guest/guest when the URI names none), and ``extra``."""
    return pika.ConnectionParameters(
        host=ep.host,
        port=ep.port,
        credentials=pika.PlainCredentials(ep.user or "guest", ep.password or "guest"),
        connection_attempts=1,
        socket_timeout=5,
        **extra,
    )


def remove_inbound_queue(spec: BindingSpec, host_id: str) -> str:
    """``bridge rm`` of an exchange binding that receives: delete its queue (bound to the
    exchange, it would collect messages for ever) and its record. What waited in the queue
    is dropped with it, as the binding's unsent outbox rows are. Returns "" when done (or
    nothing to do), else why not (the broker unreachable: the queue stays)."""
    ep = spec.endpoint
    if not (spec.inbound and ep.kind == "exchange"):
        return ""
    queue = inbound_queue(host_id, spec.name)
    params = connection_parameters(ep, blocked_connection_timeout=10)
    try:
        conn = pika.BlockingConnection(params)
        try:
            for name in (queue, bound_record(queue)):
                conn.channel().queue_delete(name)
        finally:
            with contextlib.suppress(Exception):
                conn.close()
    except (pika.exceptions.AMQPError, OSError) as exc:
        return f"queue {queue} not deleted: {type(exc).__name__} {exc}"
    return ""


def _properties(row: OutRow) -> Any:
    """The AMQP properties of an outbound message."""
    d = row.descriptor
    date = d.get("date", "")
    return pika.BasicProperties(
        message_id=d.get("id"),
        delivery_mode=2,
        priority=priority_of(d),
        timestamp=int(float(date)) if date.replace(".", "", 1).isdigit() else None,
        correlation_id=d.get("jms_correlation_id"),
        type=d.get("jms_type"),
        app_id="dodwan",
        headers=user_properties(d),
    )


def unencodable(row: OutRow) -> str:
    """Why AMQP 0-9-1 cannot carry this message ("" when it can): its properties are encoded
    as pika will (a short string, e.g. ``type``, ``correlation_id`` or a header name, holds
    at most 255 UTF-8 bytes). Checked before publishing: pika raised in the middle of the
    transaction, the link was dropped and the batch sent again, for ever."""
    try:
        _properties(row).encode()
    except pika.exceptions.ShortStringTooLong:
        return f"AMQP cannot carry message {row.msg_id}: {_too_long(row.descriptor)}"
    except (ValueError, TypeError, pika.exceptions.AMQPError) as exc:
        return f"AMQP cannot carry message {row.msg_id}: {type(exc).__name__} {exc}"
    return ""


def _too_long(d: dict[str, str]) -> str:
    """Which short string of a descriptor is over 255 bytes, said for the status."""
    for name in ("jms_type", "jms_correlation_id"):
        if len((d.get(name) or "").encode()) > SHORT_STR:
            return f"{name} is {len(d[name].encode())} bytes long, over 255 (AMQP short string)"
    for key in user_properties(d):
        if len(key.encode()) > SHORT_STR:
            return (
                f"the attribute name {key[:32]!r}... is {len(key.encode())} bytes long, "
                "over 255 (AMQP short string)"
            )
    return "a short string over 255 bytes"


class AmqpLink:
    def __init__(self, spec: BindingSpec, host_id: str, on_message: InboundHandler) -> None:
        self.spec = spec
        self.on_message = on_message
        self.conn: Any = None
        self.out_ch: Any = None
        ep = spec.endpoint
        self.queue = ep.destination if ep.kind == "queue" else inbound_queue(host_id, spec.name)
        self.record = bound_record(self.queue)
        self.ledger = ledger.queue_name(host_id, spec.name)
        self._void: set[str] = set()
        """Ids the ledger may name although the broker refused them (see :meth:`send`)."""
        self._careful = False
        """After a refusal: one message per transaction, so that the next says which."""
        self._returned: dict[str, str] = {}
        """DoDWAN id -> reply text of the messages RabbitMQ returned (basic.return) in the
        transaction being committed (queue bindings publish with ``mandatory``)."""

    def connect(self) -> None:
        ep = self.spec.endpoint
        params = connection_parameters(ep, heartbeat=30, blocked_connection_timeout=30)
        try:
            self.conn = pika.BlockingConnection(params)
            if ep.kind == "exchange":
                self._declare_exchange()
            if ep.kind == "queue" or self.spec.inbound:
                self._declare_queue()
            if self.spec.outbound:
                ch = self.conn.channel()
                ch.queue_declare(self.ledger, durable=True, arguments={"x-max-length": 1})
                ch.close()
                self.out_ch = self.conn.channel()
                self.out_ch.add_on_return_callback(self._on_return)
                self.out_ch.tx_select()
            if self.spec.inbound:
                ch = self.conn.channel()
                if ep.kind == "exchange":
                    ch.queue_bind(self.queue, ep.destination, routing_key=ep.routing_key)
                ch.basic_qos(prefetch_count=PREFETCH)
                ch.basic_consume(self.queue, self._deliver, auto_ack=False)
                if ep.kind == "exchange":
                    self._unbind_stale()
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.disconnect()
            why = str(exc) or "connection refused or closed"
            raise LinkError(f"AMQP {ep.host}:{ep.port}: {type(exc).__name__}: {why}") from None

    def _unbind_stale(self) -> None:
        """Leave the binding's queue bound to exactly what the spec names.

        The queue's name depends on the host and the binding's name only, so a binding
        replaced (or removed and added) with another exchange or routing key found its
        queue still bound to the old one, whose messages came in as the new binding's.
        AMQP cannot list a queue's bindings (RabbitMQ's management API may be off): what
        was bound is recorded on the broker, in the durable queue :func:`bound_record`
        (one message, ``x-max-length`` 1). Each connection binds the spec's pair first,
        then unbinds every other recorded one, then records the spec's pair alone (a
        connection lost in between unbinds them at the next one)."""
        ep = self.spec.endpoint
        mine = [ep.destination, ep.routing_key]
        ch = self.conn.channel()
        ch.queue_declare(self.record, durable=True, arguments={"x-max-length": 1})
        method, _props, body = ch.basic_get(self.record, auto_ack=False)
        ch.close()  # unacknowledged: the record stays
        try:
            recorded = json.loads(body) if method is not None else []
        except ValueError:
            recorded = []
        stale = [
            pair
            for pair in recorded
            if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
            if pair != mine
        ]
        for exchange, key in stale:
            ch = self.conn.channel()
            try:
                ch.queue_unbind(self.queue, exchange, routing_key=key)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404:  # the exchange is gone: so is the binding
                    raise
            else:
                ch.close()
            log.info(
                "bridge %s: queue %s unbound from %s/%s (no longer the binding's)",
                self.spec.name,
                self.queue,
                exchange,
                key,
            )
        if recorded != [mine]:
            ch = self.conn.channel()
            ch.confirm_delivery()
            ch.basic_publish(
                "",
                self.record,
                json.dumps([mine]).encode(),
                properties=pika.BasicProperties(delivery_mode=2),
            )
            ch.close()

    def _declare_exchange(self) -> None:
        """Use the exchange as it is when it exists (its owner may have declared it direct,
        fanout or not durable; declaring it again as a durable topic exchange is refused:
        PRECONDITION_FAILED); declare a durable topic exchange only when it is missing."""
        name = self.spec.endpoint.destination
        self._use_or_declare(
            lambda ch: ch.exchange_declare(name, passive=True),
            lambda ch: ch.exchange_declare(name, exchange_type="topic", durable=True),
        )

    def _declare_queue(self) -> None:
        """Use the queue as it is when it exists (its owner may have declared it with
        arguments: a length limit, a TTL, a dead-letter exchange, a quorum type; declaring
        it again without them is refused); declare it, durable, only when it is missing."""
        self._use_or_declare(
            lambda ch: ch.queue_declare(self.queue, passive=True),
            lambda ch: ch.queue_declare(self.queue, durable=True),
        )

    def _use_or_declare(self, check: Any, declare: Any) -> None:
        """``check`` (a passive declare) and, only when the broker says it is missing (404),
        ``declare``; any other answer (e.g. 403) is raised."""
        ch = self.conn.channel()
        try:
            check(ch)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:  # NOT_FOUND; anything else is the answer
                raise
            # A failed passive declare closes the channel (AMQP 0-9-1): a new one.
            ch = self.conn.channel()
            declare(ch)
        ch.close()

    def _expires(self, expiration: str | None) -> float | None:
        """When the message expires, from its AMQP ``expiration`` (ms from now); None when
        it has none or a malformed one (warned about: the message still comes in)."""
        if not expiration:
            return None
        if not _EXPIRATION.fullmatch(expiration):
            log.warning(
                "bridge %s: malformed AMQP expiration %r ignored (the binding's ttl applies)",
                self.spec.name,
                expiration[:40],
            )
            return None
        return time.time() + int(expiration) / 1000.0

    def _deliver(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        headers: dict[str, str] = {}
        for k, v in (props.headers or {}).items():
            headers[str(k)] = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        headers.setdefault("amqp_routing_key", method.routing_key)
        msg = Inbound(
            body=bytes(body),
            headers=headers,
            remote_id=props.message_id or None,
            expires=self._expires(props.expiration),
            correlation_id=props.correlation_id,
            jms_type=props.type,
            priority=props.priority,
            redelivered=bool(method.redelivered),
        )
        if self.on_message(msg):
            ch.basic_ack(method.delivery_tag)

    def left_out(self) -> list[tuple[str, list[str], str]]:
        """Nothing: every application attribute crosses (see :meth:`.binding.Link.left_out`)."""
        return []

    def committed(self) -> set[str]:
        """The ids of the last batch the broker committed, from the ledger queue."""
        try:
            ch = self.conn.channel()
            method, _props, body = ch.basic_get(self.ledger, auto_ack=False)
            ch.close()  # the message, unacknowledged, goes back to the queue
        except (pika.exceptions.AMQPError, OSError, AttributeError) as exc:
            raise LinkError(f"AMQP ledger not readable: {type(exc).__name__} {exc}") from None
        # A refused batch's ledger message may still be the newest (its rewrite failed).
        return set() if method is None else ledger.decode(self.spec, body) - self._void

    def _target(self) -> tuple[str, str, str]:
        """(exchange, routing key, destination as said in errors) of outbound messages."""
        ep = self.spec.endpoint
        if ep.kind == "queue":
            return "", self.queue, f"queue/{self.queue}"
        return ep.destination, ep.out_target, f"{ep.destination}/{ep.out_target}"

    def _on_return(self, _ch: Any, method: Any, props: Any, _body: bytes) -> None:
        """basic.return: RabbitMQ routed a ``mandatory`` message to no queue."""
        self._returned[str(props.message_id)] = f"{method.reply_code} {method.reply_text}"

    def _commit(self, rows: list[OutRow], ledger_ids: list[str]) -> dict[str, str]:
        """Publish the rows and the ledger message naming ``ledger_ids`` in one transaction.

        Returns the messages RabbitMQ returned (id -> reply): committed with the rest, the
        ledger message included, but on no queue. Raises ChannelClosedByBroker when the
        broker refused (some of) them."""
        exchange, key, _ = self._target()
        ch = self.out_ch
        if ch is None:
            raise LinkError("AMQP channel closed")
        # A queue binding's messages go to the default exchange: without ``mandatory`` one
        # for a queue deleted meanwhile was dropped, the commit answered ok, the ledger
        # naming it. An exchange binding keeps topic semantics (no queue bound: dropped).
        mandatory = self.spec.endpoint.kind == "queue"
        self._returned.clear()
        for row in rows:
            props = _properties(row)
            ch.basic_publish(exchange, key, row.payload, properties=props, mandatory=mandatory)
        self._publish_ledger(ch, ledger_ids)
        ch.tx_commit()
        # The ledger's newest message is this one: no refused batch's any more.
        self._void.clear()
        if mandatory:
            # RabbitMQ routes a transaction's messages at the commit: its basic.return frames
            # come before tx.commit-ok, so pika holds them by now; this dispatches them.
            try:
                self.conn.process_data_events(time_limit=0)
            except (pika.exceptions.AMQPError, OSError):
                # Whether RabbitMQ returned some is unknown: the ledger is trusted for none
                # of the batch (sent again: a copy rather than a loss).
                self._void.update(r.msg_id for r in rows)
                raise
        return dict(self._returned)

    def _publish_ledger(self, ch: Any, ids: list[str]) -> None:
        """Put the ledger message naming ``ids`` in the channel's transaction."""
        ch.basic_publish(
            "",
            self.ledger,
            ledger.encode(self.spec, ids),
            properties=pika.BasicProperties(delivery_mode=2, type=ledger.HEADER),
        )

    def _rewrite_ledger(self, ids: list[str]) -> None:
        """After a refusal: make the ledger name only what the broker did take (best effort;
        until it is done, :meth:`committed` leaves the refused ids out)."""
        with contextlib.suppress(pika.exceptions.AMQPError, OSError, AttributeError):
            ch = self.conn.channel()
            ch.tx_select()
            self._publish_ledger(ch, ids)
            ch.tx_commit()
            ch.close()
            self._void.clear()

    def send(self, rows: list[OutRow]) -> None:
        """One transaction for the batch and its ledger message; after a refusal, one per
        message until a whole batch has gone (see the module's docstring). Messages AMQP
        cannot encode (:func:`unencodable`) are left out of it and, once the others are
        committed, raised as :class:`~.binding.Unsendable`."""
        send_sendable(rows, unencodable, self._send)

    def _send(self, rows: list[OutRow]) -> None:
        batches = [[r] for r in rows] if self._careful else [rows]
        done: list[str] = []
        for batch in batches:
            ids = [r.msg_id for r in batch]
            try:
                returned = self._commit(batch, done + ids)
            except pika.exceptions.ChannelClosedByBroker as exc:
                # The broker answered: it refused (e.g. a full queue with overflow
                # reject-publish: "partial tx completion"). RabbitMQ commits the rest of
                # the transaction, the ledger message included, which names the refused
                # ones: they must not be marked sent from it after the reconnection.
                self._careful = True
                self._void.update(ids)
                self._rewrite_ledger(done)
                _, _, dest = self._target()
                n = "1" if len(batch) == 1 else f"some of {len(batch)}"
                raise LinkError(
                    f"AMQP broker refused {n} message(s) on {dest!r}: {exc.reply_text}"
                ) from None
            except (pika.exceptions.AMQPError, OSError) as exc:
                raise LinkError(f"AMQP publish failed: {type(exc).__name__} {exc}") from None
            if returned:
                self._fail_returned(done, ids, returned)
            done += ids
        self._careful = False

    def _fail_returned(self, done: list[str], ids: list[str], returned: dict[str, str]) -> None:
        """RabbitMQ committed the batch ``ids`` but returned some of it (no queue: NO_ROUTE,
        the queue deleted since the connection). The ledger message committed with it names
        them: it is rewritten to name only what is on the broker (until then they are not
        trusted from it), and the link is dropped. After the reconnection, which declares
        the queue again when it is missing, the ledger marks the others sent and the
        returned ones are sent again: exactly what RabbitMQ dropped, each once."""
        self._void.update(returned)
        self._rewrite_ledger(done + [i for i in ids if i not in returned])
        _, _, dest = self._target()
        why = sorted(set(returned.values()))
        raise LinkError(
            f"AMQP broker returned {len(returned)} message(s) on {dest!r}: {', '.join(why)} "
            "(no queue took them: not marked sent, sent again after the reconnection)"
        )

    def poll(self, timeout: float, wake: threading.Event) -> None:
        end = time.monotonic() + timeout
        try:
            self.conn.process_data_events(time_limit=0)
            while not wake.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return
                self.conn.process_data_events(time_limit=min(left, 0.05))
        except (pika.exceptions.AMQPError, OSError, AttributeError) as exc:
            raise LinkError(f"AMQP connection lost: {type(exc).__name__} {exc}") from None

    def disconnect(self) -> None:
        conn, self.conn, self.out_ch = self.conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        self.disconnect()
