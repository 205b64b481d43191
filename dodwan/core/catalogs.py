"""Catalogs: which cached messages to offer each round and in what order, and what to fetch
of what neighbours offer (decoding their descriptors once, within a memory budget)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from mypy_extensions import trait

from . import message as m
from . import wire
from .bits import all_of
from .cache import Cached
from .errors import WireError
from .neighbours import Neighbour
from .node_state import WANT_CARRY, WANT_FOR, WANT_NO, WANT_OWN, NodeState
from .offers import Rank
from .signing import verify

_ENTRY_COST = 400  # bytes a decoded descriptor costs beyond its text (dict, header, keys)
_OFFER_COST = 160  # bytes one remembered offer costs beyond its mask (dict slot, id string)


def _offer_memory(msg_id: str, mask: int) -> int:
    """What remembering one offer costs (its mask counted even when shared)."""
    return _OFFER_COST + len(msg_id) + (mask.bit_length() >> 3)


_ORIGIN_OFFERS = 16  # catalog entries one origin may take in one announcement round
_DEFERRED_MAX = 4096  # offers put back for the next round, at most, per round
_DEFERRED_STARTS = 256  # offers remembered as put off for want of room, at most
_CLOCK_SKEW = 3600.0  # how far a peer's clock may be ahead when its deadlines are checked


@trait
class CatalogsMixin(NodeState):
    """The catalog part of :class:`~dodwan.core.node.Node`."""

    def _offer_rank(self, c: Cached) -> Rank:
        msg_id = c.header.msg_id
        matching = self._matcher.matching
        return c.offer_rank(any(msg_id in matching(h) for h in self._neighbours))

    def _offer_matches(self, host: str) -> None:
        """Offer (as a first offer) every cached message ``host``'s profile matches."""
        for msg_id in self._matcher.matching(host):
            c = self._cache.get(msg_id)
            if c is not None:
                self._offers.add(msg_id, self._offer_rank(c))

    def _wants(self, msg_id: str, zdesc: bytes, descriptor: Mapping[str, str]) -> int:
        """Should this host fetch and carry the message ``zdesc`` (decoded: ``descriptor``)
        describes, and why (``WANT_*``)? The verdict is remembered only for the descriptor
        remembered for that id (see :meth:`_descriptor_of`): another one offered under the
        same id, say a forger's, is judged on its own (after a decode charged to its
        sender) and changes nothing remembered, so it cannot stop the genuine message."""
        cached = self._want_cache.get(msg_id)
        if cached is not None and cached[0] == self._interest_epoch and cached[2] == zdesc:
            return cached[1]
        limit = self.config.horizon - 1
        if self._own_profile.matches(descriptor):
            want = WANT_OWN
        elif any(d <= limit and p.matches(descriptor) for d, p in self._known.values()):
            want = WANT_FOR
        else:
            want = WANT_CARRY if self.config.altruistic else WANT_NO
        held = self._zdesc_cache.get(msg_id)
        if held is None or held[0] != zdesc:
            return want
        if len(self._want_cache) > 65536:
            self._want_cache.clear()
        self._want_cache[msg_id] = (self._interest_epoch, want, held[0])
        return want

    def _prefer(
        self,
        msg_id: str,
        zdesc: bytes,
        decoded: tuple[dict[str, str], m.Header],
        want: int,
        owner: Hashable,
    ) -> None:
        """A valid descriptor ``zdesc`` offered under ``msg_id`` by the peer at ``owner``
        is ``want``-ed here: it takes the place of the one remembered for that id if that
        one is wanted less (one planted first under the genuine message's id, say). The
        remembered one is what fragments by digest and deferred offers are resolved against,
        so it must be the one asked for; still one descriptor per id, charged to whoever
        offered the one kept. Among equally wanted ones the first stays."""
        held = self._zdesc_cache.get(msg_id)
        if held is None or held[0] == zdesc or want <= self._wants(msg_id, held[0], held[1]):
            return
        self._count("descriptors_displaced")
        self._remember_descriptor(msg_id, zdesc, decoded[0], decoded[1], owner)
        self._want_cache[msg_id] = (self._interest_epoch, want, zdesc)

    def _catalog_entry(self, c: Cached) -> bytes:
        msg_id = c.header.msg_id
        if c.complete:
            entry = self._entry_cache.get(msg_id)
            if entry is None:
                entry = wire.encode_catalog_entry(
                    wire.CatalogEntry(msg_id, c.header.frags, None, c.meta.zdesc, c.copies)
                )
                self._entry_cache[msg_id] = entry
            return entry
        return wire.encode_catalog_entry(
            wire.CatalogEntry(msg_id, c.header.frags, c.have, c.meta.zdesc, c.copies)
        )

    def _catalog(self, now: float, room: int, budget: int) -> list[list[bytes]]:
        """Encoded catalog entries for this round, in datagram-sized groups (the first
        group has ``room`` bytes, the others a whole catalog datagram): due offers, best
        first, skipping what every current neighbour already holds (see ``offers``)."""
        groups: list[list[bytes]] = [[]]
        if not self._neighbours:
            return groups
        offers, cache = self._offers, self._cache
        altruists = any(n.altruistic for n in self._neighbours.values())
        eligible = self._matcher.eligible

        # an altruistic neighbour is offered everything but the messages whose copy budget
        # is spent (1: for subscribers only)
        acked = self._acked

        def offerable(msg_id: str, c: Cached) -> bool:
            return (msg_id in eligible or (altruists and c.copies != 1)) and msg_id not in acked

        def pool() -> list[tuple[str, Rank]]:
            ids = cache if altruists else eligible
            return [
                (k, self._offer_rank(c))
                for k in ids
                if (c := cache.get(k)) is not None and offerable(k, c)
            ]

        def rank_of(msg_id: str) -> Rank | None:
            c = cache.get(msg_id)
            if c is None or not offerable(msg_id, c):
                return None
            return self._offer_rank(c)

        offers.refill(pool)
        offers.wake(now, rank_of)
        for fresh in self._matcher.take_fresh():
            c = cache.get(fresh)
            if c is not None:
                offers.add(fresh, self._offer_rank(c))
        neighbours = list(self._neighbours.values())
        per_origin: dict[str, int] = {}  # entries of this round per origin
        deferred: list[tuple[str, tuple[int, Rank]]] = []
        full = False

        def place(entry: bytes) -> bool:
            """Add ``entry`` to the round (False: the round is full; a too large entry is
            dropped, True)."""
            nonlocal room
            if len(entry) > room:
                if len(groups) >= self.config.max_catalog_datagrams:
                    return False
                groups.append([])
                room = budget - wire.catalog_overhead(self.host_id)
                if len(entry) > room:
                    return True
            groups[-1].append(entry)
            room -= len(entry)
            return True

        while (msg_id := offers.pop()) is not None:
            c = cache.get(msg_id)
            if c is None or c.header.deadline <= now or c.count == 0:
                continue
            if not offerable(msg_id, c):
                continue
            if all(c.have & ~n.offers.get(msg_id, 0) == 0 for n in neighbours):
                offers.offered(msg_id, now)  # all of them hold it; look again later
                continue
            origin = c.header.origin
            if per_origin.get(origin, 0) >= _ORIGIN_OFFERS and len(deferred) < _DEFERRED_MAX:
                deferred.append(offers.popped())  # one origin cannot fill a round: next one
                continue
            if not place(self._catalog_entry(c)):
                offers.unpop()  # next round, which comes promptly
                full = True
                break
            per_origin[origin] = per_origin.get(origin, 0) + 1
            offers.offered(msg_id, now)
        # Every other origin had its turn: the room left goes to the offers put off, best
        # first (a host catching up on one busy origin is not held to 16 offers a round).
        taken = 0
        if not full:
            for msg_id, _ in deferred:
                if not place(self._catalog_entry(cache[msg_id])):
                    break
                offers.offered(msg_id, now)
                taken += 1
        for popped in deferred[taken:]:
            offers.restore(popped)
        if len(deferred) > taken or full:
            self._offers_left = True  # the next round comes promptly
        return groups

    def _start(
        self, n: Neighbour, msg_id: str, offered: int, header: m.Header, own: bool, now: float
    ) -> bool:
        """Ask ``n`` for a new message if its room can be promised (False: not now)."""
        zsize = header.zsize if header.frags > 1 else 0
        if zsize and msg_id not in self._reserved:
            if self._reserved_bytes + zsize > self._limits.max_partial_bytes:
                self._count("deferred_reassembly_budget")
                return False
            if not self._within_address_share(n.address, zsize):
                self._count("deferred_neighbour_share")
                return False
            if not self._room_for(header.origin, zsize, self._incoming_rank(header, own)):
                self._count("deferred_no_room")
                return False
            self._reserve(msg_id, zsize, now, header.origin, address=n.address)
        self._queue_request(n.host_id, msg_id, offered, now)
        return True

    def _resume_deferred(self, now: float) -> None:
        """Room was freed (a transfer finished): ask at once for the offers put off for
        want of it, oldest first, rather than wait for their next offer, which may be a
        long time coming (a neighbour repeats an offer less and less often). The first that
        still does not fit goes to the back, so the next completion tries the others first
        (a large offer does not block smaller ones behind it)."""
        self._room_checks(True)  # starting a transfer stores and evicts nothing
        try:
            for msg_id, host in list(self._deferred.items()):
                del self._deferred[msg_id]
                n = self._neighbours.get(host)
                decoded = self._zdesc_cache.get(msg_id)
                if n is None or decoded is None or msg_id in self._cache or msg_id in self._history:
                    continue
                offered = n.offers.get(msg_id)
                header = decoded[2]
                if offered is None or header.deadline <= now:
                    continue
                own = self._wants(msg_id, decoded[0], decoded[1]) == WANT_OWN
                if not self._start(n, msg_id, offered, header, own, now):
                    self._deferred[msg_id] = host  # to the back
                    return  # still no room: the others wait for the next completion
        finally:
            self._room_checks(False)

    def _on_catalog(self, dg: wire.Catalog, now: float) -> None:
        self._on_catalog_entries(self._neighbours[dg.sender], dg.catalog, now)

    def _decode_due(self, msg_id: str, zdesc: bytes) -> bool:
        """Whether :meth:`_descriptor_of` would decode ``zdesc`` (work charged to the
        sender's decode budget) rather than find it decoded or known bad."""
        cached = self._zdesc_cache.get(msg_id)
        return (cached is None or cached[0] != zdesc) and zdesc not in self._bad_zdesc

    def _descriptor_of(
        self, msg_id: str, zdesc: bytes, owner: Hashable
    ) -> tuple[dict[str, str], m.Header] | None:
        """Decode (once) a descriptor offered by a peer at address ``owner`` (charged for
        keeping it decoded); None when invalid."""
        cached = self._zdesc_cache.get(msg_id)
        if cached is not None and cached[0] == zdesc:
            return cached[1], cached[2]
        if zdesc in self._bad_zdesc:
            return None
        try:
            d = m.decompress_descriptor(zdesc, self._limits)
            h = m.Header.parse(d, self._limits)
            if h.msg_id != msg_id:
                raise WireError("descriptor id mismatch")
            verify(d)
        except WireError as exc:
            self._count("bad_descriptors")
            if exc.reason == "bad signature":
                self._count("dropped_bad_signature")
            if len(self._bad_zdesc) > 4096:
                self._bad_zdesc.clear()
            self._bad_zdesc.add(zdesc)
            return None
        if cached is None:  # the first descriptor seen for an id stays, unless one wanted
            self._remember_descriptor(msg_id, zdesc, d, h, owner)  # more comes (_prefer)
        return d, h

    def _remember_descriptor(
        self, msg_id: str, zdesc: bytes, d: dict[str, str], h: m.Header, owner: Hashable
    ) -> None:
        """Keep ``zdesc`` decoded as the descriptor of ``msg_id`` (in place of any other),
        charged to ``owner``, until its deadline."""
        cost = 2 * len(zdesc) + sum(len(k) + len(v) for k, v in d.items()) + _ENTRY_COST
        self._zdesc_cache[msg_id] = (zdesc, d, h)
        self._know_until(h.deadline, msg_id)
        self._remote.charge(owner, "descriptor", msg_id, cost)

    def _forget_descriptor(self, msg_id: str) -> None:
        """Forget what was learnt from offers of ``msg_id``: its decoded descriptor, whether
        to fetch it, and (unless it is cached here) the hosts seen holding it. The
        message expired, or the remote-memory budget gave its descriptor up."""
        if self._zdesc_cache.pop(msg_id, None) is not None:
            self._remote.release("descriptor", msg_id)
        self._want_cache.pop(msg_id, None)
        if msg_id not in self._cache:
            self._copies_seen.pop(msg_id, None)

    def _offers_given_up(self, host: str) -> None:
        """The remote-memory budget gave up what neighbour ``host`` offered (learnt again
        from its next catalogs)."""
        n = self._neighbours.get(host)
        if n is not None:
            n.offers.clear()
            n.budgets.clear()
            n.offers_memory = 0

    def _too_long_lived(self, header: m.Header, now: float) -> bool:
        """A peer's message whose deadline is further ahead than ``max_ttl`` (+ an hour of
        clock skew) is refused: it would be carried and remembered for ever."""
        if header.deadline - now <= self._limits.max_ttl + _CLOCK_SKEW:
            return False
        self._count("dropped_ttl_too_long")
        return True

    def _on_catalog_entries(
        self, n: Neighbour, entries: Sequence[wire.CatalogEntry], now: float
    ) -> None:
        started: list[tuple[str, int]] = []
        new: list[tuple[str, int, int, m.Header]] = []
        mine: set[str] = set()
        acked: list[str] = []
        deferred = 0
        for e in entries:
            c = self._cache.get(e.msg_id)
            if c is not None and e.zdesc != c.meta.zdesc:
                # another message under the id of one held here (forged): not an offer of
                # it, so that neighbour is neither asked for it nor taken to hold it
                old = n.offers.pop(e.msg_id, None)
                if old is not None:
                    n.offers_memory -= _offer_memory(e.msg_id, old)
                n.budgets.pop(e.msg_id, None)
                continue
            offered = all_of(e.frags) if e.have is None else e.have
            old = n.offers.get(e.msg_id)
            # kept on the neighbour, not in a local: a charge below may make the budget
            # give up this neighbour's offers, which sets it back to 0 with them
            n.offers_memory += _offer_memory(e.msg_id, offered) - (
                0 if old is None else _offer_memory(e.msg_id, old)
            )
            n.offers[e.msg_id] = offered
            if e.copies:
                n.budgets[e.msg_id] = e.copies
            elif n.budgets:
                n.budgets.pop(e.msg_id, None)
            if c is not None:
                if e.have is None:
                    self._seen_complete(e.msg_id, n.host_id)
                if c.header.once and e.msg_id in self._acked:
                    acked.append(e.msg_id)  # delivered already: tell it
                    continue
                if not c.complete and c.header.frags == e.frags:
                    started.append((e.msg_id, offered))
                continue
            if e.msg_id in self._history:
                if e.msg_id in self._acked:
                    acked.append(e.msg_id)  # dropped here for an ack: tell it
                continue
            if self._decode_due(e.msg_id, e.zdesc) and not self._decodes.take(n.address, now):
                deferred += 1  # over its decode budget: until it is offered again
                continue
            decoded = self._descriptor_of(e.msg_id, e.zdesc, n.address)
            if decoded is None or decoded[1].frags != e.frags or decoded[1].deadline <= now:
                continue
            if e.have is None:
                self._seen_complete(e.msg_id, n.host_id)
            if self._too_long_lived(decoded[1], now):
                continue
            if decoded[1].once and e.msg_id in self._acked:
                acked.append(e.msg_id)  # delivered already: tell it, rather than fetch it
                continue
            want = self._wants(e.msg_id, e.zdesc, decoded[0])
            if want == WANT_CARRY and e.copies == 1:
                continue  # its copies are spent: it goes to subscribers only
            if want:
                self._prefer(e.msg_id, e.zdesc, decoded, want, n.address)
                zsize = decoded[1].zsize if e.frags > 1 else 0
                new.append((e.msg_id, offered, zsize, decoded[1]))
                if want == WANT_OWN:
                    mine.add(e.msg_id)
        if acked:
            self._send_acks(acked, now)
        if deferred:
            self._count("descriptors_deferred", deferred)
        # what this host itself subscribed to before what it would only carry; then higher
        # priority, persistent before non-persistent; then the smallest first (on a short
        # contact, the likeliest to finish)
        new.sort(key=lambda t: (t[0] not in mine, -t[3].priority, not t[3].persistent, t[2]))
        # messages already being reassembled first; a new one only when the reassembly
        # budget can hold all of it, so partial sets never starve each other, and only when
        # it can fit in the cache and in its origin's share beside the transfers under way
        # (several started at once would each get part of the room and none finish)
        for msg_id, offered in started:
            self._queue_request(n.host_id, msg_id, offered, now)
        if new:
            self._room_checks(True)  # starting a transfer stores and evicts nothing
            try:
                for msg_id, offered, _, header in new:
                    if not self._start(n, msg_id, offered, header, msg_id in mine, now):
                        self._deferred[msg_id] = n.host_id
                        if len(self._deferred) > _DEFERRED_STARTS:
                            del self._deferred[next(iter(self._deferred))]
            finally:
                self._room_checks(False)
        if len(n.offers) > 4 * self._limits.max_catalog_entries:
            for k in list(n.offers)[: len(n.offers) // 2]:
                n.offers_memory -= _offer_memory(k, n.offers.pop(k))
                n.budgets.pop(k, None)
        if self._neighbours.get(n.host_id) is n:
            self._remote.charge(n.address, "offers", n.host_id, n.offers_memory)
