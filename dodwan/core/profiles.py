"""Profiles in pieces: how an interest profile of any size crosses the network.

A host's profile is named in announcements by its version (a digest of its patterns) and
the number of *pieces* (datagrams) its patterns fill. A neighbour that does not hold that
version asks for the pieces it lacks (a profile request, like a fragment request); the
owner — or any host that assembled the same version — answers with broadcast pieces, so
every neighbour that lacks them takes them at once. Pieces are kept exactly as the owner
cut them, so whoever serves them serves the same bytes. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from . import wire
from .errors import WireError
from .ledger import RemoteMemory
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
    memory: int = 0
    """Bytes the pieces received take (an estimate, charged to the remote-memory budget)."""

    @property
    def missing(self) -> int:
        """Bitmask of the pieces not received yet."""
        have = 0
        for i in self.pieces:
            have |= 1 << i
        return ((1 << self.count) - 1) & ~have


PROFILE_CACHE_VERSIONS = 4
"""Compiled profiles kept per remote host: its current version and a few older ones still
relayed by slower neighbours. Older ones are dropped, so subscription churn on other hosts
costs no memory over time."""
PROFILE_CACHE_HOSTS = 4096
"""Remote hosts whose compiled profiles are cached; past that the cache starts over."""
MATCH_MEMORY = 72
"""What one cached message matching a remote profile costs in the matcher (a set entry)."""
_ITEM_MEMORY = 176
"""What one (attribute, expression) pair of a piece takes in memory beyond its text: a
tuple and two strings (measured with ``sys.getsizeof``)."""


def pieces_memory(pieces: Sequence[wire.PatternSpecs]) -> int:
    """Bytes the decoded pieces of a profile take (an estimate from their text)."""
    return sum(
        len(name) + len(regex) + _ITEM_MEMORY
        for piece in pieces
        for items in piece
        for name, regex in items
    )


Ranges = list[tuple[int, int]]


def ranges_of(mask: int) -> Ranges:
    """Bitmask -> [(first, count), ...]."""
    out: Ranges = []
    i = 0
    while mask:
        if mask & 1:
            start = i
            while mask & 1:
                mask >>= 1
                i += 1
            out.append((start, i - start))
        else:
            low = (mask & -mask).bit_length() - 1
            mask >>= low
            i += low
    return out


def merge_ranges(ranges: Sequence[tuple[int, int]], bound: int) -> Ranges:
    """Sorted, disjoint ranges covering what ``ranges`` cover below ``bound``: repeated or
    overlapping ranges count once, so the work they cause is O(len(ranges) log + bound)."""
    spans = sorted((f, min(f + c, bound)) for f, c in ranges if c > 0 and f < bound)
    out: list[list[int]] = []
    for start, end in spans:
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1][1] = end
        else:
            out.append([start, end])
    return [(s, e - s) for s, e in out]


def bounded_mask(ranges: Sequence[tuple[int, int]], bound: int) -> int:
    """The bitmask of ``ranges`` below ``bound``, in time linear in their number and bound."""
    merged = merge_ranges(ranges, bound)
    if len(merged) <= 64:
        return mask_of(merged)
    bits = bytearray((bound + 7) // 8)
    for first, count in merged:
        for i in range(first, first + count):
            bits[i >> 3] |= 1 << (i & 7)
    return int.from_bytes(bits, "little")


def mask_of(ranges: Sequence[tuple[int, int]]) -> int:
    """[(first, count), ...] -> bitmask."""
    mask = 0
    for first, count in ranges:
        mask |= ((1 << count) - 1) << first
    return mask


class ProfileBook:
    """Other hosts' profiles: the versions assembled (compiled, with their pieces, so this
    host can serve them on), the assemblies under way, and the pieces to ask each neighbour
    for. Every quantity is bounded (a few versions per host, ``max_profile_assemblies``),
    and the memory of compiled versions and of assemblies is charged to the remote-memory
    budget (``memory``), as ``("profile", (host, version))`` and ``("assembly", (host,
    version))``, to the address the last piece came from; that budget gives them up
    through :meth:`drop` and :meth:`drop_assembly`."""

    def __init__(self, limits: Limits, request_timeout: float, memory: RemoteMemory) -> None:
        self._limits = limits
        self._timeout = request_timeout
        self._memory = memory
        self._cache: dict[str, dict[int, tuple[Profile, Pieces]]] = {}
        self.generation = 0
        """Changes whenever :meth:`latest` may answer differently for some host."""
        self._base: dict[tuple[str, int], int] = {}  # what a version costs before matches
        self.assemblies: dict[tuple[str, int], Assembly] = {}
        self._pending: dict[str, dict[tuple[str, int], int]] = {}  # target -> key -> pieces
        self._requested: dict[tuple[str, int], tuple[int, float]] = {}

    def get(self, host: str, version: int) -> tuple[Profile, Pieces] | None:
        versions = self._cache.get(host)
        if versions is None:
            return None
        hit = versions.get(version)
        if hit is not None and next(reversed(self._cache)) != host:
            self._cache[host] = self._cache.pop(host)  # most recently used last
        return hit

    def latest(self, host: str) -> Profile | None:
        """The newest compiled version held of ``host``'s profile (None: none is), without
        moving it in the eviction order."""
        versions = self._cache.get(host)
        if not versions:
            return None
        return versions[next(reversed(versions))][0]

    def versions(self) -> int:
        """Compiled versions held, all hosts together."""
        return sum(len(v) for v in self._cache.values())

    def remember(
        self, host: str, version: int, profile: Profile, pieces: Pieces, owner: Hashable
    ) -> None:
        """Keep an assembled version, charged to ``owner`` (the address it came from)."""
        versions = self._cache.get(host)
        if versions is None:
            if len(self._cache) >= PROFILE_CACHE_HOSTS:
                held = [(h, v) for h, vs in self._cache.items() for v in vs]
                self._cache.clear()
                self._base.clear()
                for key in held:  # neighbours using them let them go too
                    self._memory.give_up("profile", key)
            versions = self._cache[host] = {}
        else:
            self._cache[host] = self._cache.pop(host)
        versions.pop(version, None)
        versions[version] = (profile, pieces)
        self.generation += 1
        while len(versions) > PROFILE_CACHE_VERSIONS:  # the oldest compiled goes first
            oldest = next(iter(versions))
            del versions[oldest]
            self._base.pop((host, oldest), None)
            self._memory.give_up("profile", (host, oldest))
        cost = self._base[host, version] = profile.memory + pieces_memory(pieces)
        self._memory.charge(owner, "profile", (host, version), cost)

    def charge_matches(self, host: str, version: int, matches: int) -> None:
        """Charge a version held for the ``matches`` cached messages it matches (the
        matcher keeps one set entry each) on top of what it costs itself."""
        base = self._base.get((host, version))
        owner = self._memory.owner_of("profile", (host, version))
        if base is None or owner is None:
            return
        cost = base + matches * MATCH_MEMORY
        if cost != self._memory.charged("profile", (host, version)):
            self._memory.charge(owner, "profile", (host, version), cost)

    def drop(self, host: str, version: int) -> None:
        """The remote-memory budget gave this version up (fetched again if named later)."""
        self._base.pop((host, version), None)
        versions = self._cache.get(host)
        if versions is not None and versions.pop(version, None) is not None:
            self.generation += 1
            if not versions:
                del self._cache[host]

    def drop_assembly(self, key: tuple[str, int]) -> None:
        """The remote-memory budget gave this assembly up (asked again if named later)."""
        self.assemblies.pop(key, None)
        self._requested.pop(key, None)

    def want(self, target: str, owner: str, version: int, count: int, now: float) -> bool:
        """Note the pieces of ``(owner, version)`` still missing, to ask ``target`` for;
        True when there is something to ask."""
        key = (owner, version)
        asm = self.assemblies.get(key)
        if asm is None or asm.count != count:
            if asm is None and len(self.assemblies) >= self._limits.max_profile_assemblies:
                oldest = min(self.assemblies, key=lambda k: self.assemblies[k].started)
                del self.assemblies[oldest]
                self._memory.release("assembly", oldest)
            self._memory.release("assembly", key)
            asm = self.assemblies[key] = Assembly(count, now)
        missing = asm.missing
        req = self._requested.get(key)
        if req is not None and req[1] + self._timeout > now:
            missing &= ~req[0]
        if not missing:
            return False
        pending = self._pending.setdefault(target, {})
        pending[key] = pending.get(key, 0) | missing
        return True

    def requests_for(self, target: str, now: float) -> list[tuple[str, int, Ranges]]:
        """What to ask ``target`` now (and remember it as asked)."""
        wanted: list[tuple[str, int, Ranges]] = []
        for key, mask in self._pending.pop(target, {}).items():
            asm = self.assemblies.get(key)
            mask &= asm.missing if asm is not None else 0
            if mask:
                wanted.append((key[0], key[1], ranges_of(mask)))
                old = self._requested.get(key, (0, now))[0]
                self._requested[key] = (old | mask, now)
        return wanted

    def overheard(
        self, owner: str, version: int, ranges: Sequence[tuple[int, int]], now: float
    ) -> bool:
        """Someone else asked for these pieces: the answer is broadcast, so drop them from
        our own request. True when that suppressed something."""
        key, mask = (owner, version), mask_of(ranges)
        suppressed = False
        for pending in self._pending.values():
            if pending.get(key, 0) & mask:
                pending[key] &= ~mask
                suppressed = True
                if not pending[key]:
                    del pending[key]
        if suppressed:
            old = self._requested.get(key, (0, now))[0]
            self._requested[key] = (old | mask, now)
        return suppressed

    def received(self, piece: wire.ProfilePiece, now: float, owner: Hashable) -> Profile | str:
        """Take a piece from ``owner`` (the address it came from): the assembled profile
        when it was the last one, else what became of it ("kept", "duplicate", "unwanted":
        not asked for); WireError when invalid."""
        key = (piece.owner, piece.version)
        asm = self.assemblies.get(key)
        if asm is None:
            return "unwanted"
        if asm.count != piece.count:
            raise WireError("profile piece count mismatch")
        if piece.index in asm.pieces:
            return "duplicate"
        asm.pieces[piece.index] = piece.patterns
        asm.started = now
        if len(asm.pieces) < asm.count:
            asm.memory += pieces_memory((piece.patterns,))
            self._memory.charge(owner, "assembly", key, asm.memory)
            return "kept"
        del self.assemblies[key]
        self._memory.release("assembly", key)
        self._requested.pop(key, None)
        for pending in self._pending.values():
            pending.pop(key, None)
        pieces = tuple(asm.pieces[i] for i in range(asm.count))
        profile = assemble(pieces, piece.version, self._limits)
        self.remember(piece.owner, piece.version, profile, pieces, owner)
        return profile

    def forget_target(self, target: str) -> None:
        """A neighbour is gone: nothing more to ask it."""
        self._pending.pop(target, None)

    def expire(self, now: float, stall: float) -> None:
        """Drop assemblies that made no progress for ``stall`` seconds (asked again when
        someone names that version)."""
        for key in [k for k, a in self.assemblies.items() if a.started + stall <= now]:
            del self.assemblies[key]
            self._memory.release("assembly", key)
