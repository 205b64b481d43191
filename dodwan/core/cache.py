"""Cache policy: what a host keeps, in what order it evicts, how much room a transfer may
count on (reassembly reservations, per-origin shares), and the local listing of the cache."""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from mypy_extensions import trait

from . import message as m
from .errors import WireError
from .events import MessageEvicted
from .node_state import NodeState
from .offers import Rank
from .patterns import ProfileIndex
from .store import MessageMeta

_ROOM_SCAN = 64  # cached messages looked at, at most, to tell whether a transfer fits
_SEEN_HOLDERS = 8  # other hosts seen holding a message complete: counted up to this many
_SEEN_MESSAGES = 8192  # messages whose holders are remembered, at most (the oldest goes)
_MET_HOSTS = 256  # other hosts whose contacts are counted, at most (the least recently met goes)


def _add(totals: dict[Any, int], key: Any, delta: int) -> None:
    """Add ``delta`` to ``totals[key]``; a total back to 0 leaves the dict."""
    total = totals.get(key, 0) + delta
    if total:
        totals[key] = total
    else:
        totals.pop(key, None)


EvictRank = tuple[int, int, int, int, float]
"""``(tier, origin seen complete, persistent, priority, date)`` (for a complete copy carried
for others, its date less ``seen_age``): see :meth:`Cached.rank`."""


class CacheFullError(ValueError):
    """A local publication does not fit in the cache even after evicting what may be evicted."""


@dataclass(slots=True)
class Cached:
    """In-memory index entry of a cached (possibly incomplete) message."""

    meta: MessageMeta
    descriptor: dict[str, str]
    header: m.Header
    have: int = 0
    count: int = 0
    nbytes: int = 0
    progress: float = 0.0
    own: bool = False
    """Published here or matching a local subscription (evicted after carried-only ones)."""
    sent: int = 0
    """Published here: the fragments sent at least once (bitmask)."""
    handed: bool = False
    """Published here and every fragment sent at least once: another host may hold it now."""
    credible: bool = False
    """A message of its origin was completed here (its partial sets go after those of
    origins never seen complete, which may be a flood of fragments nobody can finish)."""
    asked: bool = False
    """This host asked for it (it did not start from overheard fragments)."""
    done: bool = False
    """A ``once`` message known to be delivered, kept here as subscribed or published:
    evicted before any other complete message (see ``acks``)."""
    copies: int = 0
    """Copy budget of this copy (``NodeConfig.copy_budget``): 0 none; 1 for subscribers
    only; more: altruistic carriers may take half of it."""
    zref: bytes = b""
    """The descriptor's digest (``wire.descriptor_digest``), once a fragment by digest
    needed it: computed once per message, not per fragment."""
    seen_age: float = 0.0
    """Seconds a complete copy carried for others counts as older than it is, for the
    other hosts seen holding the message (``NodeConfig.seen_copy_age``)."""
    unmet_age: float = 0.0
    """Seconds a complete copy carried for others counts as older than it is, as this host
    rarely meets the hosts that want it (``NodeConfig.unmet_copy_age``)."""

    @property
    def complete(self) -> bool:
        return self.count == self.header.frags

    def offer_rank(self, wanted_here: bool = False) -> Rank:
        """Offer order, lowest first: what a neighbour itself subscribed to
        (``wanted_here``), complete messages before partial sets (a flood of fragment 0s
        of messages nobody can complete waits behind them), then persistent, then higher
        priority, then newest."""
        h = self.header
        tier = (0 if wanted_here else 2) + (0 if self.count == h.frags else 1)
        return (tier, 0 if h.persistent else 1, -h.priority, -h.date)

    def rank(self, arriving: bool = False) -> EvictRank:
        """Eviction order, lowest first. Tiers: partial sets carried for others (those of
        origins never seen complete here first); complete messages (copies of delivered
        ``once`` messages first, then those carried for others and this host's own
        publications already handed on, which would otherwise crowd carried messages out
        until their deadline); messages subscribed here; then this host's own publications
        not yet handed on — which only expiry or the local user removes. Within a tier:
        non-persistent, low priority, old first; a complete copy carried for others counts
        as older for each other host seen holding the message (``seen_age``).

        ``arriving``: the rank its fragments make room with as they arrive — a transfer
        this host asked for counts as the complete message it is becoming, so it may evict
        older complete messages carried for others, as they are needed (the oldest goes,
        as in epidemic routing's drop-oldest), while a partial set it left never does."""
        h = self.header
        if self.meta.local and not self.handed:
            tier, trust = 3, 0
        elif self.done:
            tier, trust = 1, 0
        elif self.own and not self.meta.local:
            tier, trust = 2, 0
        elif self.count == h.frags or (arriving and self.asked):
            return (
                1,
                1,
                1 if h.persistent else 0,
                h.priority,
                h.date - self.seen_age - self.unmet_age,
            )
        else:
            tier, trust = 0, 1 if self.credible else 0
        return (tier, trust, 1 if h.persistent else 0, h.priority, h.date)


