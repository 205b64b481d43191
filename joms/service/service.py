"""The JOMS service: JMS semantics on top of a dissemination port, sans-IO and clock-free.

Owns connections, consumers, durable subscriptions, transactions, queue managers, queue
receivers and the directory. Every entry point takes ``now`` (seconds since the epoch, the
runner's clock); outputs are pulled (:meth:`JomsService.next_event`), there is one deadline
(:meth:`get_timer` / :meth:`handle_timer`), and the only I/O is the port (publish /
subscribe / unsubscribe / drop) and the :class:`~joms.service.store.ServiceStore`.

Errors caused by the local caller raise :class:`~joms.errors.JMSException` subclasses;
malformed input from the network is dropped and counted in :attr:`counters`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dodwan import Limits

from .. import selector as selector_lang
from ..errors import (
    IllegalStateException,
    InvalidClientIDException,
    InvalidDestinationException,
    InvalidSelectorException,
    JMSException,
    MessageFormatException,
    TransactionInProgressException,
)
from . import model as mdl
from .config import ServiceConfig
from .events import Event, MessageDispatched
from .model import Destination, JomsMessage
from .ordering import Reorder, parse_sequence
from .port import DisseminationPort
from .queues import ManagedQueue, Pending, Receiver, load_policy
from .store import MemoryServiceStore, ServiceStore
from .wildcards import check_wildcard, is_wildcard, topic_matches, topic_regex

KEY_PREFIX = "joms:"
ACK_MODES = ("auto", "client", "client-individual")
_SEP = "\x1e"
_CORE_LIMITS = Limits()  # DoDWAN's default pattern limits, which network filters must fit


def _esc(value: str) -> str:
    """A literal as an RE2 full-match expression."""
    return re.escape(value)


def _json_obj(payload: bytes) -> dict[str, Any]:
    """A JSON object from the network; ValueError for anything else."""
    obj = json.loads(payload or b"{}")
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    return obj


def _digest(*parts: str) -> str:
    return hashlib.sha1("\x1f".join(parts).encode()).hexdigest()[:24]


def compile_selector(text: str | None) -> Any:
    """Parse a selector (None/blank = match all); InvalidSelectorException if invalid."""
    if text is None or not text.strip():
        return None
    try:
        return selector_lang.parse(text)
    except InvalidSelectorException as exc:
        raise InvalidSelectorException(
            f"invalid selector {text[:200]!r}: {exc}", position=exc.position
        ) from None
    except JMSException:
        raise
    except Exception as exc:
        raise InvalidSelectorException(f"invalid selector: {exc}") from None


def selector_matches(sel: Any, msg: JomsMessage) -> bool:
    if sel is None:
        return True
    try:
        return bool(sel.matches(msg.selector_values()) is True)
    except Exception:
        return False


def attribute_for(identifier: str) -> str | None:
    """Descriptor attribute carrying a selector identifier (None: not filterable in network)."""
    if identifier in mdl.HEADER_IDENTIFIERS:
        return mdl.HEADER_IDENTIFIERS[identifier]
    try:
        mdl.check_property_name(identifier)
    except MessageFormatException:
        return None
    return identifier


@dataclass(slots=True)
class _Tx:
    sends: list[tuple[JomsMessage, float | None]] = field(default_factory=list)
    acks: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class _Connection:
    id: str
    client_id: str | None
    tag: str
    consumers: set[str] = field(default_factory=set)
    temp_queues: set[str] = field(default_factory=set)
    txs: dict[str, _Tx] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    """Topic name -> messages this connection (one producer) published to it."""


@dataclass(slots=True)
class _Consumer:
    id: str
    conn: str
    kind: str  # "topic" | "durable" | "queue"
    dest: Destination
    selector_text: str
    selector: Any
    no_local: bool
    ack_mode: str
    prefetch: int = 0
    core_key: str = ""
    durable: str = ""  # durable subscription key
    reply_id: str = ""
    renew_at: float = 0.0
    seen: set[str] = field(default_factory=set)
    """Queue message ids received (a manager may re-send after a restart)."""
    done: set[str] = field(default_factory=set)
    """Queue message ids consumed (a re-sent copy is acknowledged again, not delivered)."""
    copies: dict[str, list[str]] = field(default_factory=dict)
    """Queue message id -> DoDWAN ids of its copies (delivery, original) held here."""
    pending: deque[tuple[str, JomsMessage]] = field(default_factory=deque)
    unacked: OrderedDict[str, tuple[str, JomsMessage]] = field(default_factory=OrderedDict)
    reorder: Reorder[tuple[str, JomsMessage]] | None = None
    """Topic consumers: puts each producer's messages back in order."""


@dataclass(slots=True)
class _Durable:
    key: str
    client_id: str
    name: str
    topic: str
    selector_text: str
    selector: Any
    no_local: bool
    core_key: str
    created: int = 0
    """Creation time (ms since the epoch)."""
    consumer: str | None = None
    reorder: Reorder[tuple[str, JomsMessage]] | None = None
    """Puts each producer's messages back in order before they are stored."""

    def record(self) -> bytes:
        return json.dumps(
            {
                "client_id": self.client_id,
                "name": self.name,
                "topic": self.topic,
                "selector": self.selector_text,
                "no_local": self.no_local,
                "core_key": self.core_key,
                "created": self.created,
            }
        ).encode()


