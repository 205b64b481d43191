"""Queue-manager state and the receiver-selection policy.

A :class:`ManagedQueue` is the quasi-central decision point of one queue ``Name@host``: it
knows the live receivers (leases) and the pending messages and which receiver each was
handed to. It stores nothing centrally beyond that: DoDWAN carries requests, messages and
acknowledgements. The policy choosing a receiver is replaceable (:class:`ReceiverPolicy`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from .model import JomsMessage
from .ordering import Reorder


@dataclass(slots=True)
class Receiver:
    """A live receiver of a managed queue."""

    reply_id: str
    selector_text: str
    selector: Any
    until: float
    """Lease end."""
    since: float
    """Date of the newest request seen (older requests are ignored)."""
    served: int = 0
    local: bool = False
    """A consumer of this host: it cannot outlive this process (dropped at a restart)."""
    handed: int = 0
    """Deliveries published to it (numbered, so it can put them back in order)."""
    epoch: str = ""
    """Names this numbering (a receiver created again, or reloaded after a restart, numbers
    from 1 under a new epoch, which its consumer takes as a new sequence)."""
    closing: bool = False
    """It gave messages back (only a closing consumer does, just before its cancel): it is
    handed nothing more. Handing it the message it just released would count a delivery
    its client never saw."""


@dataclass(slots=True)
class Pending:
    """A queue message waiting to be consumed."""

    seq: str
    message: JomsMessage
    deadline: float
    core_id: str
    """DoDWAN id of the copy the manager received (dropped once consumed)."""
    assigned: str | None = None
    """reply_id of the receiver it was handed to, if any."""
    attempts: int = 0
    delivery_id: str = ""


@dataclass(slots=True)
class ManagedQueue:
    name: str
    """Full name ``Name@host``."""
    temporary: bool = False
    owner: str = ""
    """Connection owning a temporary queue."""
    receivers: dict[str, Receiver] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)
    """jms message id -> pending message, in arrival order."""
    last: str = ""
    """reply_id served last (round-robin cursor)."""
    reorder: Reorder[Pending] | None = None
    """Puts each producer's messages back in order before they join ``pending``."""


class ReceiverPolicy(Protocol):
    """Picks which of the matching receivers gets a message."""

    def choose(self, queue: ManagedQueue, message: JomsMessage, candidates: list[str]) -> str: ...


class RoundRobin:
    """Fair rotation over the receivers (sorted by reply_id) whose selector matches."""

    def choose(self, queue: ManagedQueue, message: JomsMessage, candidates: list[str]) -> str:
        ordered = sorted(candidates)
        for r in ordered:
            if r > queue.last:
                return r
        return ordered[0]


def load_policy(spec: str) -> ReceiverPolicy:
    """``round-robin`` or ``module:callable`` (called without arguments).

    Whatever goes wrong (no such module, no such attribute, the callable raising or
    returning something without ``choose``) is a one-line ValueError naming the setting:
    the daemon checks the setting at start and prints that line."""
    if spec == "round-robin":
        return RoundRobin()
    module, sep, attr = spec.partition(":")
    if not (sep and module.strip() and attr.strip()):
        raise ValueError(
            f"receiver_policy must be 'round-robin' or 'module:callable', not {spec!r}"
        )
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # the user's module may raise anything while it loads
        raise ValueError(
            f"receiver_policy {spec!r}: cannot import module {module!r} ({_one_line(e)})"
        ) from None
    try:
        factory = getattr(mod, attr)
    except AttributeError:
        raise ValueError(
            f"receiver_policy {spec!r}: module {module!r} has no attribute {attr!r}"
        ) from None
    if not callable(factory):
        raise ValueError(f"receiver_policy {spec!r} is not callable")
    try:
        policy = factory()
    except Exception as e:  # user code
        raise ValueError(
            f"receiver_policy {spec!r}: calling {spec}() failed: {_one_line(e)}"
        ) from None
    if not callable(getattr(policy, "choose", None)):
        raise ValueError(
            f"receiver_policy {spec!r} did not return an object with a choose() method"
        )
    return policy  # type: ignore[no-any-return]


def _one_line(e: BaseException) -> str:
    """``Type: message`` with the message's line breaks made spaces."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
