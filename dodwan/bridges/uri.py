"""Binding specifications: a URI naming the remote destination plus the mapping and filter.

A binding is created from a URI (R-MOM style), one per remote destination:

* ``stomp://HOST:PORT/topic/NAME`` or ``stomp://HOST:PORT/queue/NAME`` (ActiveMQ),
* ``mqtt://HOST:PORT/TOPIC`` where TOPIC may end in ``/#`` or hold ``+`` (Mosquitto),
* ``amqp://HOST:PORT/EXCHANGE/ROUTING_KEY`` (an exchange of any type, declared as a durable
  topic one when missing; ``#`` and ``*`` allowed in the routing key for the inbound
  binding; RabbitMQ) or ``amqp://HOST:PORT/queue/NAME``.

``user:password@`` may precede the host. The rest of a binding (direction, the attributes
that map DoDWAN messages to the destination, a filter, the deadline of incoming messages)
comes from the ``[[bridges]]`` table or the ``dodwan bridge add`` options and is validated
here, so a bad binding is refused with one clear line before anything is touched.
"""

from __future__ import annotations

import hashlib
import math
import re
import urllib.parse
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..units import as_given

if TYPE_CHECKING:
    from joms.selector import Selector

SCHEMES = {"stomp": 61613, "mqtt": 1883, "amqp": 5672}
DIRECTIONS = ("out", "in", "both")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
KEYS = {
    "name",
    "uri",
    "direction",
    "attributes",
    "filter",
    "ttl",
    "holdoff",
    "qos",
    "joms_topic",
    "selector",
    "standby",
}
STANDBY_HOLDOFF = 30.0
"""Default hold-off of a standby binding: well above the primary's send-and-echo time (well
under a second on a working uplink, a few seconds while it reconnects), short enough for
the field's messages to reach headquarters soon when the primary is gone."""
JOMS_KIND = ("jms_kind", "message")
"""A JOMS topic's messages: jms_kind=message, destination_type=topic, destination_id=NAME."""


class SpecError(ValueError):
    """A binding URI or setting is invalid (message fit for one line of output)."""


@dataclass(frozen=True)
class Endpoint:
    """The parsed URI."""

    scheme: str
    host: str
    port: int
    kind: str
    """stomp: topic|queue; mqtt: topic; amqp: exchange|queue."""
    destination: str
    """stomp: NAME; mqtt: TOPIC (with wildcards); amqp: EXCHANGE or queue NAME."""
    routing_key: str = ""
    """amqp exchange bindings: the routing key (``#`` when absent)."""
    user: str | None = None
    password: str | None = None

    @property
    def display(self) -> str:
        """The URI without credentials (for status, logs and origin marks)."""
        return f"{self.scheme}://{self.host}:{self.port}/{self.path}"

    @property
    def path(self) -> str:
        if self.scheme == "stomp":
            return f"{self.kind}/{self.destination}"
        if self.scheme == "amqp":
            if self.kind == "queue":
                return f"queue/{self.destination}"
            return f"{self.destination}/{self.routing_key}"
        return self.destination

    @property
    def out_target(self) -> str:
        """Where outbound messages go: the MQTT topic or AMQP routing key without a trailing
        multi-level wildcard level (``field/#`` -> ``field``, which ``field/#`` also
        matches; ``#`` alone -> ``""``). Only that level goes: ``a/`` stays ``a/`` and
        ``b//#`` is ``b/`` (each a topic of its own, with an empty last level)."""
        if self.scheme == "mqtt":
            return _drop_last_hash(self.destination, "/")
        if self.scheme == "amqp" and self.kind == "exchange":
            return _drop_last_hash(self.routing_key, ".")
        return self.destination

    def check_outbound(self) -> None:
        target = self.out_target
        if (self.scheme == "mqtt" and ("+" in target or "#" in target or not target)) or (
            self.scheme == "amqp" and ("*" in target or "#" in target)
        ):
            raise SpecError(
                f"{self.display}: an outbound binding needs a destination without wildcards "
                "(except one trailing '#')"
            )


