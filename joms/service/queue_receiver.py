"""Queue receivers: a consumer's receiver requests (leases, cancel), deliveries from the
manager, and the batched acknowledgements sent back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import model as mdl
from .base import (
    ServiceBase,
    _Consumer,
)
from .model import JomsMessage
from .ordering import parse_sequence

_DUPLICATE = "\x00duplicate"
"""Stands for a delivery already received: it only fills its number in the reorder window."""

MAX_RECEIVED_ON_CANCEL = 1000
"""A receiver's cancel names the messages it got from the manager when they are at most
this many (a one-shot receiver's few): the manager then knows the others it handed out
never reached the client. Above it the cancel says nothing and they count as redelivered."""


class QueueReceiverMixin(ServiceBase):
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
        received: list[str] | None = None,
        deliveries: dict[str, int] | None = None,
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
        if received is not None:
            req["received"] = received
        if deliveries:
            req["deliveries"] = deliveries
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
        duplicate = msg.message_id in cons.done or msg.message_id in cons.seen
        if msg.message_id in cons.done:
            self._queue_ack(cons, [msg.message_id], [], now)
        if duplicate:
            self._count("queue_duplicates")
        else:
            cons.seen.add(msg.message_id)
            cons.copies[msg.message_id] = [
                c for c in (d.get("id", ""), d.get(mdl.COPY_OF, "")) if c
            ]
        # a duplicate still fills its place in the manager's numbering (a re-sent copy)
        item = (_DUPLICATE if duplicate else d.get("id", ""), msg)
        self._queue_release(cons, self._hand_in_order(cons, d, item, now), now)

    def _hand_in_order(
        self, cons: _Consumer, d: Mapping[str, str], item: tuple[str, JomsMessage], now: float
    ) -> list[tuple[str, JomsMessage]]:
        """The manager numbers its hand-outs to this receiver (``joms_hand``): put them back
        in the order handed out, holding a later one back like a topic consumer does."""
        seq = parse_sequence(d.get(mdl.HAND, "")) if cons.reorder is not None else None
        if cons.reorder is None or seq is None:
            return [item]
        gaps, late = cons.reorder.gaps, cons.reorder.late
        out = cons.reorder.push(seq[0], seq[1], item, len(item[1].body), now)
        self._count("order_gaps", cons.reorder.gaps - gaps)
        if item[0] is not _DUPLICATE:  # a copy of a delivery already had is not late
            self._count("order_late", cons.reorder.late - late)
        return out

    def _queue_release(
        self,
        cons: _Consumer,
        items: list[tuple[str, JomsMessage]],
        now: float,
        *,
        pump: bool = True,
    ) -> None:
        cons.pending.extend(it for it in items if it[0] is not _DUPLICATE)
        if pump:
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
        deliveries: dict[str, int] | None = None,
    ) -> None:
        rec: dict[str, Any] = {"acked": acked, "released": released, "copies": copies}
        if returned:
            rec["returned"] = returned  # released, but never handed to the client
        if deliveries:
            # message id -> times the client was given it (redeliveries made here included)
            rec["deliveries"] = deliveries
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
