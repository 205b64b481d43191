"""The only way the JOMS service talks to the dissemination layer: a small port.

Any layer that can publish a descriptor + payload, subscribe with selection patterns and
deliver matching messages can carry JOMS. :mod:`joms.service.core_port` implements it over
a DoDWAN core :class:`~dodwan.core.node.Node`. Deliveries come back by the runner calling
``service.on_delivery(key, descriptor, payload, now)`` for keys starting with ``joms:``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class DisseminationPort(Protocol):
    """Publish / subscribe / unsubscribe (and drop a local copy) on the dissemination layer."""

    host_id: str
    """This host's id (queues managed here are ``Name@host_id``)."""

    def publish(
        self,
        attributes: Mapping[str, str],
        payload: bytes,
        *,
        deadline: float,
        priority: int,
        persistent: bool,
    ) -> str:
        """Publish; returns the DoDWAN message id. ValueError when the layer refuses it.

        Stored durably when ``persistent``; otherwise the layer may keep it in memory
        only (JMS NON_PERSISTENT: at most once across a crash)."""

    def subscribe(self, patterns: list[dict[str, str]], *, key: str) -> str:
        """Add or replace the subscription ``key`` (starts with ``joms:``); returns the key."""

    def unsubscribe(self, key: str) -> None:
        """Remove a subscription; unknown keys are ignored."""

    def drop(self, msg_id: str) -> None:
        """Drop the local cached copy of a message (acknowledged queue message); may no-op."""