def _drop_last_hash(name: str, separator: str) -> str:
    """``name`` without a last level ``#`` (and the separator before it)."""
    if name == "#":
        return ""
    return name.removesuffix(separator + "#")


def without_credentials(uri: str) -> str:
    """``uri`` without ``USER:PASSWORD@``, also for a URI that does not parse (error messages
    and logs show this). A password may hold a raw ``/``, ``:``, ``@``, ``?`` or ``#`` (not
    percent-encoded), so no split of the authority can be trusted (``u:12/3@h`` looks like
    host ``u``, port ``12``): whenever an ``@`` follows the scheme, everything between the
    scheme and the last ``@`` goes. A path or query holding an ``@`` is cut too; showing too
    little is the safe side."""
    head, sep, rest = uri.partition("://")
    if not sep:
        head, sep, rest = uri.partition(":")
        if not sep:
            return uri.rpartition("@")[2]
    if "@" not in rest:
        return uri
    return f"{head}{sep}{rest.rpartition('@')[2]}"


def parse_uri(uri: str) -> Endpoint:
    """Parse and check a binding URI (:class:`SpecError` with the reason)."""
    if not isinstance(uri, str) or not uri:
        raise SpecError("a binding needs a URI such as mqtt://127.0.0.1:1883/field/#")
    shown = repr(without_credentials(uri))  # errors are logged and answered: no password
    try:
        uri.encode()
    except UnicodeEncodeError:
        raise SpecError(f"{shown} is not valid Unicode text (it holds a lone surrogate)") from None
    # '#' is a wildcard of MQTT topics and AMQP routing keys, not a URI fragment here.
    try:
        u = urllib.parse.urlsplit(uri.replace("#", "%23"))
    except ValueError as exc:
        raise SpecError(f"{shown} is not a valid URI: {exc}") from None
    scheme = u.scheme.lower()
    if scheme not in SCHEMES:
        raise SpecError(f"unsupported URI scheme {u.scheme!r} in {shown}: use stomp, mqtt or amqp")
    if not u.hostname:
        raise SpecError(f"{shown} names no host")
    try:
        port = u.port if u.port is not None else SCHEMES[scheme]
    except ValueError:
        raise SpecError(f"{shown} has an invalid port") from None
    if port == 0:
        raise SpecError(f"{shown} has an invalid port (0)")
    if u.query:
        raise SpecError(f"{shown}: put options in the binding settings, not in the URI")
    path = _unquote(shown, "path", u.path).removeprefix("/")
    user = _unquote(shown, "user name", u.username) if u.username else None
    password = _unquote(shown, "password", u.password) if u.password else None
    if any("\0" in part for part in (path, user or "", password or "")):
        raise SpecError(f"{shown}: a NUL character (%00) cannot cross to a broker")
    if scheme == "mqtt" and path.startswith("/"):
        # 'mqtt://h//a' or '%2Fa': the topic '/a', whose first level is empty. Refused
        # rather than silently bridged as 'a'; such topics are not supported.
        raise SpecError(
            f"{shown}: MQTT topics with an empty first level (a leading '/') are not "
            "supported; name the topic without it"
        )
    common: dict[str, Any] = {"host": u.hostname, "port": port, "user": user, "password": password}
    if scheme == "stomp":
        kind, _, name = path.partition("/")
        if kind not in ("topic", "queue") or not name:
            raise SpecError(
                f"{shown}: a STOMP binding is stomp://HOST:PORT/topic/NAME or /queue/NAME"
            )
        return Endpoint("stomp", kind=kind, destination=name, **common)
    if scheme == "mqtt":
        if not path:
            raise SpecError(
                f"{shown}: an MQTT binding names a topic, e.g. mqtt://HOST:PORT/field/#"
            )
        levels = path.split("/")
        for i, level in enumerate(levels):
            if ("#" in level and (level != "#" or i != len(levels) - 1)) or (
                "+" in level and level != "+"
            ):
                raise SpecError(
                    f"{shown}: '#' only as the last level and '+' only as a whole level"
                )
        _mqtt_string(shown, "topic", path)
        if user is not None:
            _mqtt_string(shown, "user name", user)
        if password is not None and len(password.encode()) > MQTT_STRING:
            raise SpecError(
                f"{_short(shown)}: the MQTT password is longer than {MQTT_STRING} bytes"
            )
        return Endpoint("mqtt", kind="topic", destination=path, **common)
    first, _, rest = path.partition("/")
    if not first:
        raise SpecError(f"{shown}: an AMQP binding is amqp://HOST:PORT/EXCHANGE/ROUTING_KEY")
    if first == "queue":
        if not rest:
            raise SpecError(f"{shown}: amqp://HOST:PORT/queue/NAME needs a queue name")
        _short_string(shown, "queue name", rest)
        return Endpoint("amqp", kind="queue", destination=rest, **common)
    _short_string(shown, "exchange name", first)
    _short_string(shown, "routing key", rest)
    return Endpoint("amqp", kind="exchange", destination=first, routing_key=rest or "#", **common)


