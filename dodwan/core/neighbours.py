"""Neighbour soft state: who was heard recently, their profiles and what they offer.

A neighbour exists while it keeps announcing; silence longer than the timeout removes it
together with everything learnt from it (its profile, relayed profiles, offers).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from .patterns import Profile


@dataclass(slots=True)
class Neighbour:
    host_id: str
    address: Hashable
    last_heard: float
    seq: int = 0
    """Sequence number of its last announcement (its announcements start over at 1 when
    it restarts)."""
    since: float = 0.0
    """When it became a neighbour, or was last found restarted."""
    altruistic: bool = False
    profile: Profile = field(default_factory=Profile)
    version: int | None = None
    """Profile version tag as announced (None until the first announcement)."""
    relayed: dict[str, tuple[int, Profile]] = field(default_factory=dict)
    """host -> (distance from this neighbour, profile)"""
    refs: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """Profiles its last announcement named: host -> (distance, version, pieces); its own
    at distance 0."""
    offers: dict[str, int] = field(default_factory=dict)
    """msg id -> bitmask of the fragments this neighbour last said it holds"""
    budgets: dict[str, int] = field(default_factory=dict)
    """msg id -> the copy budget it offered it with, when it has one"""
    offers_memory: int = 0
    """Bytes ``offers`` and ``budgets`` take (an estimate, charged to the remote-memory
    budget as ``("offers", host_id)``)."""
