"""JMS selectors as binding filters, through JOMS's own selector implementation.

A binding's ``selector`` (JMS 1.1 syntax, ``docs/selectors.md``) chooses the messages that
cross it, both ways. Outgoing, it is evaluated on the DoDWAN descriptor: application
attributes are string properties (typed when the message is a JOMS message carrying
``jms_types``), and ``JMSPriority``, ``JMSType``, ``JMSCorrelationID``, ``JMSMessageID``,
``JMSTimestamp`` come from the descriptor; the DoDWAN patterns JOMS derives from it narrow
the binding's subscription when no ``attributes`` or ``filter`` do. Incoming, it is
evaluated on the remote message's headers (strings) and the JMS header fields the protocol
carries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from joms.errors import InvalidSelectorException
from joms.selector import Selector, parse
from joms.service import model as mdl
from joms.service.base import attribute_for

from .mapping import Inbound


class SelectorError(ValueError):
    """The selector does not parse (message fit for one line)."""


def compile_selector(text: str) -> Selector:
    try:
        return parse(text)
    except InvalidSelectorException as exc:
        raise SelectorError(f"invalid selector {text[:200]!r}: {exc}") from None


def network_patterns(sel: Selector) -> list[dict[str, str]] | None:
    """DoDWAN patterns every message ``sel`` matches also matches (None: none narrower
    than everything, ``[]``: nothing can match)."""
    return sel.network_patterns(attribute_for)


def descriptor_values(d: Mapping[str, str]) -> dict[str, Any]:
    """Identifier -> value, as a selector sees a DoDWAN message."""
    values: dict[str, Any] = {}
    types: dict[str, str] = {}
    with contextlib.suppress(ValueError):
        types = mdl.decode_types(d.get(mdl.TYPES, ""))
    for name, text in d.items():
        if name in mdl.DODWAN_SYSTEM or name in mdl.JOMS_ATTRIBUTES:
            continue
        values[name] = text
        if name in types:
            with contextlib.suppress(ValueError):
                values[name] = mdl.decode_property(text, types[name])
    with contextlib.suppress(ValueError):
        values["JMSPriority"] = int(d.get(mdl.PRIORITY, "4"))
    with contextlib.suppress(ValueError):
        stamp = d.get(mdl.TIMESTAMP) or str(int(float(d.get("date", "")) * 1000))
        values["JMSTimestamp"] = int(stamp)
    values["JMSMessageID"] = d.get(mdl.MESSAGE_ID) or "ID:" + d.get("id", "")
    values["JMSDeliveryMode"] = d.get(mdl.DELIVERY_MODE, mdl.PERSISTENT)
    for header, attr in (("JMSType", mdl.TYPE), ("JMSCorrelationID", mdl.CORRELATION_ID)):
        if attr in d:
            values[header] = d[attr]
    return values


def inbound_values(msg: Inbound) -> dict[str, Any]:
    """Identifier -> value, as a selector sees a message received from the broker."""
    values: dict[str, Any] = dict(msg.headers)
    values["JMSPriority"] = 4 if msg.priority is None else msg.priority
    values["JMSDeliveryMode"] = mdl.PERSISTENT
    if msg.remote_id:
        values["JMSMessageID"] = msg.remote_id
    if msg.jms_type:
        values["JMSType"] = msg.jms_type
    if msg.correlation_id:
        values["JMSCorrelationID"] = msg.correlation_id
    return values