def _unquote(shown: str, what: str, value: str) -> str:
    """``value`` percent-decoded, refused when the bytes it names are not UTF-8 (``%FF``,
    ``%ED%A0%80``): earlier each such sequence silently became U+FFFD, and the binding
    used another destination (or credentials) than the one given."""
    try:
        return urllib.parse.unquote(value, errors="strict")
    except UnicodeDecodeError as exc:
        bad = "".join(f"%{b:02X}" for b in exc.object[exc.start : exc.end])
        where = "" if what == "password" else f" ({bad})"
        raise SpecError(
            f"{_short(shown)}: the {what} is not valid UTF-8 once percent-decoded{where}"
        ) from None


AMQP_SHORT_STRING = 255
"""Most UTF-8 bytes of an AMQP 0-9-1 short string: exchange and queue names, routing keys."""
MQTT_STRING = 65535
"""Most bytes of an MQTT string (a topic, a user name: UTF-8) or binary data (a password)."""


def _short(shown: str) -> str:
    """The URI as errors show it, cut to 80 characters."""
    return shown if len(shown) <= 80 else f"{shown[:76]}...'"


def _short_string(shown: str, what: str, value: str) -> None:
    """Refuse a name AMQP cannot carry: every connection failed with pika's
    ShortStringTooLong, the binding down for good. ``shown``: the URI as errors show it."""
    n = len(value.encode())
    if n > AMQP_SHORT_STRING:
        raise SpecError(
            f"{_short(shown)}: the AMQP {what} is {n} bytes long (UTF-8); AMQP 0-9-1 allows "
            f"at most {AMQP_SHORT_STRING}"
        )


def _not_for_mqtt(c: str) -> bool:
    """A control character or a Unicode non-character: MQTT strings should not hold them
    (MQTT 3.1.1 1.5.3, MQTT 5 1.5.4), and Mosquitto closes the connection of a packet
    with one as malformed."""
    n = ord(c)
    return (
        n <= 0x1F or 0x7F <= n <= 0x9F or 0xFDD0 <= n <= 0xFDEF or (n & 0xFFFF) in (0xFFFE, 0xFFFF)
    )


def _mqtt_string(shown: str, what: str, value: str) -> None:
    """Refuse a topic or user name MQTT cannot carry: paho refused to send it (a traceback
    in its thread) or the broker closed every connection ("Malformed packet"), the binding
    down for good."""
    n = len(value.encode())
    if n > MQTT_STRING:
        raise SpecError(
            f"{_short(shown)}: the MQTT {what} is {n} bytes long (UTF-8); MQTT allows at "
            f"most {MQTT_STRING}"
        )
    bad = next((c for c in value if _not_for_mqtt(c)), None)
    if bad is not None:
        raise SpecError(
            f"{_short(shown)}: the MQTT {what} holds U+{ord(bad):04X}, a control character "
            "or non-character, which MQTT brokers refuse"
        )


def _str_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise SpecError(f"{what} must be a table of attribute = string")
    return dict(value)


