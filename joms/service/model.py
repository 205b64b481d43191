"""JMS messages and destinations, and their mapping onto DoDWAN descriptors.

Owns the descriptor vocabulary of JOMS (documented in docs/joms.md): which attribute carries
which JMS header field, how typed user properties are written as strings (types in the
``jms_types`` attribute), and how a message is frozen to bytes for the service's store.
Descriptors arriving from the network are hostile: :func:`from_descriptor` raises
:class:`ValueError` on anything malformed and never anything else.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InvalidDestinationException, MessageFormatException

# ---------------------------------------------------------------- descriptor attributes
KIND = "jms_kind"
"""What a JOMS descriptor is: see the ``KIND_*`` values."""
KIND_MESSAGE = "message"  # a JMS message sent to a topic or to a queue manager
KIND_RECEIVER = "receiver"  # a receiver request (lease) to a queue manager
KIND_DELIVERY = "delivery"  # a queue message re-addressed by its manager to one receiver
KIND_ACK = "ack"  # receiver -> manager: consumed / released queue messages
KIND_DIRECTORY = "directory"  # a host's advert of the queues it manages and topics it knows

DEST_ID = "destination_id"
DEST_TYPE = "destination_type"
MESSAGE_ID = "jms_message_id"
DELIVERY_MODE = "delivery_mode"
PRIORITY = "priority"  # DoDWAN's own system attribute, set from the publish priority
TIMESTAMP = "jms_timestamp"
EXPIRATION = "jms_expiration"
CORRELATION_ID = "jms_correlation_id"
REPLY_TO = "jms_reply_to"
TYPE = "jms_type"
TYPES = "jms_types"
BODY = "jms_body"
NULL_TEXT = "jms_null_text"  # "true": a text message sent with null text (the body is empty)
CONNECTION = "joms_conn"
REPLY_ID = "reply_id"
REDELIVERED = "jms_redelivered"  # only set on queue deliveries re-sent by a manager
COPY_OF = "jms_copy_of"  # on a queue delivery: DoDWAN id of the original the manager received
DELIVERY_COUNT = "jms_delivery_count"  # redeliveries so far (queue deliveries, stored messages)
ORIGINAL_DESTINATION = "jms_original_destination"  # on a dead letter: where it was sent
DLQ_REASON = "jms_dlq_reason"  # on a dead letter: why it was dead-lettered
SEQUENCE = "joms_seq"  # "<producer>:<n>": the n-th message of a producer to a destination
HAND = "joms_hand"  # on a queue delivery: "<manager>/<queue>/<receiver>:<n>", its n-th hand-out

PERSISTENT = "PERSISTENT"
NON_PERSISTENT = "NON_PERSISTENT"
BODY_TYPES = frozenset({"text", "bytes", "map", "stream"})
PROPERTY_TYPES = frozenset({"boolean", "byte", "short", "int", "long", "float", "double", "string"})
_INT_RANGES = {
    "byte": (-(1 << 7), (1 << 7) - 1),
    "short": (-(1 << 15), (1 << 15) - 1),
    "int": (-(1 << 31), (1 << 31) - 1),
    "long": (-(1 << 63), (1 << 63) - 1),
}
INT_RANGES = _INT_RANGES
"""JMS integer property type -> (lowest, highest) value."""

DODWAN_SYSTEM = frozenset(
    {"id", "deadline", "origin", "date", "size", "priority", "persistent"}
    | {"zsize", "frags", "fsize", "zhash"}
    | {"once"}  # read by the core: "true" = done once delivered (acks purge the copies)
)
JOMS_ATTRIBUTES = frozenset(
    {KIND, DEST_ID, DEST_TYPE, MESSAGE_ID, DELIVERY_MODE, TIMESTAMP, EXPIRATION}
    | {CORRELATION_ID, REPLY_TO, TYPE, TYPES, BODY, CONNECTION, REPLY_ID, REDELIVERED, COPY_OF}
    | {DELIVERY_COUNT, ORIGINAL_DESTINATION, DLQ_REASON, SEQUENCE, HAND, NULL_TEXT}
)
STOMP_SEND_HEADERS = frozenset(
    {"destination", "content-length", "content-type", "receipt", "transaction"}
    | {"persistent", "priority", "expires", "reply-to", "correlation-id", "type"}
    | {"joms-types", "joms-body-type", "joms-null-text"}
)
"""Headers of a STOMP SEND frame that the gateway reads as frame headers (docs/stomp.md)."""
STOMP_HEADERS = STOMP_SEND_HEADERS | frozenset(
    {"subscription", "message-id", "ack", "timestamp", "redelivered"}
    | {"original-destination", "dlq-reason"}
)
"""Every header the gateway reads on SEND or writes on MESSAGE for its own purpose: as a
user property (one header per property) it would redirect, overwrite or lose the message,
so none may be one; nor may any name starting ``joms-`` (JOMS extension headers)."""
DELIVERY_COUNT_PROPERTY = "JMSXDeliveryCount"
"""The provider-set property counting deliveries (an int on MESSAGE frames, in selectors)."""
CLIENT_JMSX = {"JMSXGroupID": "string", "JMSXGroupSeq": "int"}
"""The JMS-defined properties a client sets (JMS 1.1 §3.5.9: message groups), with the type
each must have; every other name starting ``JMS`` is refused as a property."""
HEADER_IDENTIFIERS = {
    "JMSDeliveryMode": DELIVERY_MODE,
    "JMSPriority": PRIORITY,
    "JMSMessageID": MESSAGE_ID,
    "JMSTimestamp": TIMESTAMP,
    "JMSCorrelationID": CORRELATION_ID,
    "JMSType": TYPE,
}
"""Selector identifiers naming JMS header fields -> the descriptor attribute carrying them."""


_VALID_NAMES: set[str] = set()
"""Property names already found valid (a program uses a few: each is checked once)."""


def check_property_name(name: str) -> None:
    """Raise MessageFormatException unless ``name`` may be a user property."""
    if type(name) is str and (name in _VALID_NAMES or name in CLIENT_JMSX):
        return
    if not isinstance(name, str) or not name or len(name) > 64:
        raise MessageFormatException(f"bad property name {name!r}: 1-64 characters")
    if (
        name in DODWAN_SYSTEM
        or name in JOMS_ATTRIBUTES
        or name in STOMP_HEADERS
        or name.startswith(("jms_", "joms_", "joms-", "JMS"))
        or any(c in name for c in ",:=")
        or not name.isprintable()
        or any(c.isspace() for c in name)
    ):
        raise MessageFormatException(
            f"property name {name!r} is reserved or invalid (names used by DoDWAN/JOMS, "
            "STOMP frame headers such as destination, type, expires or message-id, names "
            "starting with JMS, jms_, joms_ or joms-, and names with spaces, ',', ':' or '=' "
            "cannot be used: docs/joms.md)"
        )
    if len(_VALID_NAMES) < 4096:
        _VALID_NAMES.add(name)


def check_property(name: str, value: Any, jms_type: str) -> None:
    """Raise MessageFormatException unless ``value`` of type ``jms_type`` may be sent as
    user property ``name`` (a JMSX property a client sets must have its JMS type)."""
    check_property_name(name)
    fixed = CLIENT_JMSX.get(name)
    if fixed is not None and jms_type != fixed:
        raise MessageFormatException(
            f"property {name} must be {'an' if fixed == 'int' else 'a'} {fixed} "
            f"(JMS 1.1 §3.5.9), not {jms_type}"
        )
    encode_property(value, jms_type)


def property_type_of(value: Any) -> str:
    """The JMS type a Python value gets by default."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long" if not _INT_RANGES["int"][0] <= value <= _INT_RANGES["int"][1] else "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    raise MessageFormatException(
        f"property values must be bool, int, float or str, not {type(value).__name__}"
    )