class JomsService:
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
        self._epoch = f"{self.rng.getrandbits(32):08x}"
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

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _id(self) -> str:
        self._n += 1
        return f"{self._epoch}{self._n:x}"

    def _subscribe_core(
        self,
        patterns: list[dict[str, str]],
        key: str,
        handler: Callable[[Mapping[str, str], bytes, float], None],
        *,
        fallback: list[dict[str, str]] | None = None,
    ) -> None:
        try:
            self.port.subscribe(patterns, key=key)
        except ValueError:
            if fallback is None:
                raise
            self.port.subscribe(fallback, key=key)
        self._routes[key] = handler

    def _unsubscribe_core(self, key: str) -> None:
        self._routes.pop(key, None)
        self.port.unsubscribe(key)
        self.store.delete("ephemeral", key)

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

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        times = [t for t in (self._ack_flush_at, self._next_advert, self._next_housekeeping) if t]
        for c in self._consumers.values():
            if c.kind == "queue":
                times.append(c.renew_at)
            elif c.reorder is not None and (t := c.reorder.next_deadline()) is not None:
                times.append(t)
        for d in self._durables.values():
            if d.reorder is not None and (t := d.reorder.next_deadline()) is not None:
                times.append(t)
        for q in self._queues.values():
            for r in q.receivers.values():
                times.append(r.until)
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        if self._ack_flush_at is not None and self._ack_flush_at <= now:
            self._flush_acks(now)
        for c in list(self._consumers.values()):
            if c.kind == "queue" and c.renew_at <= now:
                self._send_receiver_request(c, now)
            elif c.reorder is not None:
                self._topic_release(c, self._expire_order(c.reorder, now), now)
        for d in list(self._durables.values()):
            if d.reorder is not None:
                for item in self._expire_order(d.reorder, now):
                    self._durable_store(d, item, now)
        for q in list(self._queues.values()):
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

    def close_connection(self, conn_id: str, now: float) -> None:
        """Close consumers (unacked messages go back for redelivery), abort transactions."""
        conn = self._connections.get(conn_id)
        if conn is None:
            return
        for tx in list(conn.txs):
            self.abort(conn_id, tx, now)
        for cons in list(conn.consumers):
            self.close_consumer(cons, now)
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
        if tx is not None:
            self._tx(conn, tx).sends.append((msg, None))
            return msg.message_id
        self._publish(msg, now, conn)
        self.store.commit()
        return msg.message_id

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
            self.port.publish(
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
            if is_wildcard(dest.name):
                try:
                    check_wildcard(dest.name)
                except ValueError as exc:
                    raise InvalidDestinationException(str(exc)) from None
            else:
                self._note_topic(dest.name, now)
            if durable_name:
                self._attach_durable(conn, cons, durable_name, now)
            else:
                if self.config.nondurable == "refuse":
                    raise IllegalStateException(
                        "non-durable topic subscriptions are refused by this JOMS service "
                        "(nondurable = refuse): use a durable subscription"
                    )
                cons.core_key = f"{KEY_PREFIX}t:{cid}"
                cons.reorder = self._new_reorder(sel)
                self.store.put("ephemeral", cons.core_key, b"")
                self._subscribe_core(
                    self._topic_patterns(dest.name, sel),
                    cons.core_key,
                    functools.partial(self._on_topic_message, cid),
                    fallback=self._topic_patterns(dest.name, None),
                )
        else:
            if durable_name:
                raise InvalidDestinationException("durable subscriptions are for topics only")
            q = self._queues.get(dest.name)
            if q is not None and q.temporary and q.owner != conn_id:
                raise InvalidDestinationException(
                    "a temporary queue can only be consumed by the connection that created it"
                )
            if dest.manager == self.host_id:
                self._ensure_queue(dest.name, now)
            cons.kind = "queue"
            cons.reply_id = f"{self.host_id}.{cid}"
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

    def close_consumer(self, consumer_id: str, now: float) -> None:
        """Close a consumer: unacked messages are kept for redelivery (durable, queue)."""
        cons = self._consumers.pop(consumer_id, None)
        if cons is None:
            return
        conn = self._connections.get(cons.conn)
        if conn is not None:
            conn.consumers.discard(consumer_id)
            for tx in conn.txs.values():
                tx.acks = [(c, t) for c, t in tx.acks if c != consumer_id]
        if cons.kind == "durable":
            d = self._durables.get(cons.durable)
            if d is not None:
                d.consumer = None
                for skey, msg in cons.unacked.values():
                    msg.redelivered = True
                    self.store.put("dpending", skey, mdl.freeze(msg))
        elif cons.kind == "topic":
            self._unsubscribe_core(cons.core_key)
        else:
            released = [m.message_id for _, m in cons.unacked.values()]
            returned = [m.message_id for _, m in cons.pending]  # never handed to the client
            self._unsubscribe_core(cons.core_key)
            # The acknowledgements still in the ack batch go out now, and ride on the
            # cancel as well: a manager must never see the cancel without them (it would
            # hand an already consumed message to the next receiver).
            acked, rel, copies = self._acks_out.pop((cons.dest.name, cons.reply_id), ([], [], []))
            released = rel + released
            if acked or released or returned:
                self._publish_ack(cons.dest.name, cons.reply_id, now, acked, released, copies,
                                  returned)  # fmt: skip
            self._publish_receiver(cons, now, cancel=True, acked=acked, returned=returned)
        self.store.commit()

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

    def nack(self, consumer_id: str, tag: str, now: float) -> bool:
        """Redeliver a message (JMSRedelivered set); False when ``tag`` is unknown."""
        cons = self._consumers.get(consumer_id)
        if cons is None or tag not in cons.unacked:
            return False
        self._redeliver(cons, [tag], now)
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

    # ---------------------------------------------------------------- dispatch
    def _pump(self, cons: _Consumer, now: float) -> None:
        limit = cons.prefetch if cons.ack_mode != "auto" else 0
        while cons.pending and (not limit or len(cons.unacked) < limit):
            skey, msg = cons.pending.popleft()
            if msg.expiration and msg.expiration / 1000.0 <= now:
                self._count("expired_before_delivery")
                self._finish(cons, skey, msg, now)
                continue
            self._n += 1
            tag = f"{cons.id}-{self._n}"
            if cons.ack_mode == "auto":
                self._finish(cons, skey, msg, now)
            else:
                cons.unacked[tag] = (skey, msg)
            self._events.append(MessageDispatched(cons.conn, cons.id, tag, msg))
            self._count("messages_dispatched")

    def _finish(self, cons: _Consumer, skey: str, msg: JomsMessage, now: float) -> None:
        """A message is consumed: forget it for good."""
        if cons.kind == "durable":
            self._drop_durable(cons.durable, skey)
        elif cons.kind == "queue":
            cons.done.add(msg.message_id)
            copies = cons.copies.pop(msg.message_id, [])
            self._queue_ack(cons, [msg.message_id], [], now, copies)
            if skey:
                self.port.drop(skey)

    def _apply_ack(self, cons: _Consumer, tag: str, now: float) -> None:
        if tag not in cons.unacked:
            return
        if cons.ack_mode == "client":
            tags = []
            for t in cons.unacked:
                tags.append(t)
                if t == tag:
                    break
        else:
            tags = [tag]
        for t in tags:
            skey, msg = cons.unacked.pop(t)
            self._finish(cons, skey, msg, now)
        if cons.pending:
            self._pump(cons, now)  # room in the prefetch window

    def _over_limit(self, deliveries: int) -> bool:
        """A message delivered ``deliveries`` times (first one included) may not go again."""
        limit = self.config.max_redeliveries
        return limit >= 0 and deliveries > limit

    def _dead_letter(self, msg: JomsMessage, host: str, now: float, reason: str) -> None:
        """Send a copy of a poison message to the dead-letter queue ``DLQ@host``, with its
        original destination and the reason."""
        dlq = Destination("queue", f"{self.config.dead_letter_queue}@{host}")
        if msg.destination == dlq:  # a dead letter that is itself poison: give up on it
            self._count("dead_letters_discarded")
            return
        if host == self.host_id:
            self._ensure_queue(dlq.name, now)
        dead = msg.copy(
            destination=dlq,
            properties=dict(msg.properties),
            property_types=dict(msg.property_types),
            original_destination=str(msg.destination),
            dlq_reason=reason,
            redelivered=False,
            delivery_count=0,
            sequence="",
        )
        try:
            self._publish(dead, now)
        except JMSException:
            self._count("dead_letters_refused")
            return
        self._count("dead_lettered")

    def _redeliver(self, cons: _Consumer, tags: list[str], now: float) -> None:
        back = []
        for t in tags:
            item = cons.unacked.pop(t, None)
            if item is not None:
                skey, msg = item
                msg.delivery_count += 1
                if self._over_limit(msg.delivery_count):
                    self._finish(cons, skey, msg, now)
                    host = cons.dest.manager if cons.kind == "queue" else self.host_id
                    self._dead_letter(
                        msg, host or self.host_id, now,
                        f"redelivered {msg.delivery_count - 1} times and refused again "
                        f"(max_redeliveries = {self.config.max_redeliveries})",
                    )  # fmt: skip
                    continue
                msg.redelivered = True
                if cons.kind == "durable":
                    self.store.put("dpending", skey, mdl.freeze(msg))
                back.append((skey, msg))
        cons.pending.extendleft(reversed(back))
        self._pump(cons, now)

    # ---------------------------------------------------------------- topics
    def _topic_patterns(self, topic: str, sel: Any) -> list[dict[str, str]]:
        base = {
            mdl.KIND: mdl.KIND_MESSAGE,
            mdl.DEST_TYPE: "topic",
            mdl.DEST_ID: topic_regex(topic) if is_wildcard(topic) else _esc(topic),
        }
        if sel is None:
            return [base]
        try:
            # leave room for the base attributes within DoDWAN's per-pattern limit
            extra = sel.network_patterns(
                attribute_for,
                max_regex_length=_CORE_LIMITS.max_regex_length,
                max_attributes=_CORE_LIMITS.max_pattern_attributes - len(base),
            )
        except Exception:
            extra = None
        if not extra:
            return [base]
        return [{**p, **base} for p in extra]

    def _accepts(self, sel: Any, no_local: bool, conn_tag: str, msg: JomsMessage) -> bool:
        if no_local and msg.connection == conn_tag:
            return False
        return selector_matches(sel, msg)

    def _new_reorder(self, sel: Any) -> Reorder[tuple[str, JomsMessage]] | None:
        """A reorder window for a topic subscription, unless reordering is off or its
        selector filters in the network (it could not tell a gap from a filtered message)."""
        if self.config.order_gap_timeout <= 0:
            return None
        if sel is not None and self._topic_patterns("t", sel) != self._topic_patterns("t", None):
            return None
        return Reorder(self.config.order_gap_timeout, self.config.order_window_bytes)

    def _in_order(
        self,
        reorder: Reorder[tuple[str, JomsMessage]] | None,
        item: tuple[str, JomsMessage],
        now: float,
    ) -> list[tuple[str, JomsMessage]]:
        """What may go on now, each producer's messages in order (see joms.service.ordering)."""
        seq = parse_sequence(item[1].sequence) if reorder is not None else None
        if reorder is None or seq is None:
            return [item]
        gaps, late = reorder.gaps, reorder.late
        producer = f"{item[1].destination.name}|{seq[0]}"  # numbered per topic (wildcards)
        out = reorder.push(producer, seq[1], item, len(item[1].body), now)
        self._count("order_gaps", reorder.gaps - gaps)
        self._count("order_late", reorder.late - late)
        return out

    def _expire_order(
        self, reorder: Reorder[tuple[str, JomsMessage]], now: float
    ) -> list[tuple[str, JomsMessage]]:
        gaps = reorder.gaps
        out = reorder.expire(now)
        self._count("order_gaps", reorder.gaps - gaps)
        return out

    def _on_topic_message(self, cid: str, d: Mapping[str, str], payload: bytes, now: float) -> None:
        cons = self._consumers.get(cid)
        if cons is None:
            return
        msg = mdl.from_descriptor(d, payload)
        if msg.destination.kind != "topic" or not topic_matches(
            cons.dest.name, msg.destination.name
        ):
            self._count("filtered_on_delivery")
            return
        self._topic_release(cons, self._in_order(cons.reorder, ("", msg), now), now)

    def _topic_release(
        self, cons: _Consumer, items: list[tuple[str, JomsMessage]], now: float
    ) -> None:
        conn = self._connections[cons.conn]
        for skey, msg in items:
            if self._accepts(cons.selector, cons.no_local, conn.tag, msg):
                cons.pending.append((skey, msg))
            else:
                self._count("filtered_on_delivery")
        if items:
            self._pump(cons, now)

    # ---------------------------------------------------------------- durable subscriptions
    def _attach_durable(self, conn: _Connection, cons: _Consumer, name: str, now: float) -> None:
        if conn.client_id is None:
            raise IllegalStateException("a durable subscription needs a client id")
        if not name or len(name) > 128:
            raise JMSException("a durable subscription name has 1-128 characters")
        key = _digest(conn.client_id, name)
        d = self._durables.get(key)
        if d is not None and d.consumer is not None:
            raise IllegalStateException(f"durable subscription {name!r} is already active")
        if d is not None and (
            d.topic != cons.dest.name
            or d.selector_text != cons.selector_text
            or d.no_local != cons.no_local
        ):
            self._delete_durable(d)  # JMS: changing topic/selector recreates the subscription
            d = None
        if d is None:
            d = _Durable(
                key,
                conn.client_id,
                name,
                cons.dest.name,
                cons.selector_text,
                cons.selector,
                cons.no_local,
                self._durable_core_key(key),
                int(now * 1000),
            )
            self._durables[key] = d
            self.store.put("durable", key, d.record())
            self._install_durable(d)
        cons.kind = "durable"
        cons.durable = key
        cons.core_key = d.core_key
        d.consumer = cons.id
        waiting: list[tuple[str, JomsMessage]] = []
        for skey, blob in self.store.items("dpending", key + _SEP):
            try:
                waiting.append((skey, mdl.thaw(blob)))
            except (ValueError, KeyError):
                self.store.delete("dpending", skey)
                self._dcount.pop(key, None)
        # what waited is handed over higher JMSPriority first, then in arrival order
        waiting.sort(key=lambda item: (-item[1].priority, item[0]))
        cons.pending.extend(waiting)

    def _durable_core_key(self, key: str) -> str:
        """Subscription key of a durable subscription for this start (new at every start)."""
        return f"{KEY_PREFIX}d:{key}.{self._run}"

    def _install_durable(self, d: _Durable) -> None:
        d.reorder = self._new_reorder(d.selector)
        self._subscribe_core(
            self._topic_patterns(d.topic, d.selector),
            d.core_key,
            functools.partial(self._on_durable_message, d.key),
            fallback=self._topic_patterns(d.topic, None),
        )

    def _delete_durable(self, d: _Durable) -> None:
        self._unsubscribe_core(d.core_key)
        for skey, _ in self.store.items("dpending", d.key + _SEP):
            self.store.delete("dpending", skey)
        self.store.delete("durable", d.key)
        self._durables.pop(d.key, None)
        self._dcount.pop(d.key, None)

    def _drop_durable(self, key: str, skey: str) -> None:
        """Delete a stored durable message; the count only goes down if it was still there
        (a message the backlog bound dropped while dispatched is acknowledged later)."""
        if self.store.get("dpending", skey) is None:
            return
        self.store.delete("dpending", skey)
        if key in self._dcount:
            self._dcount[key] -= 1

    def _durable_count(self, key: str) -> int:
        """Messages waiting for a durable subscription (counted once, then maintained)."""
        if key not in self._dcount:
            self._dcount[key] = len(self.store.items("dpending", key + _SEP))
        return self._dcount[key]

    def _on_durable_message(self, key: str, desc: Mapping[str, str], p: bytes, now: float) -> None:
        d = self._durables.get(key)
        if d is None:
            return
        msg = mdl.from_descriptor(desc, p)
        core_id = desc.get("id", "")
        if msg.destination.kind != "topic" or not topic_matches(d.topic, msg.destination.name):
            self._count("filtered_on_delivery")
            return
        # held back in memory until its predecessors came: marked "seen" only once stored,
        # so a message held when the daemon stops comes again after the restart; a
        # duplicate goes through too (it tells the window where the producer is), and is
        # dropped when it comes out
        deadline = desc.get("deadline", "0")
        for item in self._in_order(d.reorder, (f"{core_id}{_SEP}{deadline}", msg), now):
            self._durable_store(d, item, now)

    def _durable_store(self, d: _Durable, item: tuple[str, JomsMessage], now: float) -> None:
        key = d.key
        ident, msg = item
        core_id, _, deadline = ident.partition(_SEP)
        if core_id:
            seen_key = key + _SEP + core_id
            if self.store.get("seen", seen_key) is not None:
                self._count("durable_duplicates")
                return
            self.store.put("seen", seen_key, (deadline or "0").encode())
        if not self._accepts(d.selector, d.no_local, f"{self.host_id}/{d.client_id}", msg):
            self._count("filtered_on_delivery")
            return
        skey = f"{key}{_SEP}{int(now * 1e6):020d}{self._id()}"
        if self._durable_count(key) >= self.config.max_pending:
            oldest = self.store.items("dpending", key + _SEP, limit=1)
            for okey, _ in oldest:
                self._drop_durable(key, okey)
                if d.consumer is not None:  # not waiting in memory either
                    c = self._consumers[d.consumer]
                    c.pending = deque(x for x in c.pending if x[0] != okey)
            self._count("pending_overflow")
        self.store.put("dpending", skey, mdl.freeze(msg))
        self._dcount[key] += 1
        if d.consumer is not None:
            cons = self._consumers[d.consumer]
            cons.pending.append((skey, msg))
            self._pump(cons, now)

    # ---------------------------------------------------------------- transactions
    def _tx(self, conn: _Connection, tx: str) -> _Tx:
        t = conn.txs.get(tx)
        if t is None:
            raise IllegalStateException(f"transaction {tx!r} was not begun")
        return t

    def begin(self, conn_id: str, tx: str) -> None:
        conn = self._conn(conn_id)
        if tx in conn.txs:
            raise TransactionInProgressException(f"transaction {tx!r} is already in progress")
        conn.txs[tx] = _Tx()

    def commit(self, conn_id: str, tx: str, now: float) -> None:
        """Publish the held sends and apply the held acknowledgements."""
        conn = self._conn(conn_id)
        t = self._tx(conn, tx)
        del conn.txs[tx]
        for msg, _ in t.sends:
            self._publish(msg, now, conn)
        for cid, tag in t.acks:
            cons = self._consumers.get(cid)
            if cons is not None:
                self._apply_ack(cons, tag, now)
        self.store.commit()

    def abort(self, conn_id: str, tx: str, now: float) -> None:
        """Drop the held sends; messages acknowledged in the transaction are redelivered."""
        conn = self._conn(conn_id)
        t = self._tx(conn, tx)
        del conn.txs[tx]
        by_consumer: dict[str, list[str]] = {}
        for cid, tag in t.acks:
            by_consumer.setdefault(cid, []).append(tag)
        for cid, tags in by_consumer.items():
            cons = self._consumers.get(cid)
            if cons is None:
                continue
            if cons.ack_mode == "client":
                last = set(tags)
                upto: list[str] = []
                for tg in cons.unacked:
                    upto.append(tg)
                    if tg in last and tg == tags[-1]:
                        break
                tags = upto
            self._redeliver(cons, tags, now)
        self.store.commit()

    # ================================================================ queues: manager side
    def create_queue(self, name: str, now: float) -> Destination:
        """Create queue ``name`` managed here (idempotent); returns ``Name@host``."""
        dest = Destination("queue", f"{name}@{self.host_id}")
        self._ensure_queue(dest.name, now)
        self.store.commit()
        return dest

    def create_temporary_queue(self, conn_id: str, now: float) -> Destination:
        """A queue managed here, consumable only by this connection, deleted with it."""
        conn = self._conn(conn_id)
        dest = Destination("queue", f"tmp.{self._id()}@{self.host_id}")
        q = self._ensure_queue(dest.name, now, temporary=True, owner=conn_id)
        conn.temp_queues.add(q.name)
        self.store.commit()
        return dest

    def delete_temporary_queue(self, conn_id: str, dest: Destination, now: float) -> None:
        conn = self._conn(conn_id)
        if dest.name not in conn.temp_queues:
            raise InvalidDestinationException(f"{dest} is not a temporary queue of this connection")
        conn.temp_queues.discard(dest.name)
        self._delete_queue(dest.name, now)

    def _ensure_queue(
        self, name: str, now: float, *, temporary: bool = False, owner: str = ""
    ) -> ManagedQueue:
        q = self._queues.get(name)
        if q is not None:
            return q
        if not temporary and name.startswith("tmp."):
            raise InvalidDestinationException(
                f"temporary queue {name} does not exist (any more); names starting with "
                "'tmp.' are reserved for temporary queues"
            )
        q = ManagedQueue(name, temporary=temporary, owner=owner)
        self._queues[name] = q
        self._save_queue(q)
        if not temporary:
            self._next_advert = min(self._next_advert or now, now)
        return q

    def _save_queue(self, q: ManagedQueue) -> None:
        self.store.put(
            "queues", q.name, json.dumps({"temporary": q.temporary, "last": q.last}).encode()
        )

    def _on_queue_input(self, d: Mapping[str, str], p: bytes, now: float) -> None:
        name = d[mdl.DEST_ID]
        if name not in self._queues:
            if name.startswith("tmp."):
                self._count("input_for_deleted_temporary_queue")
                return
            self._ensure_queue(name, now)
        self._on_manager_input(name, d, p, now)

    def _delete_queue(self, name: str, now: float) -> None:
        q = self._queues.pop(name, None)
        if q is None:
            return
        self._forget_queue(name)

    def _forget_queue(self, name: str) -> None:
        self.store.delete("queues", name)
        for table in ("qreceivers", "qpending", "seen"):
            for k, _ in self.store.items(table, name + _SEP):
                self.store.delete(table, k)

    def _load_queue(self, q: ManagedQueue) -> None:
        for k, blob in self.store.items("qreceivers", q.name + _SEP):
            try:
                rec = json.loads(blob)
                r = Receiver(
                    rec["reply_id"],
                    rec["selector"],
                    compile_selector(rec["selector"]),
                    float(rec["until"]),
                    float(rec["since"]),
                    local=bool(rec.get("local", False)),
                )
            except (ValueError, KeyError, JMSException):
                self.store.delete("qreceivers", k)
                continue
            q.receivers[r.reply_id] = r
        for k, blob in self.store.items("qpending", q.name + _SEP):
            try:
                meta, _, frozen = blob.partition(b"\n")
                rec = json.loads(meta)
                msg = mdl.thaw(frozen)
                p = Pending(
                    rec["seq"],
                    msg,
                    float(rec["deadline"]),
                    rec["core_id"],
                    rec["assigned"],
                    int(rec["attempts"]),
                    rec.get("delivery_id", ""),
                )
            except (ValueError, KeyError):
                self.store.delete("qpending", k)
                continue
            q.pending[msg.message_id] = p

    def _save_pending(self, q: ManagedQueue, p: Pending) -> None:
        meta = json.dumps(
            {
                "seq": p.seq,
                "deadline": p.deadline,
                "core_id": p.core_id,
                "assigned": p.assigned,
                "attempts": p.attempts,
                "delivery_id": p.delivery_id,
            }
        ).encode()
        self.store.put("qpending", q.name + _SEP + p.seq, meta + b"\n" + mdl.freeze(p.message))

    def _save_receiver(self, q: ManagedQueue, r: Receiver) -> None:
        self.store.put(
            "qreceivers",
            q.name + _SEP + r.reply_id,
            json.dumps(
                {
                    "reply_id": r.reply_id,
                    "selector": r.selector_text,
                    "until": r.until,
                    "since": r.since,
                    "local": r.local,
                }
            ).encode(),
        )

    def _on_manager_input(self, name: str, d: Mapping[str, str], p: bytes, now: float) -> None:
        q = self._queues.get(name)
        if q is None:
            return
        kind = d.get(mdl.KIND)
        if kind == mdl.KIND_MESSAGE:
            self._manager_message(q, d, p, now)
        elif kind == mdl.KIND_RECEIVER:
            self._manager_receiver(q, d, p, now)
        elif kind == mdl.KIND_ACK:
            self._manager_ack(q, d, p, now)

    def _manager_message(self, q: ManagedQueue, d: Mapping[str, str], p: bytes, now: float) -> None:
        msg = mdl.from_descriptor(d, p)
        deadline = float(d["deadline"])
        seen_key = q.name + _SEP + msg.message_id
        if self.store.get("seen", seen_key) is not None:
            self._count("queue_duplicates")
            return
        self.store.put("seen", seen_key, repr(deadline).encode())
        if len(q.pending) >= self.config.max_pending:
            oldest = next(iter(q.pending))
            self._drop_pending(q, oldest)
            self._count("pending_overflow")
        pend = Pending(f"{int(now * 1e6):020d}{self._id()}", msg, deadline, d.get("id", ""))
        q.pending[msg.message_id] = pend
        self._save_pending(q, pend)
        self._assign(q, now)

    def _manager_receiver(
        self, q: ManagedQueue, d: Mapping[str, str], p: bytes, now: float
    ) -> None:
        reply_id = d[mdl.REPLY_ID]
        date = float(d.get("date", now))
        req = _json_obj(p)
        local = d.get("origin") == self.host_id
        if local and date < self._started_at:
            # a request of a consumer of the previous process, still cached and seen again
            # after a restart (same clock): that consumer died with the process
            self._count("stale_local_receiver_requests")
            return
        r = q.receivers.get(reply_id)
        if r is not None and date < r.since:
            return  # an older renewal arriving late
        if req.get("cancel"):
            self._apply_acked(q, req.get("acked", []))
            self._apply_returned(q, req.get("returned", []), reply_id)
            if r is not None:
                self._remove_receiver(q, reply_id, now)
                self._assign(q, now)
            else:
                self.store.put(
                    "seen", q.name + _SEP + "cancel:" + reply_id, repr(now + 3600).encode()
                )
            return
        if self.store.get("seen", q.name + _SEP + "cancel:" + reply_id) is not None:
            return  # the receiver was already cancelled (its last renewal came late)
        lease = float(req.get("lease", self.config.lease))
        if not 0.0 < lease <= 24 * 3600.0:  # also rejects NaN
            lease = self.config.lease
        text = str(req.get("selector") or "")
        # the lease counts from its arrival: clocks of distant hosts need not agree
        until = now + lease
        if r is None or r.selector_text != text:
            try:
                sel = compile_selector(text)
            except JMSException:
                self._count("bad_receiver_selectors")
                return
            r = Receiver(reply_id, text, sel, until, date, local=local)
            q.receivers[reply_id] = r
        else:
            r.until = until
            r.since = date
        self._save_receiver(q, r)
        self._assign(q, now)

    def _manager_ack(self, q: ManagedQueue, d: Mapping[str, str], p: bytes, now: float) -> None:
        rec = _json_obj(p)
        self._apply_acked(q, rec.get("acked", []))
        released = self._apply_returned(q, rec.get("returned", []), d.get(mdl.REPLY_ID, ""))
        for mid in rec.get("released", []):
            pend = q.pending.get(mid)
            if pend is not None and pend.assigned == d.get(mdl.REPLY_ID):
                pend.assigned = None
                self._save_pending(q, pend)
                released = True
        if released:
            self._assign(q, now)

    def _apply_acked(self, q: ManagedQueue, acked: Any) -> None:
        if not isinstance(acked, list):
            raise ValueError("acked must be a list")
        for mid in acked:
            if isinstance(mid, str) and mid in q.pending:
                self._drop_pending(q, mid)
                self._count("queue_consumed")

    def _apply_returned(self, q: ManagedQueue, returned: Any, reply_id: str) -> bool:
        """Messages a receiver gives back without having handed them to its client: not a
        redelivery (no JMSRedelivered, not counted towards the dead-letter limit)."""
        if not isinstance(returned, list):
            raise ValueError("returned must be a list")
        any_back = False
        for mid in returned:
            pend = q.pending.get(mid) if isinstance(mid, str) else None
            if pend is not None and pend.assigned == reply_id:
                pend.assigned = None
                pend.attempts = max(0, pend.attempts - 1)
                self._save_pending(q, pend)
                any_back = True
        return any_back

    def _on_any_ack(self, d: Mapping[str, str], p: bytes, now: float) -> None:
        """Any host: drop the cached copies of queue messages consumed somewhere."""
        rec = _json_obj(p)
        copies = rec.get("copies", [])
        if not isinstance(copies, list):
            raise ValueError("copies must be a list")
        for core_id in copies[:1000]:
            if isinstance(core_id, str) and core_id:
                self.port.drop(core_id)
                self._count("copies_dropped")

    def _drop_pending(self, q: ManagedQueue, mid: str) -> None:
        pend = q.pending.pop(mid)
        self.store.delete("qpending", q.name + _SEP + pend.seq)
        for core_id in (pend.core_id, pend.delivery_id):
            if core_id:
                self.port.drop(core_id)

    def _remove_receiver(self, q: ManagedQueue, reply_id: str, now: float) -> None:
        q.receivers.pop(reply_id, None)
        self.store.delete("qreceivers", q.name + _SEP + reply_id)
        for pend in q.pending.values():
            if pend.assigned == reply_id:
                pend.assigned = None
                self._save_pending(q, pend)

    def _resend_assigned(self, q: ManagedQueue, now: float) -> None:
        """After a restart: the copies handed out may be lost with the old cache; hand each
        again to the same receiver (receivers drop copies they already have)."""
        for pend in q.pending.values():
            if pend.assigned is not None:
                r = q.receivers.get(pend.assigned)
                if r is None or r.until <= now:
                    pend.assigned = None
                else:
                    self._hand(q, pend, pend.assigned)
                    continue
                self._save_pending(q, pend)
        self._assign(q, now)

    def _hand(self, q: ManagedQueue, pend: Pending, reply_id: str) -> bool:
        """Publish the delivery of ``pend`` to receiver ``reply_id``."""
        redelivered = pend.attempts > 0 or pend.message.redelivered
        count = pend.attempts + pend.message.delivery_count
        pend.attempts += 1
        desc = mdl.to_descriptor(pend.message)
        if count:
            desc[mdl.DELIVERY_COUNT] = str(count)
        desc[mdl.KIND] = mdl.KIND_DELIVERY
        desc[mdl.REPLY_ID] = reply_id
        if pend.core_id:
            desc[mdl.COPY_OF] = pend.core_id
        if redelivered:
            desc[mdl.REDELIVERED] = "true"
        try:
            pend.delivery_id = self.port.publish(
                desc,
                pend.message.body,
                deadline=pend.deadline,
                priority=pend.message.priority,
                persistent=pend.message.delivery_mode == mdl.PERSISTENT,
            )
        except ValueError:
            self._count("queue_delivery_refused")
            return False
        pend.assigned = reply_id
        if q.pending.get(pend.message.message_id) is pend:  # not consumed meanwhile
            self._save_pending(q, pend)
        return True

    def _assign(self, q: ManagedQueue, now: float) -> None:
        if not q.receivers:
            return
        # higher JMSPriority first, then arrival order
        order = sorted(q.pending.items(), key=lambda kv: (-kv[1].message.priority, kv[1].seq))
        for mid, pend in order:
            if pend.deadline <= now:
                self._drop_pending(q, mid)
                continue
            if pend.assigned is not None:
                continue
            if self._over_limit(pend.attempts + pend.message.delivery_count):
                self._drop_pending(q, mid)
                self._dead_letter(
                    pend.message, self.host_id, now,
                    f"delivered {pend.attempts} times without being acknowledged "
                    f"(max_redeliveries = {self.config.max_redeliveries})",
                )  # fmt: skip
                continue
            cands = [
                r.reply_id
                for r in q.receivers.values()
                if r.until > now and selector_matches(r.selector, pend.message)
            ]
            if not cands:
                continue
            chosen = self.policy.choose(q, pend.message, cands)
            if chosen not in q.receivers:
                chosen = cands[0]
            q.last = chosen
            q.receivers[chosen].served += 1
            if not self._hand(q, pend, chosen):
                self._drop_pending(q, mid)
                continue
            self._count("queue_assigned")
        self._save_queue(q)

    # ================================================================ queues: receiver side
    def _send_receiver_request(self, cons: _Consumer, now: float) -> None:
        self._publish_receiver(cons, now, cancel=False)
        cons.renew_at = now + self.config.lease / 3.0

    def _publish_receiver(
        self,
        cons: _Consumer,
        now: float,
        *,
        cancel: bool,
        acked: list[str] | None = None,
        returned: list[str] | None = None,
    ) -> None:
        req: dict[str, Any] = {
            "selector": cons.selector_text,
            "lease": self.config.lease,
            "cancel": cancel,
        }
        if acked:
            req["acked"] = acked
        if returned:
            req["returned"] = returned
        body = json.dumps(req).encode()
        try:
            self.port.publish(
                {
                    mdl.KIND: mdl.KIND_RECEIVER,
                    mdl.DEST_TYPE: "queue",
                    mdl.DEST_ID: cons.dest.name,
                    mdl.REPLY_ID: cons.reply_id,
                },
                body,
                deadline=now + self.config.lease,
                priority=9,
                persistent=True,
            )
        except ValueError:
            self._count("receiver_request_refused")

    def _on_queue_delivery(self, cid: str, d: Mapping[str, str], p: bytes, now: float) -> None:
        cons = self._consumers.get(cid)
        if cons is None:
            return
        msg = mdl.from_descriptor(d, p)
        if msg.destination != cons.dest:
            self._count("filtered_on_delivery")
            return
        if msg.message_id in cons.done:
            self._queue_ack(cons, [msg.message_id], [], now)
            self._count("queue_duplicates")
            return
        if msg.message_id in cons.seen:
            self._count("queue_duplicates")
            return
        cons.seen.add(msg.message_id)
        cons.copies[msg.message_id] = [c for c in (d.get("id", ""), d.get(mdl.COPY_OF, "")) if c]
        cons.pending.append((d.get("id", ""), msg))
        self._pump(cons, now)

    def _queue_ack(
        self,
        cons: _Consumer,
        acked: list[str],
        released: list[str],
        now: float,
        copies: list[str] | None = None,
    ) -> None:
        key = (cons.dest.name, cons.reply_id)
        a, r, c = self._acks_out.setdefault(key, ([], [], []))
        a.extend(acked)
        r.extend(released)
        c.extend(copies or ())
        if self._ack_flush_at is None:
            self._ack_flush_at = now + self.config.ack_delay
        if self.config.ack_delay == 0:
            self._flush_acks(now)

    def _flush_acks(self, now: float) -> None:
        out = self._acks_out
        self._acks_out = {}
        self._ack_flush_at = None
        for (qname, reply_id), (acked, released, copies) in out.items():
            if acked or released:
                self._publish_ack(qname, reply_id, now, acked, released, copies)

    def _publish_ack(
        self,
        qname: str,
        reply_id: str,
        now: float,
        acked: list[str],
        released: list[str],
        copies: list[str],
        returned: list[str] | None = None,
    ) -> None:
        rec: dict[str, Any] = {"acked": acked, "released": released, "copies": copies}
        if returned:
            rec["returned"] = returned  # released, but never handed to the client
        try:
            self.port.publish(
                {
                    mdl.KIND: mdl.KIND_ACK,
                    mdl.DEST_TYPE: "queue",
                    mdl.DEST_ID: qname,
                    mdl.REPLY_ID: reply_id,
                },
                json.dumps(rec).encode(),
                deadline=now + self.config.default_ttl,
                priority=9,
                persistent=True,
            )
        except ValueError:
            self._count("ack_refused")

    # ================================================================ directory
    def _note_topic(self, topic: str, now: float) -> None:
        if topic not in self._topics_here:
            self._topics_here.add(topic)
            self._next_advert = min(self._next_advert or now, now)  # advertise it soon

    def _advertise(self, now: float) -> None:
        queues = sorted(n for n, q in self._queues.items() if not q.temporary)
        topics = sorted(self._topics_here)
        if not queues and not topics:
            return
        try:
            self.port.publish(
                {mdl.KIND: mdl.KIND_DIRECTORY, mdl.DEST_TYPE: "topic", mdl.DEST_ID: "directory"},
                json.dumps({"host": self.host_id, "queues": queues, "topics": topics}).encode(),
                deadline=now + 3 * self.config.directory_period,
                priority=1,
                persistent=False,
            )
        except ValueError:
            self._count("advert_refused")

    def _on_directory(self, d: Mapping[str, str], p: bytes, now: float) -> None:
        rec = _json_obj(p)
        host = d.get("origin", "")
        if not host or host == self.host_id:
            return
        date = float(d.get("date", now))
        old = self._directory.get(host)
        if old is not None and old[0] > date:
            return
        queues = [str(x) for x in rec.get("queues", [])][:1000]
        topics = [str(x) for x in rec.get("topics", [])][:1000]
        self._directory[host] = (date, queues, topics)

    def destinations(self) -> dict[str, list[str]]:
        """What this host knows: ``{"queues": [Name@H…], "topics": [...]}`` (eventually consistent)."""
        queues = {n for n, q in self._queues.items() if not q.temporary}
        topics = set(self._topics_here)
        for _, qs, ts in self._directory.values():
            queues.update(qs)
            topics.update(ts)
        return {"queues": sorted(queues), "topics": sorted(topics)}

    def manages(self, queue: str) -> bool:
        """Whether queue ``Name@H`` is managed here (it exists on this host)."""
        return queue in self._queues

    def lookup_queue(self, name: str) -> list[str]:
        """Known ``Name@H`` for a queue name (local manager first)."""
        hits = [q for q in self.destinations()["queues"] if q.partition("@")[0] == name]
        local = f"{name}@{self.host_id}"
        return sorted(hits, key=lambda q: (q != local, q))

    def queue_status(self, name: str) -> dict[str, Any]:
        """Manager state of a queue managed here (for admin tools and tests)."""
        q = self._queues[name]
        return {
            "receivers": {
                r.reply_id: {"until": r.until, "selector": r.selector_text, "served": r.served}
                for r in q.receivers.values()
            },
            "pending": len(q.pending),
            "assigned": sum(1 for p in q.pending.values() if p.assigned),
        }

    # ================================================================ housekeeping
    def _housekeeping(self, now: float) -> None:
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