@dataclass(frozen=True)
class BindingSpec:
    """One binding: where, which way, which messages, and how they map."""

    name: str
    uri: str
    direction: str = "both"
    attributes: dict[str, str] = field(default_factory=dict)
    """Given to every incoming message; by default also what selects outgoing ones."""
    filter: list[dict[str, str]] = field(default_factory=list)
    """DoDWAN patterns selecting outgoing messages (default: ``attributes``, exactly)."""
    ttl: float = 3600.0
    """Seconds incoming messages live in the DoDWAN network (their deadline)."""
    holdoff: float = 0.0
    """Seconds an outgoing message waits before it is sent (a standby gateway)."""
    standby: bool = False
    """A standby gateway: hold-off :data:`STANDBY_HOLDOFF` unless given, direction both."""
    qos: int = 1
    """MQTT quality of service for both directions (1 or 2). 1 by default: across a broker
    restart QoS 1 may resend (deduplicable on ``dodwan-id``), while QoS 2 lost a message
    Mosquitto had taken when its in-flight exchange was forgotten."""
    joms_topic: str | None = None
    """The JOMS topic mirrored (its attributes are part of ``attributes``)."""
    selector: str = ""
    """A JMS selector choosing the messages that cross, both ways ("": every message)."""
    instance: str = field(default="", compare=False, repr=False)
    """Which binding of this name it is: a token the gateway keeps from ``bridge add`` to
    ``bridge rm`` (across restarts and ``--replace``), written in the broker-side ledger
    (:mod:`.ledger`). Not a setting: never in :meth:`as_dict`."""
    endpoint: Endpoint = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoint", parse_uri(self.uri))

    @property
    def joms(self) -> bool:
        """Incoming messages are JOMS topic messages (JMS clients of the daemon get them)."""
        return self.attributes.get(JOMS_KIND[0]) == JOMS_KIND[1]

    @property
    def outbound(self) -> bool:
        return self.direction in ("out", "both")

    @property
    def inbound(self) -> bool:
        return self.direction in ("in", "both")

    @cached_property
    def compiled_selector(self) -> Selector | None:
        """The parsed :attr:`selector` (None when there is none)."""
        if not self.selector.strip():
            return None
        from .selection import compile_selector

        return compile_selector(self.selector)

    def selects(self, values: dict[str, Any]) -> bool:
        """Whether a message (its selector values) passes the binding's selector."""
        sel = self.compiled_selector
        return sel is None or sel.matches(values)

    def patterns(self) -> list[dict[str, str]]:
        """The DoDWAN patterns of the binding's subscription (outbound selection)."""
        if self.filter:
            return [dict(p) for p in self.filter]
        if self.attributes or self.compiled_selector is None:
            return [{k: re.escape(v) for k, v in self.attributes.items()}]
        from .selection import network_patterns

        return network_patterns(self.compiled_selector) or []

    def as_dict(self, secrets: bool = True) -> dict[str, Any]:
        uri = self.uri if secrets else self.endpoint.display
        return (
            {
                "name": self.name,
                "uri": uri,
                "direction": self.direction,
                "attributes": dict(self.attributes),
                "filter": [dict(p) for p in self.filter],
                "ttl": self.ttl,
                "holdoff": self.holdoff,
                "qos": self.qos,
                "standby": self.standby,
            }
            | ({"joms_topic": self.joms_topic} if self.joms_topic else {})
            | ({"selector": self.selector} if self.selector else {})
        )

    @classmethod
    def from_dict(cls, data: Any, max_ttl: float | None = None) -> BindingSpec:
        """Validate a ``[[bridges]]`` table or an admin API body; ``max_ttl``: the daemon's
        ``limits.max_ttl``, which ``ttl`` must not exceed."""
        if not isinstance(data, dict):
            raise SpecError("a binding must be a table (name, uri, direction, attributes, ...)")
        unknown = set(data) - KEYS
        if unknown:
            raise SpecError(f"unknown binding setting(s): {', '.join(sorted(unknown))}")
        endpoint = parse_uri(data.get("uri", ""))
        name = data.get("name") or _default_name(endpoint)
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise SpecError(f"binding name {name!r}: 1-64 letters, digits, '.', '_' or '-'")
        direction = data.get("direction", "both")
        if direction not in DIRECTIONS:
            raise SpecError(f"binding {name}: direction must be out, in or both")
        attributes = _str_map(data.get("attributes", {}), f"binding {name}: attributes")
        joms_topic = data.get("joms_topic")
        if joms_topic is not None:
            if not isinstance(joms_topic, str) or not joms_topic:
                raise SpecError(f"binding {name}: joms_topic must be a topic name")
            attributes.update(
                {
                    JOMS_KIND[0]: JOMS_KIND[1],
                    "destination_type": "topic",
                    "destination_id": joms_topic,
                }
            )
        flt = data.get("filter", [])
        if isinstance(flt, dict):
            flt = [flt]
        if not isinstance(flt, list):
            raise SpecError(f"binding {name}: filter must be a table or a list of tables")
        patterns = [_str_map(p, f"binding {name}: each filter pattern") for p in flt]
        selector = data.get("selector", "")
        if not isinstance(selector, str):
            raise SpecError(f"binding {name}: selector must be a string (a JMS selector)")
        compiled = None
        if selector.strip():
            from .selection import SelectorError, compile_selector, network_patterns

            try:
                compiled = compile_selector(selector)
            except SelectorError as exc:
                raise SpecError(f"binding {name}: {exc}") from None
            alone = direction != "in" and not (patterns or attributes)
            if alone and not network_patterns(compiled):
                raise SpecError(
                    f"binding {name}: this selector alone does not say which DoDWAN "
                    "messages the gateway must fetch (it needs an attribute compared with "
                    "=, IN or LIKE in every alternative); add attributes or a filter"
                )
        if direction != "in" and not (patterns or attributes or compiled):
            raise SpecError(
                f"binding {name}: an outbound binding needs attributes, a filter or a "
                "selector to choose which DoDWAN messages it sends"
            )
        if direction != "in":
            endpoint.check_outbound()
        if direction == "both" and endpoint.kind == "queue":
            raise SpecError(
                f"binding {name}: a queue is one way: direction out (send to it) or in "
                "(consume from it); both would consume the gateway's own messages, which "
                "headquarters' consumers would then never get"
            )
        standby = data.get("standby", False)
        if not isinstance(standby, bool):
            raise SpecError(f"binding {name}: standby must be true or false")
        if standby and direction != "both":
            raise SpecError(
                f"binding {name}: a standby binding needs direction both (it learns from what "
                "comes back from the broker which messages the primary gateway sent)"
            )
        numbers = {}
        holdoff = STANDBY_HOLDOFF if standby else 0.0
        for key, default in (("ttl", 3600.0), ("holdoff", holdoff)):
            v = data.get(key, default)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v < 0
            ):
                raise SpecError(f"binding {name}: {key} must be a finite, non-negative number")
            numbers[key] = float(v)
        if numbers["ttl"] <= 0:
            raise SpecError(f"binding {name}: ttl must be positive")
        if max_ttl is not None and numbers["ttl"] > max_ttl:
            raise SpecError(
                f"binding {name}: ttl {as_given(data['ttl'])} s is longer than this daemon's "
                f"limits.max_ttl ({max_ttl:g} s): every incoming message would be refused"
            )
        qos = data.get("qos", 1)
        if qos not in (1, 2) or isinstance(qos, bool):
            raise SpecError(f"binding {name}: qos must be 1 or 2")
        return cls(
            name=name,
            uri=data["uri"],
            direction=direction,
            attributes=attributes,
            filter=patterns,
            ttl=numbers["ttl"],
            holdoff=numbers["holdoff"],
            qos=qos,
            joms_topic=joms_topic,
            selector=selector,
            standby=standby,
        )


def _default_name(endpoint: Endpoint) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{endpoint.scheme}-{endpoint.path}").strip("-")
    return base[:64] or endpoint.scheme


def hashed_name(name: str, endpoint: Endpoint) -> str:
    """A name made from the URI (``name``), told apart from the same name another URI
    gives (``mqtt://h/a/b`` and ``mqtt://h/a-b`` are both ``mqtt-a-b``) by a short hash of
    the URI without credentials: ``mqtt-a-b-c73385``."""
    digest = hashlib.sha256(endpoint.display.encode()).hexdigest()[:6]
    return f"{name[:57].rstrip('-')}-{digest}"
