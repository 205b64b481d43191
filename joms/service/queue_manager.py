"""Queue managers: the queues this host manages, their receivers (leases), pending messages,
hand-outs to receivers, acknowledgements and releases, restarts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import (
    InvalidDestinationException,
    JMSException,
)
from . import model as mdl
from .base import (
    _SEP,
    ServiceBase,
    _json_obj,
    compile_selector,
    normal_seq,
    selector_matches,
)
from .model import Destination, JomsMessage
from .ordering import Reorder, parse_sequence
from .queues import ManagedQueue, Pending, Receiver


class QueueManagerMixin(ServiceBase):
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
                    closing=bool(rec.get("closing", False)),
                )
            except (ValueError, KeyError, JMSException):
                self.store.delete("qreceivers", k)
                continue
            q.receivers[r.reply_id] = r
        loaded: list[Pending] = []
        for k, blob in self.store.items("qpending", q.name + _SEP):
            try:
                meta, _, frozen = blob.partition(b"\n")
                rec = json.loads(meta)
                msg = mdl.thaw(frozen)
                p = Pending(
                    normal_seq(rec["seq"]),
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
            if p.seq != rec["seq"]:  # a key of an earlier version (see normal_seq)
                self.store.delete("qpending", k)
                self._save_pending(q, p)
            loaded.append(p)
        for p in sorted(loaded, key=lambda p: p.seq):  # arrival order (the oldest first)
            q.pending[p.message.message_id] = p

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
                    "closing": r.closing,
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
        pend = Pending(self._seq(now), msg, deadline, d.get("id", ""))
        self._save_pending(q, pend)  # stored at once, also while held back for order
        self._admit(q, self._queue_in_order(q, pend, now), pend, now)
        self._assign(q, now)

    def _queue_in_order(self, q: ManagedQueue, pend: Pending, now: float) -> list[Pending]:
        """Per-producer order at the manager: a producer's message that arrives before an
        earlier one is held back (see joms.service.ordering); what may join the queue now."""
        seq = parse_sequence(pend.message.sequence) if self.config.order_gap_timeout > 0 else None
        if seq is None:
            return [pend]
        if q.reorder is None:
            q.reorder = Reorder(self.config.order_gap_timeout, self.config.order_window_bytes)
        gaps, late = q.reorder.gaps, q.reorder.late
        out = q.reorder.push(seq[0], seq[1], pend, len(pend.message.body), now)
        self._count("order_gaps", q.reorder.gaps - gaps)
        self._count("order_late", q.reorder.late - late)
        return out

    def _expire_queue_order(self, q: ManagedQueue, now: float) -> None:
        if q.reorder is None:
            return
        gaps = q.reorder.gaps
        released = q.reorder.expire(now)
        self._count("order_gaps", q.reorder.gaps - gaps)
        if released:
            self._admit(q, released, None, now)
            self._assign(q, now)

    def _admit(
        self, q: ManagedQueue, released: list[Pending], arrived: Pending | None, now: float
    ) -> None:
        """``released`` join the queue in that order. The hand-out order among equal
        priorities is ``Pending.seq``: a message held back gets a new one, after the
        message that just arrived (which keeps its own when it comes first)."""
        for i, p in enumerate(released):
            if not (i == 0 and p is arrived):
                self.store.delete("qpending", q.name + _SEP + p.seq)
                p.seq = self._seq(now)
                self._save_pending(q, p)
            q.pending[p.message.message_id] = p

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
            mine = self._assigned_to(q, reply_id, req.get("deliveries"))
            self._apply_acked(q, req.get("acked", []))
            self._apply_returned(q, req.get("returned", []), reply_id)
            if "received" in req:
                self._apply_never_received(q, req["received"], reply_id)
            self._apply_deliveries(q, req.get("deliveries"), mine, reply_id)
            # remembered in every case: a renewal of the same receiver that the network
            # delivers after its cancel must not bring it back (it would hold messages
            # handed to it until its lease ran out)
            self.store.put("seen", q.name + _SEP + "cancel:" + reply_id, repr(now + 3600).encode())
            if r is not None:
                self._remove_receiver(q, reply_id, now)
                self._assign(q, now)
            return
        if self.store.get("seen", q.name + _SEP + "cancel:" + reply_id) is not None:
            return  # the receiver was already cancelled (its last renewal came late)
        if q.temporary and not self._owns_temporary(q, reply_id):
            # only a consumer of the connection that created it (on this host: subscribe
            # refuses the others, also those of other hosts); a request from elsewhere (an
            # older or hostile peer) gets nothing
            self._count("temporary_queue_receivers_refused")
            return
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

    def _owns_temporary(self, q: ManagedQueue, reply_id: str) -> bool:
        """Whether ``reply_id`` is a receiver of a consumer of the connection owning the
        temporary queue ``q`` (such a consumer is local: its reply id is ``host.consumer``)."""
        host, _, cid = reply_id.rpartition(".")
        cons = self._consumers.get(cid) if host == self.host_id else None
        return cons is not None and cons.conn == q.owner and cons.reply_id == reply_id

    def _manager_ack(self, q: ManagedQueue, d: Mapping[str, str], p: bytes, now: float) -> None:
        rec = _json_obj(p)
        reply_id = d.get(mdl.REPLY_ID, "")
        mine = self._assigned_to(q, reply_id, rec.get("deliveries"))
        r = q.receivers.get(reply_id)
        if r is not None and not r.closing and (rec.get("released") or rec.get("returned")):
            # only a closing consumer gives messages back, and its cancel follows (or came
            # first): were one of them handed to it again now, its client would never see
            # it, yet it would count as a delivery (a redelivery too many before the DLQ)
            r.closing = True
            self._save_receiver(q, r)
        self._apply_acked(q, rec.get("acked", []))
        released = self._apply_returned(q, rec.get("returned", []), reply_id)
        for mid in rec.get("released", []):
            pend = q.pending.get(mid)
            if pend is not None and pend.assigned == reply_id:
                pend.assigned = None
                self._save_pending(q, pend)
                released = True
        self._apply_deliveries(q, rec.get("deliveries"), mine, reply_id)
        if released:
            self._assign(q, now)

    def _assigned_to(self, q: ManagedQueue, reply_id: str, deliveries: Any) -> set[str]:
        """The messages of ``q`` handed to ``reply_id``, among those ``deliveries`` names
        (only a closing receiver sends it: for the others, nothing is looked at)."""
        if not isinstance(deliveries, dict):
            return set()
        return {
            mid
            for mid in deliveries
            if (p := q.pending.get(mid)) is not None and p.assigned == reply_id
        }

    def _apply_deliveries(
        self, q: ManagedQueue, deliveries: Any, mine: set[str], reply_id: str
    ) -> None:
        """A receiver giving messages back says how many times its client was given each
        (``deliveries``: its NACKs, recover()s and rollbacks redelivered them there, which
        the manager did not see): the next hand-out's JMSXDeliveryCount goes on from there,
        and the dead-letter limit counts them. Only for messages that were handed to that
        receiver (``mine``, before the message was given back) and not handed to another
        since: a copy of the record seen again later (a restart) changes nothing. Receivers
        of earlier versions send no ``deliveries``: the manager counts its hand-outs only."""
        if not isinstance(deliveries, dict):
            return
        for mid, n in deliveries.items():
            pend = q.pending.get(mid) if mid in mine else None
            if pend is None or pend.assigned not in (None, reply_id):
                continue
            if isinstance(n, bool) or not isinstance(n, int) or not 0 < n < 1 << 31:
                continue
            # the next hand-out's count is attempts + delivery_count (see _hand)
            floor = n - pend.attempts
            if floor > pend.message.delivery_count:
                pend.message.delivery_count = floor
                self._save_pending(q, pend)

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

    def _apply_never_received(self, q: ManagedQueue, received: Any, reply_id: str) -> None:
        """A cancelled receiver named every message it got: the others handed to it were
        still on their way when it closed and no client saw them, so they go back as never
        delivered (no JMSRedelivered, not counted towards the dead-letter limit)."""
        if not isinstance(received, list):
            raise ValueError("received must be a list")
        got = {mid for mid in received if isinstance(mid, str)}
        for mid, pend in q.pending.items():
            if pend.assigned == reply_id and mid not in got:
                pend.assigned = None
                pend.attempts = max(0, pend.attempts - 1)
                self._save_pending(q, pend)

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
        count = pend.attempts + pend.message.delivery_count
        redelivered = count > 0 or pend.message.redelivered
        pend.attempts += 1
        desc = mdl.to_descriptor(pend.message)
        if count:
            desc[mdl.DELIVERY_COUNT] = str(count)
        desc[mdl.KIND] = mdl.KIND_DELIVERY
        desc[mdl.REPLY_ID] = reply_id
        receiver = q.receivers.get(reply_id)
        if receiver is not None:  # numbered, so the receiver can put them back in order
            if not receiver.epoch:
                receiver.epoch = self._id()
            desc[mdl.HAND] = (
                f"{self.host_id}/{q.name}/{reply_id}/{receiver.epoch}:{receiver.handed + 1}"
            )
        if pend.core_id:
            desc[mdl.COPY_OF] = pend.core_id
        if redelivered:
            desc[mdl.REDELIVERED] = "true"
        try:
            pend.delivery_id = self._publish_named(
                desc,
                pend.message.body,
                deadline=pend.deadline,
                priority=pend.message.priority,
                persistent=pend.message.delivery_mode == mdl.PERSISTENT,
            )
        except ValueError:
            self._count("queue_delivery_refused")
            return False
        if receiver is not None:
            receiver.handed += 1
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
            count = pend.attempts + pend.message.delivery_count
            if self._over_limit(count):
                self._drop_pending(q, mid)
                self._dead_letter(
                    pend.message, self.host_id, now,
                    f"delivered {pend.attempts} times without being acknowledged "
                    f"(max_redeliveries = {self.config.max_redeliveries})",
                )  # fmt: skip
                continue
            # selectors see the message as it will be handed out (its JMSXDeliveryCount)
            seen = pend.message.copy(delivery_count=count, redelivered=True) if count else None
            cands = [
                r.reply_id
                for r in q.receivers.values()
                if r.until > now
                and not r.closing
                and selector_matches(r.selector, seen or pend.message)
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

    # ---------------------------------------------------------------- browsing
    def browse(
        self, dest: Destination, now: float, selector: str | None = None
    ) -> list[JomsMessage]:
        """The messages waiting in queue ``dest`` (JMS QueueBrowser), in the order they
        would be handed out, without consuming them. Only the queue's manager knows them:
        InvalidDestinationException for a queue managed elsewhere."""
        q = self._queues.get(dest.name)
        if q is None:
            if dest.manager == self.host_id:
                return []
            raise InvalidDestinationException(
                f"{dest} is managed by {dest.manager}: browse it through that host's gateway"
            )
        sel = compile_selector(selector)
        order = sorted(q.pending.values(), key=lambda p: (-p.message.priority, p.seq))
        return [p.message for p in order if p.deadline > now and selector_matches(sel, p.message)]
