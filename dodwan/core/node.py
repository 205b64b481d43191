"""The DoDWAN node: announcements, profiles, catalogs, requests, fragments and the cache.

Sans-IO, in the style of aioquic's ``QuicConnection``: every input carries ``now``,
datagrams are pulled with :meth:`Node.datagrams_to_send`, events with
:meth:`Node.next_event`, and there is one deadline, :meth:`Node.get_timer`, served by
:meth:`Node.handle_timer`. Randomness comes from the injected ``random.Random``; storage from
the injected :class:`~dodwan.core.store.Store`. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from . import message as m
from . import wire
from .config import NodeConfig
from .errors import WireError
from .events import (
    Event,
    MessageDelivered,
    MessageEvicted,
    NeighbourFound,
    NeighbourLost,
    TraceRecord,
)
from .matcher import Matcher
from .neighbours import Neighbour
from .offers import Offers, Rank
from .patterns import PatternError, Profile, normalise_specs
from .profiles import (
    PROFILE_CACHE_HOSTS,
    Pieces,
    ProfileBook,
    bounded_mask,
    mask_of,
    merge_ranges,
    ranges_of,
    split,
)
from .signing import Signer, verify
from .store import MemoryStore, MessageMeta, Store

BROADCAST = "<broadcast>"

TraceSink = Callable[[float, str, str, int, int, str], None]
"""``sink(time, kind, msg_id, size, hops, detail)``: the fields of a :class:`TraceRecord`."""
"""Destination meaning: every neighbour in radio range."""

_PROMPT_ANNOUNCE = 0.1  # max delay of the announcement answering a new neighbour
_PROMPT_GAP = 0.25  # prompt announcements (profile change, new offer) at most this often
_ASSEMBLY_STALL = 30.0  # a profile assembly that made no progress for this long is dropped
_ENTRY_COST = 400  # bytes a decoded descriptor costs beyond its text (dict, header, keys)
_CACHED_DECODE_MAX = 2048  # larger datagrams are decoded without the shared cache
_ORIGIN_OFFERS = 16  # catalog entries one origin may take in one announcement round
_DEFERRED_MAX = 4096  # offers put back for the next round, at most, per round
_CLOCK_SKEW = 3600.0  # how far a peer's clock may be ahead when its deadlines are checked
_HOUSEKEEPING_MIN = 1e-3  # housekeeping never re-runs sooner than this


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

    def rank(self) -> tuple[int, int, int, float]:
        """Eviction order, lowest first. Tiers: partial sets carried for others, complete
        messages carried for others, messages subscribed here (or published here and handed
        on), then this host's own publications not yet handed on — which only expiry or the
        local user removes. Within a tier: non-persistent, low priority, old first."""
        h = self.header
        if self.meta.local and not self.handed:
            tier = 3
        elif self.own:
            tier = 2
        else:
            tier = 1 if self.count == h.frags else 0
        return (tier, 1 if h.persistent else 0, h.priority, h.date)


@dataclass(slots=True)
class _Subscription:
    key: str
    profile: Profile
    trusted: frozenset[str] | None = None
    """Hex Ed25519 public keys one of which must have signed a message (None: any message)."""

    def accepts(self, descriptor: Mapping[str, str]) -> bool:
        if self.trusted is not None and descriptor.get(m.SIGKEY) not in self.trusted:
            return False
        return self.profile.matches(descriptor)


_TRUSTED = "#trusted"
"""Subscription options travel to the store as a final one-entry dict with this key."""


def _split_options(
    specs: list[dict[str, str]],
) -> tuple[list[dict[str, str]], frozenset[str] | None]:
    if specs and _TRUSTED in specs[-1]:
        keys = specs[-1][_TRUSTED]
        return specs[:-1], frozenset(k for k in keys.split(",") if k)
    return specs, None


def _check_public_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError("trusted keys are hex strings")
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raise ValueError(f"trusted key {key!r} is not hex") from None
    if len(raw) != 32:
        raise ValueError(f"trusted key {key!r} is not a 32-byte Ed25519 public key")
    return raw.hex()


@lru_cache(maxsize=256)
def _all_of(frags: int) -> int:
    """The mask of all ``frags`` fragments, one shared int per count: offers of complete
    messages remembered per neighbour cost a reference each, not up to 8 KiB each (a
    crowd offering ids that declare 65,536 fragments took +900 MB for 1.4 MB sent)."""
    return (1 << frags) - 1


def _indexes(mask: int) -> list[int]:
    """Bitmask -> indexes of its set bits, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _first_bits(mask: int, n: int) -> int:
    """The ``n`` lowest set bits of ``mask``."""
    out = 0
    while mask and n:
        low = mask & -mask
        out |= low
        mask ^= low
        n -= 1
    return out


