"""Settings of the JOMS service: one frozen dataclass, one documented field per setting."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from dodwan.core.config import attribute_docs

_DAY = 86400.0
UPPER_BOUNDS: dict[str, tuple[float, str]] = {
    "nondurable_keep": (365 * _DAY, "31536000 s (a year)"),
    "lease": (_DAY, "86400 s (a day: a receiver that died keeps its messages this long)"),
    "directory_period": (_DAY, "86400 s (a day)"),
    "ack_delay": (10.0, "10 s (consumed queue messages wait this long for their ack)"),
    "order_gap_timeout": (3600.0, "3600 s (a message behind a gap is held this long)"),
    "order_window_bytes": (float(1 << 30), "1073741824 (1 GiB held back per consumer)"),
    "max_pending": (10_000_000, "10000000 messages per subscription or queue"),
    "max_redeliveries": (1000, "1000, or -1 for no limit"),
}
"""Upper bound of each setting, and what it bounds: beyond, a setting is a typo or a stall
(a whole day of lease, a message held back an hour for order), not a choice."""


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """JOMS service settings. Durations are seconds; every one must be finite."""

    default_ttl: float = 3600.0
    """Lifetime of a message sent with JMSExpiration 0 (its DoDWAN deadline is now + this)."""

    nondurable: str = "durable"
    """Non-durable topic subscriptions: ``durable`` (treated as durable, as in the JOMS
    paper: for a connection with a client id the subscription is kept, and its messages
    stored, while the consumer is away — for ``nondurable_keep`` — and the same client id
    subscribing again to the same topic with the same selector and noLocal finds it; like
    every subscription they also receive older messages still travelling in the network),
    ``accept`` (plain JMS non-durable subscriptions: gone when the consumer closes) or
    ``refuse`` (refused with an error telling the client to use a durable subscription)."""

    nondurable_keep: float = 3600.0
    """How long a non-durable subscription kept as durable waits for its consumer to come
    back before it is deleted with its waiting messages."""

    lease: float = 30.0
    """Lifetime of a queue receiver request; receivers renew it every third of it."""

    directory_period: float = 30.0
    """Period of this host's directory advert (queues it manages, topics it knows)."""

    ack_delay: float = 0.02
    """Queue acknowledgements are batched for this long before they are published."""

    receiver_policy: str = "round-robin"
    """How a queue manager picks a receiver: ``round-robin`` or ``module:callable``
    returning a :class:`~joms.service.queues.ReceiverPolicy`. The daemon imports and calls
    it when it starts, with or without ``--stomp``: a module that cannot be imported, a
    missing attribute, a callable that raises or returns no ``choose`` method is refused
    with one line naming the setting."""

    purge_acknowledged: bool = True
    """Subscribe to every queue acknowledgement and drop the cached copies (originals and
    deliveries) of consumed queue messages this host carries, so carriers stop spreading
    them. Costs the acknowledgements travelling to every JOMS host."""

    max_pending: int = 100_000
    """Messages one durable subscription or one queue may hold waiting; beyond, the oldest
    are dropped (and counted)."""

    max_redeliveries: int = 6
    """Times a message is delivered again after a NACK, a rollback, a recover or a consumer
    closing without acknowledging it; the next time it goes to the dead-letter queue
    instead (ActiveMQ's default is also 6). -1 = redeliver without limit."""

    dead_letter_queue: str = "DLQ"
    """Name of the dead-letter queue: ``DLQ@H`` on the queue's manager H for a queue
    message, on the subscriber's host for a topic message. Dead letters carry their
    original destination and the reason (STOMP headers ``original-destination`` and
    ``dlq-reason``)."""

    order_gap_timeout: float = 2.0
    """A topic consumer or a queue's manager holds back a producer's message that arrives
    before an earlier one (same producer, same destination), and a queue receiver a
    delivery that arrives before one handed out earlier, until the gap is filled or this
    long has passed; then it delivers what it holds and counts a gap. 0 = no reordering
    (arrival order)."""

    order_window_bytes: int = 1_048_576
    """Most body bytes one consumer (or queue manager) holds back for reordering; beyond,
    the oldest held message is delivered at once (a gap is counted)."""

    def __post_init__(self) -> None:
        for f in fields(self):  # NaN passes every comparison below: refuse it first
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, not {value}")
        if self.default_ttl <= 0:
            raise ValueError("default_ttl must be positive")
        if self.nondurable not in ("durable", "accept", "refuse"):
            raise ValueError("nondurable must be 'durable', 'accept' or 'refuse'")
        if self.nondurable_keep <= 0:
            raise ValueError("nondurable_keep must be positive")
        for name in ("lease", "directory_period"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.ack_delay < 0:
            raise ValueError("ack_delay must be >= 0")
        if self.max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        if self.max_redeliveries < -1:
            raise ValueError("max_redeliveries must be >= 0, or -1 for no limit")
        if not self.dead_letter_queue or "@" in self.dead_letter_queue:
            raise ValueError("dead_letter_queue must be a queue name without '@'")
        for name in ("order_gap_timeout", "order_window_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name, (most, why) in UPPER_BOUNDS.items():
            if getattr(self, name) > most:
                raise ValueError(f"{name} must be at most {why}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ServiceConfig:
        """Build from a config-file table (e.g. TOML ``[joms]``); ValueError names bad keys."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(
                f"unknown JOMS setting(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
        defaults = cls()
        values: dict[str, Any] = {}
        for name, value in data.items():
            default = getattr(defaults, name)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, float):
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                value = float(value) if ok else value
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            else:
                ok = isinstance(value, str)
            if not ok:
                raise ValueError(
                    f"JOMS setting {name} must be a {type(default).__name__}, not {value!r}"
                )
            values[name] = value
        return cls(**values)


def field_docs() -> dict[str, str]:
    """Setting name -> its docstring (for generated docs and CLI help)."""
    return attribute_docs(ServiceConfig)
