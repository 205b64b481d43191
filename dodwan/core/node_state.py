"""What the parts of a :class:`~dodwan.core.node.Node` share.

A node is one object assembled from parts, a module each: the cache policy (:mod:`.cache`),
local subscriptions and delivery (:mod:`.delivery`), neighbours and profile gossip
(:mod:`.gossip`), catalogs (:mod:`.catalogs`), and requests and fragments
(:mod:`.transfers`); :mod:`.node` holds the public contract (inputs, outputs, timers) and
puts them together. :class:`NodeState` declares the state the parts share (set up by
``Node.__init__``) and the methods one part calls in another, so that each part can be read
and type-checked on its own.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from mypy_extensions import trait

from . import message as m
from . import wire
from .budgets import RateBudget
from .config import NodeConfig
from .events import Event, TraceRecord
from .ledger import RemoteMemory
from .limits import Limits
from .matcher import Matcher
from .neighbours import Neighbour
from .offers import Offers, Rank
from .patterns import Profile, ProfileIndex
from .profiles import Pieces, ProfileBook
from .signing import Signer
from .store import MemoryStore, Store

if TYPE_CHECKING:
    from .cache import Cached, EvictRank, RoomScan
    from .delivery import Subscription

TraceSink = Callable[[float, str, str, int, int, str], None]
"""``sink(time, kind, msg_id, size, hops, detail)``: the fields of a :class:`TraceRecord`."""


WANT_NO, WANT_CARRY, WANT_FOR, WANT_OWN = 0, 1, 2, 3
"""What ``_wants`` says of a message: not wanted; wanted only to carry it altruistically;
wanted for a host within the horizon; wanted for a subscription here."""


class Timings:
    """The float state the parts share, on an object of its own: mypyc (2.4.1) miscompiles
    float attributes of a trait that another trait sets, so :class:`NodeState`, a trait,
    holds none (see :mod:`dodwan.native`)."""

    __slots__ = ("acks_flooded_at", "beacon_scale", "last_announce", "last_sent")

    def __init__(self) -> None:
        self.acks_flooded_at = -math.inf
        """When acks were last sent to a new neighbour (see ``AcksMixin._flood_acks``)."""
        self.last_announce = -math.inf
        self.beacon_scale = 1.0
        """The beacon period's multiplier (see ``GossipMixin._beacon``)."""
        self.last_sent = -math.inf