class RoomScan:
    """The eviction heap's entries in rank order, walked without popping and only as far
    as asked (:meth:`more`): ``ranks[k]`` is the k-th entry's rank, ``sizes[k]`` the bytes
    of its message, or -1 when the entry is stale (the message left or was ranked again)
    or repeats one walked already. The walk ends at the first entry reached once
    ``_ROOM_SCAN`` messages were counted: no check reads past it."""

    def __init__(self, heap: list[tuple[EvictRank, str]], cache: dict[str, Cached]) -> None:
        self._heap = heap
        self._cache = cache
        self._todo: list[tuple[tuple[EvictRank, str], int]] = [(heap[0], 0)] if heap else []
        self._seen: set[str] = set()
        self.ranks: list[EvictRank] = []
        self.sizes: list[int] = []

    def more(self) -> bool:
        """Walk one more entry (False: none is left, or the walk is at its end)."""
        todo, seen = self._todo, self._seen
        if not todo:
            return False
        (vrank, vid), i = heapq.heappop(todo)
        self.ranks.append(vrank)
        if len(seen) >= _ROOM_SCAN:
            self.sizes.append(-1)
            todo.clear()  # the last entry any check reads
            return True
        c = self._cache.get(vid)
        if c is not None and vid not in seen and c.rank() == vrank:
            seen.add(vid)
            self.sizes.append(c.nbytes)
        else:
            self.sizes.append(-1)
        heap = self._heap
        for j in (2 * i + 1, 2 * i + 2):
            if j < len(heap):
                heapq.heappush(todo, (heap[j], j))
        return True


