"""What crosses a binding: DoDWAN descriptors <-> remote headers and properties.

Outbound, every application attribute of the descriptor becomes a header (STOMP), a user
property (MQTT 5) or an AMQP header, next to ``dodwan-id`` (the id the remote side can
deduplicate on), ``dodwan-origin`` and ``dodwan-deadline``; JMS header fields kept by JOMS
(``jms_correlation_id``, ``jms_type``) and the priority go to the protocol's own fields
where it has them. Inbound, the reverse: headers that are valid attribute names become
attributes, and the message gets the binding's attributes plus the origin mark
:data:`ORIGIN_MARK`, which no binding ever sends out again (no loops).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..core.message import ONCE

ORIGIN_MARK = "bridge_origin"
"""Descriptor attribute of a message that came in through a bridge: the remote URI."""

ID_HEADER = "dodwan-id"
ORIGIN_HEADER = "dodwan-origin"
DEADLINE_HEADER = "dodwan-deadline"
GATEWAY_HEADER = "dodwan-gateway"
"""HOST/NAME of the binding that sent a message (MQTT: it recognises its own echoes)."""
INSTANCE_HEADER = "dodwan-instance"
"""The token of the binding instance that sent a message (MQTT): HOST/NAME alone does not
tell a binding from one of the same name removed before (see :mod:`.ledger`)."""

SYSTEM = frozenset(
    {"id", "deadline", "origin", "date", "size", "priority", "persistent"}
    | {"zsize", "frags", "fsize", "zhash", "sigkey", "sig"}
)
MAX_MAPPED = 32
"""Most remote headers taken over as attributes (the core allows 64 with its own)."""


@dataclass(slots=True)
class Inbound:
    """One message received from the broker, protocol-neutral."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    remote_id: str | None = None
    """An id the remote side gives the message (same for every subscriber), if any."""
    expires: float | None = None
    """Absolute time the remote side says the message expires (None: never)."""
    correlation_id: str | None = None
    jms_type: str | None = None
    priority: int | None = None
    redelivered: bool = False
    """The broker says it delivered this message before (MQTT DUP, AMQP/STOMP redelivered)."""
    elsewhere: bool = False
    """It came from another destination than the one the binding sends to (MQTT: another
    topic than its outbound one, e.g. ``hq/sub`` for a binding on ``hq/#``, which sends to
    ``hq``; or a subscription that a removed or replaced binding of the same name left in
    the persistent session, which cannot be listed to drop it): as an echo, it says nothing
    about the binding's own."""

    @property
    def dodwan_id(self) -> str | None:
        """Set when the message went to the broker from some DoDWAN gateway (an echo)."""
        return self.headers.get(ID_HEADER)


def user_properties(descriptor: dict[str, str]) -> dict[str, str]:
    """The descriptor's application attributes plus the DoDWAN identification headers."""
    props = {k: v for k, v in descriptor.items() if k not in SYSTEM}
    props[ID_HEADER] = descriptor.get("id", "")
    props[ORIGIN_HEADER] = descriptor.get("origin", "")
    props[DEADLINE_HEADER] = descriptor.get("deadline", "")
    return props


def deadline_of(descriptor: dict[str, str], default: float) -> float:
    try:
        return float(descriptor.get("deadline", default))
    except ValueError:
        return default


def priority_of(descriptor: dict[str, str]) -> int:
    try:
        return min(9, max(0, int(descriptor.get("priority", "4"))))
    except ValueError:
        return 4


def content_digest(destination: str, msg: Inbound) -> str:
    """What identifies a remote message without an id: where it came from and all of it."""
    h = hashlib.sha256(destination.encode() + b"\x00" + msg.body)
    for k, v in sorted(msg.headers.items()):
        h.update(f"\x00{k}={v}".encode())
    h.update(f"\x00{msg.correlation_id}\x00{msg.jms_type}".encode())
    return h.hexdigest()[:40]


def inbound_id(destination: str, remote_id: str) -> str:
    """The DoDWAN id of a remote message: the same on every gateway bridging it."""
    digest = hashlib.sha256(f"{destination}\x00{remote_id}".encode()).hexdigest()
    return f"bridged-{digest[:40]}"


def inbound_attributes(
    msg: Inbound, fixed: dict[str, str], origin: str, left_out: list[str] | None = None
) -> dict[str, str]:
    """Attributes of the DoDWAN publication made from ``msg``.

    A header that is not a valid attribute (a system name, a name too long or not
    printable, ``once`` other than ``true``/``false``) is left out alone, and so is any
    header beyond the first :data:`MAX_MAPPED`; their names go to ``left_out`` (the
    protocol's own ``dodwan-*`` headers are not counted there)."""
    attrs: dict[str, str] = {}
    for name, value in msg.headers.items():
        if name.startswith("dodwan-"):
            continue
        if len(attrs) >= MAX_MAPPED or not _valid(name, str(value)):
            if left_out is not None:
                left_out.append(name)
            continue
        attrs[name] = str(value)
    if msg.correlation_id:
        attrs.setdefault("jms_correlation_id", msg.correlation_id)
    if msg.jms_type:
        attrs.setdefault("jms_type", msg.jms_type)
    attrs.update(fixed)
    attrs[ORIGIN_MARK] = origin
    return attrs


def _valid(name: str, value: str) -> bool:
    """Whether the core takes this header as an attribute (its own checks, one by one)."""
    if not name or len(name) > 64 or name in SYSTEM or not name.isprintable():
        return False
    return name != ONCE or value in ("true", "false")
