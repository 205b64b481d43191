"""What the JOMS service tells its front end (the STOMP gateway): pulled events."""

from __future__ import annotations

from dataclasses import dataclass

from .model import JomsMessage


@dataclass(frozen=True, slots=True)
class MessageDispatched:
    """A message is ready for a consumer; acknowledge it by ``tag`` unless auto-acked."""

    connection: str
    """Connection id the consumer belongs to."""
    consumer: str
    """Consumer id returned by ``subscribe``."""
    tag: str
    """Delivery tag (STOMP ``ack`` header)."""
    message: JomsMessage
    """The message (``redelivered`` set when it was delivered before)."""


Event = MessageDispatched
