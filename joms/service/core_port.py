"""The dissemination port over a DoDWAN core :class:`~dodwan.core.node.Node`.

Used by the in-process runtime, the daemon and the simulator: the runner owns the node and
its clock; this adapter reads the runner's ``clock()`` for the ``now`` the core wants.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from dodwan.core.node import Node


class NodePort:
    """:class:`~joms.service.port.DisseminationPort` on a core node.

    ``volatile``: the node store's ``volatile()`` context (``SqliteStore.volatile``), if
    any: non-persistent publications are made inside it, so the store keeps them in
    memory only (JMS NON_PERSISTENT: at most once across a crash)."""

    def __init__(
        self,
        node: Node,
        clock: Callable[[], float],
        volatile: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.node = node
        self.clock = clock
        self.host_id = node.host_id
        self.volatile = volatile

    def publish(
        self,
        attributes: Mapping[str, str],
        payload: bytes,
        *,
        deadline: float,
        priority: int,
        persistent: bool,
    ) -> str:
        volatile = self.volatile if not persistent else None
        with volatile() if volatile is not None else contextlib.nullcontext():
            return self.node.publish(
                attributes,
                payload,
                deadline=deadline,
                now=self.clock(),
                priority=priority,
                persistent=persistent,
            )

    def subscribe(self, patterns: list[dict[str, str]], *, key: str) -> str:
        return self.node.subscribe(patterns, now=self.clock(), key=key)

    def unsubscribe(self, key: str) -> None:
        with contextlib.suppress(KeyError):
            self.node.unsubscribe(key, now=self.clock())

    def drop(self, msg_id: str) -> None:
        with contextlib.suppress(KeyError):
            self.node.purge(msg_id, now=self.clock())
