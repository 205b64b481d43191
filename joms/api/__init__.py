"""The JMS-shaped Python client API of JOMS (over the daemon's STOMP gateway)."""

from .jms import (
    AUTO_ACKNOWLEDGE,
    CLIENT_ACKNOWLEDGE,
    DUPS_OK_ACKNOWLEDGE,
    SESSION_TRANSACTED,
    Connection,
    MessageConsumer,
    MessageProducer,
    Session,
    connect,
)
from .messages import (
    NON_PERSISTENT,
    PERSISTENT,
    BytesMessage,
    Destination,
    MapMessage,
    Message,
    Queue,
    StreamMessage,
    TemporaryQueue,
    TextMessage,
    Topic,
)

__all__ = [
    "AUTO_ACKNOWLEDGE",
    "CLIENT_ACKNOWLEDGE",
    "DUPS_OK_ACKNOWLEDGE",
    "NON_PERSISTENT",
    "PERSISTENT",
    "SESSION_TRANSACTED",
    "BytesMessage",
    "Connection",
    "Destination",
    "MapMessage",
    "Message",
    "MessageConsumer",
    "MessageProducer",
    "Queue",
    "Session",
    "StreamMessage",
    "TemporaryQueue",
    "TextMessage",
    "Topic",
    "connect",
]
