"""Topics and durable subscriptions: network patterns for topics and selectors, per-producer
order, durable subscriptions kept in the store while their consumer is away."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Mapping
from typing import Any

from ..errors import (
    IllegalStateException,
    InvalidDestinationException,
    JMSException,
)
from . import model as mdl
from .base import (
    _CORE_LIMITS,
    _SEP,
    KEY_PREFIX,
    TEMP_TOPIC_PREFIX,
    ServiceBase,
    _Connection,
    _Consumer,
    _digest,
    _Durable,
    _esc,
    attribute_for,
    normal_seq,
    selector_matches,
)
from .model import Destination, JomsMessage
from .ordering import Reorder, parse_sequence
from .wildcards import is_wildcard, topic_matches, topic_regex


class TopicsMixin(ServiceBase):
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

    def _filtered_in_network(self, sel: Any) -> bool:
        """The selector narrows what the network brings (not only the topic)."""
        return sel is not None and self._topic_patterns("t", sel) != self._topic_patterns("t", None)

    def _new_reorder(self, sel: Any) -> Reorder[tuple[str, JomsMessage]] | None:
        """A reorder window for a topic subscription, unless reordering is off or its
        selector filters in the network (it could not tell a gap from a filtered message)."""
        if self.config.order_gap_timeout <= 0 or self._filtered_in_network(sel):
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
        if self.config.order_gap_timeout > 0 and self._filtered_in_network(d.selector):
            # not reordered on arrival (no window): each producer's messages that waited go
            # in the order sent, whatever order the network brought them in (DoDWAN offers
            # the newest first)
            waiting = producer_order(waiting)
        cons.pending.extend(waiting)

    def _migrate_durable_keys(self) -> None:
        """Give the stored durable messages of earlier versions keys in today's form (see
        ``normal_seq``), so that the store lists them in arrival order — for the backlog
        bound too, which drops the first one listed. Once per store."""
        if self.store.get("meta", "seq_keys") is not None:
            return
        for skey, blob in self.store.items("dpending"):
            key, sep, seq = skey.partition(_SEP)
            new = f"{key}{sep}{normal_seq(seq)}"
            if new != skey:
                self.store.delete("dpending", skey)
                self.store.put("dpending", new, blob)
        self.store.put("meta", "seq_keys", b"1")

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
        if not self.store.take("dpending", skey):
            return
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
            # a message this service published since it started cannot have been seen by
            # an earlier run (what "seen" is for: the core hands cached messages again under
            # the new key of each start; within a run it hands a message once per key)
            own = core_id.startswith(self._own_ids)
            if not own and self.store.get("seen", seen_key) is not None:
                self._count("durable_duplicates")
                return
            self.store.put("seen", seen_key, (deadline or "0").encode())
        if not self._accepts(d.selector, d.no_local, f"{self.host_id}/{d.client_id}", msg):
            self._count("filtered_on_delivery")
            return
        skey = f"{key}{_SEP}{self._seq(now)}"
        if self._durable_count(key) >= self.config.max_pending:
            oldest = self.store.items("dpending", key + _SEP, limit=1)
            for okey, _ in oldest:
                self._drop_durable(key, okey)
                if d.consumer is not None:  # not waiting in memory either
                    c = self._consumers[d.consumer]
                    c.pending = deque(x for x in c.pending if x[0] != okey)
            self._count("pending_overflow")
        cons = self._consumers[d.consumer] if d.consumer is not None else None
        if cons is None or not self._dispatched_at_once(cons, msg, now):
            self.store.put("dpending", skey, mdl.freeze(msg))
        # else _pump stores it at once, as "may have been delivered" (one write, not two)
        self._dcount[key] += 1
        if cons is not None:
            cons.pending.append((skey, msg))
            self._pump(cons, now)

    # ---------------------------------------------------------------- temporary topics
    def create_temporary_topic(self, conn_id: str, now: float) -> Destination:
        """A topic only this connection may subscribe to, gone with the connection (anyone
        may publish to it, e.g. as a JMSReplyTo)."""
        conn = self._connections.get(conn_id)
        if conn is None:
            raise IllegalStateException(f"connection {conn_id!r} is closed")
        dest = Destination("topic", f"{TEMP_TOPIC_PREFIX}{self.host_id}.{self._id()}")
        conn.temp_topics.add(dest.name)
        return dest

    def delete_temporary_topic(self, conn_id: str, dest: Destination) -> None:
        """JMS TemporaryTopic.delete: refused while this connection still consumes it."""
        conn = self._connections.get(conn_id)
        if conn is None or dest.name not in conn.temp_topics:
            raise InvalidDestinationException(f"{dest} is not a temporary topic of this connection")
        if any(c in self._consumers and self._consumers[c].dest == dest for c in conn.consumers):
            raise IllegalStateException(f"temporary topic {dest} still has a consumer")
        conn.temp_topics.discard(dest.name)


def producer_order(items: list[tuple[str, JomsMessage]]) -> list[tuple[str, JomsMessage]]:
    """``items`` with each producer's messages of one priority in sequence order, in the
    places its messages held: other producers' messages, those of other priorities and
    those without a sequence number keep theirs."""
    places: dict[tuple[int, str], list[int]] = {}
    for i, (_, msg) in enumerate(items):
        seq = parse_sequence(msg.sequence)
        if seq is not None:
            producer = f"{msg.destination.name}|{seq[0]}"  # as _in_order numbers them
            places.setdefault((msg.priority, producer), []).append(i)
    out = list(items)
    for where in places.values():
        ordered = sorted(where, key=lambda i: parse_sequence(items[i][1].sequence) or ("", 0))
        for place, i in zip(where, ordered, strict=True):
            out[place] = items[i]
    return out
