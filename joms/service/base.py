"""Shared state and helpers of the JOMS service's parts (see joms.service.service)."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dodwan import Limits
from dodwan.core.message import SYSTEM_ATTRIBUTES

from .. import selector as selector_lang
from ..errors import (
    InvalidSelectorException,
    JMSException,
    MessageFormatException,
)
from . import model as mdl
from .config import ServiceConfig
from .events import Event
from .model import Destination, JomsMessage
from .ordering import Reorder
from .port import DisseminationPort
from .queues import ManagedQueue
from .store import ServiceStore

KEY_PREFIX = "joms:"
IMPLICIT_PREFIX = "~nd."
"""Name prefix of the durable subscriptions that stand for non-durable ones (nondurable =
durable): ``~nd.<digest of topic, selector, noLocal>``."""
TEMP_TOPIC_PREFIX = "tmp."
"""Topics named ``tmp.<host>.<id>`` are temporary topics of a connection of ``<host>``."""
ACK_MODES = ("auto", "client", "client-individual")
_SEP = "\x1e"
_CORE_LIMITS = Limits()  # DoDWAN's default pattern limits, which network filters must fit


def _esc(value: str) -> str:
    """A literal as an RE2 full-match expression."""
    return re.escape(value)


def _json_obj(payload: bytes) -> dict[str, Any]:
    """A JSON object from the network; ValueError for anything else."""
    obj = json.loads(payload or b"{}")
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    return obj


SEQ_COUNTER_WIDTH = 16
"""Hex digits of the counter ending a sequence key (see ``ServiceBase._seq``)."""


def normal_seq(seq: str) -> str:
    """A sequence key as ``ServiceBase._seq`` makes it now. Earlier versions ended it with
    the counter in hex of no fixed width, so that among keys made at one instant "...x10"
    sorted before "...x9": padded, such a key sorts in the order it was made."""
    head, sep, counter = seq.rpartition("x")
    if not sep or not counter or len(counter) >= SEQ_COUNTER_WIDTH:
        return seq
    try:
        n = int(counter, 16)
    except ValueError:
        return seq
    return f"{head}x{n:0{SEQ_COUNTER_WIDTH}x}"


def _digest(*parts: str) -> str:
    return hashlib.sha1("\x1f".join(parts).encode()).hexdigest()[:24]


def compile_selector(text: str | None) -> Any:
    """Parse a selector (None/blank = match all); InvalidSelectorException if invalid."""
    if text is None or not text.strip():
        return None
    try:
        return selector_lang.parse(text)
    except InvalidSelectorException as exc:
        raise InvalidSelectorException(
            f"invalid selector {text[:200]!r}: {exc}", position=exc.position
        ) from None
    except JMSException:
        raise
    except Exception as exc:
        raise InvalidSelectorException(f"invalid selector: {exc}") from None


def selector_matches(sel: Any, msg: JomsMessage) -> bool:
    if sel is None:
        return True
    try:
        return bool(sel.matches(msg.selector_values()) is True)
    except Exception:
        return False


def attribute_for(identifier: str) -> str | None:
    """Descriptor attribute carrying a selector identifier (None: not filterable in network)."""
    if identifier in mdl.HEADER_IDENTIFIERS:
        return mdl.HEADER_IDENTIFIERS[identifier]
    try:
        mdl.check_property_name(identifier)
    except MessageFormatException:
        return None
    return identifier


@dataclass(slots=True)
class _Tx:
    sends: list[tuple[JomsMessage, float | None]] = field(default_factory=list)
    acks: list[tuple[str, str]] = field(default_factory=list)
    """(consumer, tag) acknowledged — or refused, those in ``nacks`` — in the transaction,
    in order: applied at COMMIT, given back (redelivered) at ABORT."""
    nacks: set[tuple[str, str]] = field(default_factory=set)


@dataclass(slots=True)
class _Connection:
    id: str
    client_id: str | None
    tag: str
    consumers: set[str] = field(default_factory=set)
    temp_queues: set[str] = field(default_factory=set)
    temp_topics: set[str] = field(default_factory=set)
    txs: dict[str, _Tx] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    """Topic name or ``Queue@Host`` -> messages this connection (one producer) sent to it."""


@dataclass(slots=True)
class _Consumer:
    id: str
    conn: str
    kind: str  # "topic" | "durable" | "queue"
    dest: Destination
    selector_text: str
    selector: Any
    no_local: bool
    ack_mode: str
    prefetch: int = 0
    core_key: str = ""
    durable: str = ""  # durable subscription key
    reply_id: str = ""
    renew_at: float = 0.0
    seen: set[str] = field(default_factory=set)
    """Queue message ids received (a manager may re-send after a restart)."""
    done: set[str] = field(default_factory=set)
    """Queue message ids consumed (a re-sent copy is acknowledged again, not delivered)."""
    copies: dict[str, list[str]] = field(default_factory=dict)
    """Queue message id -> DoDWAN ids of its copies (delivery, original) held here."""
    pending: deque[tuple[str, JomsMessage]] = field(default_factory=deque)
    unacked: OrderedDict[str, tuple[str, JomsMessage]] = field(default_factory=OrderedDict)
    reorder: Reorder[tuple[str, JomsMessage]] | None = None
    """Topic consumers: puts each producer's messages back in order; queue consumers: puts
    the manager's hand-outs (joms_hand) back in order."""
    closing: tuple[list[str], list[str] | None] | None = None
    """Closed by its client (``unconsumed``, ``delivered`` tags of the close) while a
    transaction of its connection holds acknowledgements of its messages: it gets nothing
    more, and the close waits for that transaction to end, which settles them (JMS: the
    transaction, not the consumer, decides their fate)."""


