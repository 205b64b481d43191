"""Acknowledgements of delivery: a message published with ``once = "true"`` is done as soon
as one host has delivered it (the ONE's unicast traffic, a JMS queue's one consumer).

That host remembers the message as *acknowledged* and says so at once in an ``ack``
datagram. Acks then spread to every host, as MaxProp's do: a host sends the acks it knows
(the newest ``_ACKS_FLOODED``) when a new neighbour comes in range, and answers a
neighbour's offer of an acknowledged message with an ack instead of a request. A host that
learns an ack for a message it carries for others drops its copy (trace reason ``acked``);
one that does not hold the message never fetches it. So the copies of delivered messages
stop taking room and air time from the messages not delivered yet.

An ack acts only on a message whose own descriptor says ``once``: the holder checks its
copy, and a host that does not hold it checks the descriptor of the offer it skips. A copy
subscribed here, or published here, is kept (it is only no longer offered). Acks are
remembered until the message's deadline, capped at ``max_ttl`` for messages not held here,
at most ``_ACKS_KEPT`` of them; those learnt of messages not held here are charged to the
remote-memory budget (:mod:`.ledger`) of the address they came from. They are not stored:
after a restart a host learns them again from its neighbours.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Iterable

from mypy_extensions import trait

from . import wire
from .cache import Cached
from .node_state import NodeState

_ACKS_KEPT = 4096  # acknowledgements remembered, at most (the oldest forgotten first)
_ACKS_FLOODED = 256  # acks sent to a new neighbour, at most (the newest)
_ACK_COST = 120  # bytes one remembered ack costs beyond its id (dict slot, heap entry)


@trait
class AcksMixin(NodeState):
    """The acknowledgement part of :class:`~dodwan.core.node.Node`."""

    def _ack_delivered(self, c: Cached, now: float) -> None:
        """``c`` was just delivered here: if it is a ``once`` message from another host,
        it is done; say so now to whoever is in range (the host it came from holds it)."""
        h = c.header
        if h.once and h.origin != self.host_id and self._acknowledge(c):
            self._send_acks([h.msg_id], now)

    def _remember_ack(self, msg_id: str, deadline: float, owner: Hashable = None) -> bool:
        """Remember ``msg_id`` as acknowledged (True when it was not yet): it is no longer
        offered, and a neighbour's offer of it is answered with an ack. ``owner``: the
        address an ack of a message not held here came from (charged for it)."""
        acked = self._acked
        if msg_id in acked:
            return False
        acked[msg_id] = deadline
        heapq.heappush(self._acked_heap, (deadline, msg_id))
        if owner is not None:
            self._remote.charge(owner, "ack", msg_id, _ACK_COST + len(msg_id))
        if len(acked) > _ACKS_KEPT:
            self._forget_ack(next(iter(acked)))
        self._offers.forget(msg_id)
        return True

    def _forget_ack(self, msg_id: str) -> None:
        if self._acked.pop(msg_id, None) is not None:
            self._remote.release("ack", msg_id)

    def _send_acks(self, ids: Iterable[str], now: float) -> None:
        acked = self._acked
        entries = [(k, max(1, math.ceil(acked[k] - now))) for k in ids]
        self._outbox.extend(wire.encode_acks(self.host_id, entries, self.config.max_datagram))
        self._count("acks_sent", len(entries))

    def _flood_acks(self, now: float) -> None:
        """A new neighbour came in range: tell it (and whoever hears) the newest acks,
        at most once per ``beacon_period``."""
        if not self._acked or now < self._times.acks_flooded_at + self.config.beacon_period:
            return
        self._times.acks_flooded_at = now
        live = (k for k, d in reversed(self._acked.items()) if d > now)
        newest = list(itertools.islice(live, _ACKS_FLOODED))
        if newest:
            self._send_acks(newest, now)

    def _on_ack(self, dg: wire.Ack, now: float) -> None:
        for msg_id, ttl in dg.entries:
            c = self._cache.get(msg_id)
            if c is None:
                if msg_id not in self._acked:
                    deadline = now + min(ttl, self._limits.max_ttl)
                    self._remember_ack(msg_id, deadline, self._neighbours[dg.sender].address)
                    self._count("acks_learnt")
                continue
            if not c.header.once:
                continue  # not a message that is done once delivered: the ack is wrong
            if not self._acknowledge(c) or c.own or c.meta.local:
                continue  # known already, or subscribed or published here: kept
            self._count("acks_received")
            self._add_history(msg_id, "", c.header.deadline)  # not fetched again
            self._drop(msg_id, now, "acked")

    def _acknowledge(self, c: Cached) -> bool:
        """Cached ``once`` message ``c`` is known to be delivered (False: it was already).
        An ack of it learnt while it was not held stops being charged to the peer that
        sent it and takes the message's own deadline; a copy kept here (subscribed or
        published here) is no longer offered and is the first complete message to go when
        room is needed."""
        msg_id = c.header.msg_id
        if self._remote.owner_of("ack", msg_id) is not None:
            self._forget_ack(msg_id)
        if not self._remember_ack(msg_id, c.header.deadline):
            return False
        c.done = True
        heapq.heappush(self._evict_heap, (c.rank(), msg_id))
        return True

    def _expire_acks(self, now: float) -> None:
        heap, acked = self._acked_heap, self._acked
        while heap and heap[0][0] <= now:
            deadline, msg_id = heapq.heappop(heap)
            if acked.get(msg_id) == deadline:
                self._forget_ack(msg_id)
        if len(heap) > 2 * len(acked) + 64:
            self._acked_heap = [(d, k) for k, d in acked.items()]
            heapq.heapify(self._acked_heap)
