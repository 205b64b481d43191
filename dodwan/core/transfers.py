"""Transfers: requests for missing fragments (windowed, retried, suppressed when overheard),
serving requests through a per-message send queue pulled at link pace, and storing and
completing what arrives."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable

from mypy_extensions import trait

from . import message as m
from . import wire
from .bits import first_bits
from .cache import Cached
from .errors import WireError
from .node_state import WANT_CARRY, NodeState
from .profiles import bounded_mask, merge_ranges, ranges_of
from .store import MessageMeta

_COMPLETE_ORIGINS = 4096  # origins remembered as seen complete, at most
_MAX_RETRIES = 3  # requests asked again in a row without any fragment arriving, at most
_RETRIES_KEPT = 65536  # retry counts kept, at most
_GRANTS_PER_MESSAGE = 64  # carriers being handed half of a message's copy budget, at most

BROADCAST = "<broadcast>"
"""Destination meaning: every neighbour in radio range."""
DESCRIPTOR_EVERY = 16
"""With ``fragments_by_digest``, the fragments whose index is a multiple of this still
carry the descriptor: a host that comes into range during a transfer, without the offer
that holds the descriptor, keeps what it overhears after at most 15 fragments."""


@trait
class TransfersMixin(NodeState):
    """The request and fragment part of :class:`~dodwan.core.node.Node`."""

    def datagrams_to_send(
        self, now: float, budget: int | None = None
    ) -> list[tuple[bytes, Hashable]]:
        """Drain the datagrams produced so far (all broadcast on the shared medium).

        Control datagrams always all go; requested fragments go up to ``budget`` bytes (all
        of them when None). A runner that knows its link rate passes what the link can send
        before it would be idle (a few hundredths of a second of air time) and calls again
        when it is: fragments then wait here, where :meth:`_next_to_send` decides their
        order and those for neighbours that have left are dropped, rather than in a radio
        queue that sends them first-in, first-out, to nobody when the contact is over."""
        out = self._outbox
        self._outbox = []
        if self._send_queue and (budget is None or budget > 0):
            head = len(out)
            self._fill_fragments(out, budget)
            self._count("fragments_sent", len(out) - head)
        if out:
            self._times.last_sent = now
            counters = self.counters
            counters["datagrams_sent"] = counters.get("datagrams_sent", 0) + len(out)
            counters["bytes_sent"] = counters.get("bytes_sent", 0) + sum(map(len, out))
            totals, trace = self.datagrams_sent_by_kind, self._tracing and self._trace_datagrams
            for dg in out:
                kind = wire.KIND_NAMES.get(dg[3], "?")
                total = totals.get(kind)
                if total is None:
                    totals[kind] = [1, len(dg)]
                else:
                    total[0] += 1
                    total[1] += len(dg)
                if trace:
                    self._tr(now, "datagram_sent", size=len(dg), detail=kind)
        return [(dg, BROADCAST) for dg in out]

    @property
    def fragments_queued(self) -> int:
        """Requested fragments not handed to the runner yet (see ``budget`` above)."""
        n = 0
        for q in self._send_queue.values():
            n += len(q)
        return n

    def _next_to_send(self) -> str:
        """The message to send fragments of next: the one being sent until it is done (a
        short contact carries one whole message rather than parts of several); then one a
        requester itself subscribed to (it is the destination); then higher priority, then
        persistent before non-persistent; then the one with the fewest fragments left to
        send, then the one asked first.

        The queued messages are kept in a heap by that key (``_send_keys``): a choice costs
        O(log M) amortised with M messages queued, not a look at each of them, so serving
        a fragment of each of many messages stays linear (docs/security.md). A key is
        pushed again when it changes (outdated ones are dropped when they come on top):
        fragments left when a request adds some (``_send_dirty``) or, for the message
        under way, when another one takes over (it is the only one whose fragments are
        sent, and its own count does not matter while it goes on); its class when
        ``_send_class`` computes it again, at the first choice after a change of
        requesters or of interest epoch, when the former walk of the whole queue did."""
        queue, keys, heap = self._send_queue, self._send_keys, self._send_heap
        if self._send_keyed != self._interest_epoch:  # every class again
            self._send_keyed = self._interest_epoch
            self._send_dirty.clear()
            keys.clear()
            heap.clear()
            seq = self._send_seq
            for msg_id, q in queue.items():
                direct, prio, transient = self._send_class(msg_id)
                key = (direct, prio, transient, len(q), seq[msg_id], msg_id)
                keys[msg_id] = key
                heap.append(key)
            heapq.heapify(heap)
        elif self._send_dirty:
            for msg_id in self._send_dirty:
                asked = queue.get(msg_id)
                if asked is not None:
                    self._rekey(msg_id, len(asked))
            self._send_dirty.clear()
        if len(heap) > 2 * len(keys) + 64:  # mostly outdated keys: the current ones only
            heap.clear()
            heap.extend(keys.values())
            heapq.heapify(heap)
        while True:
            top = heap[0]
            if keys.get(top[5]) == top:
                break
            heapq.heappop(heap)
        cur = self._sending
        if cur is not None:
            k = keys.get(cur)
            if k is not None:
                # the message under way goes on unless one of a better class (direct,
                # priority, persistent) was asked for meanwhile
                if k[0] < top[0] or (
                    k[0] == top[0] and (k[1] < top[1] or (k[1] == top[1] and k[2] <= top[2]))
                ):
                    return cur
                self._rekey(cur, len(queue[cur]))  # its fragments left, counted again
        best = top[5]
        self._sending = best
        return best

    def _rekey(self, msg_id: str, left: int) -> None:
        """Push the current key of queued ``msg_id``."""
        direct, prio, transient = self._send_class(msg_id)
        key = (direct, prio, transient, left, self._send_seq[msg_id], msg_id)
        self._send_keys[msg_id] = key
        heapq.heappush(self._send_heap, key)

    def _send_class(self, msg_id: str) -> tuple[int, int, bool]:
        """Sending class of a queued message, best lowest: asked by a host that subscribed
        to it, then higher priority, then persistent (kept until a requester comes or goes,
        or the profiles known change)."""
        hit = self._send_classes.get(msg_id)
        if hit is not None and hit[0] == self._interest_epoch:
            return hit[1]
        direct = any(msg_id in self._matcher.matching(h) for h in self._send_for.get(msg_id, ()))
        c = self._cache.get(msg_id)
        prio, kept = (c.header.priority, c.header.persistent) if c is not None else (0, False)
        cls = (0 if direct else 1, -prio, not kept)
        self._send_classes[msg_id] = (self._interest_epoch, cls)
        return cls

    def _fill_fragments(self, out: list[bytes], budget: int | None) -> None:
        used = 0
        while self._send_queue and (budget is None or used < budget):
            msg_id = self._next_to_send()
            q = self._send_queue[msg_id]
            c = self._cache.get(msg_id)
            if c is not None:
                pre = self._encoders.get(msg_id)
                if pre is None:
                    zdesc = c.meta.zdesc
                    full = wire.fragment_encoder(self.host_id, msg_id, zdesc)
                    lean = (
                        wire.fragment_encoder(self.host_id, msg_id, zdesc, by_digest=True)
                        if self.config.fragments_by_digest
                        else full
                    )
                    pre = (full[0], full[1], lean[0], lean[1])
                    self._encoders[msg_id] = pre
                own = c.meta.local and not c.handed
                have = c.have
                sent = 0
                while q and (budget is None or used < budget):
                    index, hops = q.popitem(last=False)  # in request order
                    if not have >> index & 1:
                        continue
                    chunk = self._get_fragment(msg_id, index)
                    if chunk is None:
                        continue
                    if own:
                        self._sent_own(c, index)
                    if index % DESCRIPTOR_EVERY:
                        dg = wire.encode_fragment_fast(pre[2], pre[3], hops, index, chunk)
                    else:  # every 16th carries the descriptor, for hosts that lack it
                        dg = wire.encode_fragment_fast(pre[0], pre[1], hops, index, chunk)
                    out.append(dg)
                    used += len(dg)
                    sent |= 1 << index
                if sent and msg_id in self._granted:
                    self._handed_copies(c, sent)
            else:
                q.clear()
            if not q:
                self._unqueue(msg_id)

    def _grant(self, msg_id: str, host: str) -> None:
        """``host`` asked for ``msg_id`` to carry it, which has a copy budget here: it
        takes half once every fragment has been sent (binary Spray-and-Wait)."""
        grants = self._granted.setdefault(msg_id, {})
        if host not in grants:
            if len(grants) >= _GRANTS_PER_MESSAGE:
                del grants[next(iter(grants))]  # the oldest, most likely gone
            grants[host] = 0

    def _handed_copies(self, c: Cached, sent: int) -> None:
        """Fragments ``sent`` of a message carriers asked for went out: each carrier that
        has now been sent all of them took half of the remaining budget."""
        msg_id = c.header.msg_id
        grants = self._granted[msg_id]
        full = (1 << c.header.frags) - 1
        for host, mask in list(grants.items()):
            mask |= sent
            if mask != full:
                grants[host] = mask
                continue
            del grants[host]
            if c.copies > 1:
                c.copies -= c.copies // 2
                self._entry_cache.pop(msg_id, None)
                self._count("copies_handed")
        if not grants or c.copies < 2:
            del self._granted[msg_id]

    def _unqueue(self, msg_id: str) -> None:
        self._send_queue.pop(msg_id, None)
        self._send_for.pop(msg_id, None)
        self._send_classes.pop(msg_id, None)
        self._send_seq.pop(msg_id, None)
        self._send_keys.pop(msg_id, None)  # its keys in the heap are outdated now
        if not self._send_queue:
            self._send_heap.clear()
            self._send_dirty.clear()
        self._encoders.pop(msg_id, None)
        if self._sending == msg_id:
            self._sending = None

    def _sent_own(self, c: Cached, index: int) -> None:
        """A fragment of a publication of this host went out; once all of them have, the
        publication may be evicted like any message subscribed here."""
        c.sent |= 1 << index
        if c.sent == (1 << c.header.frags) - 1:
            c.handed = True
            c.seen_age = self._seen_age(c.header, 1)  # another host holds it now
            c.unmet_age = self._unmet_age(c)
            heapq.heappush(self._evict_heap, (c.rank(), c.header.msg_id))

    def _missing(self, msg_id: str, offered: int, now: float) -> int:
        """Offered fragments we neither hold nor recently requested."""
        c = self._cache.get(msg_id)
        mask = offered & ~(c.have if c is not None else 0)
        req = self._requested.get(msg_id)
        if req is not None:
            if req[1] + self.config.request_timeout > now:
                mask &= ~req[0]
            else:
                del self._requested[msg_id]
        return mask

    def _queue_request(self, target: str, msg_id: str, offered: int, now: float) -> None:
        pending = self._pending.setdefault(target, {})
        already = pending.get(msg_id, 0)
        missing = self._missing(msg_id, offered, now) & ~already
        window = self.config.request_window - already.bit_count()
        req = self._requested.get(msg_id)
        if req is not None and req[1] + self.config.request_timeout > now:
            c = self._cache.get(msg_id)
            window -= (req[0] & ~(c.have if c is not None else 0)).bit_count()  # in flight
        if not missing or window <= 0:
            return
        pending[msg_id] = already | first_bits(missing, window)
        if target not in self._pending_at:
            self._pending_at[target] = now + self._rng.uniform(0, self.config.request_delay)

    def _send_request(self, target: str, now: float) -> None:
        self._pending_at.pop(target, None)
        pending = self._pending.pop(target, {})
        if target not in self._neighbours:
            self._profiles.forget_target(target)
            return
        wanted = self._profiles.requests_for(target, now)
        for i in range(0, len(wanted), 32):
            self._outbox.append(
                wire.encode_profile_request(self.host_id, target, wanted[i : i + 32])
            )
            self._count("profile_requests_sent")
        entries: list[tuple[str, list[tuple[int, int]]]] = []
        for msg_id, mask in pending.items():
            mask = self._missing(msg_id, mask, now)
            if mask:
                entries.append((msg_id, ranges_of(mask)))
                self._asked(msg_id, mask, now)
        for i in range(0, len(entries), 32):
            self._outbox.append(wire.encode_request(self.host_id, target, entries[i : i + 32]))
            self._count("requests_sent")

    def _on_request(self, dg: wire.Request, now: float) -> None:
        # Repeated or overlapping ranges count once (merged first), and every fragment asked
        # costs a token of the asker's rate limit: the work a request causes is bounded by
        # its size and by that limit, whatever its ranges say.
        if dg.target != self.host_id:
            # Overheard: the answer will be broadcast, so drop the same fragments from ours;
            # only those the target is a neighbour known to hold: a request naming anyone
            # else will not be answered, and would only delay ours (an attack: see
            # docs/security.md).
            target = self._neighbours.get(dg.target)
            if target is None:
                return
            for msg_id, ranges in dg.entries:
                held = target.offers.get(msg_id, 0)
                if not held or not any(msg_id in pending for pending in self._pending.values()):
                    continue
                mask = bounded_mask(ranges, self._limits.max_fragments) & held
                suppressed = False
                for pending in self._pending.values():
                    if msg_id in pending and pending[msg_id] & mask:
                        pending[msg_id] &= ~mask
                        suppressed = True
                        if not pending[msg_id]:
                            del pending[msg_id]
                if suppressed:
                    self._count("requests_suppressed")
                    self._asked(msg_id, mask, now)
            return
        # charged to the source address and to the node's total (see budgets.py)
        address = self._neighbours[dg.sender].address
        tokens = start = self._serving.available(address, now)
        try:
            for msg_id, ranges in dg.entries:
                c = self._cache.get(msg_id)
                if c is None:
                    continue
                q = self._send_queue.get(msg_id)
                if q is None:
                    q = self._send_queue[msg_id] = OrderedDict()
                    self._send_seq[msg_id] = self._send_seq_next  # last in the queue
                    self._send_seq_next += 1
                self._send_dirty.add(msg_id)  # its class or fragments left may change
                asked = self._send_for.setdefault(msg_id, set())
                if dg.sender not in asked:
                    asked.add(dg.sender)
                    self._send_classes.pop(msg_id, None)  # a new requester: its class again
                    if c.copies > 1 and msg_id not in self._matcher.matching(dg.sender):
                        self._grant(msg_id, dg.sender)
                hops, have = c.meta.hops + 1, c.have
                for first, count in merge_ranges(ranges, c.header.frags):
                    for i in range(first, first + count):
                        if tokens < 1:
                            self._count("requests_rate_limited")
                            if not q:
                                self._unqueue(msg_id)
                            return
                        tokens -= 1
                        if have >> i & 1 and i not in q:
                            q[i] = hops
                if not q:
                    self._unqueue(msg_id)
        finally:
            self._serving.spend(address, start - tokens)

    def _on_fragment(self, dg: wire.Fragment, now: float) -> None:
        c = self._cache.get(dg.msg_id)
        zdesc = dg.zdesc
        if dg.zref:  # by digest: a descriptor this host holds already
            zdesc = self._descriptor_named(c, dg.msg_id, dg.zref)
            if not zdesc:
                self._count("fragments_unknown_descriptor")
                return
        descriptor: dict[str, str] = {}
        if c is not None:
            if zdesc != c.meta.zdesc:
                raise WireError("descriptor mismatch")
            if c.complete or c.have >> dg.index & 1:
                self._count("fragments_duplicate")
                return
            header = c.header
        else:
            if dg.msg_id in self._history:
                self._count("fragments_duplicate")
                return
            address = self._neighbours[dg.sender].address
            if self._decode_due(dg.msg_id, zdesc) and not self._decodes.take(address, now):
                self._count("descriptors_deferred")
                return
            decoded = self._descriptor_of(dg.msg_id, zdesc, address)
            if decoded is None:
                raise WireError("bad descriptor")
            descriptor, header = decoded
            if header.deadline <= now:
                self._count("fragments_expired")
                return
            if self._too_long_lived(header, now):
                return
            if header.once and dg.msg_id in self._acked:
                self._count("fragments_acked")  # delivered already
                return
            want = self._wants(dg.msg_id, zdesc, descriptor)
            if not want or (
                want == WANT_CARRY and self._neighbours[dg.sender].budgets.get(dg.msg_id) == 1
            ):
                self._count("fragments_unwanted")
                return
            self._prefer(dg.msg_id, zdesc, decoded, want, address)
        if dg.index >= header.frags:
            raise WireError("fragment index out of range")
        if len(dg.chunk) != header.fragment_length(dg.index):
            raise WireError("fragment length mismatch")
        self._store_fragment(c, dg, zdesc, header, descriptor, now)

    def _descriptor_named(self, c: Cached | None, msg_id: str, zref: bytes) -> bytes:
        """The compressed descriptor of ``msg_id`` this host holds (its copy's, or one
        decoded from an offer), if ``zref`` names it; b"" when it holds none. WireError
        when it names another one."""
        if c is not None:
            if not c.zref:
                c.zref = wire.descriptor_digest(c.meta.zdesc)
            held, digest = c.meta.zdesc, c.zref
        else:
            decoded = self._zdesc_cache.get(msg_id)
            if decoded is None:
                return b""
            held = decoded[0]
            digest = wire.descriptor_digest(held)
        if digest != zref:
            raise WireError("descriptor mismatch")
        return held

    def _store_fragment(
        self,
        c: Cached | None,
        dg: wire.Fragment,
        zdesc: bytes,
        header: m.Header,
        descriptor: dict[str, str],
        now: float,
    ) -> None:
        """Store a validated fragment of the message whose compressed descriptor is
        ``zdesc``; ``descriptor`` is the decoded one when ``c`` is None."""
        size = len(dg.chunk)
        extra = size if c is not None else size + len(zdesc)
        if c is None:
            c = Cached(
                MessageMeta(dg.msg_id, zdesc, dg.hops, False, now),
                descriptor,
                header,
                progress=now,
            )
            c.own = self._own_profile.matches(c.descriptor)
            c.credible = header.origin in self._complete_origins
            c.asked = dg.msg_id in self._requested
            c.copies = self._copies_received(c, dg.sender)
            aged = c.asked and not self._origin_fits(header.origin, extra)
            if aged:
                # ranked as arriving against the origin's other messages: with its ages
                # (a partial set's rank reads none)
                c.seen_age = self._seen_age(header)
                c.unmet_age = self._unmet_age(c)
            if not self._within_origin_quota(c, extra, now):
                self._count("origin_quota_exceeded")
                self._give_up(dg.msg_id)
                return
            if header.frags > 1 and dg.msg_id not in self._reserved:
                # overheard, not requested by us: start it only if all of it fits in the
                # free room (or it is for this host): a transfer that was not asked for must
                # not evict the partial sets this host is reassembling
                free = self.config.cache_capacity - self._cache_bytes - self._reserved_bytes
                if not c.own and header.zsize + len(zdesc) > free:
                    self._count("overheard_no_room")
                    self._give_up(dg.msg_id)
                    return
                address = self._neighbours[dg.sender].address
                if not self._reserve(dg.msg_id, header.zsize, now, header.origin, address=address):
                    self._count("partial_memory_full")
                    self._give_up(dg.msg_id)
                    return
            # Only now, for a copy that may be kept (making room ranks it as arriving): the
            # unmet age is a sum over the hosts met, wasted on fragments refused above.
            if not aged:
                c.seen_age = self._seen_age(header)
                c.unmet_age = self._unmet_age(c)
            if not self._make_room(extra, c, now):
                self._count("cache_full")
                self._give_up(dg.msg_id)
                return
            self._store.put_message(c.meta)
            c.nbytes = len(zdesc)
            self._index(c)
        else:
            if not self._within_origin_quota(c, extra, now):
                self._count("origin_quota_exceeded")
                self._give_up(dg.msg_id, keep_room=True)
                return
            if not self._make_room(extra, c, now):
                self._count("cache_full")
                self._give_up(dg.msg_id, keep_room=True)
                return
        self._put_fragment(dg.msg_id, dg.index, dg.chunk)
        c.have |= 1 << dg.index
        c.count += 1
        c.nbytes += size
        self._cache_bytes += size
        self._partial_bytes += size
        if dg.msg_id in self._left_of:
            self._refresh_left(dg.msg_id)
        self._origin_bytes[header.origin] = self._origin_bytes.get(header.origin, 0) + size
        c.progress = now
        if self._retries:
            self._retries.pop(dg.msg_id, None)  # progress: retries count from zero again
        counters = self.counters
        counters["fragments_stored"] = counters.get("fragments_stored", 0) + 1
        if self._tracing:
            self._tr(now, "fragment_stored", dg.msg_id, size, dg.hops)
        if c.complete:
            self._partial_bytes -= c.nbytes
            self._partial.discard(dg.msg_id)
            self._release(dg.msg_id)
            heapq.heappush(self._evict_heap, (c.rank(), dg.msg_id))  # now a complete message
            self._completed(c, now)
            if self._deferred:
                self._resume_deferred(now)
        else:
            self._continue_transfer(c, now)

    def _copies_received(self, c: Cached, sender: str) -> int:
        """Copy budget of a copy whose first fragment came from ``sender``: none if the
        sender gave none; half of the sender's if this host asked for it to carry it
        (the sender keeps the other half, see ``_handed_copies``); otherwise 1 (a subscriber
        here, or fragments overheard: such copies go on to subscribers only)."""
        n = self._neighbours.get(sender)
        budget = n.budgets.get(c.header.msg_id, 0) if n is not None else 0
        if budget < 2:
            return budget
        if c.own or not c.asked:
            return 1
        return budget // 2

    def _give_up(self, msg_id: str, keep_room: bool = False) -> None:
        """A fragment of a message could not be stored: stop asking for it (its retries
        were refused the same way while the sender kept sending); it is asked again when
        offered again. The room promised to it goes, unless part of it is stored
        (``keep_room``): the partial set may still finish when room is made."""
        if self._requested.pop(msg_id, None) is not None:
            self._count("requests_abandoned")
        for pending in self._pending.values():
            pending.pop(msg_id, None)
        if not keep_room:
            self._release(msg_id)

    def _completed(self, c: Cached, now: float) -> None:
        msg_id = c.header.msg_id
        self._requested.pop(msg_id, None)
        self._entry_cache.pop(msg_id, None)
        for pending in self._pending.values():
            pending.pop(msg_id, None)
        chunks = self._chunks(c)  # verified without joining them: most carried copies are
        try:  # not delivered here, and never need the payload in one piece
            if chunks is None:
                raise WireError("missing fragment")
            verified = self._verified
            if verified is not None:
                verified.verify(chunks, c.header)
            else:
                m.verify_chunks(chunks, c.header)
        except WireError:
            self._count("corrupt_messages")
            self._drop(msg_id, now, "corrupt")
            return
        self._count("messages_completed")
        self._origin_completed(c.header.origin)
        self._tr(now, "message_completed", msg_id, c.header.size, c.meta.hops)
        self._add_history(msg_id, "", c.header.deadline)
        self._offers.add(msg_id, self._offer_rank(c))  # now ranked as complete
        self._prompt_announce(msg_id, now)
        self._deliver(c, now, chunks=chunks)

    def _asked(self, msg_id: str, mask: int, now: float) -> None:
        """``mask`` of ``msg_id`` was asked for (by us, or by a neighbour we overheard)."""
        old = self._requested.get(msg_id, (0, now))[0]
        self._requested[msg_id] = (old | mask, now)
        heap = self._requested_heap
        heapq.heappush(heap, (now, msg_id))
        if len(heap) > 2 * len(self._requested) + 64:
            self._requested_heap = [(w, k) for k, (_, w) in self._requested.items()]
            heapq.heapify(self._requested_heap)

    def _oldest_request(self) -> float | None:
        """When the oldest request still outstanding was made (stale heap entries go)."""
        heap, requested = self._requested_heap, self._requested
        while heap:
            when, msg_id = heap[0]
            req = requested.get(msg_id)
            if req is not None and req[1] == when:
                return when
            heapq.heappop(heap)
        return None

    def _origin_completed(self, origin: str) -> None:
        """A message of ``origin`` was completed here: its partial sets are now worth more
        than those of origins never seen complete."""
        known = self._complete_origins
        if origin in known:
            return
        if len(known) >= _COMPLETE_ORIGINS:
            for k in list(known)[: len(known) // 2]:
                del known[k]
        known[origin] = None
        for msg_id in self._partial:
            c = self._cache[msg_id]
            if c.header.origin == origin and not c.credible:
                c.credible = True
                heapq.heappush(self._evict_heap, (c.rank(), msg_id))

    def _retry_requests(self, now: float) -> None:
        """Fragments asked for and not received within ``request_timeout`` are asked again
        from a neighbour that offered them, without waiting for it to offer them again —
        at most ``_MAX_RETRIES`` times in a row without a fragment arriving (a neighbour
        that offers and never sends, or has left, is not asked every request_timeout for
        ever); then the message is asked for again when it is offered again."""
        timeout = self.config.request_timeout
        oldest = self._oldest_request()
        if oldest is None or oldest + timeout > now:
            return  # nothing due (checked in O(log n), not by looking at every request)
        retries = self._retries
        for msg_id, (_, when) in list(self._requested.items()):
            if when + timeout > now:
                continue
            del self._requested[msg_id]
            tries = retries.pop(msg_id, 0)
            c = self._cache.get(msg_id)
            if c is not None and c.complete:
                continue
            if tries >= _MAX_RETRIES:
                self._count("requests_given_up")
                continue
            have = c.have if c is not None else 0
            for n in self._neighbours.values():
                offered = n.offers.get(msg_id, 0)
                if c is None and offered > 1 and msg_id not in self._reserved:
                    break  # its room is no longer promised: asked again when offered again
                if offered & ~have:
                    self._count("requests_retried")
                    if len(retries) >= _RETRIES_KEPT:
                        retries.clear()  # a request that never went out left its count
                    retries[msg_id] = tries + 1
                    self._queue_request(n.host_id, msg_id, offered, now)
                    break

    def _continue_transfer(self, c: Cached, now: float) -> None:
        """Sliding window: once half of what was requested has arrived, ask for more, so the
        sender has the next fragments before it runs out of the current ones."""
        msg_id = c.header.msg_id
        req = self._requested.get(msg_id)
        if req is not None:
            outstanding = (req[0] & ~c.have).bit_count()
            if outstanding > self.config.request_window // 2:
                return
            if not outstanding:
                del self._requested[msg_id]
        for n in self._neighbours.values():
            offered = n.offers.get(msg_id)
            if offered is not None and offered & ~c.have:
                pending = self._pending.get(n.host_id)
                if pending is None or msg_id not in pending:
                    self._queue_request(n.host_id, msg_id, offered, now)
                return