@dataclass(slots=True)
class _Durable:
    key: str
    client_id: str
    name: str
    topic: str
    selector_text: str
    selector: Any
    no_local: bool
    core_key: str
    created: int = 0
    """Creation time (ms since the epoch)."""
    consumer: str | None = None
    reorder: Reorder[tuple[str, JomsMessage]] | None = None
    """Puts each producer's messages back in order before they are stored."""
    idle_since: float | None = None
    """An implicit subscription (a non-durable one kept as durable): since when it has no
    consumer (None: it has one, or it is an ordinary durable subscription)."""

    @property
    def implicit(self) -> bool:
        return self.name.startswith(IMPLICIT_PREFIX)

    def record(self) -> bytes:
        return json.dumps(
            {
                "client_id": self.client_id,
                "name": self.name,
                "topic": self.topic,
                "selector": self.selector_text,
                "no_local": self.no_local,
                "core_key": self.core_key,
                "created": self.created,
                "idle_since": self.idle_since,
            }
        ).encode()


class ServiceBase:
    """State every part of the service shares (set up by ``JomsService.__init__``), and the
    few helpers they all use. The parts are mixins of :class:`JomsService`; each method
    may call the others' (they are one object)."""

    port: DisseminationPort
    host_id: str
    config: ServiceConfig
    store: ServiceStore
    rng: random.Random
    counters: dict[str, int]
    _events: deque[Event]
    _handed: list[tuple[str, str]]
    _epoch: str
    _own_ids: str
    _n: int
    _connections: dict[str, _Connection]
    _clients: dict[str, str]
    _consumers: dict[str, _Consumer]
    _durables: dict[str, _Durable]
    _dcount: dict[str, int]
    _queues: dict[str, ManagedQueue]
    _routes: dict[str, Callable[[Mapping[str, str], bytes, float], None]]
    _acks_out: dict[tuple[str, str], tuple[list[str], list[str], list[str]]]
    _ack_flush_at: float | None
    _next_advert: float | None
    _directory: dict[str, tuple[float, list[str], list[str]]]
    _topics_here: set[str]
    _run: str
    _started_at: float

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _id(self) -> str:
        self._n += 1
        return f"{self._epoch}{self._n:x}"

    def _seq(self, now: float) -> str:
        """A key that sorts, as a string, in the order the keys were made (the order stored
        durable and queue messages arrived): the time in microseconds, then this run's
        epoch (ending in ``x``), then the counter in fixed-width hex — many messages of a
        batch from the network share one instant."""
        self._n += 1
        return f"{int(now * 1e6):020d}{self._epoch}{self._n:0{SEQ_COUNTER_WIDTH}x}"

    def _publish_named(self, attributes: dict[str, str], payload: bytes, **kw: Any) -> str:
        """``port.publish`` with a DoDWAN id of the service's choosing (``host-<epoch><n>``,
        unique like the core's own, which ``_epoch`` makes new at every start) rather than
        one the core draws at random: ids that grow within a run keep the stores' indexes
        keyed by message id appending to one place, where random ids dirtied a random page
        of each index per message (in the bench, 4x the SQLite pages written per commit).
        The core's choice when the descriptor is at DoDWAN's attribute limit (a given
        ``id`` counts twice), or when the layer refuses the named one (e.g. an id a node
        still remembers from a service that started afresh on the same seed, without its
        store): a publication never fails for its name."""
        if len(attributes) + len(SYSTEM_ATTRIBUTES) >= _CORE_LIMITS.max_attributes:
            return self.port.publish(attributes, payload, **kw)
        attributes["id"] = f"{self.host_id}-{self._id()}"
        try:
            return self.port.publish(attributes, payload, **kw)
        except ValueError:
            del attributes["id"]
            return self.port.publish(attributes, payload, **kw)

    def _subscribe_core(
        self,
        patterns: list[dict[str, str]],
        key: str,
        handler: Callable[[Mapping[str, str], bytes, float], None],
        *,
        fallback: list[dict[str, str]] | None = None,
    ) -> None:
        try:
            self.port.subscribe(patterns, key=key)
        except ValueError:
            if fallback is None:
                raise
            self.port.subscribe(fallback, key=key)
        self._routes[key] = handler

    def _unsubscribe_core(self, key: str) -> None:
        self._routes.pop(key, None)
        self.port.unsubscribe(key)
        self.store.delete("ephemeral", key)
