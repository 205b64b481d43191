"""What the daemon offers to services it hosts (the JOMS service behind the STOMP gateway).

A hosted service talks to DoDWAN only through this small interface (docs/architecture.md:
JOMS uses the core's public pub/sub API). Subscription keys a service creates must start with
its prefix (``joms:``); deliveries for those keys go to the service's handler instead of a
daemon sink. All methods are called from the daemon's event loop thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..core import MessageDelivered

SERVICE_PREFIX = "joms:"


class ServiceHost(Protocol):
    """The daemon as seen by a hosted service."""

    host_id: str
    state_dir: Path
    """The daemon's state directory (a service may keep its own database there)."""

    def now(self) -> float:
        """Wall-clock seconds (the clock the daemon feeds the core)."""

    def publish(
        self,
        attributes: Mapping[str, str],
        payload: bytes,
        deadline: float,
        priority: int = 4,
        persistent: bool = True,
    ) -> str:
        """Publish and return the message id (raises ValueError on bad input).

        A non-``persistent`` message is kept in memory only (``SqliteStore.volatile``):
        gone after a crash or restart, as JMS allows for NON_PERSISTENT."""

    def subscribe(self, patterns: Mapping[str, str] | Sequence[Mapping[str, str]], key: str) -> str:
        """Add or replace a subscription whose key starts with ``joms:``."""

    def unsubscribe(self, key: str) -> None:
        """Remove a subscription (KeyError when unknown)."""

    def purge(self, msg_id: str) -> None:
        """Drop a cached message (KeyError when absent), e.g. a consumed queue message."""

    def subscriptions(self) -> dict[str, list[dict[str, str]]]:
        """Every subscription held by the daemon (key -> patterns)."""

    def set_delivery_handler(self, handler: Callable[[MessageDelivered], Any] | None) -> None:
        """Receive every delivery whose subscription key starts with ``joms:``."""
