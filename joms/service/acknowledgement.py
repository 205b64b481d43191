"""Acknowledgement and transactions: dispatch to consumers within their prefetch window,
ACK/NACK/recover, redelivery with a limit and the dead-letter queue, BEGIN/COMMIT/ABORT."""

from __future__ import annotations

import itertools

from ..errors import (
    IllegalStateException,
    JMSException,
    TransactionInProgressException,
)
from . import model as mdl
from .base import (
    ServiceBase,
    _Connection,
    _Consumer,
    _Tx,
)
from .events import MessageDispatched
from .model import Destination, JomsMessage


class AcknowledgementMixin(ServiceBase):
    # ---------------------------------------------------------------- dispatch
    def _pump(self, cons: _Consumer, now: float) -> None:
        if cons.closing is not None:
            return  # closed by its client; waiting for a transaction to settle its acks
        limit = cons.prefetch if cons.ack_mode != "auto" else 0
        while cons.pending and (not limit or len(cons.unacked) < limit):
            skey, msg = cons.pending.popleft()
            if msg.expiration and msg.expiration / 1000.0 <= now:
                self._count("expired_before_delivery")
                self._finish(cons, skey, msg, now)
                continue
            self._n += 1
            tag = f"{cons.id}-{self._n}"
            # unacknowledged until the client acks, or (auto) until the transport took it
            # and settled (JomsService.settle): a crash before that loses nothing
            cons.unacked[tag] = (skey, msg)
            if cons.kind == "durable" and skey and not msg.redelivered:
                # from here it may reach the client: a copy coming back after a crash
                # says so (JMSRedelivered)
                self.store.put("dpending", skey, mdl.freeze(msg, redelivered=True))
            self._events.append(MessageDispatched(cons.conn, cons.id, tag, msg))
            self._count("messages_dispatched")

    def _dispatched_at_once(self, cons: _Consumer, msg: JomsMessage, now: float) -> bool:
        """Whether :meth:`_pump` would dispatch ``msg`` as soon as it is queued for ``cons``
        (nothing waits before it, the prefetch window has room, it has not expired)."""
        if cons.pending or msg.redelivered:
            return False
        if cons.ack_mode != "auto" and cons.prefetch and len(cons.unacked) >= cons.prefetch:
            return False
        return not (msg.expiration and msg.expiration / 1000.0 <= now)

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

    def _apply_nack(self, cons: _Consumer, tag: str, now: float) -> None:
        if tag not in cons.unacked:
            return
        tags = [tag]
        if cons.ack_mode == "client":  # cumulative, like ACK (STOMP 1.2)
            tags = list(itertools.takewhile(lambda t: t != tag, cons.unacked)) + tags
        self._redeliver(cons, tags, now)

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

    def _refused(self, cons: _Consumer, skey: str, msg: JomsMessage, now: float) -> bool:
        """A delivered message comes back unacknowledged (NACK, recover, rollback, its
        consumer closing): one more to its JMSXDeliveryCount, marked redelivered (stored so
        for a durable subscription); past ``max_redeliveries`` it is consumed and a copy
        goes to the dead-letter queue instead. Whether it may be delivered again."""
        msg.delivery_count += 1
        if self._over_limit(msg.delivery_count):
            self._finish(cons, skey, msg, now)
            host = cons.dest.manager if cons.kind == "queue" else self.host_id
            self._dead_letter(
                msg, host or self.host_id, now,
                f"redelivered {msg.delivery_count - 1} times and refused again "
                f"(max_redeliveries = {self.config.max_redeliveries})",
            )  # fmt: skip
            return False
        msg.redelivered = True
        if cons.kind == "durable":
            self.store.put("dpending", skey, mdl.freeze(msg))
        return True

    def _redeliver(self, cons: _Consumer, tags: list[str], now: float) -> None:
        back = []
        for t in tags:
            item = cons.unacked.pop(t, None)
            if item is not None and self._refused(cons, *item, now):
                back.append(item)
        cons.pending.extendleft(reversed(back))
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
        """Publish the held sends and apply the held acknowledgements (and NACKs)."""
        conn = self._conn(conn_id)
        t = self._tx(conn, tx)
        del conn.txs[tx]
        for msg, _ in t.sends:
            self._publish(msg, now, conn)
        for cid, tag in t.acks:
            cons = self._consumers.get(cid)
            if cons is None:
                continue
            if (cid, tag) in t.nacks:
                self._apply_nack(cons, tag, now)
            else:
                self._apply_ack(cons, tag, now)
        self._end_deferred_closes(conn, now)
        self.store.commit()

    def abort(self, conn_id: str, tx: str, now: float) -> None:
        """Drop the held sends; messages acknowledged (or refused: NACK) in the transaction
        are redelivered."""
        conn = self._conn(conn_id)
        t = self._tx(conn, tx)
        del conn.txs[tx]
        by_consumer: dict[str, list[str]] = {}
        for cid, tag in t.acks:
            by_consumer.setdefault(cid, []).append(tag)
        for cid, tags in by_consumer.items():
            cons = self._consumers.get(cid)
            if cons is None or cons.closing is not None:
                continue  # (a consumer closed meanwhile gives them back as it closes now)
            if cons.ack_mode == "client":
                last = set(tags)
                upto: list[str] = []
                for tg in cons.unacked:
                    upto.append(tg)
                    if tg in last and tg == tags[-1]:
                        break
                tags = upto
            self._redeliver(cons, tags, now)
        self._end_deferred_closes(conn, now)
        self.store.commit()

    def _end_deferred_closes(self, conn: _Connection, now: float) -> None:
        """Close the consumers closed by the client while a transaction held acks of their
        messages, once no open transaction holds any."""
        held = {c for tx in conn.txs.values() for c, _ in tx.acks}
        for cid in list(conn.consumers):
            cons = self._consumers.get(cid)
            if cons is not None and cons.closing is not None and cid not in held:
                unconsumed, delivered = cons.closing
                self.close_consumer(cid, now, unconsumed=unconsumed, delivered=delivered)
