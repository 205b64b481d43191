"""The DoDWAN node: one host's protocol state machine, and its public contract.

Sans-IO, in the style of aioquic's ``QuicConnection``: every input carries ``now``,
datagrams are pulled with :meth:`Node.datagrams_to_send`, events with
:meth:`Node.next_event`, and there is one deadline, :meth:`Node.get_timer`, served by
:meth:`Node.handle_timer`. Randomness comes from the injected ``random.Random``; storage from
the injected :class:`~dodwan.core.store.Store`. Nothing here reads a clock or does I/O.

The protocol's parts live in their own modules (see :mod:`.node_state`): the cache policy,
delivery, neighbours and profile gossip, catalogs, and transfers. This module puts them
together and holds what the runner calls: publishing, receiving, timers and events.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Hashable, Mapping

from . import message as m
from . import wire
from .acks import AcksMixin
from .budgets import RateBudget
from .cache import Cached, CacheFullError, CacheMixin
from .catalogs import CatalogsMixin
from .config import NodeConfig
from .delivery import DeliveryMixin, Subscription, split_options
from .errors import WireError
from .events import Event, TraceRecord
from .gossip import PROMPT_ANNOUNCE, PROMPT_GAP, GossipMixin
from .ledger import RemoteMemory
from .matcher import Matcher
from .node_state import NodeState, Timings, TraceSink
from .offers import Offers
from .patterns import PatternError, Profile
from .profiles import ProfileBook
from .signing import Signer
from .store import MemoryStore, MessageMeta, Store
from .transfers import BROADCAST, TransfersMixin

__all__ = ["BROADCAST", "CacheFullError", "Cached", "Node", "TraceSink"]

_ASSEMBLY_STALL = 30.0  # a profile assembly that made no progress for this long is dropped
_CACHED_DECODE_MAX = 2048  # larger datagrams are decoded without the shared cache
_HOUSEKEEPING_MIN = 1e-3  # housekeeping never re-runs sooner than this


class Node(
    TransfersMixin, CatalogsMixin, GossipMixin, DeliveryMixin, AcksMixin, CacheMixin, NodeState
):
    """One DoDWAN host's protocol state machine."""

    def __init__(
        self,
        config: NodeConfig,
        rng: random.Random,
        store: Store | None = None,
        *,
        trace_sink: TraceSink | None = None,
        trace_datagrams: bool = True,
        verified: m.VerifiedPayloads | None = None,
    ) -> None:
        """``trace_sink``, when given, receives every trace record as
        ``sink(time, kind, msg_id, size, hops, detail)`` the moment it happens, instead of
        :meth:`pop_trace` collecting :class:`TraceRecord` objects (a simulator writing
        columnar logs of millions of records needs no object per record).

        ``trace_datagrams=False`` leaves out the ``datagram_sent`` and ``datagram_received``
        records, one per datagram: :attr:`datagrams_sent_by_kind` and
        :attr:`datagrams_received_by_kind` keep their totals per kind in any case (a
        simulator that only logs totals reads them at the end).

        ``verified``, shared by the nodes of one process, lets a node accept a completed
        copy equal byte for byte to one another node accepted (the same verdict, without
        hashing it again; see :class:`~dodwan.core.message.VerifiedPayloads`)."""
        if not isinstance(config, NodeConfig):
            raise TypeError("config must be a NodeConfig")
        if not isinstance(rng, random.Random):
            raise TypeError("rng must be a random.Random")
        self.config = config
        self.host_id = config.host_id
        self._limits = config.limits
        self._rng = rng
        self._signer = Signer(config.signing_key) if config.signing_key is not None else None
        self._store = store if store is not None else MemoryStore()
        self._memory_store = self._store if isinstance(self._store, MemoryStore) else None
        self._verified = verified
        self._events = deque()
        self._trace = []
        self._trace_sink = trace_sink
        self._tracing = config.trace or trace_sink is not None
        self._trace_datagrams = trace_datagrams
        self.datagrams_sent_by_kind = {}
        self.datagrams_received_by_kind = {}
        self._outbox = []
        self._send_queue = {}
        self._send_for = {}
        self._sending = None
        self._send_classes = {}
        self._send_seq = {}
        self._send_seq_next = 0
        self._send_keys = {}
        self._send_heap = []
        self._send_dirty = set()
        self._send_keyed = -1
        self._encoders = {}
        self.counters = {}

        self._cache = {}
        self._cache_bytes = 0
        self._partial_bytes = 0
        self._partial = set()
        self._reserved = {}
        self._reserved_from = {}
        self._address_reserved = {}
        self._reserved_bytes = 0
        self._reserved_left = 0
        self._origin_left = {}
        self._left_of = {}
        self._origin_bytes = {}
        self._deadlines = []
        self._evict_heap = []
        self._history = {}
        self._history_deadline = {}
        self._history_heap = []
        self._entry_cache = {}
        self._remote = RemoteMemory(self._limits.max_remote_memory, self._give_up_remote)
        self._known_stale = False
        self._zdesc_cache = {}
        self._known_deadlines = []
        self._copies_seen = {}
        self._met = {}
        self._met_epoch = 0
        self._met_index = None
        self._met_index_epoch = self._met_index_profiles = -1
        self._room_scan = None
        self._bad_zdesc = set()

        self._subs = {}
        self._own_profile = Profile()
        self._sub_counter = 0

        self._neighbours = {}
        self._known = {}  # host -> (distance, profile)
        self._profiles = ProfileBook(self._limits, config.request_timeout, self._remote)
        self._own_pieces = ()
        self._matcher = Matcher()
        self._interest_epoch = 0
        self._want_cache = {}
        self._granted = {}
        self._deferred = {}
        self._acked = {}
        self._acked_heap = []
        self._times = Timings()
        self._retries = {}

        self._pending = {}  # target -> msg -> mask to request
        self._pending_at = {}  # target -> when to send
        self._requested = {}  # msg -> (mask, when)
        self._requested_heap = []

        self._seq = 0
        self._offers = Offers(config.announce_period)
        self._offers_left = False  # the last catalog could not carry every due offer
        self._relay_rotation = 0
        self._ref_cache = {}  # host -> (dist, version, ref)
        self._relays_sent = b""  # the relayed references of the last full list
        self._relays_due = True  # send the full list next time (a neighbour arrived)
        self._next_announce = None
        self._next_beacon = None
        self._beacon_bytes = b""
        self._next_housekeeping = None
        lim, sources = self._limits, 4 * self._limits.max_neighbours
        self._decodes = RateBudget(
            lim.max_descriptor_decodes, lim.max_descriptor_decodes_total, sources
        )
        self._serving = RateBudget(lim.max_requests_per_second, lim.max_served_per_second, sources)
        hour = 3600.0
        self._inflation = RateBudget(
            lim.max_inflation_per_origin / hour, lim.max_inflation_total / hour, sources, hour
        )
        self._inflation_waiting = {}
        self._inflation_retry_at = None
        self._inflation_denials = 0
        self._complete_origins = {}

        self._load()

    def _give_up_remote(self, kind: str, key: Hashable) -> None:
        """The remote-memory budget is full: drop the state it chose (see :mod:`.ledger`)."""
        self._count(f"remote_memory_evicted_{kind}")
        if kind == "descriptor":
            assert isinstance(key, str)
            self._forget_descriptor(key)
        elif kind == "offers":
            assert isinstance(key, str)
            self._offers_given_up(key)
        elif kind == "ack":
            assert isinstance(key, str)
            self._forget_ack(key)
        elif kind == "profile":
            assert isinstance(key, tuple)
            self._profile_given_up(*key)
        elif kind == "assembly":
            assert isinstance(key, tuple)
            self._profiles.drop_assembly(key)

    def _schedule_basics(self, now: float) -> None:
        if self._next_announce is None:
            self._next_announce = now + self._rng.uniform(0, self.config.announce_period * 0.5)
        if self._next_housekeeping is None:
            self._next_housekeeping = now + self.config.effective_neighbour_timeout
        if self._next_beacon is None and self.config.beacon_period:
            self._next_beacon = now + self._rng.uniform(0, self.config.beacon_period)

    def _load(self) -> None:
        """Rebuild the in-memory indexes from the store (after a restart)."""
        for key, stored in self._store.iter_subscriptions():
            specs, trusted = split_options(list(stored))
            try:
                profile = Profile.from_patterns(specs, self._limits)
            except (PatternError, TypeError):
                self._store.delete_subscription(key)
                continue
            self._subs[key] = Subscription(key, profile, trusted)
        self._rebuild_own_profile()
        for msg_id, key, deadline in self._store.iter_history():
            self._history.setdefault(msg_id, set()).add(key)
            self._history_deadline[msg_id] = deadline
            heapq.heappush(self._history_heap, (deadline, msg_id))
        for meta, indexes in self._store.iter_messages():
            try:
                descriptor = m.decompress_descriptor(meta.zdesc, self._limits)
                header = m.Header.parse(descriptor, self._limits)
            except WireError:
                self._store.delete_message(meta.msg_id)
                continue
            c = Cached(meta, descriptor, header, progress=meta.received)
            # the copy budget is not stored: a restarted host keeps its own publications'
            # whole budget and, when it gives budgets, carries the others for subscribers
            c.copies = (
                min(self.config.copy_budget, 1) if not meta.local else self.config.copy_budget
            )
            for i in indexes:
                if 0 <= i < header.frags and not c.have >> i & 1:
                    c.have |= 1 << i
                    c.count += 1
                    c.nbytes += header.fragment_length(i)
            c.nbytes += len(meta.zdesc)
            self._index(c)
        for c in self._cache.values():
            if c.complete and not c.meta.local:
                self._complete_origins[c.header.origin] = None
        for msg_id in self._partial:
            c = self._cache[msg_id]
            c.credible = c.header.origin in self._complete_origins
            heapq.heappush(self._evict_heap, (c.rank(), msg_id))

    @property
    def public_key(self) -> str | None:
        """Hex public key this node signs with, if any."""
        return self._signer.public_hex if self._signer is not None else None

    def publish(
        self,
        attributes: Mapping[str, str],
        payload: bytes,
        deadline: float,
        now: float,
        priority: int = 4,
        persistent: bool = True,
    ) -> str:
        """Put a new message in the cache (and deliver it to matching local subscriptions).

        ``attributes`` may hold ``id`` to choose the message id; other system attributes
        are set here. Returns the message id.
        """
        m.check_app_attributes(attributes, self._limits)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError("payload must be bytes")
        payload = bytes(payload)
        if len(payload) > self._limits.max_message_size:
            raise ValueError(f"payload larger than {self._limits.max_message_size} bytes")
        if not isinstance(deadline, int | float) or not isinstance(now, int | float):
            raise TypeError("deadline and now must be numbers")
        if not math.isfinite(deadline) or not math.isfinite(now):
            raise ValueError("deadline and now must be finite times")
        if not deadline > now:
            raise ValueError("deadline must be later than now")
        if deadline - now > self._limits.max_ttl:
            raise ValueError(
                f"time to live {deadline - now:.15g} s is longer than the maximum, "
                f"{self._limits.max_ttl:.15g} s (limits.max_ttl)"
            )
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise ValueError("priority must be an int between 0 and 9")
        if not isinstance(persistent, bool):
            raise TypeError("persistent must be a bool")
        msg_id = attributes.get(m.ID)
        if msg_id is None:
            msg_id = f"{self.host_id}-{self._rng.getrandbits(64):016x}"
        m.check_message_id(msg_id)
        if msg_id in self._cache or msg_id in self._history:
            raise ValueError(f"message id {msg_id!r} is already known here")

        zpayload = m.compressor(self.config.compression_level).compress(payload)
        zhash = m.payload_digest(zpayload)
        descriptor = dict(attributes)
        descriptor.update(
            {
                m.ID: msg_id,
                m.DEADLINE: m.format_time(deadline),
                m.ORIGIN: self.host_id,
                m.DATE: m.format_time(now),
                m.SIZE: str(len(payload)),
                m.PRIORITY: str(priority),
                m.PERSISTENT: "true" if persistent else "false",
                m.ZSIZE: str(len(zpayload)),
                m.ZHASH: zhash,
            }
        )
        zdesc, frags, fsize = self._geometry(descriptor, len(zpayload))
        # the Header of the values just set (what Header.parse would read back from their
        # strings: a time's repr gives the same float back), not parsed from the descriptor
        header = m.Header(
            msg_id, float(deadline), self.host_id, float(now), len(payload), len(zpayload),
            frags, fsize, zhash, priority, persistent, attributes.get(m.ONCE) == "true",
        )  # fmt: skip
        c = Cached(
            MessageMeta(msg_id, zdesc, 0, True, now),
            descriptor,
            header,
            own=True,
            progress=now,
            copies=self.config.copy_budget,
        )
        total = len(zpayload) + len(zdesc)
        if not self._make_room(total, c, now):
            raise CacheFullError(
                f"message of {total} compressed bytes does not fit in the cache ({self.config.cache_capacity} bytes)"
            )
        self._store.put_message(c.meta)
        fsize = header.fsize
        self._store.put_fragments(
            msg_id, [zpayload[i * fsize : (i + 1) * fsize] for i in range(header.frags)]
        )
        c.have = (1 << header.frags) - 1
        c.count = header.frags
        c.nbytes = total
        self._index(c)
        self._count("messages_published")
        self._tr(now, "message_created", msg_id, len(payload), 0)
        self._schedule_basics(now)
        self._prompt_announce(msg_id, now)
        self._deliver(c, now, payload=payload)
        self._store.commit()
        return msg_id

    def largest_fragmented_payload(self, attribute_bytes: int = 0) -> int:
        """Largest incompressible payload :meth:`publish` can cut into at most
        ``limits.max_fragments`` fragments of this ``max_datagram``, when the application
        attributes take at most ``attribute_bytes`` in the compressed descriptor.

        The descriptor counted has system attributes of realistic widths (plus 16 bytes
        of margin), and zstd's framing of the payload (header, checksum, 3 bytes per
        128 KiB block) is set aside. A compressible payload can be larger. The cache and
        ``limits.max_message_size`` bound it too (not counted here).
        """
        digits = "7305918264" * 2  # like real values: digits that barely compress
        widest = {
            m.ID: f"{self.host_id}-9e3779b97f4a7c15",
            m.DEADLINE: f"{digits[:10]}.{digits[10:17]}",
            m.ORIGIN: self.host_id,
            m.DATE: f"{digits[3:13]}.{digits[13:20]}",
            m.SIZE: digits[:12],
            m.PRIORITY: "9",
            m.PERSISTENT: "false",
            m.ZSIZE: digits[5:17],
            m.ZHASH: m.payload_digest(digits.encode()),
            m.FRAGS: str(self._limits.max_fragments),
            m.FSIZE: str(self.config.max_datagram),
        }
        if self._signer is not None:
            self._signer.sign(widest)
        zdesc = m.compress_descriptor(widest, self.config.compression_level)
        size = len(zdesc) + max(0, attribute_bytes) + 16
        room = m.fragment_room(self.config.max_datagram, self.host_id, widest[m.ID], size)
        if room < 64:  # as _geometry refuses
            return 0
        capacity = self._limits.max_fragments * room
        return max(0, capacity - 32 - 3 * -(-capacity // (128 * 1024)))

    def _geometry(self, descriptor: dict[str, str], zsize: int) -> tuple[bytes, int, int]:
        """Choose the fragment size so a fragment datagram fits ``max_datagram``: the
        compressed descriptor, the fragment count and size.

        The first guess (one fragment when the payload is small) is usually right, so most
        publications compress their descriptor once.
        """
        guess = self.config.max_datagram - 200 - len(descriptor[m.ID]) - len(self.host_id)
        fsize = max(1, zsize if zsize <= guess else guess)
        for _ in range(8):
            frags = max(1, -(-zsize // fsize))
            descriptor[m.FRAGS] = str(frags)
            descriptor[m.FSIZE] = str(fsize)
            if self._signer is not None:
                self._signer.sign(descriptor)
            zdesc = m.compress_descriptor(descriptor, self.config.compression_level)
            # peers refuse a descriptor whose encoded size (decompress_descriptor) or
            # compressed size (a datagram's blob) is over the limit
            limit = self._limits.max_descriptor_bytes
            encoded = len(wire.encode_attributes(descriptor))
            if max(encoded, len(zdesc)) > limit:
                raise ValueError(
                    f"descriptor of {encoded} bytes (attributes encoded) is over "
                    f"limits.max_descriptor_bytes ({limit})"
                )
            room = m.fragment_room(
                self.config.max_datagram, self.host_id, descriptor[m.ID], len(zdesc)
            )
            if room < 64:
                raise ValueError(
                    f"descriptor leaves only {room} bytes per fragment in a {self.config.max_datagram}-byte datagram"
                )
            if fsize <= room:
                if frags > self._limits.max_fragments:
                    raise ValueError(
                        f"payload needs {frags} fragments of {fsize} bytes, more than "
                        f"limits.max_fragments ({self._limits.max_fragments}): raise "
                        "max_datagram or limits.max_fragments, or use fewer attributes"
                    )
                if zsize > self._limits.max_message_size + 1024:  # as Header.parse checks
                    raise ValueError("compressed payload larger than limits allow")
                return zdesc, frags, fsize
            fsize = room
        raise ValueError("could not fit the descriptor in a datagram")  # pragma: no cover

    def receive_datagram(self, data: bytes, source: Hashable, now: float) -> None:
        """Feed one datagram heard from ``source``. Never raises for bad peer input."""
        if self._next_announce is None or self._next_housekeeping is None:
            self._schedule_basics(now)
        if isinstance(data, bytes):  # what a runner gives: no copy, no call
            size = len(data)
        else:
            size = len(data) if isinstance(data, bytearray) else 0
        try:
            if size > 65535:
                raise WireError("oversized")
            if not isinstance(data, bytes):
                data = bytes(data)
            # Fragments are most of the traffic and rarely heard twice by one process: decoded
            # directly; the cache helps the other kinds, which a simulator's hosts share.
            if size > _CACHED_DECODE_MAX or (size > 4 and data[3] in wire.FRAGMENT_KINDS):
                # a large datagram (only a peer with a large max_datagram sends those, or an
                # attacker) decodes to large objects: not kept in the shared decode cache
                dg = wire.decode(data, self._limits)
            else:
                dg = wire.decode_cached(data, self._limits)
        except WireError as exc:
            self._count("datagrams_dropped")
            self._count(f"dropped_{exc.reason.replace(' ', '_')}")
            self._tr(now, "datagram_dropped", size=size, detail=exc.reason)
            return
        except Exception:  # a bug must not take the node down; count it
            self._count("internal_errors")
            self._tr(now, "datagram_dropped", size=size, detail="internal error")
            return
        if dg.sender == self.host_id:
            self._count("own_datagrams_ignored")
            return
        counters = self.counters
        counters["datagrams_received"] = counters.get("datagrams_received", 0) + 1
        counters["bytes_received"] = counters.get("bytes_received", 0) + size
        kind = wire.KIND_NAMES.get(data[3], "?")
        total = self.datagrams_received_by_kind.get(kind)
        if total is None:
            self.datagrams_received_by_kind[kind] = [1, size]
        else:
            total[0] += 1
            total[1] += size
        if self._tracing and self._trace_datagrams:
            self._tr(now, "datagram_received", size=size, detail=kind)
        try:
            self._heard(dg.sender, source, now)
            self._handle(dg, now)
        except WireError as exc:
            self._count("datagrams_dropped")
            self._count(f"dropped_{exc.reason.replace(' ', '_')}")
            self._tr(now, "datagram_dropped", size=size, detail=exc.reason)
        except Exception:
            self._count("internal_errors")
            self._tr(now, "datagram_dropped", size=size, detail="internal error")
        self._settle_known(now)
        if self._memory_store is None:  # a MemoryStore has nothing to commit
            self._store.commit()

    def remote_memory_usage(self) -> dict[str, int]:
        """What peers make this host keep (see :mod:`.ledger`): bytes charged, the budget
        (``limits.max_remote_memory``), items held, items given up so far, and what the
        source address holding the most holds."""
        mem = self._remote
        return {
            "bytes": mem.total,
            "budget": mem.budget,
            "items": len(mem),
            "evicted": mem.evicted,
            "largest_holder": mem.largest_share(),
        }

    def get_timer(self, *, presence: bool = True) -> float | None:
        """Earliest absolute time at which :meth:`handle_timer` must be called.

        A node that has not handled any input yet returns 0.0 ("as soon as possible"), so
        the runner's first ``handle_timer(now)`` starts its announcements.

        ``presence=False`` leaves out the announcement and beacon deadlines: when anything
        else is due (purges, housekeeping, requests, deliveries put off), None if nothing
        is. Before then a timer only tells the neighbours this host is here: what it does
        depends on this node alone and traces nothing but the datagrams it sends, so a
        runner that knows nobody can hear them (a simulator's host alone) may handle those
        timers ahead of its other hosts' events.
        """
        if self._next_announce is None:
            return 0.0
        t = self._next_announce if presence else math.inf
        if self._next_housekeeping is not None and self._next_housekeeping < t:
            t = self._next_housekeeping
        if presence and self._next_beacon is not None and self._next_beacon < t:
            t = self._next_beacon
        if self._pending_at:
            t = min(t, min(self._pending_at.values()))
        if self._deadlines and self._deadlines[0][0] < t:
            t = self._deadlines[0][0]
        if self._history_heap and self._history_heap[0][0] < t:
            t = self._history_heap[0][0]
        oldest = self._oldest_request()
        if oldest is not None:
            t = min(t, oldest + self.config.request_timeout)
        if self._inflation_retry_at is not None and self._inflation_retry_at < t:
            t = self._inflation_retry_at
        return t if t < math.inf else None

    def handle_timer(self, now: float) -> None:
        """Do whatever was due at or before ``now``."""
        self._schedule_basics(now)
        self._purge_expired(now)
        self._expire_acks(now)
        self._retry_requests(now)
        if self._inflation_retry_at is not None and self._inflation_retry_at <= now:
            self._retry_inflation(now)
        for target, at in list(self._pending_at.items()):
            if at <= now:
                self._send_request(target, now)
        if self._next_housekeeping is not None and self._next_housekeeping <= now:
            self._next_housekeeping = self._housekeeping(now)
        if self._next_announce is not None and self._next_announce <= now:
            self._offers_left = False
            self._announce(now)
            j = self.config.announce_jitter
            self._next_announce = now + self.config.announce_period * self._rng.uniform(
                1 - j, 1 + j
            )
            if self._offers_left:  # more offers are due than one round carries: go on soon
                soon = now + PROMPT_GAP + self._rng.uniform(0, PROMPT_ANNOUNCE)
                self._next_announce = min(self._next_announce, soon)
        if self._next_beacon is not None and self._next_beacon <= now:
            self._beacon(now)
        self._settle_known(now)
        self._store.commit()

    def next_event(self) -> Event | None:
        """Pop the oldest pending event, or None."""
        return self._events.popleft() if self._events else None

    @property
    def has_output(self) -> bool:
        """Whether :meth:`datagrams_to_send`, :meth:`next_event` or :meth:`pop_trace` may
        return anything now. False: none of them would (a runner may skip them until the
        next input, timer or idle link)."""
        return bool(self._outbox or self._send_queue or self._events or self._trace)

    def pop_trace(self) -> list[TraceRecord]:
        """Take the trace records accumulated so far (empty unless ``config.trace``)."""
        out = self._trace
        self._trace = []
        return out

    def _housekeeping(self, now: float) -> float:
        """Drop silent neighbours, stale partial sets and unused reservations; return when
        the next of these can happen (so an idle node wakes rarely)."""
        timeout = self.config.effective_neighbour_timeout
        lost = [h for h, n in self._neighbours.items() if n.last_heard + timeout <= now]
        for h in lost:
            self._lose(h)
        if lost:
            self._recompute_known(now)
        hold = 2 * self.config.request_timeout
        for msg_id in [
            k for k, (_, t) in self._reserved.items() if t + hold <= now and k not in self._cache
        ]:
            self._release(msg_id)  # requested but never started
        self._profiles.expire(now, _ASSEMBLY_STALL)
        self._charge_all_matches()
        stale = self.config.partial_timeout
        for msg_id in [p for p in self._partial if self._cache[p].progress + stale <= now]:
            self._drop(msg_id, now, "stale")
        nxt = now + timeout
        for n in self._neighbours.values():
            nxt = min(nxt, n.last_heard + timeout)
        for k, (_, t) in self._reserved.items():
            if k not in self._cache:
                nxt = min(nxt, t + hold)
        for p in self._partial:
            nxt = min(nxt, self._cache[p].progress + stale)
        return max(nxt, now + _HOUSEKEEPING_MIN)

    def _handle(self, dg: wire.Datagram, now: float) -> None:
        """Hand a decoded datagram to the part that handles its kind (compiled, these are
        direct calls; fragments, most of the traffic, first)."""
        if isinstance(dg, wire.Fragment):
            self._on_fragment(dg, now)
        elif isinstance(dg, wire.Announce):
            self._on_announce(dg, now)
        elif isinstance(dg, wire.Request):
            self._on_request(dg, now)
        elif isinstance(dg, wire.Catalog):
            self._on_catalog(dg, now)
        elif isinstance(dg, wire.Ack):
            self._on_ack(dg, now)
        elif isinstance(dg, wire.ProfilePiece):
            self._on_profile_piece(dg, now)
        elif isinstance(dg, wire.ProfileRequest):
            self._on_profile_request(dg, now)
        else:
            raise TypeError(f"no handler for {type(dg).__name__}")