def encode_property(value: Any, jms_type: str) -> str:
    """A typed property value as its descriptor string (MessageFormatException if it does not fit)."""
    if jms_type not in PROPERTY_TYPES:
        raise MessageFormatException(f"unknown property type {jms_type!r}")
    if jms_type == "boolean":
        if not isinstance(value, bool):
            raise MessageFormatException("a boolean property needs a bool value")
        return "true" if value else "false"
    if jms_type in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MessageFormatException(f"a {jms_type} property needs an int value")
        lo, hi = _INT_RANGES[jms_type]
        if not lo <= value <= hi:
            raise MessageFormatException(f"{value} is out of range for a {jms_type} property")
        return str(value)
    if jms_type in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MessageFormatException(f"a {jms_type} property needs a number")
        return repr(float(value))
    if not isinstance(value, str):
        raise MessageFormatException("a string property needs a str value")
    return value


def decode_property(text: str, jms_type: str) -> Any:
    """The inverse of :func:`encode_property`; ValueError when ``text`` does not parse."""
    if jms_type == "string":
        return text
    if jms_type == "boolean":
        if text not in ("true", "false"):
            raise ValueError(f"bad boolean {text!r}")
        return text == "true"
    if jms_type in _INT_RANGES:
        v = int(text)
        lo, hi = _INT_RANGES[jms_type]
        if not lo <= v <= hi:
            raise ValueError(f"{v} out of range for {jms_type}")
        return v
    if jms_type in ("float", "double"):
        f = float(text)
        if jms_type == "float" and math.isfinite(f):
            f = float(f)
        return f
    raise ValueError(f"unknown property type {jms_type!r}")


