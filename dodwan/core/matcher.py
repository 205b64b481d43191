"""Incremental matching of cached messages against the profiles a node knows.

Each profile's set of matching message ids is computed once per profile version, and each
new message is matched once against every known profile; the catalog reads the result
without re-matching anything. ``eligible`` keeps insertion order so catalogs can rotate
through it fairly, and ``fresh`` lists messages that became eligible since the last round.
"""

from __future__ import annotations

from collections.abc import Mapping

from .patterns import Profile


class Matcher:
    """Which cached messages match at least one known profile."""

    __slots__ = ("_count", "_descriptors", "_matched", "_profiles", "eligible", "fresh")

    def __init__(self) -> None:
        self._profiles: dict[str, Profile] = {}
        self._matched: dict[str, set[str]] = {}
        self._count: dict[str, int] = {}
        self._descriptors: dict[str, Mapping[str, str]] = {}
        self.eligible: dict[str, None] = {}
        """Message ids matching some profile, in the order they became eligible."""
        self.fresh: dict[str, None] = {}
        """Message ids that became eligible since :meth:`take_fresh` was last called."""

    def _inc(self, msg_id: str) -> None:
        c = self._count.get(msg_id, 0) + 1
        self._count[msg_id] = c
        if c == 1:
            self.eligible[msg_id] = None
            self.fresh[msg_id] = None

    def _dec(self, msg_id: str) -> None:
        c = self._count.get(msg_id, 0) - 1
        if c <= 0:
            self._count.pop(msg_id, None)
            self.eligible.pop(msg_id, None)
            self.fresh.pop(msg_id, None)
        else:
            self._count[msg_id] = c

    def set_profile(self, host: str, profile: Profile) -> bool:
        """Add or replace ``host``'s profile; re-match only when its version changed
        (returns whether it did)."""
        old = self._profiles.get(host)
        if old is not None and old.version == profile.version:
            return False
        self.remove_profile(host)
        self._profiles[host] = profile
        matched: set[str] = set()
        self._matched[host] = matched
        for m, d in self._descriptors.items():  # cache order, not hash order: deterministic
            if profile.matches(d):
                matched.add(m)
                self._inc(m)
        return True

    def remove_profile(self, host: str) -> None:
        if self._profiles.pop(host, None) is None:
            return
        for m in self._matched.pop(host, set()):
            self._dec(m)

    def hosts(self) -> list[str]:
        return list(self._profiles)

    def add_message(self, msg_id: str, descriptor: Mapping[str, str]) -> None:
        if msg_id in self._descriptors:
            return
        self._descriptors[msg_id] = descriptor
        for host, profile in self._profiles.items():
            if profile.matches(descriptor):
                self._matched[host].add(msg_id)
                self._inc(msg_id)

    def remove_message(self, msg_id: str) -> None:
        if self._descriptors.pop(msg_id, None) is None:
            return
        for matched in self._matched.values():
            if msg_id in matched:
                matched.discard(msg_id)
                self._dec(msg_id)

    def matching(self, host: str) -> set[str]:
        """Cached messages ``host``'s profile matches (empty for an unknown host)."""
        return self._matched.get(host, set())

    def interested_hosts(self, msg_id: str) -> list[str]:
        """Known hosts whose profile matches a cached message."""
        return [h for h, s in self._matched.items() if msg_id in s]

    def take_fresh(self) -> list[str]:
        out = list(self.fresh)
        self.fresh.clear()
        return out
