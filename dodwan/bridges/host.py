"""The daemon seen by its bridges (:class:`~dodwan.bridges.manager.BridgeHost`).

Uses only the core's public publish/subscribe API, through the daemon's node, and runs the
daemon's post-input step after each call (datagrams out, events routed, timer re-armed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any


class DaemonBridgeHost:
    def __init__(self, daemon: Any) -> None:
        self._d = daemon

    @property
    def host_id(self) -> str:
        return str(self._d.host_id)

    @property
    def state_dir(self) -> Path:
        return Path(self._d.state_dir)

    @property
    def max_ttl(self) -> float:
        return float(self._d._node().config.limits.max_ttl)

    @property
    def max_payload(self) -> int:
        return int(self._d.max_payload())

    def publish(
        self, attributes: Mapping[str, str], payload: bytes, deadline: float, priority: int
    ) -> str:
        msg_id = self._d._node().publish(
            attributes, payload, deadline=deadline, now=time.time(), priority=priority
        )
        self._d._after_input()
        return str(msg_id)

    def subscribe(self, key: str, patterns: list[dict[str, str]]) -> None:
        self._d._node().subscribe(patterns, now=time.time(), key=key)
        self._d._after_input()

    def unsubscribe(self, key: str) -> None:
        self._d._node().unsubscribe(key, time.time())
        self._d._after_input()

    def subscription_keys(self) -> list[str]:
        return list(self._d._node().subscriptions())

    def cached(self) -> list[tuple[dict[str, str], Callable[[], bytes | None]]]:
        node = self._d._node()
        return [
            (dict(e["descriptor"]), partial(node.message_payload, e["id"]))
            for e in node.cache_listing()
            if e["complete"]
        ]
