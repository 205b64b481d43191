"""The issue-14 reference routers (Epidemic, binary Spray-and-Wait, PRoPHET, MaxProp) with
The ONE's transfer physics or our medium's, on the contacts and messages of a scenario: the
contact trace it replays, or the contacts its own mobility makes (what a live run sees).

The issue's goal (0.56 delivered) is MaxProp's figure on The ONE's Helsinki map. PONS has
no MaxProp, and its physics are kinder or harsher than The ONE's (see
``bench_one.PONS_RADIOS``). This is a small message-level model of what The ONE's
``ActiveRouter`` does, so that the routers the issue names run on *our* contacts:

* physics ``one``: a host takes part in one transfer at a time, sending or receiving (The
  ONE's ``isTransferring``); physics ``medium``: a host sends one message at a time but
  receives from any number of senders at once, as our medium's radios do (no broadcast:
  every transfer is to one host); either way a message of ``size`` bytes takes
  ``size / rate`` seconds and is lost if the contact ends first;
* when a host is free it first offers messages whose destination is a free neighbour
  (``exchangeDeliverableMessages``), then what its router chooses; a receiver refuses a
  message it holds or had delivered, and makes room for a new one by its router's drop
  order when the transfer starts (``checkReceiving``); a destination does not store what
  is delivered to it;
* contacts come up and go down at the trace's (or the mobility's) times; discovery is
  instant (The ONE's connection events); messages expire at their deadline.

Routers (as their papers and The ONE describe them; written here, not ported):

* ``epidemic``: every message to every neighbour lacking it, oldest received first; drop
  the oldest received;
* ``spray``: binary Spray-and-Wait, 6 copies (The ONE's default): a copy with n > 1 hands
  ceil(n / 2) on and keeps floor(n / 2); with 1 it waits for the destination;
* ``prophet``: PRoPHET (Lindgren et al.) with The ONE's constants: delivery
  predictabilities raised at each meeting, aged every 30 s, passed on transitively; a
  message goes to a neighbour likelier to meet its destination, likeliest first (GRTRMax);
  drop the oldest received;
* ``maxprop``: MaxProp (Burgess et al., INFOCOM 2006): meeting probabilities (on meeting
  j, f(j) += 1 and normalise) exchanged at each contact with every host's newest vector
  heard; a message's cost is the cheapest path to its destination, each hop x -> y costing
  1 - f_x(y); messages within the hop-count threshold (the first bytes of the buffer in
  hop order, up to the average bytes a contact carried, at most half the buffer) go first
  by hop count, the rest by cost; drops from the other end; never to a host already on the
  message's path; delivery acknowledgements flooded at each contact purge the copies;
* ``maxprop1`` (not one of the issue's, and not run unless named): MaxProp with one-hop
  costs, 1 - f_peer(dst), no path through other hosts: what DoDWAN's own predictor
  (``unmet_copy_age``: contacts with the subscribers) can know.

Run: ``.venv/bin/python bench/reference_routers.py [--router maxprop] [--physics medium]
[--until S] [--seed N]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.mobility.contacts import link_changes  # noqa: E402
from sim.mobility.trace import load_trace, map_hosts  # noqa: E402
from sim.scenario import Scenario, load  # noqa: E402
from sim.traffic import as_events, schedule  # noqa: E402

ROUTERS = ("epidemic", "spray", "prophet", "maxprop")
EXTRA_ROUTERS = ("maxprop1",)
PHYSICS = ("one", "medium")
PROPHET_INIT, PROPHET_BETA, PROPHET_GAMMA, PROPHET_UNIT = 0.75, 0.25, 0.98, 30.0
"""PRoPHET's constants as The ONE's router takes them by default (P_enc max, transitivity,
aging per time unit of 30 s)."""
SPRAY_COPIES = 6


@dataclasses.dataclass(slots=True)
class Msg:
    mid: str
    src: int
    dst: int
    size: int
    created: float
    deadline: float


@dataclasses.dataclass(slots=True)
class Copy:
    msg: Msg
    hops: int
    received: float
    path: tuple[int, ...]
    copies: int = 1


@dataclasses.dataclass(slots=True)
class Host:
    idx: int
    capacity: int
    store: dict[str, Copy] = dataclasses.field(default_factory=dict)  # in order received
    used: int = 0
    nbrs: set[int] = dataclasses.field(default_factory=set)
    transfer: Transfer | None = None  # what it sends (physics one: or receives)
    seen: set[str] = dataclasses.field(default_factory=set)  # delivered here or acknowledged
    # MaxProp's meeting probabilities, PRoPHET's delivery predictabilities
    probs: dict[int, float] = dataclasses.field(default_factory=dict)
    known: dict[int, tuple[float, dict[int, float]]] = dataclasses.field(
        default_factory=dict
    )  # MaxProp
    aged: float = 0.0  # PRoPHET: when its predictabilities were last aged
    costs: dict[int, dict[int, float]] = dataclasses.field(default_factory=dict)  # from a host
    contact_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    avg_bytes: float = 0.0
    contacts_done: int = 0


@dataclasses.dataclass(slots=True)
class Transfer:
    sender: int
    receiver: int
    copy: Copy
    end: float


def trace_contacts(
    path: Path, fmt: str, hosts: list[str], until: float
) -> list[tuple[float, int, int, bool]]:
    """``(time, a, b, up)`` of a contact trace before ``until``, in time order, read as the
    simulator's replay reads it (``sim.mobility.trace``: The ONE's format or CSV, hosts by
    name or 0-based index)."""
    return [e for e in map_hosts(load_trace(path, fmt), hosts) if e[0] < until]


def mobility_contacts(sc: Scenario, until: float) -> list[tuple[float, int, int, bool]]:
    """``(time, a, b, up)`` of the links the scenario's own mobility makes before ``until``
    (``sim.mobility.contacts.link_changes``, what a live run of the scenario replays)."""
    n = len(sc.host_names())
    out: list[tuple[float, int, int, bool]] = []
    for t, up, down in link_changes(sc, sc.seed, until):
        if t >= until:
            break
        out.extend((t, c // n, c % n, False) for c in down.tolist())
        out.extend((t, c // n, c % n, True) for c in up.tolist())
    return out


class World:
    """The hosts, their contacts and transfers, and one router's decisions."""

    def __init__(
        self, router: str, n: int, capacity: int | list[int], rate: float, physics: str = "one"
    ) -> None:
        """``capacity``: every host's buffer in bytes, or one per host."""
        if router not in ROUTERS + EXTRA_ROUTERS:
            raise ValueError(
                f"unknown router {router!r} (one of {', '.join(ROUTERS + EXTRA_ROUTERS)})"
            )
        if physics not in PHYSICS:
            raise ValueError(f"unknown physics {physics!r} (one of {', '.join(PHYSICS)})")
        self.one_hop = router == "maxprop1"
        self.router = "maxprop" if self.one_hop else router
        self.exclusive = physics == "one"
        self.inflight: set[tuple[int, str]] = set()  # (receiver, message) under way
        self.rate = rate
        caps = capacity if isinstance(capacity, list) else [capacity] * n
        if len(caps) != n:
            raise ValueError(f"{len(caps)} capacities for {n} hosts")
        self.hosts = [Host(i, c) for i, c in enumerate(caps)]
        self.now = 0.0
        self.events: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self.relayed = 0
        self.delivered: dict[str, float] = {}
        self.aborted = 0
        self.acked: set[str] = set()

    # ------------------------------------------------------------------ event loop

    def at(self, t: float, kind: str, data: object) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, data))

    def run(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            t, _, kind, data = heapq.heappop(self.events)
            self.now = t
            if kind == "up":
                a, b = data  # type: ignore[misc]
                self.link_up(a, b)
            elif kind == "down":
                a, b = data  # type: ignore[misc]
                self.link_down(a, b)
            elif kind == "create":
                self.create(data)  # type: ignore[arg-type]
            elif kind == "done":
                self.transfer_done(data)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ physics

    def create(self, msg: Msg) -> None:
        h = self.hosts[msg.src]
        c = Copy(msg, 0, self.now, (msg.src,), SPRAY_COPIES if self.router == "spray" else 1)
        if self.make_room(h, msg.size):
            h.store[msg.mid] = c
            h.used += msg.size
        self.try_start(h)

    def link_up(self, a: int, b: int) -> None:
        ha, hb = self.hosts[a], self.hosts[b]
        ha.nbrs.add(b)
        hb.nbrs.add(a)
        if self.router == "maxprop":
            self.maxprop_meet(ha, hb)
        elif self.router == "prophet":
            self.prophet_meet(ha, hb)
        self.try_start(ha)
        self.try_start(hb)

    def link_down(self, a: int, b: int) -> None:
        ha, hb = self.hosts[a], self.hosts[b]
        ha.nbrs.discard(b)
        hb.nbrs.discard(a)
        for h in (ha, hb):
            tr = h.transfer
            if tr is not None and tr.sender == h.idx and {tr.sender, tr.receiver} == {a, b}:
                self.aborted += 1
                self.inflight.discard((tr.receiver, tr.copy.msg.mid))
                ha.transfer = None if ha.transfer is tr else ha.transfer
                hb.transfer = None if hb.transfer is tr else hb.transfer
        if self.router == "maxprop":
            for h, peer in ((ha, b), (hb, a)):
                sent = h.contact_bytes.pop(peer, 0)
                h.contacts_done += 1
                h.avg_bytes += (sent - h.avg_bytes) / min(h.contacts_done, 100)
        self.try_start(ha)
        self.try_start(hb)
        # neighbours may have waited for these two to be free, or for a transfer to one of
        # them that was just cut (The ONE tries again at every update)
        for p in list(ha.nbrs) + list(hb.nbrs):
            self.try_start(self.hosts[p])

    def transfer_done(self, tr: Transfer) -> None:
        s, r = self.hosts[tr.sender], self.hosts[tr.receiver]
        if s.transfer is not tr:
            return  # aborted when the contact ended
        s.transfer = None
        if r.transfer is tr:
            r.transfer = None
        self.inflight.discard((r.idx, tr.copy.msg.mid))
        self.relayed += 1
        msg = tr.copy.msg
        if self.router == "maxprop":
            s.contact_bytes[r.idx] = s.contact_bytes.get(r.idx, 0) + msg.size
            r.contact_bytes[s.idx] = r.contact_bytes.get(s.idx, 0) + msg.size
        if msg.dst == r.idx:
            if msg.mid not in self.delivered and self.now <= msg.deadline:
                self.delivered[msg.mid] = self.now
            r.seen.add(msg.mid)
            if self.router == "maxprop":
                self.acked.add(msg.mid)
                self.purge_acked(s, {msg.mid})
        elif msg.mid in s.store and msg.mid not in r.store and msg.mid not in r.seen:
            held = s.store[msg.mid]
            copies = math.ceil(held.copies / 2) if self.router == "spray" else 1
            if self.make_room(r, msg.size):
                if self.router == "spray":
                    held.copies -= copies
                r.store[msg.mid] = Copy(
                    msg, tr.copy.hops + 1, self.now, (*tr.copy.path, r.idx), copies
                )
                r.used += msg.size
        for h in (s, r):
            self.try_start(h)
        for p in list(s.nbrs) + list(r.nbrs):
            self.try_start(self.hosts[p])

    def expire(self, h: Host) -> None:
        for mid in [mid for mid, c in h.store.items() if c.msg.deadline <= self.now]:
            self.drop(h, mid)

    def drop(self, h: Host, mid: str) -> None:
        c = h.store.pop(mid)
        h.used -= c.msg.size

    def try_start(self, h: Host) -> None:
        """If ``h`` is free, start its next transfer to a neighbour that can receive, if any."""
        if h.transfer is not None or not h.nbrs:
            return
        self.expire(h)
        hosts = self.hosts
        free = sorted(p for p in h.nbrs if not self.exclusive or hosts[p].transfer is None)
        if not free:
            return
        for p in free:  # deliverable messages first
            for c in h.store.values():
                mid = c.msg.mid
                if c.msg.dst == p and mid not in hosts[p].seen and (p, mid) not in self.inflight:
                    self.start(h, hosts[p], c)
                    return
        if self.router in ("epidemic", "spray"):  # each message to any neighbour lacking it
            for c in self.order(h):
                for p in free:
                    if self.offer_to(h, hosts[p], c):
                        return
            return
        for p in free:  # PRoPHET and MaxProp order by what each neighbour can do
            peer = hosts[p]
            ordered = self.prophet_order(h, peer) if self.router == "prophet" else self.order(h, p)
            for c in ordered:
                if self.offer_to(h, peer, c):
                    return

    def offer_to(self, h: Host, peer: Host, c: Copy) -> bool:
        mid = c.msg.mid
        if mid in peer.store or mid in peer.seen or c.msg.dst == peer.idx:
            return False
        if (peer.idx, mid) in self.inflight:
            return False
        if self.router == "spray" and c.copies <= 1:
            return False
        if self.router == "maxprop" and peer.idx in c.path:
            return False
        if not self.make_room(peer, c.msg.size):
            return False
        self.start(h, peer, c)
        return True

    def start(self, h: Host, peer: Host, c: Copy) -> None:
        tr = Transfer(h.idx, peer.idx, c, self.now + c.msg.size / self.rate)
        h.transfer = tr
        if self.exclusive:
            peer.transfer = tr
        self.inflight.add((peer.idx, c.msg.mid))
        self.at(tr.end, "done", tr)

    # ------------------------------------------------------------------ routers

    # PRoPHET

    def prophet_age(self, h: Host) -> None:
        k = (self.now - h.aged) / PROPHET_UNIT
        if k > 0:
            f = PROPHET_GAMMA**k
            h.probs = {x: p * f for x, p in h.probs.items()}
            h.aged = self.now

    def prophet_meet(self, a: Host, b: Host) -> None:
        for h in (a, b):
            self.prophet_age(h)
        old = {a.idx: dict(a.probs), b.idx: dict(b.probs)}
        for h, peer in ((a, b), (b, a)):
            p = h.probs.get(peer.idx, 0.0)
            h.probs[peer.idx] = p + (1.0 - p) * PROPHET_INIT
            p_ab = h.probs[peer.idx]
            for c, p_bc in old[peer.idx].items():  # transitivity, from the peer's vector
                if c != h.idx:
                    h.probs[c] = max(h.probs.get(c, 0.0), p_ab * p_bc * PROPHET_BETA)

    def prophet_order(self, h: Host, peer: Host) -> list[Copy]:
        """GRTRMax: the messages whose destination the peer is likelier to meet, likeliest
        first."""
        self.prophet_age(h)
        self.prophet_age(peer)
        mine, theirs = h.probs, peer.probs
        better = [
            c for c in h.store.values() if theirs.get(c.msg.dst, 0.0) > mine.get(c.msg.dst, 0.0)
        ]
        better.sort(key=lambda c: -theirs.get(c.msg.dst, 0.0))
        return better

    def order(self, h: Host, peer: int | None = None) -> list[Copy]:
        """What ``h`` offers ``peer`` first (MaxProp: by the cost of the peer's paths to
        each destination, as ``h`` knows them); with no peer, what it keeps longest."""
        if self.router != "maxprop":
            return list(h.store.values())  # oldest received first
        head, rest = self.maxprop_split(h)
        costs = self.maxprop_costs(h, h.idx if peer is None else peer)
        rest.sort(key=lambda c: costs.get(c.msg.dst, math.inf))
        return head + rest

    def make_room(self, h: Host, size: int) -> bool:
        """Drop by the router's order until ``size`` more bytes fit; False if they cannot
        (a message being sent is never dropped)."""
        if size > h.capacity:
            return False
        if h.used + size <= h.capacity:
            return True
        self.expire(h)
        busy = h.transfer.copy.msg.mid if h.transfer and h.transfer.sender == h.idx else None
        if self.router == "maxprop":
            victims = list(reversed(self.order(h)))
        else:
            victims = list(h.store.values())  # oldest received first
        for c in victims:
            if h.used + size <= h.capacity:
                break
            if c.msg.mid == busy:
                continue
            self.drop(h, c.msg.mid)
        return h.used + size <= h.capacity

    # MaxProp

    def maxprop_meet(self, a: Host, b: Host) -> None:
        for h, peer in ((a, b), (b, a)):
            h.probs[peer.idx] = h.probs.get(peer.idx, 0.0) + 1.0
            total = sum(h.probs.values())
            h.probs = {k: v / total for k, v in h.probs.items()}
        now = self.now
        for h, peer in ((a, b), (b, a)):
            h.known[peer.idx] = (now, peer.probs)  # vectors are replaced, never changed
            for x, (t, vec) in peer.known.items():
                if x != h.idx and (x not in h.known or h.known[x][0] < t):
                    h.known[x] = (t, vec)
            h.costs.clear()
        acks = a.seen | b.seen
        for h in (a, b):
            self.purge_acked(h, acks)

    def purge_acked(self, h: Host, acks: set[str]) -> None:
        new = acks & self.acked
        h.seen |= new
        for mid in [mid for mid in h.store if mid in new]:
            if not (h.transfer and h.transfer.copy.msg.mid == mid):
                self.drop(h, mid)

    def maxprop_costs(self, h: Host, source: int) -> dict[int, float]:
        """Cheapest path cost from ``source`` to every host, as ``h`` knows the meeting
        probabilities, hops costing 1 - f_x(y)."""
        hit = h.costs.get(source)
        if hit is not None:
            return hit
        if self.one_hop:
            vec = h.probs if source == h.idx else h.known.get(source, (0.0, {}))[1]
            h.costs[source] = {y: 1.0 - p for y, p in vec.items()}
            return h.costs[source]
        vectors = {x: vec for x, (_, vec) in h.known.items()}
        vectors[h.idx] = h.probs
        dist: dict[int, float] = {source: 0.0}
        heap = [(0.0, source)]
        done: set[int] = set()
        while heap:
            d, x = heapq.heappop(heap)
            if x in done:
                continue
            done.add(x)
            for y, p in vectors.get(x, {}).items():
                nd = d + 1.0 - p
                if nd < dist.get(y, math.inf):
                    dist[y] = nd
                    heapq.heappush(heap, (nd, y))
        h.costs[source] = dist
        return dist

    def maxprop_split(self, h: Host) -> tuple[list[Copy], list[Copy]]:
        """The buffer's head (within the hop-count threshold, by hop count) and the rest."""
        threshold = min(h.avg_bytes, h.capacity / 2)
        head: list[Copy] = []
        rest: list[Copy] = []
        total = 0
        for c in sorted(h.store.values(), key=lambda c: (c.hops, c.received)):
            total += c.msg.size
            (head if total <= threshold else rest).append(c)
        return head, rest


def scenario_contacts(sc: Scenario, until: float) -> list[tuple[float, int, int, bool]]:
    """``(time, a, b, up)`` of the scenario's contacts before ``until``: the trace it
    replays, else those its own mobility makes."""
    if sc.contacts is not None:
        return trace_contacts(sc.contacts.path, sc.contacts.format, sc.host_names(), until)
    return mobility_contacts(sc, until)


def simulate(
    sc: Scenario,
    router: str,
    until: float,
    physics: str = "one",
    contacts: list[tuple[float, int, int, bool]] | None = None,
) -> dict[str, float]:
    """One router on the scenario's contacts (``scenario_contacts``, unless given) and
    messages; its figures."""
    names = sc.host_names()
    pubs = schedule(sc, names, until)
    rate = sc.radio.bit_rate / 8
    capacity = [g.protocol.cache_capacity for g in sc.groups for _ in range(g.count)]
    w = World(router, len(names), capacity, rate, physics)
    if contacts is None:
        contacts = scenario_contacts(sc, until)
    for t, a, b, up in contacts:
        w.at(t, "up" if up else "down", (a, b))
    ttls = {p.ttl for p in pubs}
    if len(ttls) > 1:
        raise ValueError(f"{sc.name}: messages with different TTLs ({sorted(ttls)[:3]} ...)")
    ttl = ttls.pop() if ttls else 3600.0
    msgs = [Msg(mid, src, dst, size, t, t + ttl) for t, mid, src, dst, size in as_events(sc, pubs)]
    for m in msgs:
        w.at(m.created, "create", m)
    t0 = time.process_time()
    w.run(until)
    delays = [w.delivered[m.mid] - m.created for m in msgs if m.mid in w.delivered]
    n = len(w.delivered)
    return {
        "messages": len(msgs),
        "delivered": n,
        "ratio": n / len(msgs) if msgs else 0.0,
        "relayed": w.relayed,
        "overhead": (w.relayed - n) / n if n else math.inf,
        "median_delay": statistics.median_low(delays) if delays else math.nan,
        "aborted": w.aborted,
        "cpu": time.process_time() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "one_default_trace.toml")
    ap.add_argument("--router", action="append", choices=ROUTERS + EXTRA_ROUTERS)
    ap.add_argument("--physics", choices=PHYSICS, default="one")
    ap.add_argument("--until", type=float)
    ap.add_argument("--seed", type=int)
    args = ap.parse_args(argv)
    sc = load(args.scenario)
    if args.seed is not None:
        sc = dataclasses.replace(sc, seed=args.seed)
    until = float(sc.duration if args.until is None else args.until)
    contacts = scenario_contacts(sc, until)
    for router in args.router or list(ROUTERS):
        r = simulate(sc, router, until, args.physics, contacts)
        print(
            f"{router:9} delivered {r['delivered']:5} of {r['messages']} ({r['ratio']:.3f}), "
            f"relayed {r['relayed']:6}, ONE overhead {r['overhead']:6.1f}, "
            f"median delay {r['median_delay']:7.0f} s, aborted {r['aborted']:6}, "
            f"{r['cpu']:.1f} s CPU",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