@trait
class CacheMixin(NodeState):
    """The cache part of :class:`~dodwan.core.node.Node`."""

    def _kept_because(self, c: Cached) -> str:
        if c.meta.local:
            return "published here"
        if c.own:
            return "subscribed"
        hosts = self._matcher.interested_hosts(c.header.msg_id)
        return "carried for " + ", ".join(hosts) if hosts else "carried altruistically"

    def _entry(self, c: Cached) -> dict[str, Any]:
        h = c.header
        return {
            "id": h.msg_id,
            "complete": c.complete,
            "fragments": c.count,
            "total_fragments": h.frags,
            "size": h.size,
            "stored_bytes": c.nbytes,
            "deadline": h.deadline,
            "priority": h.priority,
            "persistent": h.persistent,
            "hops": c.meta.hops,
            "reason": self._kept_because(c),
            "descriptor": dict(c.descriptor),
        }

    def cache_listing(self) -> list[dict[str, Any]]:
        """What the host carries: one dict per message, by id."""
        return [self._entry(self._cache[k]) for k in sorted(self._cache)]

    def cache_entry(self, msg_id: str) -> dict[str, Any] | None:
        """One message of :meth:`cache_listing` (None when not cached)."""
        c = self._cache.get(msg_id)
        return None if c is None else self._entry(c)

    def cache_usage(self) -> dict[str, int]:
        return {
            "bytes": self._cache_bytes,
            "capacity": self.config.cache_capacity,
            "messages": len(self._cache),
            "complete": sum(1 for c in self._cache.values() if c.complete),
        }

    def message_payload(self, msg_id: str) -> bytes | None:
        """The payload of a complete cached message (None when absent or incomplete)."""
        c = self._cache.get(msg_id)
        if c is None or not c.complete:
            return None
        z = self._assemble(c)
        try:
            return m.inflate_payload(z, c.header) if z is not None else None
        except WireError:
            return None

    def purge(self, msg_id: str, now: float) -> None:
        """Drop a cached message on the local user's request (KeyError if absent)."""
        if msg_id not in self._cache:
            raise KeyError(f"no cached message {msg_id!r}")
        self._drop(msg_id, now, "purged")
        self._store.commit()

    def _index(self, c: Cached) -> None:
        msg_id = c.header.msg_id
        c.own = c.meta.local or self._own_profile.matches(c.descriptor)
        self._cache[msg_id] = c
        self._cache_bytes += c.nbytes
        origin = c.header.origin
        self._origin_bytes[origin] = self._origin_bytes.get(origin, 0) + c.nbytes
        if not c.complete:
            self._partial_bytes += c.nbytes
            self._partial.add(msg_id)
            self._reserve(msg_id, c.header.zsize, c.progress, origin, force=True)
        heapq.heappush(self._deadlines, (c.header.deadline, msg_id))
        heapq.heappush(self._evict_heap, (c.rank(), msg_id))
        self._offers.add(msg_id, self._offer_rank(c))
        if len(self._evict_heap) > 2 * len(self._cache) + 64:
            self._rebuild_heaps()
        self._matcher.add_message(msg_id, c.descriptor)

    def _rebuild_heaps(self) -> None:
        """Forget heap entries of messages no longer cached (they are skipped lazily, but
        without this a busy cache would keep one stale entry per message ever held)."""
        self._evict_heap = [(c.rank(), k) for k, c in self._cache.items()]
        heapq.heapify(self._evict_heap)
        self._deadlines = [(c.header.deadline, k) for k, c in self._cache.items()]
        heapq.heapify(self._deadlines)

    def _drop(self, msg_id: str, now: float, reason: str) -> None:
        c = self._cache.pop(msg_id, None)
        if c is None:
            return
        self._cache_bytes -= c.nbytes
        self._unqueue(msg_id)
        left = self._origin_bytes.get(c.header.origin, 0) - c.nbytes
        if left > 0:
            self._origin_bytes[c.header.origin] = left
        else:
            self._origin_bytes.pop(c.header.origin, None)
        if not c.complete:
            self._partial_bytes -= c.nbytes
            self._partial.discard(msg_id)
        self._release(msg_id)
        self._matcher.remove_message(msg_id)
        self._offers.forget(msg_id)
        self._entry_cache.pop(msg_id, None)
        self._granted.pop(msg_id, None)
        self._retries.pop(msg_id, None)
        self._requested.pop(msg_id, None)
        self._store.delete_message(msg_id)
        self._count("messages_evicted")
        self._tr(now, "message_evicted", msg_id, c.nbytes, c.meta.hops, reason)
        if reason in ("capacity", "stale"):
            self._events.append(MessageEvicted(msg_id, reason))

    def _make_room(self, needed: int, incoming: Cached, now: float) -> bool:
        """Evict messages ranked below ``incoming`` until ``needed`` more bytes fit; False if
        impossible. The rank is only computed when the cache is actually full."""
        cap = self.config.cache_capacity
        if self._cache_bytes + needed <= cap:
            return True
        if needed > cap:
            return False
        rank = incoming.rank(arriving=True)
        exclude = incoming.header.msg_id
        victims: list[tuple[EvictRank, str]] = []
        while self._cache_bytes + needed > cap:
            if not self._evict_heap:
                break
            vrank, vid = heapq.heappop(self._evict_heap)
            c = self._cache.get(vid)
            if c is None or vid == exclude:
                if vid == exclude and c is not None:
                    victims.append((vrank, vid))
                continue
            if c.rank() != vrank:
                heapq.heappush(self._evict_heap, (c.rank(), vid))
                continue
            # never for capacity: one ranked at or above the newcomer, nor an own
            # publication not yet handed on (only expiry or the user removes those, even
            # for a newer or higher-priority own publication)
            if c.header.deadline > now and (vrank >= rank or vrank[0] == 3):
                victims.append((vrank, vid))
                break
            self._drop(vid, now, "expired" if c.header.deadline <= now else "capacity")
        for v in victims:
            heapq.heappush(self._evict_heap, v)
        return self._cache_bytes + needed <= cap

    def _origin_fits(self, origin: str, extra: int) -> bool:
        """Whether ``extra`` more bytes of ``origin`` stay within its share of the cache."""
        quota = self._limits.max_origin_share * self.config.cache_capacity
        return self._origin_bytes.get(origin, 0) + extra <= quota

    def _within_origin_quota(self, c: Cached, extra: int, now: float) -> bool:
        """Keep one remote origin under its share of the cache, evicting its own messages
        ranked below ``c`` first; False when the new bytes cannot fit.

        ``c`` ranks as it makes room in the cache (:meth:`Cached.rank` ``arriving``): a
        transfer this host asked for as the complete message it is becoming, so it evicts
        the origin's older complete copies carried for others, oldest first, as its
        fragments arrive (``_room_for`` let it start counting on that). As a partial set it
        ranked below all of them: it stopped at the share, half stored, and nothing newer
        from that origin could come in."""
        origin = c.header.origin
        if self._origin_fits(origin, extra):
            return True
        incoming = c.rank(arriving=True)
        msg_id = c.header.msg_id
        # another transfer of this origin still arriving ranks as what it is becoming too:
        # the newer of two goes on, the older is dropped once (as a partial set, it would
        # drop the newer in turn when its next fragment came, and neither might finish)
        victims = sorted(
            (v.rank(arriving=True), v.header.msg_id)
            for v in self._cache.values()
            if v.header.origin == origin and not v.meta.local and v.header.msg_id != msg_id
        )
        for rank, vid in victims:
            if self._origin_fits(origin, extra) or rank >= incoming:
                break
            self._drop(vid, now, "capacity")
        return self._origin_fits(origin, extra)

    def _purge_expired(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, msg_id = heapq.heappop(self._deadlines)
            c = self._cache.get(msg_id)
            if c is not None and c.header.deadline <= now:
                self._drop(msg_id, now, "expired")
        known = self._known_deadlines
        while known and known[0][0] <= now:
            self._forget_expired(heapq.heappop(known)[1], now)
        purged = False
        while self._history_heap and self._history_heap[0][0] <= now:
            deadline, msg_id = heapq.heappop(self._history_heap)
            if self._history_deadline.get(msg_id) == deadline:
                self._history.pop(msg_id, None)
                self._history_deadline.pop(msg_id, None)
                self._forget_descriptor(msg_id)
                purged = True
        if purged:
            self._store.purge_history(now)

    def _know_until(self, deadline: float, msg_id: str) -> None:
        """This host now keeps something about ``msg_id`` beyond its cache (a decoded
        descriptor, its holders): forget it at ``deadline`` (see :meth:`_forget_expired`)."""
        known = self._known_deadlines
        heapq.heappush(known, (deadline, msg_id))
        if len(known) > 2 * (len(self._zdesc_cache) + len(self._copies_seen)) + 64:
            # entries of what the remote-memory budget gave up early: rebuild from what is
            # still kept, so offers of ever new ids cannot grow the heap
            cache, zdesc_cache = self._cache, self._zdesc_cache
            rebuilt = [(h.deadline, k) for k, (_, _, h) in zdesc_cache.items()]
            for k in self._copies_seen:
                c = cache.get(k)
                if c is not None and k not in zdesc_cache:
                    rebuilt.append((c.header.deadline, k))
            heapq.heapify(rebuilt)
            self._known_deadlines = rebuilt

    def _forget_expired(self, msg_id: str, now: float) -> None:
        """``msg_id`` expired: nothing learnt about it can serve any more (its offers and
        fragments are refused for their deadline), so what peers told about it goes."""
        decoded = self._zdesc_cache.get(msg_id)
        if decoded is not None and decoded[2].deadline > now:
            return  # another descriptor under this id, not yet expired: it has its own entry
        self._forget_descriptor(msg_id)  # keeps the holders of a message still cached

    def _add_history(self, msg_id: str, key: str, deadline: float) -> None:
        keys = self._history.setdefault(msg_id, set())
        if key in keys:
            return
        keys.add(key)
        if msg_id not in self._history_deadline:
            self._history_deadline[msg_id] = deadline
            heapq.heappush(self._history_heap, (deadline, msg_id))
        self._store.add_history(msg_id, key, deadline)

    def _chunks(self, c: Cached) -> list[bytes] | None:
        """The stored fragments of ``c`` in order (None if one is missing)."""
        parts = []
        msg_id = c.header.msg_id
        for i in range(c.header.frags):
            chunk = self._get_fragment(msg_id, i)
            if chunk is None:
                return None
            parts.append(chunk)
        return parts

    def _assemble(self, c: Cached) -> bytes | None:
        parts = self._chunks(c)
        return None if parts is None else b"".join(parts)

    def _incoming_rank(self, header: m.Header, own: bool) -> EvictRank:
        """The rank a message this host is about to ask for will make room with."""
        meta = MessageMeta(header.msg_id, b"", 0, False, 0.0)
        credible = header.origin in self._complete_origins
        c = Cached(meta, {}, header, own=own, credible=credible, asked=True)
        c.seen_age = self._seen_age(header)
        return c.rank(arriving=True)

    def _seen_age(self, header: m.Header, least: int = 0) -> float:
        """What :attr:`Cached.seen_age` is for a message with this header, from the other
        hosts seen holding it complete (at least ``least``: one for a publication of this
        host handed on)."""
        seen = self._copies_seen.get(header.msg_id)
        holders = max(least, len(seen) if seen is not None else 0)
        if not holders:
            return 0.0
        return holders * self.config.seen_copy_age * max(0.0, header.deadline - header.date)

    def _met_host(self, host: str) -> None:
        """A contact with ``host`` began: one more in its count (the host least recently
        met is forgotten when ``_MET_HOSTS`` are counted)."""
        if not self.config.unmet_copy_age:
            return
        met = self._met
        n = met.pop(host, 0)
        if not n:
            self._met_epoch += 1  # another host: ``_met_index`` is out of date
            if len(met) >= _MET_HOSTS:
                del met[next(iter(met))]
        met[host] = n + 1

    def _unmet_age(self, c: Cached) -> float:
        """What :attr:`Cached.unmet_age` is for ``c``: ``unmet_copy_age`` of its lifetime
        over one plus the contacts with the hosts met whose profile, the newest held here,
        matches it (set when the copy is first stored, or handed on if published here: a
        sum over the hosts met, not done again as contacts come)."""
        k = self.config.unmet_copy_age
        if not k:
            return 0.0
        index = self._met_index
        if (
            index is None
            or self._met_index_epoch != self._met_epoch
            or self._met_index_profiles != self._profiles.generation
        ):
            # built again only when a host is first met or a profile held changes (a
            # first fragment of each copy asks, and a host meets many hosts: matching each
            # one's profile every time was a tenth of a run of the ONE workload)
            latest = self._profiles.latest
            index = self._met_index = ProfileIndex(
                (host, prof) for host in self._met if (prof := latest(host)) is not None
            )
            self._met_index_epoch = self._met_epoch
            self._met_index_profiles = self._profiles.generation
        met = self._met
        contacts = 0
        for host in index.matching(c.descriptor):
            contacts += met[host]
        h = c.header
        return k * max(0.0, h.deadline - h.date) / (1 + contacts)

    def _seen_complete(self, msg_id: str, host: str) -> None:
        """Neighbour ``host`` offered ``msg_id`` complete: one more copy elsewhere (each
        host counted once, up to ``_SEEN_HOLDERS``), which moves a complete copy carried
        here for others earlier in the eviction order."""
        if not self.config.seen_copy_age:
            return
        copies_seen = self._copies_seen
        seen = copies_seen.get(msg_id)
        if seen is None:
            if len(copies_seen) >= _SEEN_MESSAGES:
                del copies_seen[next(iter(copies_seen))]
            seen = copies_seen[msg_id] = set()
            c = self._cache.get(msg_id)
            if c is not None:
                self._know_until(c.header.deadline, msg_id)
            # otherwise its descriptor was decoded, and has its deadline kept already
        elif host in seen or len(seen) >= _SEEN_HOLDERS:
            return
        seen.add(host)
        c = self._cache.get(msg_id)
        if c is not None:
            c.seen_age = self._seen_age(c.header, 1 if c.handed else 0)
            if c.complete:  # its place in the heap moves (the old entry is skipped)
                heapq.heappush(self._evict_heap, (c.rank(), msg_id))

    def _evictable_below(self, rank: EvictRank, needed: int) -> int:
        """Bytes of cached messages ranked below ``rank`` (what a message of that rank may
        evict), counted lowest first until ``needed``, in the order of a :class:`RoomScan`
        (the one :meth:`_room_checks` opened, else a new one). Past ``_ROOM_SCAN`` entries
        it answers ``needed`` (assume room: the first fragment will tell)."""
        scan = self._room_scan
        if scan is None:
            scan = RoomScan(self._evict_heap, self._cache)
        ranks, sizes = scan.ranks, scan.sizes
        found, seen, k = 0, 0, 0
        while found < needed:
            if k == len(ranks) and not scan.more():
                break
            if ranks[k] >= rank:
                break
            if seen >= _ROOM_SCAN:
                return needed
            size = sizes[k]
            if size >= 0:
                seen += 1
                found += size
            k += 1
        return found

    def _room_checks(self, on: bool) -> None:
        """Open (``on``) or close the scope of several :meth:`_room_for` calls in a row
        between which nothing is stored, evicted or ranked again (the new offers of one
        catalog): they share one :class:`RoomScan` of the eviction heap instead of walking
        it each (an altruistic host offered a catalog of messages it has no room for asks
        about each of them)."""
        self._room_scan = RoomScan(self._evict_heap, self._cache) if on else None

    def _room_for(self, origin: str, zsize: int, rank: EvictRank) -> bool:
        """Whether a new transfer of ``zsize`` bytes from ``origin``, of eviction rank
        ``rank``, can finish beside the transfers already under way: their bytes still to
        come and its own must fit in the free room plus what it may evict (a transfer
        started without that room had its first fragment refused, and its retries too,
        while the sender kept sending), and those of one origin in its share of it (what
        that origin already has stored here can make room, oldest first, when the new one
        arrives)."""
        cap = self.config.cache_capacity
        quota = self._limits.max_origin_share * cap
        coming = self._reserved_left
        if origin != self.host_id and self._origin_left.get(origin, 0) + zsize > quota:
            return False
        need = coming + zsize - (cap - self._cache_bytes)
        return need <= 0 or self._evictable_below(rank, need) >= need

    def _reserve(
        self,
        msg_id: str,
        zsize: int,
        now: float,
        origin: str,
        force: bool = False,
        address: Hashable | None = None,
    ) -> bool:
        """Promise reassembly memory (the whole compressed size) to an incomplete message
        of ``origin``, fetched from ``address`` (charged to its share,
        ``max_partial_share``)."""
        if msg_id in self._reserved:
            self._refresh_left(msg_id)
            return True
        if not force and self._reserved_bytes + zsize > self._limits.max_partial_bytes:
            return False
        if address is not None and not force:
            if not self._within_address_share(address, zsize):
                return False
            self._reserved_from[msg_id] = (address, zsize)
            _add(self._address_reserved, address, zsize)
        self._reserved[msg_id] = (zsize, now)
        self._reserved_bytes += zsize
        self._left_of[msg_id] = (origin, 0)
        self._refresh_left(msg_id)
        return True

    def _refresh_left(self, msg_id: str) -> None:
        """Bring the bytes still to come of a reserved transfer up to date (after its
        stored bytes changed), in the totals :meth:`_room_for` reads in O(1): before, it
        summed every reservation for every new offer, which a peer re-offering hundreds of
        ids per datagram to a host holding thousands of reservations turned into seconds."""
        entry = self._left_of.get(msg_id)
        if entry is None:
            return
        origin, old = entry
        c = self._cache.get(msg_id)
        left = max(self._reserved[msg_id][0] - (c.nbytes if c is not None else 0), 0)
        if left != old:
            self._left_of[msg_id] = (origin, left)
            self._reserved_left += left - old
            _add(self._origin_left, origin, left - old)

    def _within_address_share(self, address: Hashable, zsize: int) -> bool:
        held = self._address_reserved.get(address, 0)
        return held + zsize <= self._limits.max_partial_share * self._limits.max_partial_bytes

    def _release(self, msg_id: str) -> None:
        r = self._reserved.pop(msg_id, None)
        if r is not None:
            self._reserved_bytes -= r[0]
        entry = self._left_of.pop(msg_id, None)
        if entry is not None and entry[1]:
            origin, left = entry
            self._reserved_left -= left
            _add(self._origin_left, origin, -left)
        charged = self._reserved_from.pop(msg_id, None)
        if charged is not None:
            address, size = charged
            _add(self._address_reserved, address, -size)
