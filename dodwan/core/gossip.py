"""Neighbours and profile gossip: who is in range (heard, lost), announcements and beacons,
profiles named by version and fetched piece by piece, relayed within the horizon."""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Any

from mypy_extensions import trait

from . import wire
from .bits import indexes
from .events import NeighbourFound, NeighbourLost, NeighbourRestarted
from .neighbours import Neighbour
from .node_state import NodeState
from .patterns import Profile
from .profiles import PROFILE_CACHE_HOSTS, Pieces, mask_of, split

PROMPT_ANNOUNCE = 0.1  # max delay of the announcement answering a new neighbour
PROMPT_GAP = 0.25  # prompt announcements (profile change, new offer) at most this often


@trait
class GossipMixin(NodeState):
    """The neighbour and profile-gossip part of :class:`~dodwan.core.node.Node`."""

    def neighbours(self) -> dict[str, dict[str, Any]]:
        """Current neighbours: host -> {address, last_heard, altruistic, patterns}."""
        return {
            h: {
                "address": n.address,
                "last_heard": n.last_heard,
                "altruistic": n.altruistic,
                "patterns": n.profile.specs(),
                "relayed": sorted(n.relayed),
            }
            for h, n in sorted(self._neighbours.items())
        }

    def profile(self) -> dict[str, Any]:
        """This host's profile and the profiles it knows within the horizon."""
        return {
            "own": self._own_profile.specs(),
            "known": {
                h: {"distance": d, "patterns": p.specs()}
                for h, (d, p) in sorted(self._known.items())
            },
        }

    def _piece_room(self) -> int:
        return self.config.max_datagram - wire.profile_piece_overhead(self.host_id, self.host_id)

    def _rebuild_own_profile(self) -> None:
        self._own_profile = Profile([p for s in self._subs.values() for p in s.profile.patterns])
        self._own_pieces = split(self._own_profile, self._piece_room(), strict=False)
        for c in self._cache.values():
            own = c.meta.local or self._own_profile.matches(c.descriptor)
            if own != c.own:
                c.own = own
                heapq.heappush(self._evict_heap, (c.rank(), c.header.msg_id))
        self._interest_epoch += 1
        self._beacon_bytes = b""  # it names the profile version

    def _pieces_of(self, host: str, version: int) -> Pieces | None:
        """The pieces of a profile this node can serve (its own, or one it assembled)."""
        if host == self.host_id:
            return self._own_pieces if version == self._own_profile.version else None
        hit = self._profiles.get(host, version)
        return None if hit is None else hit[1]

    def _resolve_refs(self, n: Neighbour, now: float) -> bool:
        """Turn a neighbour's profile references into profiles; ask it for the pieces of
        those not held yet (meanwhile the previous version stays in use). True when the
        neighbour's own or relayed profiles changed."""
        changed = False
        relayed: dict[str, tuple[int, Profile]] = {}
        for host, (dist, version, pieces) in n.refs.items():
            if pieces == 0:
                prof: Profile | None = Profile()
            else:
                hit = self._profiles.get(host, version)
                prof = None if hit is None else hit[0]
                if prof is None:
                    self._want_profile(n.host_id, host, version, pieces, now)
            if host == n.host_id:
                if prof is not None and n.version != version:
                    changed = changed or prof != n.profile
                    n.profile, n.version = prof, version
            elif prof is not None:
                if prof:
                    relayed[host] = (dist, prof)
            elif host in n.relayed:
                relayed[host] = n.relayed[host]  # stale until the new version is assembled
        if {h: (d, p.version) for h, (d, p) in relayed.items()} != {
            h: (d, p.version) for h, (d, p) in n.relayed.items()
        }:
            n.relayed = relayed
            changed = True
        return changed

    def _want_profile(self, target: str, owner: str, version: int, count: int, now: float) -> None:
        """Queue a request to ``target`` for the pieces of ``(owner, version)`` still missing."""
        if (
            self._profiles.want(target, owner, version, count, now)
            and target not in self._pending_at
        ):
            self._pending_at[target] = now + self._rng.uniform(0, self.config.request_delay)

    def _recompute_known(self, now: float) -> None:
        """Derive the profiles known within the horizon from the neighbours' announcements."""
        known: dict[str, tuple[int, Profile]] = {}
        horizon = self.config.horizon
        for n in self._neighbours.values():
            if n.profile:
                known[n.host_id] = (1, n.profile)
        for n in self._neighbours.values():
            for host, (dist, prof) in n.relayed.items():
                d = dist + 1
                if host == self.host_id or d > horizon or not prof:
                    continue
                if host not in known or known[host][0] > d:
                    known[host] = (d, prof)
        if known.keys() == self._known.keys() and all(
            known[h][0] == self._known[h][0] and known[h][1].version == self._known[h][1].version
            for h in known
        ):
            return
        self._known = known
        for host in self._matcher.hosts():
            if host not in known:
                self._matcher.remove_profile(host)
        for host, (_, prof) in known.items():
            if self._matcher.set_profile(host, prof):
                self._offer_matches(host)  # what it now wants is offered first
                self._charge_matches(host, prof)
        self._interest_epoch += 1
        if self._matcher.fresh:  # a neighbour now wants something held here: offer it soon
            self._prompt(now)

    def _heard(self, sender: str, source: Hashable, now: float) -> None:
        n = self._neighbours.get(sender)
        if n is None:
            if len(self._neighbours) >= self._limits.max_neighbours:
                # Full: the one heard least recently goes (a host in range is heard at
                # least every announce period, so a crowd of names must keep talking to stay).
                stale = min(self._neighbours.values(), key=lambda x: x.last_heard)
                self._lose(stale.host_id)
                self._count("neighbours_displaced")
                self._recompute_known(now)
            n = Neighbour(sender, source, now, since=now)
            self._neighbours[sender] = n
            self._times.beacon_scale = 1.0
            self._events.append(NeighbourFound(sender, source))
            self._count("neighbours_found")
            self._met_host(sender)
            self._relays_due = True
            self._offer_matches(sender)  # back in range, profile already known
            self._flood_acks(now)
            prompt = now + self._rng.uniform(0, PROMPT_ANNOUNCE)
            if self._next_announce is None or self._next_announce > prompt:
                self._next_announce = prompt
        else:
            n.last_heard = now
            n.address = source

    def _charge_matches(self, host: str, prof: Profile) -> None:
        """Charge a known profile for the matcher's set of the cached messages it matches
        (256 names relaying 64 hosts each could otherwise make 16,640 such sets)."""
        self._profiles.charge_matches(host, prof.version, len(self._matcher.matching(host)))

    def _charge_all_matches(self) -> None:
        """Charge every known profile again for what it matches now (messages came and went
        since it was set)."""
        for host, (_, prof) in list(self._known.items()):
            self._charge_matches(host, prof)

    def _settle_known(self, now: float) -> None:
        """Derive the profiles known again if one was given up meanwhile (it happens deep
        inside other work, where deriving them at once would re-enter it)."""
        if self._known_stale:
            self._known_stale = False
            self._recompute_known(now)

    def _profile_given_up(self, host: str, version: int) -> None:
        """The remote-memory budget gave up a compiled profile: the neighbours holding it
        let it go too (so its memory is freed), until it is fetched again when named; the
        profiles known are derived again before the next datagram is handled."""
        self._profiles.drop(host, version)
        self._met_index = None  # it may hold that version: built again when next needed
        for n in self._neighbours.values():
            if n.host_id == host and n.version == version:
                n.profile, n.version = Profile(), None
                self._known_stale = True
            rel = n.relayed.get(host)
            if rel is not None and rel[1].version == version:
                n.relayed = {h: r for h, r in n.relayed.items() if h != host}
                self._known_stale = True

    def _lose(self, h: str) -> None:
        """Forget neighbour ``h`` and what was queued for it or asked of it."""
        self._remote.release("offers", h)
        del self._neighbours[h]
        self._times.beacon_scale = 1.0
        self._pending.pop(h, None)
        self._send_classes.clear()  # a requester gone: classes again
        self._send_keyed = -1
        for msg_id, asked in list(self._send_for.items()):
            asked.discard(h)
            if not asked:  # nobody left to send it to
                self._unqueue(msg_id)
        self._profiles.forget_target(h)
        self._pending_at.pop(h, None)
        self._events.append(NeighbourLost(h))
        self._count("neighbours_lost")

    def _relayed_for_announce(self, room: int) -> list[bytes]:
        """References to the profiles to relay (distance < horizon), rotating when they do
        not all fit; only profiles this node can serve the pieces of."""
        candidates = sorted((d, h) for h, (d, _) in self._known.items() if d < self.config.horizon)[
            : self._limits.max_relayed_profiles
        ]
        if not candidates:
            return []
        start = self._relay_rotation % len(candidates)
        out: list[bytes] = []
        for d, h in candidates[start:] + candidates[:start]:
            version = self._known[h][1].version
            hit = self._ref_cache.get(h)
            if hit is not None and hit[0] == d and hit[1] == version:
                enc = hit[2]
            else:
                pieces = self._pieces_of(h, version)
                if not pieces:
                    continue
                if hit is None and len(self._ref_cache) >= PROFILE_CACHE_HOSTS:
                    self._ref_cache.clear()
                enc = wire.encode_ref(wire.ProfileRef(h, d, version, len(pieces)))
                self._ref_cache[h] = (d, version, enc)
            if len(enc) > room:
                break
            out.append(enc)
            room -= len(enc)
        if len(out) < len(candidates):
            self._relay_rotation += len(out) or 1
        return out

    def _prompt(self, now: float) -> None:
        """Announce soon (jittered, at most once per ``PROMPT_GAP``) when neighbours are
        there to hear it: a profile change, or something a neighbour now wants."""
        if not self._neighbours:
            return
        at = max(now, self._times.last_announce + PROMPT_GAP) + self._rng.uniform(
            0, PROMPT_ANNOUNCE
        )
        if self._next_announce is None or at < self._next_announce:
            self._next_announce = at

    def _prompt_announce(self, msg_id: str, now: float) -> None:
        """Offer a new message soon when a neighbour may want it (rate-limited)."""
        if not self._neighbours or not (
            msg_id in self._matcher.eligible or any(n.altruistic for n in self._neighbours.values())
        ):
            return
        self._prompt(now)

    def _beacon(self, now: float) -> None:
        """Send a beacon if nothing else went out lately, and plan the next one a jittered
        beacon period after the last datagram sent (any datagram tells neighbours we are
        here, so a busy node sends no beacons). Among the same neighbours the period doubles
        after each beacon, up to ``announce_period`` (a settled group learns nothing from
        them); it is back to ``beacon_period`` when a neighbour comes or goes, and stays
        there while the node is alone — waiting for a contact is when beacons matter."""
        base, j = self.config.beacon_period, self.config.announce_jitter
        period = base * self._times.beacon_scale
        if self._outbox or self._times.last_sent + period * (1 - j) > now:
            last = now if self._outbox else self._times.last_sent
            self._next_beacon = last + period * self._rng.uniform(1 - j, 1 + j)
            return
        version, pieces = self._own_profile.version, len(self._own_pieces)
        if not self._beacon_bytes:  # a bare announcement, same bytes until the next round
            self._beacon_bytes = wire.encode_announce(
                self.host_id, self._seq, self.config.altruistic, version, pieces, (), (), True
            )
        self._outbox.append(self._beacon_bytes)
        self._count("beacons_sent")
        if self._neighbours:
            most = max(1.0, self.config.announce_period / base)
            self._times.beacon_scale = min(self._times.beacon_scale * 2, most)
        else:
            self._times.beacon_scale = 1.0
        self._next_beacon = now + base * self._times.beacon_scale * self._rng.uniform(1 - j, 1 + j)

    def _announce(self, now: float) -> None:
        self._seq += 1
        self._times.last_announce = now
        self._beacon_bytes = b""
        version, pieces = self._own_profile.version, len(self._own_pieces)
        bare = wire.announce_overhead(self.host_id, self._seq, pieces)
        relayed = self._relayed_for_announce(self.config.max_datagram // 2 - bare)
        # The relayed list is soft state too, but it rarely changes: sent in full when it
        # changed, when a neighbour arrived and every 4th round; otherwise a flag says "same".
        joined = b"".join(relayed)
        same = bool(relayed) and joined == self._relays_sent and not self._relays_due
        same = same and self._seq % 4 != 0
        if not same:
            self._relays_sent, self._relays_due = joined, False
        else:
            relayed = []
        base = bare + sum(len(r) for r in relayed)
        budget = self.config.max_datagram
        datagrams = self._catalog(now, budget - base - 4, budget)
        self._outbox.append(
            wire.encode_announce(
                self.host_id,
                self._seq,
                self.config.altruistic,
                version,
                pieces,
                relayed,
                datagrams[0],
                same,
            )
        )
        for entries in datagrams[1:]:
            if entries:
                self._outbox.append(wire.encode_catalog(self.host_id, self._seq, entries))
        self._count("announcements_sent")

    def _restarted(self, n: Neighbour, now: float) -> None:
        """Neighbour ``n`` restarted, faster than the neighbour timeout. The offers made to
        it while it was down count as made (repeated only on their backoff, up to 32
        periods) and what it said it holds is stale: forget the latter and offer again,
        as to a host that just arrived, what it and the hosts it relays want (everything,
        to an altruistic carrier). What it asked for stays queued: a restarted host keeps
        its partial sets, and a forger announcing under its name (heeded at most once an
        announce period per neighbour) cannot make this host drop what it serves."""
        self._count("neighbours_restarted")
        self._events.append(NeighbourRestarted(n.host_id, n.address))
        n.since = now
        self._remote.release("offers", n.host_id)
        self._offers_given_up(n.host_id)  # what it said it holds
        for host in dict.fromkeys([n.host_id, *n.refs]):
            self._offer_matches(host)
        if n.altruistic:
            self._offers.changed()
        self._relays_due = True
        prompt = now + self._rng.uniform(0, PROMPT_ANNOUNCE)
        if self._next_announce is None or self._next_announce > prompt:
            self._next_announce = prompt

    def _on_announce(self, dg: wire.Announce, now: float) -> None:
        n = self._neighbours[dg.sender]
        if dg.seq < n.seq and now - n.since >= self.config.announce_period:
            self._restarted(n, now)  # its announcements started over
        n.seq = dg.seq
        if n.altruistic != dg.altruistic:
            n.altruistic = dg.altruistic
            self._offers.changed()
        refs = {dg.sender: (0, dg.version, dg.pieces)}
        if dg.same_relays:  # unchanged since its last full list
            refs.update((h, v) for h, v in n.refs.items() if h != dg.sender)
        for r in dg.relayed:
            if r.host == self.host_id or r.distance < 1 or r.host in refs:
                continue
            refs[r.host] = (r.distance, r.version, r.pieces)
        n.refs = refs
        if self._resolve_refs(n, now):
            self._recompute_known(now)
        self._on_catalog_entries(n, dg.catalog, now)

    def _on_profile_piece(self, dg: wire.ProfilePiece, now: float) -> None:
        profile = self._profiles.received(dg, now, self._neighbours[dg.sender].address)
        if isinstance(profile, str):
            if profile != "kept":
                self._count(f"profile_pieces_{profile}")
            return
        self._count("profiles_assembled")
        changed = False
        for n in self._neighbours.values():
            if dg.owner in n.refs and self._resolve_refs(n, now):
                changed = True
        if changed:
            self._recompute_known(now)

    def _on_profile_request(self, dg: wire.ProfileRequest, now: float) -> None:
        if dg.target != self.host_id:
            # Overheard: the pieces will be broadcast, so drop them from our own request;
            # only when the target is a neighbour that named that profile (anyone else will
            # not answer, and suppressing would only delay ours).
            target = self._neighbours.get(dg.target)
            if target is None:
                return
            for owner, version, ranges in dg.entries:
                ref = target.refs.get(owner)
                if ref is None or ref[1] != version:
                    continue
                if self._profiles.overheard(owner, version, ranges, now):
                    self._count("profile_requests_suppressed")
            return
        address = self._neighbours[dg.sender].address
        tokens = start = self._serving.available(address, now)
        try:
            for owner, version, ranges in dg.entries:
                pieces = self._pieces_of(owner, version)
                if pieces is None:
                    continue
                for i in indexes(mask_of(ranges) & ((1 << len(pieces)) - 1)):
                    if tokens < 1:
                        self._count("requests_rate_limited")
                        return
                    tokens -= 1
                    data = wire.encode_profile_piece(
                        self.host_id, owner, version, len(pieces), i, pieces[i]
                    )
                    if len(data) > self.config.max_datagram:
                        self._count("profile_pieces_too_large")
                        continue
                    self._outbox.append(data)
                    self._count("profile_pieces_sent")
        finally:
            self._serving.spend(address, start - tokens)
