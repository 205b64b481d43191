"""The JOMS service: JMS semantics on top of a dissemination port, sans-IO and clock-free.

This module owns the life cycle, the runner API, connections, sending and the consumer
API; the rest is split along JMS's own parts, each a mixin of :class:`JomsService`:
:mod:`.topics` (topics, durable subscriptions, per-producer order),
:mod:`.acknowledgement` (dispatch, ACK/NACK, redelivery, dead letters, transactions),
:mod:`.queue_manager` and :mod:`.queue_receiver` (the two sides of a queue),
:mod:`.directory`; shared state and helpers are in :mod:`.base`. Every entry point takes ``now`` (seconds since the epoch, the
runner's clock); outputs are pulled (:meth:`JomsService.next_event`), there is one deadline
(:meth:`get_timer` / :meth:`handle_timer`), and the only I/O is the port (publish /
subscribe / unsubscribe / drop) and the :class:`~joms.service.store.ServiceStore`.

Errors caused by the local caller raise :class:`~joms.errors.JMSException` subclasses;
malformed input from the network is dropped and counted in :attr:`counters`.
"""

from __future__ import annotations

import functools
import json
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dodwan.core.message import SYSTEM_ATTRIBUTES
from dodwan.core.wire import encode_attributes

from ..errors import (
    IllegalStateException,
    InvalidClientIDException,
    InvalidDestinationException,
    JMSException,
    MessageFormatException,
)
from . import model as mdl
from .acknowledgement import AcknowledgementMixin
from .base import (
    _CORE_LIMITS,
    ACK_MODES,
    IMPLICIT_PREFIX,
    KEY_PREFIX,
    TEMP_TOPIC_PREFIX,
    ServiceBase,
    _Connection,
    _Consumer,
    _digest,
    _Durable,
    _esc,
    attribute_for,
    compile_selector,
    selector_matches,
)
from .config import ServiceConfig
from .directory import DirectoryMixin
from .events import Event, MessageDispatched
from .model import Destination, JomsMessage
from .ordering import Reorder
from .port import DisseminationPort
from .queue_manager import QueueManagerMixin
from .queue_receiver import MAX_RECEIVED_ON_CANCEL, QueueReceiverMixin
from .queues import ManagedQueue, load_policy
from .store import MemoryServiceStore, ServiceStore
from .topics import TopicsMixin
from .wildcards import check_wildcard, is_wildcard

QUEUE_ADDED_ATTRIBUTES = 7
"""Attributes a queue message may gain after its producer sent it: the manager's hand-out
(receiver, hand-out number, original id, delivery count, redelivered flag) and, moved to the
dead-letter queue, its original destination and the reason."""
QUEUE_ADDED_BYTES = 1024
"""Encoded bytes those may take (ids and names of ordinary length), and DoDWAN's own."""

__all__ = ["KEY_PREFIX", "JomsService", "attribute_for", "compile_selector", "selector_matches"]


