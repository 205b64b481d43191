"""Profiles in pieces: how an interest profile of any size crosses the network.

A host's profile is named in announcements by its version (a digest of its patterns) and
the number of *pieces* (datagrams) its patterns fill. A neighbour that does not hold that
version asks for the pieces it lacks (a profile request, like a fragment request); the
owner — or any host that assembled the same version — answers with broadcast pieces, so
every neighbour that lacks them takes them at once. Pieces are kept exactly as the owner
cut them, so whoever serves them serves the same bytes. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import wire
from .errors import WireError
from .limits import Limits
from .patterns import PatternError, Profile

Pieces = tuple[wire.PatternSpecs, ...]


def split(profile: Profile, room: int, *, strict: bool = True) -> Pieces:
    """Cut a profile's patterns (in their canonical order) into pieces of at most ``room``
    encoded bytes and 255 patterns each. A pattern larger than a piece raises ValueError,
    or is left out when not ``strict`` (a profile stored under a larger ``max_datagram``)."""
    pieces: list[wire.PatternSpecs] = []
    current: list[tuple[tuple[str, str], ...]] = []
    size = 1
    for p in profile.patterns:
        one = wire.patterns_size((p.items,)) - 1
        if one + 1 > room:
            if strict:
                raise ValueError(f"pattern {p.spec()} does not fit in a {room}-byte profile piece")
            continue
        if current and (size + one > room or len(current) == 255):
            pieces.append(tuple(current))
            current, size = [], 1
        current.append(p.items)
        size += one
    if current:
        pieces.append(tuple(current))
    return tuple(pieces)


def assemble(pieces: Pieces, version: int, limits: Limits) -> Profile:
    """The profile the pieces make; WireError when invalid or not of ``version``."""
    specs = [dict(items) for piece in pieces for items in piece]
    try:
        profile = Profile.from_patterns(specs, limits)
    except (PatternError, TypeError) as exc:
        raise WireError("bad pattern") from exc
    if profile.version != version:
        raise WireError("profile version mismatch")
    return profile


@dataclass(slots=True)
class Assembly:
    """Pieces received so far of one remote profile version."""

    count: int
    started: float
    pieces: dict[int, wire.PatternSpecs] = field(default_factory=dict)

    @property
    def missing(self) -> int:
        """Bitmask of the pieces not received yet."""
        have = 0
        for i in self.pieces:
            have |= 1 << i
        return ((1 << self.count) - 1) & ~have