def decode_typed_value(item: Any) -> tuple[Any, str]:
    """One ``{"t": type, "v": value}`` item of a map or stream body (docs/joms.md) as
    (value, type); MessageFormatException when it is malformed or its value does not fit
    its type (``{"t": "int", "v": "zz"}``)."""
    if not isinstance(item, dict) or item.get("t") not in PROPERTY_TYPES | {"bytes"}:
        raise MessageFormatException("malformed typed value in a map/stream body")
    t, v = item["t"], item.get("v")
    if t == "bytes":
        if not isinstance(v, str):
            raise MessageFormatException("a bytes value in a map/stream body is base64 text")
        try:
            return base64.b64decode(v, validate=True), t
        except (binascii.Error, ValueError):
            raise MessageFormatException(
                "a bytes value in a map/stream body is not base64"
            ) from None
    try:
        encode_property(v, t)  # type and range check
    except MessageFormatException as exc:
        raise MessageFormatException(f"a value in a map/stream body: {exc}") from None
    return (float(v) if t in ("float", "double") else v), t


def decode_typed_body(
    body_type: str, data: bytes
) -> dict[str, tuple[Any, str]] | list[tuple[Any, str]]:
    """The (value, type) items of a ``map`` (a dict) or ``stream`` (a list) body;
    MessageFormatException when the body is not the documented JSON form."""
    empty = b"{}" if body_type == "map" else b"[]"
    try:
        raw = json.loads(data or empty)
    except (ValueError, UnicodeDecodeError):
        raise MessageFormatException(f"a {body_type} body is not JSON") from None
    if body_type == "map":
        if not isinstance(raw, dict):
            raise MessageFormatException("a map body is a JSON object")
        return {k: decode_typed_value(v) for k, v in raw.items()}
    if not isinstance(raw, list):
        raise MessageFormatException("a stream body is a JSON list")
    return [decode_typed_value(v) for v in raw]


def encode_types(types: Mapping[str, str]) -> str:
    return ",".join(f"{n}:{t}" for n, t in sorted(types.items()) if t != "string")


