"""JMS message and destination objects of the Python API, and their STOMP form.

Owns the client-side shape of messages (Text, Bytes, Map, Stream bodies; typed properties;
JMS header fields) and their encoding in SEND/MESSAGE frames: typed properties travel as
string headers plus ``joms-types``; Map and Stream bodies as JSON with an explicit type per
value (docs/joms.md). No pickled objects, ever.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import math
import re
from collections.abc import Callable
from typing import Any

from ..errors import (
    MessageFormatException,
    MessageNotReadableException,
    MessageNotWriteableException,
    NumberFormatException,
)
from ..selector.lexer import KEYWORDS, is_identifier_part, is_identifier_start
from ..service import model as mdl
from ..stomp.frame import Frame

PERSISTENT = 2
"""JMS DeliveryMode.PERSISTENT."""
NON_PERSISTENT = 1
"""JMS DeliveryMode.NON_PERSISTENT."""

log = logging.getLogger(__name__)

_VALUE_TYPES = mdl.PROPERTY_TYPES | {"bytes"}
_PROVIDER_PROPERTIES = frozenset(
    {"original-destination", "dlq-reason", mdl.DELIVERY_COUNT_PROPERTY}
)
"""Properties the provider sets on a received message (a dead letter's): read like any
other, but never sent on when the message is sent again (the provider sets its own)."""


# ---------------------------------------------------------------- destinations
class Destination:
    """A JMS destination; ``str(d)`` is its STOMP destination."""

    prefix = ""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise MessageFormatException("a destination needs a name")
        self.name = name

    def __str__(self) -> str:
        return f"{self.prefix}{self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))


class Topic(Destination):
    prefix = "/topic/"

    @property
    def topic_name(self) -> str:
        return self.name


class Queue(Destination):
    """``Name`` (managed by the host this client talks to) or ``Name@HOST``."""

    prefix = "/queue/"

    @property
    def queue_name(self) -> str:
        return self.name


class TemporaryQueue(Queue):
    """A queue that lives as long as the connection that created it."""

    prefix = "/temp-queue/"

    def __init__(self, name: str, deleter: Callable[[TemporaryQueue], None] | None = None) -> None:
        super().__init__(name)
        self._deleter = deleter

    def delete(self) -> None:
        if self._deleter is not None:
            self._deleter(self)


class TemporaryTopic(Topic):
    """A topic that lives as long as the connection that created it; only that connection
    may subscribe to it (anyone may publish to it)."""

    prefix = "/temp-topic/"

    def __init__(self, name: str, deleter: Callable[[TemporaryTopic], None] | None = None) -> None:
        super().__init__(name)
        self._deleter = deleter

    def delete(self) -> None:
        if self._deleter is not None:
            self._deleter(self)


def destination_from(text: str | None) -> Destination | None:
    if not text:
        return None
    for cls in (Topic, TemporaryTopic, TemporaryQueue, Queue):
        if text.startswith(cls.prefix):
            return cls(text[len(cls.prefix) :])
    return None


# ---------------------------------------------------------------- typed values
JAVA_FLOAT_MAX = 3.4028234663852886e38
"""Float.MAX_VALUE: a finite ``float`` (JMS float) value must be within ±this."""


def _check_float(value: Any, t: str) -> None:
    """A JMS ``float`` is a Java float: a finite value beyond ±Float.MAX_VALUE has no such
    float (``double`` is Python's own float; infinities and NaN are floats too)."""
    if (
        t == "float"
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
        and abs(float(value)) > JAVA_FLOAT_MAX
    ):
        raise MessageFormatException(
            f"{value!r} is out of range for a float (a Java float: at most ±{JAVA_FLOAT_MAX}); "
            "use a double"
        )


def _type_of(value: Any, what: str) -> str:
    if isinstance(value, bytes | bytearray):
        return "bytes"
    if value is None or not isinstance(value, bool | int | float | str):
        raise MessageFormatException(
            f"{what} must be bool, int, float, str or bytes, not {type(value).__name__}"
        )
    return mdl.property_type_of(value)


def _encode_value(value: Any, t: str | None = None, what: str = "a value") -> dict[str, Any]:
    t = t or _type_of(value, what)
    if t not in _VALUE_TYPES:
        raise MessageFormatException(f"unknown value type {t!r}")
    if t == "bytes":
        if not isinstance(value, bytes | bytearray):
            raise MessageFormatException(f"{what} of type bytes needs bytes")
        return {"t": t, "v": base64.b64encode(bytes(value)).decode()}
    mdl.encode_property(value, t)  # range and type check
    _check_float(value, t)
    if t in ("float", "double"):
        return {"t": t, "v": float(value)}
    return {"t": t, "v": value}


def _check_wire_text(what: str, value: str, *, header: bool = True) -> None:
    """A string that travels as a STOMP header (UTF-8 encodable, no NUL) or as a text body
    (UTF-8 encodable: it goes with its content-length, so NUL is fine)."""
    if header and "\0" in value:
        raise MessageFormatException(f"{what} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MessageFormatException(f"{what} is not valid Unicode (a lone surrogate?)") from None


@functools.lru_cache(maxsize=4096)
def _is_selector_identifier(name: str) -> bool:
    """JMS 1.1 §3.5.1: a property name must obey the rules of a selector identifier (a Java
    identifier, not NULL, TRUE, FALSE, NOT, AND, OR, BETWEEN, LIKE, IN, IS or ESCAPE)."""
    return (
        is_identifier_start(name[0])
        and all(is_identifier_part(c) for c in name[1:])
        and not (name.isascii() and name.upper() in KEYWORDS)
    )


def _check_property_name(name: Any) -> None:
    """The API's own rule on top of the service's (``mdl.check_property_name``): only
    selector identifiers (the service still carries other names a raw STOMP client sends)."""
    if isinstance(name, str) and name and not _is_selector_identifier(name):
        raise MessageFormatException(
            f"property name {name!r} is not a selector identifier (JMS 1.1 §3.5.1: a Java "
            "identifier, not NULL, TRUE, FALSE, NOT, AND, OR, BETWEEN, LIKE, IN, IS or ESCAPE)"
        )


_READ_AS: dict[str, frozenset[str]] = {
    "boolean": frozenset({"boolean"}),
    "byte": frozenset({"byte"}),
    "short": frozenset({"byte", "short"}),
    "int": frozenset({"byte", "short", "int"}),
    "long": frozenset({"byte", "short", "int", "long"}),
    "float": frozenset({"float"}),
    "double": frozenset({"float", "double"}),
}
"""JMS 1.1 §3.5.4: target type -> the property types it may be read from (besides string,
which every type is read from by parsing it, and to which every type converts)."""
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")
_JAVA_DECIMAL = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)


def _parse_number(text: str | None, target: str, name: str) -> Any:
    """A string property read as a number, as Java's ``Integer.valueOf`` & co. do."""
    if text is None:
        raise NumberFormatException(f"no property {name!r} to read as a {target}")
    if target in ("float", "double"):
        trimmed = text.strip(" \t\n\r\f\v")
        if not _JAVA_DECIMAL.fullmatch(trimmed):
            raise NumberFormatException(f"property {name!r} = {text!r} is not a {target}")
        f = float(trimmed.rstrip("fFdD").replace("Infinity", "inf"))
        if target == "float" and math.isfinite(f) and abs(f) > JAVA_FLOAT_MAX:
            f = math.copysign(math.inf, f)  # (Java's Float.valueOf overflows to infinity)
        return f
    lo, hi = mdl.INT_RANGES[target]
    if not _JAVA_INTEGER.fullmatch(text) or not lo <= int(text) <= hi:
        raise NumberFormatException(f"property {name!r} = {text!r} is not a {target}")
    return int(text)


# ---------------------------------------------------------------- messages
class Message:
    """A JMS message: header fields, typed properties, and a body (in subclasses)."""

    body_type = "bytes"

    def __init__(self, properties: dict[str, Any] | None = None) -> None:
        self.message_id: str | None = None
        self.timestamp: int = 0
        self.destination: Destination | None = None
        self.reply_to: Destination | None = None
        self.correlation_id: str | None = None
        self.type: str | None = None
        self.delivery_mode: int = PERSISTENT
        self.priority: int = 4
        self.expiration: int = 0
        self.redelivered: bool = False
        self._props: dict[str, Any] = {}
        self._types: dict[str, str] = {}
        self._ack: Callable[[], None] | None = None
        self._props_read_only = False
        self._body_read_only = False
        self._body_error: MessageFormatException | None = None
        for k, v in (properties or {}).items():
            # a received message's properties copied to forward it: those the provider set
            # are its to set again (set by name, they are refused)
            if k not in _PROVIDER_PROPERTIES:
                self.set_property(k, v)

    # read-only state of a received message (JMS 1.1 §3.9, §3.10)
    def _check_props_writable(self) -> None:
        if self._props_read_only:
            raise MessageNotWriteableException(
                "the properties of a received message are read-only: clear_properties() first"
            )

    def _check_body_writable(self) -> None:
        if self._body_read_only:
            raise MessageNotWriteableException(
                "the body of a received message is read-only: clear_body() first"
            )

    def _check_body_readable(self) -> None:
        """A received body that did not decode raises here, when it is read (the message
        itself is delivered: its header fields and properties are readable)."""
        if self._body_error is not None:
            raise MessageFormatException(str(self._body_error))

    def _set_read_only(self) -> None:
        self._props_read_only = True
        self._body_read_only = True

    def clear_body(self) -> None:
        """Empty the body and make it writable (also on a received message)."""
        self._body_read_only = False
        self._body_error = None
        self._clear_body()

    def _clear_body(self) -> None:
        raise NotImplementedError

    # properties
    def set_property(self, name: str, value: Any, jms_type: str | None = None) -> None:
        self._check_props_writable()
        t = jms_type or mdl.property_type_of(value)
        mdl.check_property(name, value, t)
        _check_property_name(name)
        _check_float(value, t)
        if isinstance(value, str):
            _check_wire_text(f"property {name!r}", value)
        self._props[name] = value
        self._types[name] = t

    def set_int_property(self, name: str, value: int) -> None:
        self.set_property(name, value, "int")

    def set_long_property(self, name: str, value: int) -> None:
        self.set_property(name, value, "long")

    def set_float_property(self, name: str, value: float) -> None:
        self.set_property(name, value, "float")

    def set_double_property(self, name: str, value: float) -> None:
        self.set_property(name, value, "double")

    def set_boolean_property(self, name: str, value: bool) -> None:
        self.set_property(name, value, "boolean")

    def set_string_property(self, name: str, value: str) -> None:
        self.set_property(name, value, "string")

    def get_property(self, name: str) -> Any:
        return self._props.get(name)

    # typed reads with the conversions of JMS 1.1 §3.5.4
    def _read_as(self, name: str, target: str) -> Any:
        value, t = self._props.get(name), self._types.get(name)
        if t == "string" or value is None:
            return _parse_number(value, target, name)
        if t not in _READ_AS[target]:
            raise MessageFormatException(
                f"property {name!r} is a {t}: it cannot be read as a {target}"
            )
        return float(value) if target in ("float", "double") else value

    def property_exists(self, name: str) -> bool:
        return name in self._props

    def get_object_property(self, name: str) -> Any:
        """The value as set (bool, int, float or str), None if there is no such property."""
        return self._props.get(name)

    def get_string_property(self, name: str) -> str | None:
        """Any property as a string (its wire form: ``true``, ``5``, ``2.5``); None if none."""
        if name not in self._props:
            return None
        value = self._props[name]
        return value if isinstance(value, str) else mdl.encode_property(value, self._types[name])

    def get_boolean_property(self, name: str) -> bool:
        """A boolean, or a string read as Java's ``Boolean.valueOf`` (``true`` in any case is
        True, anything else False); False if there is no such property."""
        value, t = self._props.get(name), self._types.get(name)
        if value is None:
            return False
        if t == "string":
            return str(value).lower() == "true"
        if t != "boolean":
            raise MessageFormatException(
                f"property {name!r} is a {t}: it cannot be read as a boolean"
            )
        return bool(value)

    def get_byte_property(self, name: str) -> int:
        return int(self._read_as(name, "byte"))

    def get_short_property(self, name: str) -> int:
        return int(self._read_as(name, "short"))

    def get_int_property(self, name: str) -> int:
        """A byte, short or int property, or a string parsed as one (NumberFormatException
        if it does not parse or fit, or there is no such property; MessageFormatException
        for another type)."""
        return int(self._read_as(name, "int"))

    def get_long_property(self, name: str) -> int:
        return int(self._read_as(name, "long"))

    def get_float_property(self, name: str) -> float:
        return float(self._read_as(name, "float"))

    def get_double_property(self, name: str) -> float:
        return float(self._read_as(name, "double"))

    def property_type(self, name: str) -> str | None:
        return self._types.get(name)

    @property
    def properties(self) -> dict[str, Any]:
        return dict(self._props)

    def property_names(self) -> list[str]:
        return list(self._props)

    def clear_properties(self) -> None:
        """Remove every property and make them writable (also on a received message)."""
        self._props.clear()
        self._types.clear()
        self._props_read_only = False

    def acknowledge(self) -> None:
        """CLIENT_ACKNOWLEDGE: acknowledge every message the session consumed so far."""
        if self._ack is not None:
            self._ack()

    # body codec (subclasses)
    def _encode_body(self) -> bytes:
        raise NotImplementedError

    def _decode_body(self, data: bytes) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.message_id} to {self.destination}>"


def _checked_text(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise MessageFormatException(f"a text body is a str, not {type(value).__name__}")
    if value is not None:
        _check_wire_text("the text body", value, header=False)
    return value


def _checked_bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise MessageFormatException(f"a bytes body is bytes, not {type(value).__name__}")
    return bytes(value)


class TextMessage(Message):
    body_type = "text"

    def __init__(self, text: str | None = None, properties: dict[str, Any] | None = None) -> None:
        super().__init__(properties)
        self._text = _checked_text(text)

    @property
    def text(self) -> str | None:
        return self._text

    @text.setter
    def text(self, value: str | None) -> None:
        self._check_body_writable()
        self._text = _checked_text(value)

    def _clear_body(self) -> None:
        self._text = None

    def _encode_body(self) -> bytes:
        return (self._text or "").encode("utf-8")

    def _decode_body(self, data: bytes) -> None:
        self._text = data.decode("utf-8", "replace")


class BytesMessage(Message):
    body_type = "bytes"

    def __init__(self, data: bytes = b"", properties: dict[str, Any] | None = None) -> None:
        super().__init__(properties)
        self._data = _checked_bytes(data)

    @property
    def data(self) -> bytes:
        return self._data

    @data.setter
    def data(self, value: bytes) -> None:
        self._check_body_writable()
        self._data = _checked_bytes(value)

    def write_bytes(self, data: bytes) -> None:
        self._check_body_writable()
        self._data += _checked_bytes(data)

    def _clear_body(self) -> None:
        self._data = b""

    def _encode_body(self) -> bytes:
        return self._data

    def _decode_body(self, data: bytes) -> None:
        self._data = data


class MapMessage(Message):
    """Name -> typed value (bool, int, float, str, bytes); set_int etc. fix the JMS type."""

    body_type = "map"

    def __init__(
        self, values: dict[str, Any] | None = None, properties: dict[str, Any] | None = None
    ) -> None:
        super().__init__(properties)
        self._map: dict[str, tuple[Any, str]] = {}
        for k, v in (values or {}).items():
            self.set(k, v)

    def set(self, name: str, value: Any, jms_type: str | None = None) -> None:
        self._check_body_writable()
        if not isinstance(name, str) or not name:  # (JMS: IllegalArgumentException)
            raise MessageFormatException(f"a map name must be a non-empty str, not {name!r}")
        enc = _encode_value(value, jms_type, "a map value")
        self._map[name] = (value, enc["t"])

    def set_int(self, name: str, value: int) -> None:
        self.set(name, value, "int")

    def set_long(self, name: str, value: int) -> None:
        self.set(name, value, "long")

    def set_double(self, name: str, value: float) -> None:
        self.set(name, value, "double")

    def set_string(self, name: str, value: str) -> None:
        self.set(name, value, "string")

    def get(self, name: str) -> Any:
        self._check_body_readable()
        item = self._map.get(name)
        return None if item is None else item[0]

    def item_type(self, name: str) -> str | None:
        self._check_body_readable()
        item = self._map.get(name)
        return None if item is None else item[1]

    def _clear_body(self) -> None:
        self._map = {}

    @property
    def map(self) -> dict[str, Any]:
        self._check_body_readable()
        return {k: v for k, (v, _) in self._map.items()}

    def _encode_body(self) -> bytes:
        return json.dumps({k: _encode_value(v, t) for k, (v, t) in self._map.items()}).encode()

    def _decode_body(self, data: bytes) -> None:
        decoded = mdl.decode_typed_body("map", data)
        assert isinstance(decoded, dict)
        self._map = decoded


class StreamMessage(Message):
    """A sequence of typed values, read back in order.

    As in JMS, a new message is write-only: ``read()`` raises MessageNotReadableException
    until ``reset()``, which makes the body read-only and goes back to the first value
    (``clear_body()`` makes it writable again). A received message is ready to read."""

    body_type = "stream"

    def __init__(
        self, items: list[Any] | None = None, properties: dict[str, Any] | None = None
    ) -> None:
        super().__init__(properties)
        self._items: list[tuple[Any, str]] = []
        self._pos = 0
        self._reading = False
        for v in items or []:
            self.write(v)

    def write(self, value: Any, jms_type: str | None = None) -> None:
        self._check_body_writable()
        enc = _encode_value(value, jms_type, "a stream value")
        self._items.append((value, enc["t"]))

    def read(self) -> Any:
        from ..errors import MessageEOFException

        if not self._reading:
            raise MessageNotReadableException(
                "a stream message is write-only until reset() (JMS StreamMessage)"
            )
        self._check_body_readable()
        if self._pos >= len(self._items):
            raise MessageEOFException("end of the stream message")
        self._pos += 1
        return self._items[self._pos - 1][0]

    def reset(self) -> None:
        """Make the body read-only and read it from the first value again."""
        self._pos = 0
        self._reading = True
        self._body_read_only = True

    def _clear_body(self) -> None:
        self._items, self._pos, self._reading = [], 0, False

    @property
    def items(self) -> list[Any]:
        self._check_body_readable()
        return [v for v, _ in self._items]

    def _encode_body(self) -> bytes:
        return json.dumps([_encode_value(v, t) for v, t in self._items]).encode()

    def _decode_body(self, data: bytes) -> None:
        decoded = mdl.decode_typed_body("stream", data)
        assert isinstance(decoded, list)
        self._items, self._pos = decoded, 0


_BY_BODY: dict[str, type[Message]] = {
    "text": TextMessage,
    "bytes": BytesMessage,
    "map": MapMessage,
    "stream": StreamMessage,
}


def to_frame(msg: Message, destination: Destination) -> Frame:
    """The SEND frame for a message (header fields already set on it)."""
    h: dict[str, str] = {
        "destination": str(destination),
        "joms-body-type": msg.body_type,
        "content-type": "text/plain;charset=utf-8"
        if msg.body_type == "text"
        else "application/octet-stream",
        "persistent": "true" if msg.delivery_mode == PERSISTENT else "false",
        "priority": str(msg.priority),
        "expires": str(msg.expiration),
    }
    if msg.reply_to is not None:
        h["reply-to"] = str(msg.reply_to)
    if msg.correlation_id is not None:
        h["correlation-id"] = msg.correlation_id
    if msg.type is not None:
        h["type"] = msg.type
    for field, key in (("correlation_id", "correlation-id"), ("type", "type")):
        if key in h:
            if not isinstance(h[key], str):
                raise MessageFormatException(f"the message's {field} must be a str")
            _check_wire_text(f"the message's {field}", h[key])
    types: dict[str, str] = {}
    for name, value in msg._props.items():
        if name in _PROVIDER_PROPERTIES:
            continue  # (only on a received message; set_property refuses these names)
        h[name] = mdl.encode_property(value, msg._types[name])
        types[name] = msg._types[name]
    enc = mdl.encode_types(types)
    if enc:
        h["joms-types"] = enc
    if isinstance(msg, TextMessage) and msg.text is None:
        h["joms-null-text"] = "true"  # JMS: getText() is null, not "", on the other side
    return Frame("SEND", h, msg._encode_body())


def from_frame(f: Frame) -> Message:
    """Rebuild a received message from its MESSAGE frame."""
    h = f.headers
    cls = _BY_BODY.get(h.get("joms-body-type", ""))
    if cls is None:
        cls = TextMessage if h.get("content-type", "").startswith("text/") else BytesMessage
    msg = cls.__new__(cls)
    Message.__init__(msg)
    if cls is MapMessage:
        msg._map = {}  # type: ignore[attr-defined]
    if cls is StreamMessage:
        msg._items, msg._pos = [], 0  # type: ignore[attr-defined]
        msg._reading = True  # type: ignore[attr-defined]  # (received: read-only, readable)
    try:
        msg._decode_body(f.body)
        if cls is TextMessage and h.get("joms-null-text") == "true" and not f.body:
            msg._text = None  # type: ignore[attr-defined]
    except MessageFormatException as exc:  # delivered; reading the body raises (docs/joms.md)
        log.warning("message %s: undecodable body: %s", h.get("message-id"), exc)
        msg._body_error = exc
    msg.message_id = h.get("message-id")
    msg.destination = destination_from(h.get("destination"))
    msg.reply_to = destination_from(h.get("reply-to"))
    msg.correlation_id = h.get("correlation-id")
    msg.type = h.get("type")
    msg.delivery_mode = PERSISTENT if h.get("persistent", "true") == "true" else NON_PERSISTENT
    msg.redelivered = h.get("redelivered") == "true"
    for attr, key in (
        ("priority", "priority"),
        ("timestamp", "timestamp"),
        ("expiration", "expires"),
    ):
        with contextlib.suppress(ValueError):
            setattr(msg, attr, int(h.get(key, "0")))
    try:
        types = mdl.decode_types(h.get("joms-types", ""))
    except ValueError:
        types = {}
    for name, value in h.items():
        if name.startswith("joms-") or (
            name in mdl.STOMP_HEADERS and name not in _PROVIDER_PROPERTIES
        ):
            continue  # the frame's own headers (docs/stomp.md), never user properties
        t = types.get(name, "string")
        try:
            msg._props[name] = mdl.decode_property(value, t)
            msg._types[name] = t
        except ValueError:
            msg._props[name] = value
            msg._types[name] = "string"
    msg._set_read_only()  # JMS: a received message's body and properties are read-only
    return msg
