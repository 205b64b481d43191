"""The cache's storage interface and its in-memory implementation.

The node keeps its indexes in memory and writes through this small interface; the daemon
plugs in a SQLite implementation (durable, crash-safe), the simulator and tests use
:class:`MemoryStore`. A store never decides anything: policy lives in the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class MessageMeta:
    """What must survive a restart about a cached message (besides its fragments)."""

    msg_id: str
    zdesc: bytes
    """Compressed descriptor, exactly as carried by fragments."""
    hops: int
    """Transmissions this copy travelled (0 when published here)."""
    local: bool
    """Published on this host."""
    received: float
    """When the first fragment was stored."""


class Store(Protocol):
    """Persistence for messages, fragments, the reception history and subscriptions."""

    def put_message(self, meta: MessageMeta) -> None: ...
    def delete_message(self, msg_id: str) -> None:
        """Remove the message and all its fragments."""

    def put_fragment(self, msg_id: str, index: int, data: bytes) -> None: ...
    def put_fragments(self, msg_id: str, chunks: Sequence[bytes]) -> None:
        """Store fragments 0 .. len(chunks) - 1 of a message at once (a publication)."""

    def get_fragment(self, msg_id: str, index: int) -> bytes | None: ...
    def iter_messages(self) -> Iterable[tuple[MessageMeta, list[int]]]:
        """Every stored message with the indexes of the fragments held."""

    def add_history(self, msg_id: str, key: str, deadline: float) -> None:
        """Record that ``msg_id`` was delivered to subscription ``key`` ("" = held complete)."""

    def iter_history(self) -> Iterable[tuple[str, str, float]]: ...
    def purge_history(self, now: float) -> None:
        """Forget history entries whose deadline is at or before ``now``."""

    def put_subscription(self, key: str, specs: list[dict[str, str]]) -> None: ...
    def delete_subscription(self, key: str) -> None: ...
    def iter_subscriptions(self) -> Iterable[tuple[str, list[dict[str, str]]]]: ...
    def commit(self) -> None:
        """Make everything written so far durable (called at the end of each node input)."""


class MemoryStore:
    """A :class:`Store` in dictionaries (lost when the process ends)."""

    def __init__(self) -> None:
        self._messages: dict[str, MessageMeta] = {}
        self._fragments: dict[str, dict[int, bytes]] = {}
        self._history: dict[tuple[str, str], float] = {}
        self._subscriptions: dict[str, list[dict[str, str]]] = {}

    def put_message(self, meta: MessageMeta) -> None:
        self._messages[meta.msg_id] = meta
        self._fragments.setdefault(meta.msg_id, {})

    def delete_message(self, msg_id: str) -> None:
        self._messages.pop(msg_id, None)
        self._fragments.pop(msg_id, None)

    def put_fragment(self, msg_id: str, index: int, data: bytes) -> None:
        self._fragments.setdefault(msg_id, {})[index] = data

    def put_fragments(self, msg_id: str, chunks: Sequence[bytes]) -> None:
        self._fragments.setdefault(msg_id, {}).update(enumerate(chunks))

    def get_fragment(self, msg_id: str, index: int) -> bytes | None:
        frags = self._fragments.get(msg_id)
        return None if frags is None else frags.get(index)

    def iter_messages(self) -> Iterable[tuple[MessageMeta, list[int]]]:
        for msg_id, meta in self._messages.items():
            yield meta, sorted(self._fragments.get(msg_id, {}))

    def add_history(self, msg_id: str, key: str, deadline: float) -> None:
        self._history[(msg_id, key)] = deadline

    def iter_history(self) -> Iterable[tuple[str, str, float]]:
        for (msg_id, key), deadline in self._history.items():
            yield msg_id, key, deadline

    def purge_history(self, now: float) -> None:
        for k in [k for k, d in self._history.items() if d <= now]:
            del self._history[k]

    def put_subscription(self, key: str, specs: list[dict[str, str]]) -> None:
        self._subscriptions[key] = [dict(s) for s in specs]

    def delete_subscription(self, key: str) -> None:
        self._subscriptions.pop(key, None)

    def iter_subscriptions(self) -> Iterable[tuple[str, list[dict[str, str]]]]:
        return list(self._subscriptions.items())

    def commit(self) -> None:
        return None