@trait
class NodeState:
    """The state every part of a node shares, and the helpers they all use.

    A mypyc trait, as every part is: :class:`~dodwan.core.node.Node` inherits from all of
    them, and mypyc compiles multiple inheritance only from traits. At run time without
    mypyc, ``@trait`` does nothing.
    """

    config: NodeConfig
    _times: Timings
    host_id: str
    _limits: Limits
    _rng: random.Random
    _signer: Signer | None
    _store: Store
    _verified: m.VerifiedPayloads | None
    """Verdicts on completed copies shared with other nodes of the process (see
    ``Node.__init__``); None: every completed copy is hashed."""
    _memory_store: MemoryStore | None
    """``_store`` when it is a :class:`MemoryStore` (the simulator's): the per-fragment
    calls go to it directly, compiled, rather than through the ``Store`` protocol (see
    :meth:`_get_fragment`)."""
    _events: deque[Event]
    _trace: list[TraceRecord]
    _trace_sink: TraceSink | None
    _tracing: bool
    _trace_datagrams: bool
    """Whether each datagram sent or received is a trace record (see ``Node.__init__``)."""
    datagrams_sent_by_kind: dict[str, list[int]]
    """Datagram kind (``wire.KIND_NAMES``) -> [datagrams sent, bytes]."""
    datagrams_received_by_kind: dict[str, list[int]]
    """Datagram kind -> [datagrams received and decoded, bytes]."""
    _outbox: list[bytes]
    """Control datagrams produced and not yet pulled by the runner."""
    _send_queue: dict[str, OrderedDict[int, int]]
    """Fragments requested from us, per message (in request order): index -> hops."""
    _send_for: dict[str, set[str]]
    """Per queued message, the neighbours that asked for it (gone ones are forgotten)."""
    _sending: str | None
    """The message being sent: served until its queue is empty before another starts."""
    _send_classes: dict[str, tuple[int, tuple[int, int, bool]]]
    """Queued message -> (interest epoch, its sending class); see ``_send_class``."""
    _send_seq: dict[str, int]
    """Queued message -> its place in the queue (a count of messages queued, ever): the
    one asked first goes first on a tie; queued again, it goes last."""
    _send_seq_next: int
    _send_keys: dict[str, tuple[int, int, bool, int, int, str]]
    """Queued message -> its key in ``_send_heap``: (class, fragments left, place in the
    queue, message); see ``_next_to_send``."""
    _send_heap: list[tuple[int, int, bool, int, int, str]]
    """The keys of ``_send_keys``, least first, and outdated ones, dropped when on top."""
    _send_dirty: set[str]
    """Queued messages whose key may have changed since the last choice (asked again)."""
    _send_keyed: int
    """The interest epoch ``_send_keys`` were computed in; -1 when every class must be
    computed again (a requester lost)."""
    _encoders: dict[str, tuple[bytes, bytes, bytes, bytes]]
    """Queued message -> the fixed parts of its fragment datagrams: prefix and suffix of
    the form with the descriptor, then of the form sent by digest (the same again when
    ``fragments_by_digest`` is off)."""
    counters: dict[str, int]
    _cache: dict[str, Cached]
    _cache_bytes: int
    _partial_bytes: int
    _partial: set[str]
    """Ids of incomplete cached messages."""
    _reserved: dict[str, tuple[int, float]]
    """Reassembly budget promised to requested messages not stored yet: id -> (zsize, when)."""
    _reserved_bytes: int
    _reserved_left: int
    """Bytes still to come of all reserved transfers (see ``CacheMixin._refresh_left``)."""
    _origin_left: dict[str, int]
    """The same per origin."""
    _left_of: dict[str, tuple[str, int]]
    """Reserved message -> (origin, bytes still to come)."""
    _reserved_from: dict[str, tuple[Hashable, int]]
    """Reserved message -> (source address it is fetched from, bytes charged to it)."""
    _address_reserved: dict[Hashable, int]
    """Source address -> reassembly bytes reserved for transfers from it."""
    _origin_bytes: dict[str, int]
    """Cached bytes per origin host (the per-origin quota)."""
    _deadlines: list[tuple[float, str]]
    _evict_heap: list[tuple[EvictRank, str]]
    _history: dict[str, set[str]]
    _history_deadline: dict[str, float]
    _history_heap: list[tuple[float, str]]
    _entry_cache: dict[str, bytes]
    _copies_seen: dict[str, set[str]]
    """Message id -> the other hosts seen offering it complete (see ``_seen_complete``)."""
    _met: dict[str, int]
    """Contacts this host had with each other host (the last ``cache._MET_HOSTS`` met,
    least recently met first), for ``NodeConfig.unmet_copy_age``."""
    _met_epoch: int
    """Changes whenever a host is added to ``_met``."""
    _met_index: ProfileIndex | None
    """The newest profiles held of the hosts in ``_met``, indexed (None: not built yet);
    built at ``_met_index_epoch`` and ``ProfileBook.generation`` ``_met_index_profiles``."""
    _met_index_epoch: int
    _met_index_profiles: int
    _room_scan: RoomScan | None
    """The eviction heap's walk shared by the room checks of one scope (see
    ``CacheMixin._room_checks``); None outside one."""
    _zdesc_cache: dict[str, tuple[bytes, dict[str, str], m.Header]]
    """Descriptors peers offered, decoded once: id -> (compressed, decoded, header), each
    charged to ``_remote`` as ``("descriptor", id)``."""
    _known_deadlines: list[tuple[float, str]]
    """(deadline, id) of the messages ``_zdesc_cache`` or ``_copies_seen`` keeps something
    about: forgotten when they expire (``CacheMixin._forget_expired``). Compacted to what
    is still kept when it outgrows it (the remote-memory budget gives entries up early)."""
    _remote: RemoteMemory
    """The remote-memory budget (``limits.max_remote_memory``), see :mod:`.ledger`."""
    _known_stale: bool
    """A compiled profile was given up: ``_known`` must be derived again."""
    _bad_zdesc: set[bytes]
    _subs: dict[str, Subscription]
    _own_profile: Profile
    _sub_counter: int
    _neighbours: dict[str, Neighbour]
    _known: dict[str, tuple[int, Profile]]
    """host -> (distance, profile), within the horizon"""
    _profiles: ProfileBook
    _own_pieces: Pieces
    _matcher: Matcher
    _interest_epoch: int
    _want_cache: dict[str, tuple[int, int, bytes]]
    """message -> (interest epoch, ``WANT_*``, the compressed descriptor judged: the one
    ``_zdesc_cache`` holds for it, shared)"""
    _retries: dict[str, int]
    """Message -> times it was asked again in a row without a fragment arriving."""
    _deferred: dict[str, str]
    """Message -> neighbour whose offer of it was put off for want of room (oldest first):
    asked for as soon as a transfer finishes."""
    _acked: dict[str, float]
    """Messages published ``once`` known to be delivered -> their deadline (see ``acks``)."""
    _acked_heap: list[tuple[float, str]]
    _granted: dict[str, dict[str, int]]
    """Message -> carriers that asked for it while it had a copy budget -> the fragments
    sent since: once all are, the carrier holds a copy with half the budget, and this
    host keeps the other half (see ``TransfersMixin._fragments_sent``)."""
    _pending: dict[str, dict[str, int]]
    """target -> message -> mask of fragments to request"""
    _pending_at: dict[str, float]
    """target -> when to send its requests"""
    _requested: dict[str, tuple[int, float]]
    """message -> (mask asked, when)"""
    _requested_heap: list[tuple[float, str]]
    """``(when, id)`` of every ``_requested`` entry (stale ones skipped lazily): the oldest
    request in O(log n) for every timer computation, which runs after every datagram."""
    _seq: int
    _offers: Offers
    _offers_left: bool
    """The last catalog could not carry every due offer."""
    _relay_rotation: int
    _ref_cache: dict[str, tuple[int, int, bytes]]
    """host -> (distance, version, encoded reference)"""
    _relays_sent: bytes
    """The relayed references of the last full list."""
    _relays_due: bool
    """Send the full relayed list next time (a neighbour arrived)."""
    _next_announce: float | None
    _next_beacon: float | None
    _beacon_bytes: bytes
    _next_housekeeping: float | None
    _complete_origins: dict[str, None]
    """Origins a message of which was completed here (bounded; oldest forgotten first)."""
    _decodes: RateBudget
    """Descriptor decodes peers may cause, per source address and in all."""
    _serving: RateBudget
    _inflation: RateBudget
    """Bytes inflation for delivery may add, per origin and in all (per hour)."""
    _inflation_waiting: dict[str, None]
    """Complete messages whose delivery waits for their origin's inflation allowance."""
    _inflation_retry_at: float | None
    _inflation_denials: int
    """Fragments and profile pieces peers may ask for, per source address and in all."""

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _get_fragment(self, msg_id: str, index: int) -> bytes | None:
        mem = self._memory_store
        if mem is not None:
            return mem.get_fragment(msg_id, index)
        return self._store.get_fragment(msg_id, index)

    def _put_fragment(self, msg_id: str, index: int, chunk: bytes) -> None:
        mem = self._memory_store
        if mem is not None:
            mem.put_fragment(msg_id, index, chunk)
        else:
            self._store.put_fragment(msg_id, index, chunk)

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

    # What one part calls in another, defined in the module named above each group. These
    # are real methods rather than declarations for the type checker only, so that mypyc
    # can compile the parts as traits (see dodwan/native/); Node's parts override them.
    # node
    def _schedule_basics(self, now: float) -> None:
        raise NotImplementedError

    # cache
    def _add_history(self, msg_id: str, key: str, deadline: float) -> None:
        raise NotImplementedError

    def _assemble(self, c: Cached) -> bytes | None:
        raise NotImplementedError

    def _chunks(self, c: Cached) -> list[bytes] | None:
        raise NotImplementedError

    def _drop(self, msg_id: str, now: float, reason: str) -> None:
        raise NotImplementedError

    def _index(self, c: Cached) -> None:
        raise NotImplementedError

    def _make_room(self, needed: int, incoming: Cached, now: float) -> bool:
        raise NotImplementedError

    def _release(self, msg_id: str) -> None:
        raise NotImplementedError

    def _refresh_left(self, msg_id: str) -> None:
        raise NotImplementedError

    def _reserve(
        self,
        msg_id: str,
        zsize: int,
        now: float,
        origin: str,
        force: bool = False,
        address: Hashable | None = None,
    ) -> bool:
        raise NotImplementedError

    def _within_address_share(self, address: Hashable, zsize: int) -> bool:
        raise NotImplementedError

    def _resume_deferred(self, now: float) -> None:
        raise NotImplementedError

    def _room_checks(self, on: bool) -> None:
        raise NotImplementedError

    def _room_for(self, origin: str, zsize: int, rank: EvictRank) -> bool:
        raise NotImplementedError

    def _incoming_rank(self, header: m.Header, own: bool) -> EvictRank:
        raise NotImplementedError

    def _unmet_age(self, c: Cached) -> float:
        raise NotImplementedError

    def _met_host(self, host: str) -> None:
        raise NotImplementedError

    def _seen_age(self, header: m.Header, least: int = 0) -> float:
        raise NotImplementedError

    def _seen_complete(self, msg_id: str, host: str) -> None:
        raise NotImplementedError

    def _know_until(self, deadline: float, msg_id: str) -> None:
        raise NotImplementedError

    def _within_origin_quota(self, c: Cached, extra: int, now: float) -> bool:
        raise NotImplementedError

    def _origin_fits(self, origin: str, extra: int) -> bool:
        raise NotImplementedError

    # acks
    def _ack_delivered(self, c: Cached, now: float) -> None:
        raise NotImplementedError

    def _send_acks(self, ids: Iterable[str], now: float) -> None:
        raise NotImplementedError

    def _flood_acks(self, now: float) -> None:
        raise NotImplementedError

    def _forget_ack(self, msg_id: str) -> None:
        raise NotImplementedError

    # delivery
    def _deliver(
        self,
        c: Cached,
        now: float,
        only: str | None = None,
        payload: bytes | None = None,
        chunks: list[bytes] | None = None,
    ) -> None:
        raise NotImplementedError

    # gossip
    def _piece_room(self) -> int:
        raise NotImplementedError

    def _prompt(self, now: float) -> None:
        raise NotImplementedError

    def _prompt_announce(self, msg_id: str, now: float) -> None:
        raise NotImplementedError

    def _rebuild_own_profile(self) -> None:
        raise NotImplementedError

    def _recompute_known(self, now: float) -> None:
        raise NotImplementedError

    def _settle_known(self, now: float) -> None:
        raise NotImplementedError

    def _profile_given_up(self, host: str, version: int) -> None:
        raise NotImplementedError

    def _charge_all_matches(self) -> None:
        raise NotImplementedError

    # catalogs
    def _decode_due(self, msg_id: str, zdesc: bytes) -> bool:
        raise NotImplementedError

    def _catalog(self, now: float, room: int, budget: int) -> list[list[bytes]]:
        raise NotImplementedError

    def _descriptor_of(
        self, msg_id: str, zdesc: bytes, owner: Hashable
    ) -> tuple[dict[str, str], m.Header] | None:
        raise NotImplementedError

    def _forget_descriptor(self, msg_id: str) -> None:
        raise NotImplementedError

    def _offers_given_up(self, host: str) -> None:
        raise NotImplementedError

    def _offer_matches(self, host: str) -> None:
        raise NotImplementedError

    def _offer_rank(self, c: Cached) -> Rank:
        raise NotImplementedError

    def _on_catalog_entries(
        self, n: Neighbour, entries: Sequence[wire.CatalogEntry], now: float
    ) -> None:
        raise NotImplementedError

    def _too_long_lived(self, header: m.Header, now: float) -> bool:
        raise NotImplementedError

    def _wants(self, msg_id: str, zdesc: bytes, descriptor: Mapping[str, str]) -> int:
        raise NotImplementedError

    def _prefer(
        self,
        msg_id: str,
        zdesc: bytes,
        decoded: tuple[dict[str, str], m.Header],
        want: int,
        owner: Hashable,
    ) -> None:
        raise NotImplementedError

    # transfers
    def _queue_request(self, target: str, msg_id: str, offered: int, now: float) -> None:
        raise NotImplementedError

    def _unqueue(self, msg_id: str) -> None:
        raise NotImplementedError