class Node:
    """One DoDWAN host's protocol state machine."""

    def __init__(
        self,
        config: NodeConfig,
        rng: random.Random,
        store: Store | None = None,
        *,
        trace_sink: TraceSink | None = None,
    ) -> None:
        """``trace_sink``, when given, receives every trace record as
        ``sink(time, kind, msg_id, size, hops, detail)`` the moment it happens, instead of
        :meth:`pop_trace` collecting :class:`TraceRecord` objects (a simulator writing
        columnar logs of millions of records needs no object per record)."""
        if not isinstance(config, NodeConfig):
            raise TypeError("config must be a NodeConfig")
        if not isinstance(rng, random.Random):
            raise TypeError("rng must be a random.Random")
        self.config = config
        self.host_id = config.host_id
        self._limits = config.limits
        self._rng = rng
        self._signer = Signer(config.signing_key) if config.signing_key is not None else None
        self._store: Store = store if store is not None else MemoryStore()
        self._events: deque[Event] = deque()
        self._trace: list[TraceRecord] = []
        self._trace_sink: TraceSink | None = trace_sink
        self._tracing = config.trace or trace_sink is not None
        self._outbox: list[bytes] = []
        self._send_queue: dict[str, dict[int, int]] = {}
        """Fragments requested from us, per message (in request order): index -> hops."""
        self._send_for: dict[str, set[str]] = {}
        """Per queued message, the neighbours that asked for it (gone ones are forgotten)."""
        self._sending: str | None = None
        """The message being sent: served until its queue is empty before another starts."""
        self.counters: dict[str, int] = {}

        self._cache: dict[str, Cached] = {}
        self._cache_bytes = 0
        self._partial_bytes = 0
        self._partial: set[str] = set()
        """Ids of incomplete cached messages."""
        self._reserved: dict[str, tuple[int, float]] = {}
        """Reassembly budget promised to requested messages not stored yet: id -> (zsize, when)."""
        self._reserved_bytes = 0
        self._origin_bytes: dict[str, int] = {}
        """Cached bytes per origin host (the per-origin quota)."""
        self._deadlines: list[tuple[float, str]] = []
        self._evict_heap: list[tuple[tuple[int, int, int, float], str]] = []
        self._history: dict[str, set[str]] = {}
        self._history_deadline: dict[str, float] = {}
        self._history_heap: list[tuple[float, str]] = []
        self._entry_cache: dict[str, bytes] = {}
        self._zdesc_cache: dict[str, tuple[bytes, dict[str, str], m.Header]] = {}
        """Descriptors peers offered, decoded once: id -> (compressed, decoded, header)."""
        self._zdesc_bytes: dict[str, int] = {}  # id -> what the entry above costs (estimate)
        self._zdesc_total = 0
        self._bad_zdesc: set[bytes] = set()

        self._subs: dict[str, _Subscription] = {}
        self._own_profile = Profile()
        self._sub_counter = 0

        self._neighbours: dict[str, Neighbour] = {}
        self._known: dict[str, tuple[int, Profile]] = {}  # host -> (distance, profile)
        self._profiles = ProfileBook(self._limits, config.request_timeout)
        self._own_pieces: Pieces = ()
        self._matcher = Matcher()
        self._interest_epoch = 0
        self._want_cache: dict[str, tuple[int, bool]] = {}

        self._pending: dict[str, dict[str, int]] = {}  # target -> msg -> mask to request
        self._pending_at: dict[str, float] = {}  # target -> when to send
        self._requested: dict[str, tuple[int, float]] = {}  # msg -> (mask, when)

        self._seq = 0
        self._offers = Offers(config.announce_period)
        self._offers_left = False  # the last catalog could not carry every due offer
        self._relay_rotation = 0
        self._ref_cache: dict[str, tuple[int, int, bytes]] = {}  # host -> (dist, version, ref)
        self._relays_sent = b""  # the relayed references of the last full list
        self._relays_due = True  # send the full list next time (a neighbour arrived)
        self._next_announce: float | None = None
        self._last_announce = float("-inf")
        self._next_beacon: float | None = None
        self._beacon_scale = 1.0  # the beacon period's multiplier (see _beacon)
        self._last_sent = float("-inf")
        self._beacon_bytes = b""
        self._next_housekeeping: float | None = None

        self._load()

    # ------------------------------------------------------------------ helpers

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _tr(
        self,
        now: float,
        kind: str,
        msg_id: str = "",
        size: int = 0,
        hops: int = 0,
        detail: str = "",
    ) -> None:
        if self._tracing:
            sink = self._trace_sink
            if sink is not None:
                sink(now, kind, msg_id, size, hops, detail)
            else:
                self._trace.append(TraceRecord(now, kind, msg_id, size, hops, detail))

    def _schedule_basics(self, now: float) -> None:
        if self._next_announce is None:
            self._next_announce = now + self._rng.uniform(0, self.config.announce_period * 0.5)
        if self._next_housekeeping is None:
            self._next_housekeeping = now + self.config.effective_neighbour_timeout
        if self._next_beacon is None and self.config.beacon_period:
            self._next_beacon = now + self._rng.uniform(0, self.config.beacon_period)

    # ------------------------------------------------------------------ restart

    def _load(self) -> None:
        """Rebuild the in-memory indexes from the store (after a restart)."""
        for key, stored in self._store.iter_subscriptions():
            specs, trusted = _split_options(list(stored))
            try:
                profile = Profile.from_patterns(specs, self._limits)
            except (PatternError, TypeError):
                self._store.delete_subscription(key)
                continue
            self._subs[key] = _Subscription(key, profile, trusted)
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
            for i in indexes:
                if 0 <= i < header.frags and not c.have >> i & 1:
                    c.have |= 1 << i
                    c.count += 1
                    c.nbytes += header.fragment_length(i)
            c.nbytes += len(meta.zdesc)
            self._index(c)

    # ------------------------------------------------------------------ local API

    def subscribe(
        self,
        patterns: Mapping[str, str] | Sequence[Mapping[str, str]],
        now: float,
        key: str | None = None,
        trusted_keys: Sequence[str] | None = None,
    ) -> str:
        """Add (or replace, when ``key`` exists) a subscription; returns its key.

        ``patterns`` is one mapping attribute -> regex, or a list of them (an OR). Cached
        complete messages that match are delivered at once (each at most once per key).
        With ``trusted_keys`` (hex Ed25519 public keys), only messages signed by one of
        them are delivered.
        """
        specs = normalise_specs(patterns)
        trusted: frozenset[str] | None = None
        if trusted_keys is not None:
            if isinstance(trusted_keys, str | bytes):
                raise TypeError("trusted_keys is a sequence of hex public keys")
            trusted = frozenset(_check_public_key(k) for k in trusted_keys)
            if not trusted:
                raise ValueError("trusted_keys must name at least one key")
        try:
            profile = Profile.from_patterns(specs, self._limits)
        except PatternError as exc:
            raise ValueError(str(exc)) from None
        if key is None:
            while True:
                self._sub_counter += 1
                key = f"sub-{self._sub_counter}"
                if key not in self._subs:
                    break
        elif not isinstance(key, str) or not key or len(key) > 128:
            raise ValueError("subscription key must be a non-empty str of at most 128 characters")
        others = [s.profile for k, s in self._subs.items() if k != key]
        merged = Profile([p for prof in [*others, profile] for p in prof.patterns])
        if len(merged.patterns) > self._limits.max_patterns:
            raise ValueError(f"the host profile would exceed {self._limits.max_patterns} patterns")
        if len(split(merged, self._piece_room())) > self._limits.max_profile_pieces:
            raise ValueError(
                f"the host profile would span more than {self._limits.max_profile_pieces} "
                "profile pieces; use fewer or shorter patterns"
            )
        sub = _Subscription(key, profile, trusted)
        self._subs[key] = sub
        options = [] if trusted is None else [{_TRUSTED: ",".join(sorted(trusted))}]
        self._store.put_subscription(key, specs + options)
        self._rebuild_own_profile()
        self._schedule_basics(now)
        self._prompt(now)
        for c in list(self._cache.values()):
            if c.complete and sub.accepts(c.descriptor):
                self._deliver(c, now, only=key)
        self._store.commit()
        return key

    def unsubscribe(self, key: str, now: float) -> None:
        """Remove a subscription; unknown keys raise ``KeyError``."""
        if key not in self._subs:
            raise KeyError(f"no subscription {key!r}")
        del self._subs[key]
        self._store.delete_subscription(key)
        self._rebuild_own_profile()
        self._prompt(now)
        self._store.commit()

    def subscriptions(self) -> dict[str, list[dict[str, str]]]:
        """Local subscriptions: key -> patterns."""
        return {k: s.profile.specs() for k, s in self._subs.items()}

    def trusted_keys(self, key: str) -> list[str] | None:
        """The public keys a subscription requires (None when it accepts unsigned messages)."""
        trusted = self._subs[key].trusted
        return None if trusted is None else sorted(trusted)

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
                f"time to live {deadline - now:g} s is longer than the maximum, "
                f"{self._limits.max_ttl:g} s (limits.max_ttl)"
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
                m.ZHASH: m.payload_digest(zpayload),
            }
        )
        zdesc, header = self._geometry(descriptor, len(zpayload))
        c = Cached(
            MessageMeta(msg_id, zdesc, 0, True, now), descriptor, header, own=True, progress=now
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

    def _geometry(self, descriptor: dict[str, str], zsize: int) -> tuple[bytes, m.Header]:
        """Choose the fragment size so a fragment datagram fits ``max_datagram``.

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
            if len(zdesc) > self._limits.max_descriptor_bytes:
                raise ValueError("descriptor too large")
            room = m.fragment_room(
                self.config.max_datagram, self.host_id, descriptor[m.ID], len(zdesc)
            )
            if room < 64:
                raise ValueError(
                    f"descriptor leaves only {room} bytes per fragment in a {self.config.max_datagram}-byte datagram"
                )
            if fsize <= room:
                if frags > self._limits.max_fragments:
                    raise ValueError("payload needs too many fragments; raise max_datagram")
                return zdesc, m.Header.parse(descriptor, self._limits)
            fsize = room
        raise ValueError("could not fit the descriptor in a datagram")  # pragma: no cover

    # ------------------------------------------------------------------ runner API

    def receive_datagram(self, data: bytes, source: Hashable, now: float) -> None:
        """Feed one datagram heard from ``source``. Never raises for bad peer input."""
        if self._next_announce is None or self._next_housekeeping is None:
            self._schedule_basics(now)
        size = len(data) if isinstance(data, bytes | bytearray) else 0
        try:
            if size > 65535:
                raise WireError("oversized")
            data = bytes(data)
            # Fragments are most of the traffic and rarely heard twice by one process: decoded
            # directly; the cache helps the other kinds, which a simulator's hosts share.
            if size > _CACHED_DECODE_MAX or (size > 4 and data[3] == wire.FRAGMENT):
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
        if self._tracing:
            kind = wire.KIND_NAMES.get(data[3], "?")
            self._tr(now, "datagram_received", size=size, detail=kind)
        try:
            self._heard(dg.sender, source, now)
            self._handlers[type(dg)](self, dg, now)
        except WireError as exc:
            self._count("datagrams_dropped")
            self._count(f"dropped_{exc.reason.replace(' ', '_')}")
            self._tr(now, "datagram_dropped", size=size, detail=exc.reason)
        except Exception:
            self._count("internal_errors")
            self._tr(now, "datagram_dropped", size=size, detail="internal error")
        self._store.commit()

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
            self._last_sent = now
            counters = self.counters
            counters["datagrams_sent"] = counters.get("datagrams_sent", 0) + len(out)
            counters["bytes_sent"] = counters.get("bytes_sent", 0) + sum(map(len, out))
            if self._tracing:
                for dg in out:
                    kind = wire.KIND_NAMES.get(dg[3], "?")
                    self._tr(now, "datagram_sent", size=len(dg), detail=kind)
        return [(dg, BROADCAST) for dg in out]

    @property
    def fragments_queued(self) -> int:
        """Requested fragments not handed to the runner yet (see ``budget`` above)."""
        return sum(map(len, self._send_queue.values()))

    def _next_to_send(self) -> str:
        """The message to send fragments of next: the one being sent until it is done (a
        short contact carries one whole message rather than parts of several); then one a
        requester itself subscribed to (it is the destination), then the one with the fewest
        fragments left to send, then the one asked first."""
        cur = self._sending
        if cur is not None and cur in self._send_queue:
            return cur
        best, best_key = "", (2, 0, 0)
        for order, (msg_id, q) in enumerate(self._send_queue.items()):
            direct = any(
                msg_id in self._matcher.matching(h) for h in self._send_for.get(msg_id, ())
            )
            key = (0 if direct else 1, len(q), order)
            if not best or key < best_key:
                best, best_key = msg_id, key
        self._sending = best
        return best

    def _fill_fragments(self, out: list[bytes], budget: int | None) -> None:
        get = self._store.get_fragment
        used = 0
        while self._send_queue and (budget is None or used < budget):
            msg_id = self._next_to_send()
            q = self._send_queue[msg_id]
            c = self._cache.get(msg_id)
            items = list(q.items())
            taken = 0
            if c is not None:
                pre = wire.fragment_encoder(self.host_id, msg_id, c.meta.zdesc)
                own = c.meta.local and not c.handed
                for index, hops in items:
                    if budget is not None and used >= budget:
                        break
                    taken += 1
                    if not c.have >> index & 1:
                        continue
                    chunk = get(msg_id, index)
                    if chunk is None:
                        continue
                    if own:
                        self._sent_own(c, index)
                    dg = wire.encode_fragment_fast(pre[0], pre[1], hops, index, chunk)
                    out.append(dg)
                    used += len(dg)
            else:
                taken = len(items)
            if taken < len(items):
                self._send_queue[msg_id] = dict(items[taken:])
            else:
                self._unqueue(msg_id)

    def _unqueue(self, msg_id: str) -> None:
        self._send_queue.pop(msg_id, None)
        self._send_for.pop(msg_id, None)
        if self._sending == msg_id:
            self._sending = None

    def _sent_own(self, c: Cached, index: int) -> None:
        """A fragment of a publication of this host went out; once all of them have, the
        publication may be evicted like any message subscribed here."""
        c.sent |= 1 << index
        if c.sent == (1 << c.header.frags) - 1:
            c.handed = True
            heapq.heappush(self._evict_heap, (c.rank(), c.header.msg_id))

    def get_timer(self) -> float | None:
        """Earliest absolute time at which :meth:`handle_timer` must be called.

        A node that has not handled any input yet returns 0.0 ("as soon as possible"), so
        the runner's first ``handle_timer(now)`` starts its announcements.
        """
        if self._next_announce is None:
            return 0.0
        t = self._next_announce
        if self._next_housekeeping is not None and self._next_housekeeping < t:
            t = self._next_housekeeping
        if self._next_beacon is not None and self._next_beacon < t:
            t = self._next_beacon
        if self._pending_at:
            t = min(t, min(self._pending_at.values()))
        if self._deadlines and self._deadlines[0][0] < t:
            t = self._deadlines[0][0]
        if self._history_heap and self._history_heap[0][0] < t:
            t = self._history_heap[0][0]
        if self._requested:
            oldest = min(when for _, when in self._requested.values())
            t = min(t, oldest + self.config.request_timeout)
        return t

    def handle_timer(self, now: float) -> None:
        """Do whatever was due at or before ``now``."""
        self._schedule_basics(now)
        self._purge_expired(now)
        self._retry_requests(now)
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
                soon = now + _PROMPT_GAP + self._rng.uniform(0, _PROMPT_ANNOUNCE)
                self._next_announce = min(self._next_announce, soon)
        if self._next_beacon is not None and self._next_beacon <= now:
            self._beacon(now)
        self._store.commit()

    def next_event(self) -> Event | None:
        """Pop the oldest pending event, or None."""
        return self._events.popleft() if self._events else None

    def pop_trace(self) -> list[TraceRecord]:
        """Take the trace records accumulated so far (empty unless ``config.trace``)."""
        out = self._trace
        self._trace = []
        return out

    # ------------------------------------------------------------------ introspection

    def neighbours(self) -> dict[str, dict[str, Any]]:
        """Current neighbours: host -> {address, last_heard, altruistic, patterns}."""
        return {
            h: {
                "address": n.address,
                "last_heard": n.last_heard,
                "altruistic": n.altruistic,
                "patterns": n.profile.specs(),
                "relayed": sorted(n.relayed),
            }
            for h, n in sorted(self._neighbours.items())
        }

    def profile(self) -> dict[str, Any]:
        """This host's profile and the profiles it knows within the horizon."""
        return {
            "own": self._own_profile.specs(),
            "known": {
                h: {"distance": d, "patterns": p.specs()}
                for h, (d, p) in sorted(self._known.items())
            },
        }

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

    # ------------------------------------------------------------------ cache internals

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
            self._reserve(msg_id, c.header.zsize, c.progress, force=True)
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
        rank = incoming.rank()
        exclude = incoming.header.msg_id
        victims: list[tuple[tuple[int, int, int, float], str]] = []
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
            if c.header.deadline > now and vrank >= rank:
                victims.append((vrank, vid))
                break
            self._drop(vid, now, "expired" if c.header.deadline <= now else "capacity")
        for v in victims:
            heapq.heappush(self._evict_heap, v)
        return self._cache_bytes + needed <= cap

    def _within_origin_quota(self, c: Cached, extra: int, now: float) -> bool:
        """Keep one remote origin under its share of the cache, evicting its own messages
        ranked below ``c`` first; False when the new bytes cannot fit."""
        quota = self._limits.max_origin_share * self.config.cache_capacity
        origin = c.header.origin
        if self._origin_bytes.get(origin, 0) + extra <= quota:
            return True
        incoming = c.rank()
        msg_id = c.header.msg_id
        victims = sorted(
            (v.rank(), v.header.msg_id)
            for v in self._cache.values()
            if v.header.origin == origin and not v.meta.local and v.header.msg_id != msg_id
        )
        for rank, vid in victims:
            if self._origin_bytes.get(origin, 0) + extra <= quota or rank >= incoming:
                break
            self._drop(vid, now, "capacity")
        return self._origin_bytes.get(origin, 0) + extra <= quota

    def _purge_expired(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, msg_id = heapq.heappop(self._deadlines)
            c = self._cache.get(msg_id)
            if c is not None and c.header.deadline <= now:
                self._drop(msg_id, now, "expired")
        purged = False
        while self._history_heap and self._history_heap[0][0] <= now:
            deadline, msg_id = heapq.heappop(self._history_heap)
            if self._history_deadline.get(msg_id) == deadline:
                self._history.pop(msg_id, None)
                self._history_deadline.pop(msg_id, None)
                self._forget_descriptor(msg_id)
                self._want_cache.pop(msg_id, None)
                purged = True
        if purged:
            self._store.purge_history(now)

    def _add_history(self, msg_id: str, key: str, deadline: float) -> None:
        keys = self._history.setdefault(msg_id, set())
        if key in keys:
            return
        keys.add(key)
        if msg_id not in self._history_deadline:
            self._history_deadline[msg_id] = deadline
            heapq.heappush(self._history_heap, (deadline, msg_id))
        self._store.add_history(msg_id, key, deadline)

    def _assemble(self, c: Cached) -> bytes | None:
        parts = []
        for i in range(c.header.frags):
            chunk = self._store.get_fragment(c.header.msg_id, i)
            if chunk is None:
                return None
            parts.append(chunk)
        return b"".join(parts)

    def _deliver(
        self,
        c: Cached,
        now: float,
        only: str | None = None,
        payload: bytes | None = None,
        zpayload: bytes | None = None,
    ) -> None:
        """Deliver a complete message to each matching subscription not yet served."""
        msg_id = c.header.msg_id
        done = self._history.get(msg_id, set())
        keys = [
            k
            for k, s in self._subs.items()
            if (only is None or k == only) and k not in done and s.accepts(c.descriptor)
        ]
        if not keys:
            return
        if payload is None:
            z = zpayload if zpayload is not None else self._assemble(c)
            try:
                if z is None:
                    raise WireError("missing fragment")
                payload = m.inflate_payload(z, c.header, verified=zpayload is not None)
            except WireError:
                self._count("corrupt_messages")
                self._drop(msg_id, now, "corrupt")
                return
        for k in keys:
            self._add_history(msg_id, k, c.header.deadline)
            self._events.append(MessageDelivered(k, dict(c.descriptor), payload))
            self._count("messages_delivered")
            self._tr(now, "message_delivered", msg_id, c.header.size, c.meta.hops, k)

    # ------------------------------------------------------------------ profiles

    def _piece_room(self) -> int:
        return self.config.max_datagram - wire.profile_piece_overhead(self.host_id, self.host_id)

    def _rebuild_own_profile(self) -> None:
        self._own_profile = Profile([p for s in self._subs.values() for p in s.profile.patterns])
        self._own_pieces = split(self._own_profile, self._piece_room(), strict=False)
        for c in self._cache.values():
            own = c.meta.local or self._own_profile.matches(c.descriptor)
            if own != c.own:
                c.own = own
                heapq.heappush(self._evict_heap, (c.rank(), c.header.msg_id))
        self._interest_epoch += 1
        self._beacon_bytes = b""  # it names the profile version

    def _pieces_of(self, host: str, version: int) -> Pieces | None:
        """The pieces of a profile this node can serve (its own, or one it assembled)."""
        if host == self.host_id:
            return self._own_pieces if version == self._own_profile.version else None
        hit = self._profiles.get(host, version)
        return None if hit is None else hit[1]

    def _resolve_refs(self, n: Neighbour, now: float) -> bool:
        """Turn a neighbour's profile references into profiles; ask it for the pieces of
        those not held yet (meanwhile the previous version stays in use). True when the
        neighbour's own or relayed profiles changed."""
        changed = False
        relayed: dict[str, tuple[int, Profile]] = {}
        for host, (dist, version, pieces) in n.refs.items():
            if pieces == 0:
                prof: Profile | None = Profile()
            else:
                hit = self._profiles.get(host, version)
                prof = None if hit is None else hit[0]
                if prof is None:
                    self._want_profile(n.host_id, host, version, pieces, now)
            if host == n.host_id:
                if prof is not None and n.version != version:
                    changed = changed or prof != n.profile
                    n.profile, n.version = prof, version
            elif prof is not None:
                if prof:
                    relayed[host] = (dist, prof)
            elif host in n.relayed:
                relayed[host] = n.relayed[host]  # stale until the new version is assembled
        if {h: (d, p.version) for h, (d, p) in relayed.items()} != {
            h: (d, p.version) for h, (d, p) in n.relayed.items()
        }:
            n.relayed = relayed
            changed = True
        return changed

    def _want_profile(self, target: str, owner: str, version: int, count: int, now: float) -> None:
        """Queue a request to ``target`` for the pieces of ``(owner, version)`` still missing."""
        if (
            self._profiles.want(target, owner, version, count, now)
            and target not in self._pending_at
        ):
            self._pending_at[target] = now + self._rng.uniform(0, self.config.request_delay)

    def _recompute_known(self, now: float) -> None:
        """Derive the profiles known within the horizon from the neighbours' announcements."""
        known: dict[str, tuple[int, Profile]] = {}
        horizon = self.config.horizon
        for n in self._neighbours.values():
            if n.profile:
                known[n.host_id] = (1, n.profile)
        for n in self._neighbours.values():
            for host, (dist, prof) in n.relayed.items():
                d = dist + 1
                if host == self.host_id or d > horizon or not prof:
                    continue
                if host not in known or known[host][0] > d:
                    known[host] = (d, prof)
        if known.keys() == self._known.keys() and all(
            known[h][0] == self._known[h][0] and known[h][1].version == self._known[h][1].version
            for h in known
        ):
            return
        self._known = known
        for host in self._matcher.hosts():
            if host not in known:
                self._matcher.remove_profile(host)
        for host, (_, prof) in known.items():
            if self._matcher.set_profile(host, prof):
                self._offer_matches(host)  # what it now wants is offered first
        self._interest_epoch += 1
        if self._matcher.fresh:  # a neighbour now wants something held here: offer it soon
            self._prompt(now)

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

    def _wants(self, msg_id: str, descriptor: Mapping[str, str]) -> bool:
        """Should this host fetch and carry the message?"""
        cached = self._want_cache.get(msg_id)
        if cached is not None and cached[0] == self._interest_epoch:
            return cached[1]
        want = self.config.altruistic or self._own_profile.matches(descriptor)
        if not want:
            limit = self.config.horizon - 1
            want = any(d <= limit and p.matches(descriptor) for d, p in self._known.values())
        if len(self._want_cache) > 65536:
            self._want_cache.clear()
        self._want_cache[msg_id] = (self._interest_epoch, want)
        return want

    # ------------------------------------------------------------------ neighbours

    def _heard(self, sender: str, source: Hashable, now: float) -> None:
        n = self._neighbours.get(sender)
        if n is None:
            if len(self._neighbours) >= self._limits.max_neighbours:
                # Full: the one heard least recently goes (a host in range is heard at
                # least every announce period, so a crowd of names must keep talking to stay).
                stale = min(self._neighbours.values(), key=lambda x: x.last_heard)
                self._lose(stale.host_id)
                self._count("neighbours_displaced")
                self._recompute_known(now)
            n = Neighbour(
                sender, source, now, tokens=self._limits.max_requests_per_second, tokens_at=now
            )
            self._neighbours[sender] = n
            self._beacon_scale = 1.0
            self._events.append(NeighbourFound(sender, source))
            self._count("neighbours_found")
            self._relays_due = True
            self._offer_matches(sender)  # back in range, profile already known
            prompt = now + self._rng.uniform(0, _PROMPT_ANNOUNCE)
            if self._next_announce is None or self._next_announce > prompt:
                self._next_announce = prompt
        else:
            n.last_heard = now
            n.address = source

    def _lose(self, h: str) -> None:
        """Forget neighbour ``h`` and what was queued for it or asked of it."""
        del self._neighbours[h]
        self._beacon_scale = 1.0
        self._pending.pop(h, None)
        for msg_id, asked in list(self._send_for.items()):
            asked.discard(h)
            if not asked:  # nobody left to send it to
                self._unqueue(msg_id)
        self._profiles.forget_target(h)
        self._pending_at.pop(h, None)
        self._events.append(NeighbourLost(h))
        self._count("neighbours_lost")

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

    # ------------------------------------------------------------------ announcements

    def _catalog_entry(self, c: Cached) -> bytes:
        msg_id = c.header.msg_id
        if c.complete:
            entry = self._entry_cache.get(msg_id)
            if entry is None:
                entry = wire.encode_catalog_entry(
                    wire.CatalogEntry(msg_id, c.header.frags, None, c.meta.zdesc)
                )
                self._entry_cache[msg_id] = entry
            return entry
        return wire.encode_catalog_entry(
            wire.CatalogEntry(msg_id, c.header.frags, c.have, c.meta.zdesc)
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

        def pool() -> list[tuple[str, Rank]]:
            ids = cache if altruists else eligible
            return [(k, self._offer_rank(cache[k])) for k in ids if k in cache]

        def rank_of(msg_id: str) -> Rank | None:
            c = cache.get(msg_id)
            if c is None or not (altruists or msg_id in eligible):
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
        while (msg_id := offers.pop()) is not None:
            c = cache.get(msg_id)
            if c is None or c.header.deadline <= now or c.count == 0:
                continue
            if not altruists and msg_id not in eligible:
                continue
            if all(c.have & ~n.offers.get(msg_id, 0) == 0 for n in neighbours):
                offers.offered(msg_id, now)  # all of them hold it; look again later
                continue
            origin = c.header.origin
            if per_origin.get(origin, 0) >= _ORIGIN_OFFERS and len(deferred) < _DEFERRED_MAX:
                deferred.append(offers.popped())  # one origin cannot fill a round: next one
                continue
            entry = self._catalog_entry(c)
            if len(entry) > room:
                if len(groups) >= self.config.max_catalog_datagrams:
                    offers.unpop()  # next round, which comes promptly
                    self._offers_left = True
                    break
                groups.append([])
                room = budget - wire.catalog_overhead(self.host_id)
                if len(entry) > room:
                    continue
            groups[-1].append(entry)
            room -= len(entry)
            per_origin[origin] = per_origin.get(origin, 0) + 1
            offers.offered(msg_id, now)
        for popped in deferred:
            offers.restore(popped)
        if deferred:
            self._offers_left = True  # the next round comes promptly
        return groups

    def _relayed_for_announce(self, room: int) -> list[bytes]:
        """References to the profiles to relay (distance < horizon), rotating when they do
        not all fit; only profiles this node can serve the pieces of."""
        candidates = sorted((d, h) for h, (d, _) in self._known.items() if d < self.config.horizon)[
            : self._limits.max_relayed_profiles
        ]
        if not candidates:
            return []
        start = self._relay_rotation % len(candidates)
        out: list[bytes] = []
        for d, h in candidates[start:] + candidates[:start]:
            version = self._known[h][1].version
            hit = self._ref_cache.get(h)
            if hit is not None and hit[0] == d and hit[1] == version:
                enc = hit[2]
            else:
                pieces = self._pieces_of(h, version)
                if not pieces:
                    continue
                if hit is None and len(self._ref_cache) >= PROFILE_CACHE_HOSTS:
                    self._ref_cache.clear()
                enc = wire.encode_ref(wire.ProfileRef(h, d, version, len(pieces)))
                self._ref_cache[h] = (d, version, enc)
            if len(enc) > room:
                break
            out.append(enc)
            room -= len(enc)
        if len(out) < len(candidates):
            self._relay_rotation += len(out) or 1
        return out

    def _prompt(self, now: float) -> None:
        """Announce soon (jittered, at most once per ``_PROMPT_GAP``) when neighbours are
        there to hear it: a profile change, or something a neighbour now wants."""
        if not self._neighbours:
            return
        at = max(now, self._last_announce + _PROMPT_GAP) + self._rng.uniform(0, _PROMPT_ANNOUNCE)
        if self._next_announce is None or at < self._next_announce:
            self._next_announce = at

    def _prompt_announce(self, msg_id: str, now: float) -> None:
        """Offer a new message soon when a neighbour may want it (rate-limited)."""
        if not self._neighbours or not (
            msg_id in self._matcher.eligible or any(n.altruistic for n in self._neighbours.values())
        ):
            return
        self._prompt(now)

    def _beacon(self, now: float) -> None:
        """Send a beacon if nothing else went out lately, and plan the next one a jittered
        beacon period after the last datagram sent (any datagram tells neighbours we are
        here, so a busy node sends no beacons). Among the same neighbours the period doubles
        after each beacon, up to ``announce_period`` (a settled group learns nothing from
        them); it is back to ``beacon_period`` when a neighbour comes or goes, and stays
        there while the node is alone — waiting for a contact is when beacons matter."""
        base, j = self.config.beacon_period, self.config.announce_jitter
        period = base * self._beacon_scale
        if self._outbox or self._last_sent + period * (1 - j) > now:
            last = now if self._outbox else self._last_sent
            self._next_beacon = last + period * self._rng.uniform(1 - j, 1 + j)
            return
        version, pieces = self._own_profile.version, len(self._own_pieces)
        if not self._beacon_bytes:  # a bare announcement, same bytes until the next round
            self._beacon_bytes = wire.encode_announce(
                self.host_id, self._seq, self.config.altruistic, version, pieces, (), (), True
            )
        self._outbox.append(self._beacon_bytes)
        self._count("beacons_sent")
        if self._neighbours:
            most = max(1.0, self.config.announce_period / base)
            self._beacon_scale = min(self._beacon_scale * 2, most)
        else:
            self._beacon_scale = 1.0
        self._next_beacon = now + base * self._beacon_scale * self._rng.uniform(1 - j, 1 + j)

    def _announce(self, now: float) -> None:
        self._seq += 1
        self._last_announce = now
        self._beacon_bytes = b""
        version, pieces = self._own_profile.version, len(self._own_pieces)
        bare = wire.encode_announce(
            self.host_id, self._seq, self.config.altruistic, version, pieces, (), ()
        )
        relayed = self._relayed_for_announce(self.config.max_datagram // 2 - len(bare))
        # The relayed list is soft state too, but it rarely changes: sent in full when it
        # changed, when a neighbour arrived and every 4th round; otherwise a flag says "same".
        joined = b"".join(relayed)
        same = bool(relayed) and joined == self._relays_sent and not self._relays_due
        same = same and self._seq % 4 != 0
        if not same:
            self._relays_sent, self._relays_due = joined, False
        else:
            relayed = []
        base = len(bare) + sum(len(r) for r in relayed)
        budget = self.config.max_datagram
        datagrams = self._catalog(now, budget - base - 4, budget)
        self._outbox.append(
            wire.encode_announce(
                self.host_id,
                self._seq,
                self.config.altruistic,
                version,
                pieces,
                relayed,
                datagrams[0],
                same,
            )
        )
        for entries in datagrams[1:]:
            if entries:
                self._outbox.append(wire.encode_catalog(self.host_id, self._seq, entries))
        self._count("announcements_sent")

    # ------------------------------------------------------------------ handlers

    def _on_announce(self, dg: wire.Announce, now: float) -> None:
        n = self._neighbours[dg.sender]
        if n.altruistic != dg.altruistic:
            n.altruistic = dg.altruistic
            self._offers.changed()
        refs = {dg.sender: (0, dg.version, dg.pieces)}
        if dg.same_relays:  # unchanged since its last full list
            refs.update((h, v) for h, v in n.refs.items() if h != dg.sender)
        for r in dg.relayed:
            if r.host == self.host_id or r.distance < 1 or r.host in refs:
                continue
            refs[r.host] = (r.distance, r.version, r.pieces)
        n.refs = refs
        if self._resolve_refs(n, now):
            self._recompute_known(now)
        self._on_catalog_entries(n, dg.catalog, now)

    def _on_profile_piece(self, dg: wire.ProfilePiece, now: float) -> None:
        profile = self._profiles.received(dg, now)
        if isinstance(profile, str):
            if profile != "kept":
                self._count(f"profile_pieces_{profile}")
            return
        self._count("profiles_assembled")
        changed = False
        for n in self._neighbours.values():
            if dg.owner in n.refs and self._resolve_refs(n, now):
                changed = True
        if changed:
            self._recompute_known(now)

    def _on_profile_request(self, dg: wire.ProfileRequest, now: float) -> None:
        if dg.target != self.host_id:
            # Overheard: the pieces will be broadcast, so drop them from our own request.
            for owner, version, ranges in dg.entries:
                if self._profiles.overheard(owner, version, ranges, now):
                    self._count("profile_requests_suppressed")
            return
        n = self._neighbours[dg.sender]
        rate = self._limits.max_requests_per_second
        n.tokens = min(rate, n.tokens + (now - n.tokens_at) * rate)
        n.tokens_at = now
        for owner, version, ranges in dg.entries:
            pieces = self._pieces_of(owner, version)
            if pieces is None:
                continue
            for i in _indexes(mask_of(ranges) & ((1 << len(pieces)) - 1)):
                if n.tokens < 1:
                    self._count("requests_rate_limited")
                    return
                n.tokens -= 1
                data = wire.encode_profile_piece(
                    self.host_id, owner, version, len(pieces), i, pieces[i]
                )
                if len(data) > self.config.max_datagram:
                    self._count("profile_pieces_too_large")
                    continue
                self._outbox.append(data)
                self._count("profile_pieces_sent")

    def _on_catalog(self, dg: wire.Catalog, now: float) -> None:
        self._on_catalog_entries(self._neighbours[dg.sender], dg.catalog, now)

    def _descriptor_of(self, msg_id: str, zdesc: bytes) -> tuple[dict[str, str], m.Header] | None:
        """Decode (once) a descriptor offered by a peer; None when invalid."""
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
        if cached is None:  # the first descriptor seen for an id wins
            cost = 2 * len(zdesc) + sum(len(k) + len(v) for k, v in d.items()) + _ENTRY_COST
            budget = self._limits.max_descriptor_cache
            while self._zdesc_cache and self._zdesc_total + cost > budget:
                self._forget_descriptor(next(iter(self._zdesc_cache)))  # oldest first
            self._zdesc_cache[msg_id] = (zdesc, d, h)
            self._zdesc_bytes[msg_id] = cost
            self._zdesc_total += cost
        return d, h

    def _forget_descriptor(self, msg_id: str) -> None:
        if self._zdesc_cache.pop(msg_id, None) is not None:
            self._zdesc_total -= self._zdesc_bytes.pop(msg_id)

    def _too_long_lived(self, header: m.Header, now: float) -> bool:
        """A peer's message whose deadline is further ahead than ``max_ttl`` (+ an hour of
        clock skew) is refused: it would be carried and remembered for ever."""
        if header.deadline - now <= self._limits.max_ttl + _CLOCK_SKEW:
            return False
        self._count("dropped_ttl_too_long")
        return True

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

    def _on_catalog_entries(
        self, n: Neighbour, entries: Sequence[wire.CatalogEntry], now: float
    ) -> None:
        started: list[tuple[str, int]] = []
        new: list[tuple[str, int, int, str]] = []
        mine: set[str] = set()
        for e in entries:
            offered = _all_of(e.frags) if e.have is None else e.have
            n.offers[e.msg_id] = offered
            c = self._cache.get(e.msg_id)
            if c is not None:
                if not c.complete and c.header.frags == e.frags:
                    started.append((e.msg_id, offered))
                continue
            if e.msg_id in self._history:
                continue
            decoded = self._descriptor_of(e.msg_id, e.zdesc)
            if decoded is None or decoded[1].frags != e.frags or decoded[1].deadline <= now:
                continue
            if self._too_long_lived(decoded[1], now):
                continue
            if self._wants(e.msg_id, decoded[0]):
                zsize = decoded[1].zsize if e.frags > 1 else 0
                new.append((e.msg_id, offered, zsize, decoded[1].origin))
                if self.config.altruistic and self._own_profile.matches(decoded[0]):
                    mine.add(e.msg_id)
        # what this host itself subscribed to before what it would only carry; among those,
        # the smallest first (on a short contact, the likeliest to finish)
        new.sort(key=lambda t: (t[0] not in mine, t[2]))
        # messages already being reassembled first; a new one only when the reassembly
        # budget can hold all of it, so partial sets never starve each other, and only when
        # it can fit in the cache and in its origin's share beside the transfers under way
        # (several started at once would each get part of the room and none finish)
        for msg_id, offered in started:
            self._queue_request(n.host_id, msg_id, offered, now)
        for msg_id, offered, zsize, origin in new:
            if zsize and msg_id not in self._reserved:
                if self._reserved_bytes + zsize > self._limits.max_partial_bytes:
                    self._count("deferred_reassembly_budget")
                    continue
                if not self._room_for(origin, zsize):
                    self._count("deferred_no_room")
                    continue
                self._reserve(msg_id, zsize, now)
            self._queue_request(n.host_id, msg_id, offered, now)
        if len(n.offers) > 4 * self._limits.max_catalog_entries:
            for k in list(n.offers)[: len(n.offers) // 2]:
                del n.offers[k]

    def _room_for(self, origin: str, zsize: int) -> bool:
        """Whether a new transfer of ``zsize`` bytes from ``origin`` can finish beside the
        transfers already under way: their bytes still to come and its own must fit in the
        cache, and those of one origin in its share of it (what that origin already has
        stored here can make room, oldest first, when the new one arrives)."""
        cap = self.config.cache_capacity
        quota = self._limits.max_origin_share * cap
        coming = from_origin = 0
        for msg_id, (size, _) in self._reserved.items():
            c = self._cache.get(msg_id)
            left = size - (c.nbytes if c is not None else 0)
            coming += max(left, 0)
            if c is not None:
                o = c.header.origin
            else:
                z = self._zdesc_cache.get(msg_id)
                o = z[2].origin if z is not None else ""
            if o == origin:
                from_origin += max(left, 0)
        if origin != self.host_id and from_origin + zsize > quota:
            return False
        return coming + zsize <= cap

    def _reserve(self, msg_id: str, zsize: int, now: float, force: bool = False) -> bool:
        """Promise reassembly memory (the whole compressed size) to an incomplete message."""
        if msg_id in self._reserved:
            return True
        if not force and self._reserved_bytes + zsize > self._limits.max_partial_bytes:
            return False
        self._reserved[msg_id] = (zsize, now)
        self._reserved_bytes += zsize
        return True

    def _release(self, msg_id: str) -> None:
        r = self._reserved.pop(msg_id, None)
        if r is not None:
            self._reserved_bytes -= r[0]

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
        pending[msg_id] = already | _first_bits(missing, window)
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
                old = self._requested.get(msg_id, (0, now))[0]
                self._requested[msg_id] = (old | mask, now)
        for i in range(0, len(entries), 32):
            self._outbox.append(wire.encode_request(self.host_id, target, entries[i : i + 32]))
            self._count("requests_sent")

    def _on_request(self, dg: wire.Request, now: float) -> None:
        # Repeated or overlapping ranges count once (merged first), and every fragment asked
        # costs a token of the asker's rate limit: the work a request causes is bounded by
        # its size and by that limit, whatever its ranges say.
        if dg.target != self.host_id:
            # Overheard: the answer will be broadcast, so drop the same fragments from ours.
            for msg_id, ranges in dg.entries:
                if not any(msg_id in pending for pending in self._pending.values()):
                    continue
                mask = bounded_mask(ranges, self._limits.max_fragments)
                suppressed = False
                for pending in self._pending.values():
                    if msg_id in pending and pending[msg_id] & mask:
                        pending[msg_id] &= ~mask
                        suppressed = True
                        if not pending[msg_id]:
                            del pending[msg_id]
                if suppressed:
                    self._count("requests_suppressed")
                    old = self._requested.get(msg_id, (0, now))[0]
                    self._requested[msg_id] = (old | mask, now)
            return
        n = self._neighbours[dg.sender]
        rate = self._limits.max_requests_per_second
        n.tokens = min(rate, n.tokens + (now - n.tokens_at) * rate)
        n.tokens_at = now
        for msg_id, ranges in dg.entries:
            c = self._cache.get(msg_id)
            if c is None:
                continue
            q = self._send_queue.setdefault(msg_id, {})
            self._send_for.setdefault(msg_id, set()).add(dg.sender)
            hops, have = c.meta.hops + 1, c.have
            for first, count in merge_ranges(ranges, c.header.frags):
                for i in range(first, first + count):
                    if n.tokens < 1:
                        self._count("requests_rate_limited")
                        if not q:
                            self._unqueue(msg_id)
                        return
                    n.tokens -= 1
                    if have >> i & 1 and i not in q:
                        q[i] = hops
            if not q:
                self._unqueue(msg_id)

    def _on_fragment(self, dg: wire.Fragment, now: float) -> None:
        c = self._cache.get(dg.msg_id)
        descriptor: dict[str, str] = {}
        if c is not None:
            if dg.zdesc != c.meta.zdesc:
                raise WireError("descriptor mismatch")
            if c.complete or c.have >> dg.index & 1:
                self._count("fragments_duplicate")
                return
            header = c.header
        else:
            if dg.msg_id in self._history:
                self._count("fragments_duplicate")
                return
            decoded = self._descriptor_of(dg.msg_id, dg.zdesc)
            if decoded is None:
                raise WireError("bad descriptor")
            descriptor, header = decoded
            if header.deadline <= now:
                self._count("fragments_expired")
                return
            if self._too_long_lived(header, now):
                return
            if not self._wants(dg.msg_id, descriptor):
                self._count("fragments_unwanted")
                return
        if dg.index >= header.frags:
            raise WireError("fragment index out of range")
        if len(dg.chunk) != header.fragment_length(dg.index):
            raise WireError("fragment length mismatch")
        self._store_fragment(c, dg, header, descriptor, now)

    def _store_fragment(
        self,
        c: Cached | None,
        dg: wire.Fragment,
        header: m.Header,
        descriptor: dict[str, str],
        now: float,
    ) -> None:
        """Store a validated fragment; ``descriptor`` is the decoded one when ``c`` is None."""
        size = len(dg.chunk)
        extra = size if c is not None else size + len(dg.zdesc)
        if c is None:
            c = Cached(
                MessageMeta(dg.msg_id, dg.zdesc, dg.hops, False, now),
                descriptor,
                header,
                progress=now,
            )
            c.own = self._own_profile.matches(c.descriptor)
            if not self._within_origin_quota(c, extra, now):
                self._count("origin_quota_exceeded")
                return
            if header.frags > 1 and dg.msg_id not in self._reserved:
                # overheard, not requested by us: start it only if all of it fits in the
                # free room (or it is for this host): a transfer that was not asked for must
                # not evict the partial sets this host is reassembling
                free = self.config.cache_capacity - self._cache_bytes - self._reserved_bytes
                if not c.own and header.zsize + len(dg.zdesc) > free:
                    self._count("overheard_no_room")
                    return
                if not self._reserve(dg.msg_id, header.zsize, now):
                    self._count("partial_memory_full")
                    return
            if not self._make_room(extra, c, now):
                self._count("cache_full")
                return
            self._store.put_message(c.meta)
            c.nbytes = len(dg.zdesc)
            self._index(c)
        else:
            if not self._within_origin_quota(c, extra, now):
                self._count("origin_quota_exceeded")
                return
            if not self._make_room(extra, c, now):
                self._count("cache_full")
                return
        self._store.put_fragment(dg.msg_id, dg.index, dg.chunk)
        c.have |= 1 << dg.index
        c.count += 1
        c.nbytes += size
        self._cache_bytes += size
        self._partial_bytes += size
        self._origin_bytes[header.origin] = self._origin_bytes.get(header.origin, 0) + size
        c.progress = now
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
        else:
            self._continue_transfer(c, now)

    def _completed(self, c: Cached, now: float) -> None:
        msg_id = c.header.msg_id
        self._requested.pop(msg_id, None)
        self._entry_cache.pop(msg_id, None)
        for pending in self._pending.values():
            pending.pop(msg_id, None)
        z = self._assemble(c)
        try:
            if z is None:
                raise WireError("missing fragment")
            m.verify_payload(z, c.header)
        except WireError:
            self._count("corrupt_messages")
            self._drop(msg_id, now, "corrupt")
            return
        self._count("messages_completed")
        self._tr(now, "message_completed", msg_id, c.header.size, c.meta.hops)
        self._add_history(msg_id, "", c.header.deadline)
        self._offers.add(msg_id, self._offer_rank(c))  # now ranked as complete
        self._prompt_announce(msg_id, now)
        self._deliver(c, now, zpayload=z)

    def _retry_requests(self, now: float) -> None:
        """Fragments asked for and not received within ``request_timeout`` are asked again
        from a neighbour that offered them, without waiting for it to offer them again."""
        timeout = self.config.request_timeout
        for msg_id, (_, when) in list(self._requested.items()):
            if when + timeout > now:
                continue
            del self._requested[msg_id]
            c = self._cache.get(msg_id)
            if c is not None and c.complete:
                continue
            have = c.have if c is not None else 0
            for n in self._neighbours.values():
                offered = n.offers.get(msg_id, 0)
                if offered & ~have:
                    self._count("requests_retried")
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

    _handlers: ClassVar[dict[type, Callable[[Node, Any, float], None]]] = {
        wire.Announce: _on_announce,
        wire.Catalog: _on_catalog,
        wire.Request: _on_request,
        wire.Fragment: _on_fragment,
        wire.ProfilePiece: _on_profile_piece,
        wire.ProfileRequest: _on_profile_request,
    }
