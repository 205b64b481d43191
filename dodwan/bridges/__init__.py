"""Bridges: bindings from a DoDWAN gateway host to STOMP, MQTT and AMQP brokers.

See docs/bridges.md. :mod:`.uri` parses binding URIs and settings, :mod:`.outbox` is the
durable outbox, :mod:`.binding` the thread of one binding, :mod:`.mqtt`, :mod:`.stomp` and
:mod:`.amqp` the protocol links, :mod:`.mapping` what crosses, :mod:`.manager` the adapter
the daemon runs.
"""

from .manager import KEY_PREFIX, BridgeError, BridgeManager
from .uri import BindingSpec, SpecError, parse_uri

__all__ = ["KEY_PREFIX", "BindingSpec", "BridgeError", "BridgeManager", "SpecError", "parse_uri"]