class JomsService(
    TopicsMixin,
    AcknowledgementMixin,
    QueueManagerMixin,
    QueueReceiverMixin,
    DirectoryMixin,
    ServiceBase,
):
    """JMS topics, durable subscriptions, queues and transactions over a dissemination port."""

    def __init__(
        self,
        port: DisseminationPort,
        config: ServiceConfig | None = None,
        store: ServiceStore | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.port = port
        self.host_id = port.host_id
        self.config = config or ServiceConfig()
        self.store: ServiceStore = store if store is not None else MemoryServiceStore()
        self.rng = rng or random.Random()
        self.policy = load_policy(self.config.receiver_policy)
        self.counters: dict[str, int] = {}
        self._events: deque[Event] = deque()
        self._handed: list[tuple[str, str]] = []  # (consumer, tag) taken in ack=auto mode
        self._epoch = f"{self.rng.getrandbits(32):08x}"
        self._own_ids = "\x00"  # prefix of the DoDWAN ids published in this run (at start)
        self._n = 0
        self._connections: dict[str, _Connection] = {}
        self._clients: dict[str, str] = {}  # client id -> connection id
        self._consumers: dict[str, _Consumer] = {}
        self._durables: dict[str, _Durable] = {}
        self._dcount: dict[str, int] = {}  # durable key -> messages in "dpending"
        self._queues: dict[str, ManagedQueue] = {}  # full name -> state (managed here)
        self._routes: dict[str, Callable[[Mapping[str, str], bytes, float], None]] = {}
        self._acks_out: dict[tuple[str, str], tuple[list[str], list[str], list[str]]] = {}
        self._ack_flush_at: float | None = None
        self._next_advert: float | None = None
        self._next_housekeeping: float | None = None
        self._directory: dict[str, tuple[float, list[str], list[str]]] = {}
        self._topics_here: set[str] = set()
        self._started = False
        self._queues_key = f"{KEY_PREFIX}queues"
        self._run = "0"
        """Number of this start of the service on its store (part of subscription keys)."""
        self._started_at = 0.0

    # ================================================================ lifecycle
    def start(self, now: float) -> None:
        """Load durable state and (re)install this host's subscriptions. Call once."""
        if self._started:
            return
        self._started = True
        self._started_at = now
        for key, _ in self.store.items("ephemeral"):
            self.port.unsubscribe(key)
            self.store.delete("ephemeral", key)
        # The dissemination layer records a delivery as done when it hands it out, but a
        # runner may feed it to the service a moment later: a crash in between (or a message
        # arriving before the service was attached) would lose it for good under a key the
        # layer remembers. So the keys receiving messages that must not be lost are new at
        # every start (messages still cached come again) and the service de-duplicates.
        try:
            starts = int(self.store.get("meta", "starts") or b"0") + 1
        except ValueError:
            starts = 1
        self.store.put("meta", "starts", str(starts).encode())
        self._run = f"{starts:x}"
        # ids (consumers, receivers, JMSMessageIDs) never repeat across starts, even with a
        # seeded rng: a restarted consumer is a new receiver, a new message is not "seen"
        self._epoch = f"{self._epoch}r{self._run}x"
        self._own_ids = f"{self.host_id}-{self._epoch}"
        self.port.unsubscribe(f"{KEY_PREFIX}queues")  # the key of earlier versions
        self._queues_key = f"{KEY_PREFIX}queues.{self._run}"
        self.store.put("ephemeral", self._queues_key, b"")
        self._subscribe_core(
            [{mdl.KIND: mdl.KIND_DIRECTORY}], f"{KEY_PREFIX}dir", self._on_directory
        )
        if self.config.purge_acknowledged:
            self._subscribe_core([{mdl.KIND: mdl.KIND_ACK}], f"{KEY_PREFIX}acks", self._on_any_ack)
        # Every queue addressed to this host (Name@host) is managed here: one subscription
        # for all of them; a queue is created by its first local use or first message.
        self._subscribe_core(
            [
                {
                    mdl.KIND: f"{mdl.KIND_MESSAGE}|{mdl.KIND_RECEIVER}|{mdl.KIND_ACK}",
                    mdl.DEST_TYPE: "queue",
                    mdl.DEST_ID: "[^@]+@" + _esc(self.host_id),
                }
            ],
            self._queues_key,
            self._on_queue_input,
        )
        self._migrate_durable_keys()
        for key, blob in self.store.items("durable"):
            try:
                rec = json.loads(blob)
                sel = compile_selector(rec["selector"])
                d = _Durable(
                    key,
                    rec["client_id"],
                    rec["name"],
                    rec["topic"],
                    rec["selector"] or "",
                    sel,
                    bool(rec["no_local"]),
                    rec["core_key"],
                    int(rec.get("created", 0)),
                )
                if d.implicit:  # its consumer died with the previous process
                    d.idle_since = float(rec.get("idle_since") or now)
            except (ValueError, KeyError, JMSException):
                self._count("bad_durable_records")
                self.store.delete("durable", key)
                continue
            self._durables[key] = d
            self.port.unsubscribe(d.core_key)  # the previous run's key (see above)
            d.core_key = self._durable_core_key(key)
            self.store.put("durable", key, d.record())
            self._install_durable(d)
        for name, blob in self.store.items("queues"):
            try:
                rec = json.loads(blob)
            except ValueError:
                continue
            if rec.get("temporary"):
                self._forget_queue(name)
                continue
            q = ManagedQueue(name, last=rec.get("last", ""))
            self._queues[name] = q
            self._load_queue(q)
            # receivers of this host were consumers of the previous process: dead for sure,
            # what they held goes to live receivers now rather than at their lease's end
            for r in [r for r in q.receivers.values() if r.local]:
                self._remove_receiver(q, r.reply_id, now)
                self._count("dead_local_receivers")
            self._resend_assigned(q, now)
        self._next_advert = now
        self._next_housekeeping = now + 1.0
        self.store.commit()

    # ================================================================ runner API
    def on_delivery(
        self, subscription_key: str, descriptor: Mapping[str, str], payload: bytes, now: float
    ) -> None:
        """Feed a DoDWAN delivery for a ``joms:`` subscription. Never raises for bad input."""
        handler = self._routes.get(subscription_key)
        if handler is None:
            self._count("deliveries_unrouted")
            return
        try:
            handler(descriptor, payload, now)
        except (ValueError, KeyError, TypeError, JMSException):
            self._count("deliveries_malformed")
        except Exception:  # a bug must not let a peer's message take the service down
            self._count("internal_errors")
        self.store.commit()

    def next_event(self, *, confirm: bool = False) -> Event | None:
        """The next event; a :class:`MessageDispatched` of an ``auto`` consumer counts as
        handed to the client once taken here, and as consumed at the next :meth:`settle`.

        ``confirm``: the caller says itself which ``auto``-mode messages it wrote
        (``settle(now, written=...)``); one it never confirms stays unconsumed, and goes
        back as never delivered when its consumer closes (a transport that held it back
        for a client not reading, then discarded it)."""
        if not self._events:
            return None
        ev = self._events.popleft()
        if not confirm and isinstance(ev, MessageDispatched):
            cons = self._consumers.get(ev.consumer)
            if cons is not None and cons.ack_mode == "auto":
                self._handed.append((ev.consumer, ev.tag))
        return ev

    def settle(self, now: float, written: Iterable[tuple[str, str]] = ()) -> None:
        """Consume the ``auto``-mode messages taken since the last call, and those of
        ``written`` ((consumer, tag) taken with ``next_event(confirm=True)``), and commit.

        A transport calls it once it has written what it took (the STOMP gateway once its
        MESSAGE frames left its buffer for the socket): a crash before that finds them still
        stored, so an ``auto`` consumer loses nothing the transport had not written yet.
        Timers settle too, for a transport that does not call it."""
        handed = [*self._handed, *written]
        if not handed:
            return
        self._handed = []
        for consumer, tag in handed:
            cons = self._consumers.get(consumer)
            if cons is not None and cons.ack_mode == "auto" and tag in cons.unacked:
                skey, msg = cons.unacked.pop(tag)
                self._finish(cons, skey, msg, now)
        self.store.commit()

    def flush_acks(self, now: float, conn_id: str | None = None) -> None:
        """Publish now the queue acknowledgements waiting in the ack batch (``ack_delay``):
        those of one connection's consumers, or all of them.

        A transport calls it before it confirms a client's frame (the STOMP gateway before
        a RECEIPT): an acknowledgement still in the batch lives in memory only, and a stop
        in the next ``ack_delay`` seconds would have the queue manager hand the message out
        again. Published, it is stored by the dissemination layer with the frame's run."""
        if not self._acks_out:
            return
        if conn_id is None:
            self._flush_acks(now)
            return
        conn = self._connections.get(conn_id)
        if conn is None:
            return
        for cid in conn.consumers:
            cons = self._consumers.get(cid)
            if cons is None or cons.kind != "queue":
                continue
            out = self._acks_out.pop((cons.dest.name, cons.reply_id), None)
            if out is not None and (out[0] or out[1]):
                self._publish_ack(cons.dest.name, cons.reply_id, now, *out)
        if not self._acks_out:
            self._ack_flush_at = None
        self.store.commit()

    def flush(self, now: float) -> None:
        """Before the runner stops: publish what is held back in memory (the ack batch),
        consume the ``auto``-mode messages taken, and commit."""
        self.settle(now)
        if self._acks_out:
            self._flush_acks(now)
        self.store.commit()

    def get_timer(self) -> float | None:
        if self._handed:
            return 0.0  # taken auto-mode messages to settle: at once
        times = [t for t in (self._ack_flush_at, self._next_advert, self._next_housekeeping) if t]
        for c in self._consumers.values():
            if c.kind == "queue":
                times.append(c.renew_at)
            if c.reorder is not None and (t := c.reorder.next_deadline()) is not None:
                times.append(t)
        for d in self._durables.values():
            if d.reorder is not None and (t := d.reorder.next_deadline()) is not None:
                times.append(t)
        for q in self._queues.values():
            for r in q.receivers.values():
                times.append(r.until)
            if q.reorder is not None and (t := q.reorder.next_deadline()) is not None:
                times.append(t)
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        self.settle(now)
        if self._ack_flush_at is not None and self._ack_flush_at <= now:
            self._flush_acks(now)
        for c in list(self._consumers.values()):
            if c.kind == "queue":
                if c.renew_at <= now:
                    self._send_receiver_request(c, now)
                if c.reorder is not None:
                    self._queue_release(c, self._expire_order(c.reorder, now), now)
            elif c.reorder is not None:
                self._topic_release(c, self._expire_order(c.reorder, now), now)
        for d in list(self._durables.values()):
            if d.reorder is not None:
                for item in self._expire_order(d.reorder, now):
                    self._durable_store(d, item, now)
        for q in list(self._queues.values()):
            self._expire_queue_order(q, now)
            expired = [r for r in q.receivers.values() if r.until <= now]
            for r in expired:
                self._remove_receiver(q, r.reply_id, now)
            if expired:
                self._assign(q, now)
        if self._next_advert is not None and self._next_advert <= now:
            self._advertise(now)
            self._next_advert = now + self.config.directory_period
        if self._next_housekeeping is not None and self._next_housekeeping <= now:
            self._housekeeping(now)
            self._next_housekeeping = now + 10.0
        self.store.commit()

    # ================================================================ connections
    def open_connection(self, now: float, client_id: str | None = None) -> str:
        """Register a client connection; InvalidClientIDException if the id is in use."""
        if client_id is not None:
            if not client_id or len(client_id) > 128 or not client_id.isprintable():
                raise InvalidClientIDException(f"invalid client id {client_id!r}")
            if client_id in self._clients:
                raise InvalidClientIDException(f"client id {client_id!r} is already connected")
        cid = f"c{self._id()}"
        tag = f"{self.host_id}/{client_id if client_id else cid}"
        self._connections[cid] = _Connection(cid, client_id, tag)
        if client_id is not None:
            self._clients[client_id] = cid
        return cid

    def close_connection(
        self,
        conn_id: str,
        now: float,
        *,
        unconsumed: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Close consumers (unacked messages go back for redelivery), abort transactions.

        ``unconsumed``: consumer id -> tags of dispatched messages the client never got
        (a transport discarded them): they go back as never delivered."""
        conn = self._connections.get(conn_id)
        if conn is None:
            return
        for tx in list(conn.txs):
            self.abort(conn_id, tx, now)
        for cons in list(conn.consumers):
            self.close_consumer(cons, now, unconsumed=(unconsumed or {}).get(cons, ()))
        for qname in list(conn.temp_queues):
            self._delete_queue(qname, now)
        del self._connections[conn_id]
        if conn.client_id is not None and self._clients.get(conn.client_id) == conn_id:
            del self._clients[conn.client_id]
        self.store.commit()

    def _conn(self, conn_id: str) -> _Connection:
        conn = self._connections.get(conn_id)
        if conn is None:
            raise IllegalStateException(f"connection {conn_id!r} is closed")
        return conn

    # ================================================================ sending
    def send(
        self,
        conn_id: str,
        msg: JomsMessage,
        now: float,
        *,
        time_to_live: float | None = None,
        tx: str | None = None,
    ) -> str:
        """Send ``msg`` (held until commit inside a transaction); returns its JMSMessageID.

        ``msg.expiration`` (ms since the epoch) wins over ``time_to_live`` (seconds); with
        neither, the configured default TTL gives the DoDWAN deadline.
        """
        conn = self._conn(conn_id)
        mdl.validate_outgoing(msg)
        dest = msg.destination
        if dest.kind == "topic" and is_wildcard(dest.name):
            raise InvalidDestinationException(
                f"cannot send to wildcard topic {dest.name!r}: wildcards are for subscriptions"
            )
        if dest.kind == "queue" and dest.manager == self.host_id:
            self._ensure_queue(dest.name, now)
        msg.message_id = f"ID:{self.host_id}-{self._id()}"
        msg.timestamp = int(now * 1000)
        if not msg.expiration and time_to_live:
            msg.expiration = int((now + time_to_live) * 1000)
        msg.connection = conn.tag
        msg.redelivered = False
        if dest.kind == "queue":
            self._check_queue_room(msg, conn)
        if tx is not None:
            self._tx(conn, tx).sends.append((msg, None))
            return msg.message_id
        self._publish(msg, now, conn)
        self.store.commit()
        return msg.message_id

    def _check_queue_room(self, msg: JomsMessage, conn: _Connection) -> None:
        """Refuse a queue message its manager could not hand on: the hand-out (and a move
        to the dead-letter queue) adds attributes the producer's publication does not have,
        and a descriptor over the core's limits then is refused there, after the producer
        was told the message was sent."""
        d = mdl.to_descriptor(msg)
        d.setdefault(mdl.SEQUENCE, f"{self.host_id}/{conn.id}:{2**32}")  # as _publish sets it
        limits, system = _CORE_LIMITS, len(SYSTEM_ATTRIBUTES)
        room = limits.max_attributes - system - QUEUE_ADDED_ATTRIBUTES
        if len(d) > room:
            raise MessageFormatException(
                f"message refused: a queue message's descriptor holds at most {room} "
                f"attributes (limits.max_attributes {limits.max_attributes}, less DoDWAN's "
                f"{system} and the {QUEUE_ADDED_ATTRIBUTES} its queue manager may add); this "
                f"one needs {len(d)}: send it with fewer properties"
            )
        size = len(encode_attributes(d)) + QUEUE_ADDED_BYTES
        if size > limits.max_descriptor_bytes:
            raise MessageFormatException(
                f"message refused: a queue message's descriptor would reach {size} bytes "
                f"with what its queue manager adds, over limits.max_descriptor_bytes "
                f"({limits.max_descriptor_bytes}): send it with fewer or shorter properties"
            )

    def _publish(self, msg: JomsMessage, now: float, conn: _Connection | None = None) -> None:
        deadline = msg.expiration / 1000.0 if msg.expiration else now + self.config.default_ttl
        if deadline <= now:
            self._count("sent_already_expired")
            return
        if msg.destination.kind == "topic":
            self._note_topic(msg.destination.name, now)
        if conn is not None:  # number the producer's messages (per-producer order)
            n = conn.sent.get(msg.destination.name, 0) + 1
            conn.sent[msg.destination.name] = n
            msg.sequence = f"{self.host_id}/{conn.id}:{n}"
        try:
            self._publish_named(
                mdl.to_descriptor(msg),
                msg.body,
                deadline=deadline,
                priority=msg.priority,
                persistent=msg.delivery_mode == mdl.PERSISTENT,
            )
        except ValueError as exc:
            raise MessageFormatException(f"message refused by DoDWAN: {exc}") from None
        self._count("messages_sent")

    # ================================================================ consumers
    def subscribe(
        self,
        conn_id: str,
        dest: Destination,
        now: float,
        *,
        selector: str | None = None,
        no_local: bool = False,
        durable_name: str | None = None,
        ack_mode: str = "auto",
        prefetch: int = 0,
    ) -> str:
        """Create a consumer; returns its id. Messages come as :class:`MessageDispatched`.

        ``prefetch`` (client ack modes) bounds the messages dispatched and not yet
        acknowledged; 0 = unbounded.
        """
        conn = self._conn(conn_id)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise JMSException("prefetch must be an int >= 0")
        if ack_mode not in ACK_MODES:
            raise JMSException(f"unknown ack mode {ack_mode!r}: use one of {', '.join(ACK_MODES)}")
        sel = compile_selector(selector)
        cid = f"s{self._id()}"
        cons = _Consumer(cid, conn_id, "topic", dest, selector or "", sel, no_local, ack_mode)
        cons.prefetch = prefetch
        if dest.kind == "topic":
            if dest.name.startswith(TEMP_TOPIC_PREFIX) and dest.name not in conn.temp_topics:
                raise InvalidDestinationException(
                    "a temporary topic can only be consumed by the connection that created it"
                )
            if is_wildcard(dest.name):
                try:
                    check_wildcard(dest.name)
                except ValueError as exc:
                    raise InvalidDestinationException(str(exc)) from None
            implicit: str | None = None
            if durable_name and durable_name.startswith(IMPLICIT_PREFIX):
                raise JMSException(
                    f"durable subscription names starting {IMPLICIT_PREFIX!r} are reserved"
                )
            if durable_name:
                self._attach_durable(conn, cons, durable_name, now)
            else:
                if self.config.nondurable == "refuse":
                    raise IllegalStateException(
                        "non-durable topic subscriptions are refused by this JOMS service "
                        "(nondurable = refuse): use a durable subscription"
                    )
                implicit = self._implicit_name(conn, dest, selector or "", no_local)
            if implicit is not None:
                # nondurable = durable: kept (and its messages stored) while the consumer is
                # away, found again by the same client id, topic, selector and noLocal
                self._attach_durable(conn, cons, implicit, now)
                d = self._durables[cons.durable]
                d.idle_since = None
                self.store.put("durable", d.key, d.record())
            elif not durable_name:
                cons.core_key = f"{KEY_PREFIX}t:{cid}"
                cons.reorder = self._new_reorder(sel)
                self.store.put("ephemeral", cons.core_key, b"")
                self._subscribe_core(
                    self._topic_patterns(dest.name, sel),
                    cons.core_key,
                    functools.partial(self._on_topic_message, cid),
                    fallback=self._topic_patterns(dest.name, None),
                )
            # advertised as used only now that the subscription is accepted (a refused one,
            # durable without a client id or under nondurable = refuse, used nothing)
            self._note_topic(dest.name, now)
        else:
            if durable_name:
                raise InvalidDestinationException("durable subscriptions are for topics only")
            q = self._queues.get(dest.name)
            # a temporary queue (tmp.<id>@H, a reserved name) is managed by the host of the
            # connection that created it: no connection of another host can be its owner
            foreign_tmp = dest.name.startswith("tmp.") and dest.manager != self.host_id
            if foreign_tmp or (q is not None and q.temporary and q.owner != conn_id):
                raise InvalidDestinationException(
                    "a temporary queue can only be consumed by the connection that created it"
                )
            if dest.manager == self.host_id:
                self._ensure_queue(dest.name, now)
            cons.kind = "queue"
            cons.reply_id = f"{self.host_id}.{cid}"
            if self.config.order_gap_timeout > 0:
                cons.reorder = Reorder(
                    self.config.order_gap_timeout, self.config.order_window_bytes
                )
            cons.core_key = f"{KEY_PREFIX}r:{cid}"
            self.store.put("ephemeral", cons.core_key, b"")
            self._subscribe_core(
                [{mdl.KIND: mdl.KIND_DELIVERY, mdl.REPLY_ID: _esc(cons.reply_id)}],
                cons.core_key,
                functools.partial(self._on_queue_delivery, cid),
            )
        self._consumers[cid] = cons
        conn.consumers.add(cid)
        if cons.kind == "queue":
            self._send_receiver_request(cons, now)
        self._pump(cons, now)
        self.store.commit()
        return cid

    def close_consumer(
        self,
        consumer_id: str,
        now: float,
        *,
        unconsumed: Sequence[str] = (),
        delivered: list[str] | tuple[str, ...] | None = None,
        defer: bool = True,
    ) -> None:
        """Close a consumer: unacked messages are kept for redelivery (durable, queue).

        While an open transaction of its connection holds acknowledgements of its messages
        (a STOMP client's ACK in a transaction, then UNSUBSCRIBE, then COMMIT), the close
        waits for the transaction's end (``_Consumer.closing``), so the commit consumes
        them rather than find them given back; ``defer=False`` closes at once (the
        subscription is being deleted).

        ``unconsumed``: tags of dispatched messages the client application never received
        (still in the client's buffer): they go back as never delivered — no JMSRedelivered,
        not counted towards the dead-letter limit. ``delivered``, when the client knows it:
        the only unacknowledged tags its application holds; every other unacknowledged one
        (also those still on their way to the client) goes back as never delivered."""
        cons = self._consumers.get(consumer_id)
        if cons is None:
            return
        conn = self._connections.get(cons.conn)
        if (
            defer
            and conn is not None
            and any(c == consumer_id for tx in conn.txs.values() for c, _ in tx.acks)
        ):
            if cons.closing is None:
                cons.closing = (list(unconsumed), None if delivered is None else list(delivered))
                self._count("consumer_closes_deferred")
            return
        self.settle(now)  # what the transport took in auto mode is consumed
        if delivered is not None:
            held = set(delivered)
            unconsumed = [*unconsumed, *(t for t in cons.unacked if t not in held)]
        if cons.ack_mode == "auto":  # dispatched, never taken by the transport
            unconsumed = [*unconsumed, *cons.unacked]
        back = [(t, cons.unacked.pop(t)) for t in dict.fromkeys(unconsumed) if t in cons.unacked]
        for _, item in reversed(back):
            cons.pending.appendleft(item)
        del self._consumers[consumer_id]
        if conn is not None:
            conn.consumers.discard(consumer_id)
            for tx in conn.txs.values():
                tx.acks = [(c, t) for c, t in tx.acks if c != consumer_id]
                tx.nacks = {(c, t) for c, t in tx.nacks if c != consumer_id}
        if cons.kind == "durable":
            d = self._durables.get(cons.durable)
            if d is not None:
                d.consumer = None
                if d.implicit:
                    d.idle_since = now
                    self.store.put("durable", d.key, d.record())
                for skey, msg in cons.unacked.values():  # delivered, not acknowledged
                    self._refused(cons, skey, msg, now)
                for _, (skey, msg) in back:  # stored as "may have been delivered" at dispatch
                    if skey:
                        self.store.put("dpending", skey, mdl.freeze(msg))
        elif cons.kind == "topic":
            self._unsubscribe_core(cons.core_key)
        else:
            if cons.reorder is not None:  # held back for order: never handed to the client
                self._queue_release(cons, cons.reorder.flush(), now, pump=False)
            released = [m.message_id for _, m in cons.unacked.values()]
            returned = [m.message_id for _, m in cons.pending]  # never handed to the client
            # how many times the client was given each (its count, raised here by NACKs,
            # recover and rollback): the manager goes on counting from there
            deliveries = {
                m.message_id: m.delivery_count for _, m in cons.pending if m.delivery_count
            }
            for _, m in cons.unacked.values():
                if m.delivery_count:  # (the last time included)
                    deliveries[m.message_id] = m.delivery_count + 1
            self._unsubscribe_core(cons.core_key)
            # The acknowledgements still in the ack batch go out now, and ride on the
            # cancel as well: a manager must never see the cancel without them (it would
            # hand an already consumed message to the next receiver).
            acked, rel, copies = self._acks_out.pop((cons.dest.name, cons.reply_id), ([], [], []))
            released = rel + released
            if acked or released or returned:
                self._publish_ack(cons.dest.name, cons.reply_id, now, acked, released, copies,
                                  returned, deliveries)  # fmt: skip
            # every message this receiver got from the manager: those it was handed but
            # never got (still on their way when it closed) go back as never delivered
            received = sorted(cons.seen) if len(cons.seen) <= MAX_RECEIVED_ON_CANCEL else None
            self._publish_receiver(cons, now, cancel=True, acked=acked, returned=returned,
                                   received=received, deliveries=deliveries)  # fmt: skip
        self.store.commit()

    def _implicit_name(
        self, conn: _Connection, dest: Destination, selector: str, no_local: bool
    ) -> str | None:
        """The durable name standing for a non-durable subscription, when it is kept as a
        durable one (nondurable = durable, a client id, that subscription not already
        consumed on this connection); None otherwise."""
        if self.config.nondurable != "durable" or conn.client_id is None:
            return None
        if dest.name.startswith(TEMP_TOPIC_PREFIX):
            return None
        name = IMPLICIT_PREFIX + _digest(dest.name, selector, str(no_local))
        d = self._durables.get(_digest(conn.client_id, name))
        if d is not None and d.consumer is not None:
            return None  # a second consumer of the same subscription: a plain one
        return name

    def unsubscribe_durable(self, conn_id: str, name: str, now: float) -> None:
        """Delete a durable subscription of this connection's client id (JMS unsubscribe)."""
        conn = self._conn(conn_id)
        if conn.client_id is None:
            raise IllegalStateException("unsubscribing a durable subscription needs a client id")
        key = _digest(conn.client_id, name)
        d = self._durables.get(key)
        if d is None:
            raise InvalidDestinationException(f"no durable subscription {name!r}")
        if d.consumer is not None:
            raise IllegalStateException(f"durable subscription {name!r} has an active consumer")
        self._delete_durable(d)
        self.store.commit()

    def waiting(self, consumer_id: str, tag: str) -> bool:
        """Whether ``tag`` was sent to the consumer and is not acknowledged yet."""
        cons = self._consumers.get(consumer_id)
        return cons is not None and tag in cons.unacked

    def ack(self, consumer_id: str, tag: str, now: float, *, tx: str | None = None) -> bool:
        """Acknowledge (cumulatively in ``client`` mode); False when ``tag`` is unknown."""
        cons = self._consumers.get(consumer_id)
        if cons is None or tag not in cons.unacked:
            return False
        if tx is not None:
            self._tx(self._conn(cons.conn), tx).acks.append((consumer_id, tag))
            return True
        self._apply_ack(cons, tag, now)
        self.store.commit()
        return True

    def nack(self, consumer_id: str, tag: str, now: float, *, tx: str | None = None) -> bool:
        """Redeliver a message (JMSRedelivered set) — in ``client`` mode, as STOMP 1.2 has
        it, every unacknowledged one up to it too (cumulative, like ACK); False when
        ``tag`` is unknown. In transaction ``tx``, at its commit (as an ACK)."""
        cons = self._consumers.get(consumer_id)
        if cons is None or tag not in cons.unacked:
            return False
        if tx is not None:
            t = self._tx(self._conn(cons.conn), tx)
            t.acks.append((consumer_id, tag))
            t.nacks.add((consumer_id, tag))
            return True
        self._apply_nack(cons, tag, now)
        self.store.commit()
        return True

    def recover(self, consumer_id: str, now: float) -> None:
        """Redeliver every unacknowledged message of a consumer (JMS Session.recover)."""
        cons = self._consumers.get(consumer_id)
        if cons is not None:
            self._redeliver(cons, list(cons.unacked), now)
            self.store.commit()

    def consumer_info(self, consumer_id: str) -> dict[str, Any]:
        c = self._consumers[consumer_id]
        return {
            "destination": str(c.dest),
            "selector": c.selector_text,
            "kind": c.kind,
            "pending": len(c.pending),
            "unacked": len(c.unacked),
        }

    # ================================================================ housekeeping
    def _housekeeping(self, now: float) -> None:
        keep = self.config.nondurable_keep
        for d in list(self._durables.values()):
            if d.implicit and d.idle_since is not None and d.idle_since + keep <= now:
                self._delete_durable(d)  # its consumer did not come back
                self._count("implicit_subscriptions_expired")
        for k, v in self.store.items("seen"):
            try:
                if float(v) < now:
                    self.store.delete("seen", k)
            except ValueError:
                self.store.delete("seen", k)
        for q in self._queues.values():
            for mid, pend in list(q.pending.items()):
                if pend.deadline <= now:
                    self._drop_pending(q, mid)
        for host, (date, _, _) in list(self._directory.items()):
            if date + 3 * self.config.directory_period < now:
                del self._directory[host]
