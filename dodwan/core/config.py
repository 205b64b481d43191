"""Node configuration: one frozen dataclass, one documented field per setting.

Runners (daemon, simulator, tests) build a :class:`NodeConfig`; the core never reads
settings from anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .limits import Limits
from .wire import ENTRY_MAX_COPIES as MAX_COPY_BUDGET  # it travels in 7 bits of a flags byte


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Settings of one DoDWAN node. Durations are seconds, sizes are bytes."""

    host_id: str
    """Unique name of this host in the network (1-64 printable characters, no spaces)."""

    horizon: int = 2
    """Hops an interest profile travels: 1 = direct neighbours only; with 2 a neighbour also
    fetches and carries messages for the hosts it can hear (relayed profiles)."""

    altruistic: bool = False
    """Fetch and carry every offered message, not only those some known profile wants."""

    announce_period: float = 5.0
    """Mean time between two announcements (jittered by ``announce_jitter``)."""

    announce_jitter: float = 0.25
    """Each period is drawn uniformly in ``period * (1 ± jitter)`` to avoid synchronised peers."""

    beacon_period: float = 1.0
    """Most time without sending anything before a node sends a beacon (a bare announcement,
    ~30 bytes): hosts meeting notice each other within about this long, which matters when
    contacts last seconds. Among the same neighbours the period doubles after each beacon,
    up to ``announce_period``, and is back to this when a neighbour comes or goes; catalogs
    still go every ``announce_period``. 0 turns beacons off."""

    neighbour_timeout: float = 0.0
    """Silence after which a neighbour is considered gone; 0 means 3 × ``announce_period``
    (beacons slow down to ``announce_period`` among settled neighbours, so a shorter
    timeout would make them flap)."""

    max_datagram: int = 1400
    """Largest datagram this node sends (UDP payload); fragments are cut to fit it."""

    cache_capacity: int = 64 * 1024 * 1024
    """Bytes of compressed messages (fragments + descriptors) the cache may hold."""

    request_delay: float = 0.05
    """Upper bound of the random wait before a request goes out; a matching request overheard
    in that window suppresses ours (the answer is broadcast, so we get it too)."""

    request_timeout: float = 2.0
    """Fragments requested and not received after this long may be requested again."""

    request_window: int = 64
    """Most fragments of one message requested from one neighbour and not yet received; more
    are asked as soon as half of them have arrived (a sliding window). It bounds what a
    sender still puts on the air after the requester has left (64 × 1400 B ≈ 0.36 s at
    2 Mbit/s)."""

    copy_budget: int = 0
    """Copies of a message published here that altruistic carriers may make (binary
    Spray-and-Wait): a carrier that fetches a message only to carry it takes half of its
    holder's budget, and a copy whose budget is down to 1 goes only to hosts that subscribed
    to it (or carry it for a subscriber within ``horizon``). On short contacts and small
    caches, fewer carried copies leave the air time and the room to the transfers that
    deliver. 0: no budget (every altruistic carrier may take a copy, as epidemic routing
    does). A host honours the budget a message carries whatever its own setting."""

    seen_copy_age: float = 0.4
    """How much older a complete copy carried for others counts, in the eviction order, for
    each other host seen offering that message complete (up to 8), as a share of the
    message's lifetime (deadline less date). Copies held by many go first, so that a full
    cache keeps what few others hold (as RAPID and MaxProp value rare copies). 0: the
    oldest carried copy goes first, whatever is seen (epidemic routing's drop-oldest)."""

    unmet_copy_age: float = 0.4
    """How much older a complete copy carried for others counts, in the eviction order, when
    this host rarely meets the hosts that want it: this share of the message's lifetime
    (deadline less date), divided by one plus the contacts this host has had with hosts
    whose profile, as last known here, matches the message (the last 256 hosts met).
    Copies this host is likely to hand to a subscriber itself are kept longer, as PRoPHET's
    delivery predictability and MaxProp's delivery likelihood favour them. 0: contacts
    are not counted."""

    fragments_by_digest: bool = True
    """Fragments this host sends name their message's compressed descriptor by an 8-byte
    digest instead of carrying it, but for every 16th: about 150 bytes less on 15 fragments
    of 16 of a typical message, 11 % of the air time of 1,400-byte fragments (see
    docs/protocol.md, fragment by digest). Every fragment answers a request, and
    a requester holds the descriptor (from the catalog it asked from, or in its partial
    copy); a host that overhears a fragment by digest without holding its descriptor drops
    it (``fragments_unknown_descriptor``), until one of those that still carry it comes.
    Fragments of both forms are always accepted.
    False: fragments carry the descriptor, for peers that predate fragments by digest
    (they drop those as an unknown kind)."""

    partial_timeout: float = 1800.0
    """An incomplete message that made no progress for this long is dropped."""

    max_catalog_datagrams: int = 4
    """Most catalog datagrams per announcement round; offers that do not fit wait for the next."""

    compression_level: int = 3
    """zstd level used when publishing (descriptor and payload)."""

    signing_key: bytes | None = None
    """Raw 32-byte Ed25519 private key: when set, every publication carries ``sigkey`` (the
    public key, hex) and ``sig`` (a signature over the whole descriptor, which includes the
    payload digest), so carriers cannot forge or alter it."""

    trace: bool = False
    """Record :class:`~dodwan.core.events.TraceRecord` entries for :meth:`Node.pop_trace`."""

    limits: Limits = field(default_factory=Limits)
    """Bounds applied to local and remote input (see :class:`~dodwan.core.limits.Limits`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.host_id, str):
            raise TypeError("host_id must be a str")
        if (
            not 1 <= len(self.host_id) <= 64
            or not self.host_id.isprintable()
            or any(c.isspace() for c in self.host_id)
        ):
            raise ValueError(
                f"host_id must be 1-64 printable characters without spaces: {self.host_id!r}"
            )
        if self.horizon < 1 or self.horizon > 8:
            raise ValueError("horizon must be between 1 and 8 hops")
        if self.announce_period <= 0:
            raise ValueError("announce_period must be positive")
        if not 0 <= self.announce_jitter < 1:
            raise ValueError("announce_jitter must be in [0, 1)")
        if not 0 <= self.beacon_period <= 3600:
            raise ValueError("beacon_period must be between 0 (off) and 3600 s")
        if self.neighbour_timeout < 0:
            raise ValueError("neighbour_timeout must be >= 0")
        if not 256 <= self.max_datagram <= 65507:
            raise ValueError("max_datagram must be between 256 and 65507 bytes")
        if self.cache_capacity <= 0:
            raise ValueError("cache_capacity must be positive")
        if self.request_delay < 0 or self.request_timeout <= 0:
            raise ValueError("request_delay must be >= 0 and request_timeout > 0")
        if self.request_window < 1:
            raise ValueError("request_window must be >= 1")
        if not 0 <= self.copy_budget <= MAX_COPY_BUDGET:
            raise ValueError(f"copy_budget must be between 0 (none) and {MAX_COPY_BUDGET}")
        if not 0 <= self.seen_copy_age <= 10:
            raise ValueError("seen_copy_age must be between 0 (off) and 10 lifetimes")
        if not 0 <= self.unmet_copy_age <= 10:
            raise ValueError("unmet_copy_age must be between 0 (off) and 10 lifetimes")
        if self.max_catalog_datagrams < 1:
            raise ValueError("max_catalog_datagrams must be >= 1")
        if self.signing_key is not None and (
            not isinstance(self.signing_key, bytes) or len(self.signing_key) != 32
        ):
            raise ValueError("signing_key must be 32 raw bytes (an Ed25519 private key)")
        if not 1 <= self.compression_level <= 22:
            raise ValueError("compression_level must be between 1 and 22")

    @property
    def effective_neighbour_timeout(self) -> float:
        """The neighbour timeout actually applied."""
        return self.neighbour_timeout or 3.0 * self.announce_period


def _class_body(cls: type) -> list[Any]:
    """The statements of ``cls``'s definition, parsed from its module's source file (found
    next to its package's ``__init__``, so also for a module compiled by mypyc, whose
    ``__file__`` is the compiled library: ``inspect.getsource`` fails there)."""
    import ast
    import inspect
    import sys
    from pathlib import Path

    try:
        return list(ast.parse(inspect.getsource(cls)).body[0].body)  # type: ignore[attr-defined]
    except (OSError, TypeError):
        pass
    package, _, leaf = cls.__module__.rpartition(".")
    where = getattr(sys.modules[package], "__path__", []) if package else []
    for folder in where:
        source = Path(folder) / f"{leaf}.py"
        if source.is_file():
            for node in ast.parse(source.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and node.name == cls.__qualname__:
                    return list(node.body)
    raise LookupError(f"no source for {cls.__module__}.{cls.__qualname__}")


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it, for a dataclass (for generated
    documentation and CLI help); "" for a field without one."""
    import ast
    import itertools

    body = _class_body(cls)
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return {f.name: docs.get(f.name, "") for f in fields(cls)}


def field_docs() -> dict[str, str]:
    """:class:`NodeConfig` field name -> docstring."""
    return attribute_docs(NodeConfig)