def decode_types(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if not text:
        return out
    for item in text.split(","):
        name, sep, t = item.partition(":")
        if not sep or t not in PROPERTY_TYPES or not name:
            raise ValueError(f"bad {TYPES} entry {item!r}")
        out[name] = t
    return out


# ---------------------------------------------------------------- destinations
@dataclass(frozen=True, slots=True)
class Destination:
    """A topic (``name``) or a queue (``name`` is ``Queue@ManagerHost``)."""

    kind: str
    """``topic`` or ``queue``."""
    name: str
    """Topic name, or ``Name@Host`` for a queue."""

    def __post_init__(self) -> None:
        if self.kind not in ("topic", "queue"):
            raise InvalidDestinationException(f"unknown destination type {self.kind!r}")
        check_destination_name(self.name, queue=self.kind == "queue")

    @property
    def queue_name(self) -> str:
        return self.name.partition("@")[0]

    @property
    def manager(self) -> str:
        """The managing host of a queue."""
        return self.name.partition("@")[2]

    def __str__(self) -> str:
        return f"/{self.kind}/{self.name}"

    @classmethod
    def parse(cls, text: str, local_host: str) -> Destination:
        """``/topic/X``, ``/queue/Q`` (managed here) or ``/queue/Q@HOST``."""
        if not isinstance(text, str):
            raise InvalidDestinationException("a destination is a string")
        for prefix, kind in (("/topic/", "topic"), ("/queue/", "queue")):
            if text.startswith(prefix):
                name = text[len(prefix) :]
                if kind == "queue" and "@" not in name:
                    name = f"{name}@{local_host}"
                return cls(kind, name)
        raise InvalidDestinationException(
            f"unknown destination {text!r}: use /topic/NAME, /queue/NAME or /queue/NAME@HOST"
        )


def check_destination_name(name: str, *, queue: bool) -> None:
    if type(name) is str and _valid_name(name, queue):
        return
    _check_destination_name(name, queue=queue)


@functools.lru_cache(maxsize=4096)
def _valid_name(name: str, queue: bool) -> bool:
    """Cached: every message checks its destination several times on its way."""
    try:
        _check_destination_name(name, queue=queue)
    except InvalidDestinationException:
        return False
    return True


def _check_destination_name(name: str, *, queue: bool) -> None:
    if not isinstance(name, str) or not name or len(name) > 128:
        raise InvalidDestinationException("destination names have 1-128 characters")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise InvalidDestinationException(f"destination name {name!r} has spaces or controls")
    if queue:
        q, at, host = name.partition("@")
        if not q or not at or not host or "@" in host:
            raise InvalidDestinationException(f"queue name {name!r} must be NAME@HOST")
    elif "@" in name:
        raise InvalidDestinationException(f"topic name {name!r} may not contain '@'")


# ---------------------------------------------------------------- messages
@dataclass(slots=True)
class JomsMessage:
    """One JMS message as the service handles it."""

    destination: Destination
    body: bytes = b""
    """Encoded body (UTF-8 text, raw bytes, or the JSON form of a map/stream body)."""
    body_type: str = "text"
    null_text: bool = False
    """A text message sent with null text (JMS getText() returns null; the body is empty),
    as opposed to empty text."""
    properties: dict[str, Any] = field(default_factory=dict)
    """User properties: name -> bool/int/float/str."""
    property_types: dict[str, str] = field(default_factory=dict)
    """Name -> JMS type for each property (missing = inferred from the value)."""
    message_id: str = ""
    delivery_mode: str = PERSISTENT
    priority: int = 4
    timestamp: int = 0
    """Milliseconds since the epoch (JMSTimestamp)."""
    expiration: int = 0
    """Milliseconds since the epoch, 0 = never (JMSExpiration)."""
    correlation_id: str | None = None
    reply_to: str | None = None
    """Reply destination as text (``/queue/Q@H`` or ``/topic/T``)."""
    type: str | None = None
    redelivered: bool = False
    connection: str = ""
    """``host/client`` of the sending connection (for noLocal)."""
    delivery_count: int = 0
    """Times the message was delivered again after a NACK, rollback, recover or release."""
    original_destination: str | None = None
    """On a dead letter: the destination it was sent to (``/queue/…`` or ``/topic/…``)."""
    dlq_reason: str | None = None
    """On a dead letter: why it was dead-lettered."""
    sequence: str = ""
    """``<producer>:<n>``: this is the n-th message its producer sent to this destination
    (consumers use it to deliver each producer's messages in order)."""

    @property
    def jmsx_delivery_count(self) -> int:
        """JMSXDeliveryCount (JMS 1.1 §3.5.9): 1 for a first delivery, one more for each
        redelivery; at least 2 for a message flagged redelivered (it may have reached a
        client before a crash without being counted)."""
        n = self.delivery_count + 1
        return max(n, 2) if self.redelivered else n

    def selector_values(self) -> dict[str, Any]:
        """Identifier -> value, as JMS selectors see the message."""
        values: dict[str, Any] = dict(self.properties)
        values[DELIVERY_COUNT_PROPERTY] = self.jmsx_delivery_count
        values["JMSDeliveryMode"] = self.delivery_mode
        values["JMSPriority"] = self.priority
        values["JMSMessageID"] = self.message_id
        values["JMSTimestamp"] = self.timestamp
        if self.correlation_id is not None:
            values["JMSCorrelationID"] = self.correlation_id
        if self.type is not None:
            values["JMSType"] = self.type
        return values

    def copy(self, **changes: Any) -> JomsMessage:
        return replace(self, **changes)


def validate_outgoing(msg: JomsMessage) -> None:
    """Check a locally sent message; raise MessageFormatException with a clear reason."""
    if msg.body_type not in BODY_TYPES:
        raise MessageFormatException(f"unknown body type {msg.body_type!r}")
    if msg.delivery_mode not in (PERSISTENT, NON_PERSISTENT):
        raise MessageFormatException(f"bad delivery mode {msg.delivery_mode!r}")
    if (
        isinstance(msg.priority, bool)
        or not isinstance(msg.priority, int)
        or not 0 <= msg.priority <= 9
    ):
        raise MessageFormatException("priority must be an int between 0 and 9")
    if not isinstance(msg.body, bytes):
        raise MessageFormatException("the body must be bytes")
    if msg.body_type in ("map", "stream"):
        decode_typed_body(msg.body_type, msg.body)  # the documented typed JSON form
    if msg.null_text and (msg.body_type != "text" or msg.body):
        raise MessageFormatException("null text is a text message with an empty body")
    for name, value in msg.properties.items():
        check_property(name, value, msg.property_types.get(name) or property_type_of(value))


def to_descriptor(msg: JomsMessage) -> dict[str, str]:
    """DoDWAN attributes of a JMS message (priority travels as DoDWAN's own ``priority``)."""
    d = {
        KIND: KIND_MESSAGE,
        DEST_ID: msg.destination.name,
        DEST_TYPE: msg.destination.kind,
        MESSAGE_ID: msg.message_id,
        DELIVERY_MODE: msg.delivery_mode,
        TIMESTAMP: str(msg.timestamp),
        EXPIRATION: str(msg.expiration),
        BODY: msg.body_type,
    }
    if msg.null_text:
        d[NULL_TEXT] = "true"
    if msg.correlation_id is not None:
        d[CORRELATION_ID] = msg.correlation_id
    if msg.reply_to is not None:
        d[REPLY_TO] = msg.reply_to
    if msg.type is not None:
        d[TYPE] = msg.type
    if msg.connection:
        d[CONNECTION] = msg.connection
    if msg.delivery_count:
        d[DELIVERY_COUNT] = str(msg.delivery_count)
    if msg.original_destination is not None:
        d[ORIGINAL_DESTINATION] = msg.original_destination
    if msg.dlq_reason is not None:
        d[DLQ_REASON] = msg.dlq_reason
    if msg.sequence:
        d[SEQUENCE] = msg.sequence
    types: dict[str, str] = {}
    for name, value in msg.properties.items():
        t = msg.property_types.get(name) or property_type_of(value)
        types[name] = t
        d[name] = encode_property(value, t)
    enc = encode_types(types)
    if enc:
        d[TYPES] = enc
    return d


def from_descriptor(d: Mapping[str, str], payload: bytes) -> JomsMessage:
    """Rebuild a message from a delivered descriptor; ValueError if malformed."""
    try:
        dest = Destination(d[DEST_TYPE], d[DEST_ID])
        types = decode_types(d.get(TYPES, ""))
        props: dict[str, Any] = {}
        ptypes: dict[str, str] = {}
        for name, value in d.items():
            if name in DODWAN_SYSTEM or name in JOMS_ATTRIBUTES:
                continue
            t = types.get(name, "string")
            props[name] = decode_property(value, t)
            ptypes[name] = t
        body_type = d.get(BODY, "bytes")
        if body_type not in BODY_TYPES:
            raise ValueError(f"bad body type {body_type!r}")
        mode = d.get(DELIVERY_MODE, PERSISTENT)
        if mode not in (PERSISTENT, NON_PERSISTENT):
            raise ValueError(f"bad delivery mode {mode!r}")
        priority = int(d.get(PRIORITY, "4"))
        if not 0 <= priority <= 9:
            raise ValueError("bad priority")
        return JomsMessage(
            destination=dest,
            body=bytes(payload),
            body_type=body_type,
            null_text=d.get(NULL_TEXT) == "true" and body_type == "text" and not payload,
            properties=props,
            property_types=ptypes,
            message_id=d.get(MESSAGE_ID) or "ID:" + d.get("id", "?"),
            delivery_mode=mode,
            priority=priority,
            timestamp=int(d.get(TIMESTAMP, "0")),
            expiration=int(d.get(EXPIRATION, "0")),
            correlation_id=d.get(CORRELATION_ID),
            reply_to=d.get(REPLY_TO),
            type=d.get(TYPE),
            redelivered=d.get(REDELIVERED) == "true",
            connection=d.get(CONNECTION, ""),
            delivery_count=max(0, int(d.get(DELIVERY_COUNT, "0"))),
            original_destination=d.get(ORIGINAL_DESTINATION),
            dlq_reason=d.get(DLQ_REASON),
            sequence=d.get(SEQUENCE, ""),
        )
    except (KeyError, ValueError, TypeError, InvalidDestinationException) as exc:
        raise ValueError(f"not a JOMS message descriptor: {exc}") from None


# ---------------------------------------------------------------- store form
_COMPACT = json.JSONEncoder(separators=(",", ":"))
"""``json.dumps(..., separators=(",", ":"))`` without building an encoder per call."""


def freeze(msg: JomsMessage, *, redelivered: bool = False) -> bytes:
    """A message as bytes for the service's store (``redelivered``: as if
    ``msg.redelivered`` were set)."""
    head = to_descriptor(msg)
    head[PRIORITY] = str(msg.priority)
    if msg.redelivered or redelivered:
        head[REDELIVERED] = "true"
    return _COMPACT.encode(head).encode() + b"\n" + msg.body


def thaw(blob: bytes) -> JomsMessage:
    head, _, body = blob.partition(b"\n")
    return from_descriptor(json.loads(head), body)
