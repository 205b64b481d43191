"""What the node tells its runner: events (for applications) and trace records (for logs).

Both are frozen dataclasses pulled by the runner (``next_event()`` / ``pop_trace()``); the
core never calls back into its runner.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MessageDelivered:
    """A complete message matched a local subscription (delivered once per subscription)."""

    subscription: str
    """Key of the subscription it matched."""
    descriptor: Mapping[str, str]
    """All descriptor attributes, system ones (id, deadline, origin, …) included."""
    payload: bytes
    """The decompressed payload."""


@dataclass(frozen=True, slots=True)
class NeighbourFound:
    """A host was heard that was not a current neighbour."""

    host_id: str
    """The neighbour's host id."""
    address: Hashable
    """The runner's address it was heard from."""


@dataclass(frozen=True, slots=True)
class NeighbourRestarted:
    """A current neighbour's announcements started over: it restarted, faster than the
    neighbour timeout; everything it wants is offered to it again."""

    host_id: str
    """The neighbour's host id."""
    address: Hashable
    """The runner's address it is heard from now."""


@dataclass(frozen=True, slots=True)
class NeighbourLost:
    """A neighbour stayed silent longer than the neighbour timeout."""

    host_id: str
    """The neighbour's host id."""


@dataclass(frozen=True, slots=True)
class MessageEvicted:
    """A cached message was removed before its deadline to make room."""

    msg_id: str
    """Id of the evicted message."""
    reason: str
    """Why: ``capacity`` or ``stale`` (an incomplete set that made no progress)."""


Event = MessageDelivered | NeighbourFound | NeighbourRestarted | NeighbourLost | MessageEvicted

TRACE_KINDS = frozenset(
    {
        "datagram_sent",
        "datagram_received",
        "datagram_dropped",
        "message_created",
        "fragment_stored",
        "message_completed",
        "message_delivered",
        "message_evicted",
    }
)


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One line of the node's trace, stamped with the injected ``now``."""

    time: float
    """The ``now`` of the call that produced it."""
    kind: str
    """One of :data:`TRACE_KINDS`."""
    msg_id: str = ""
    """Message concerned ("" for datagram records)."""
    size: int = 0
    """Bytes: datagram size, payload size, fragment size or bytes freed."""
    hops: int = 0
    """Transmissions the copy travelled (0 at its origin)."""
    detail: str = ""
    """Datagram kind, drop reason, subscription key or eviction reason."""
