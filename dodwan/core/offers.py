"""What to offer in the next catalogs, best first, and when to offer it again.

A catalog used to rotate through everything eligible, round after round, so a host that
sat among the same neighbours re-sent the same offers forever: on a quiet island most bytes
on the air were offers nobody needed. Here a message is offered when it becomes worth
offering — new in the cache, completed, or matching the profile of a host that just
arrived, changed its profile, or came back in range — and then repeated with exponential
backoff (2, 4, 8, … up to 32 announcement periods) only to cover a lost catalog; the node
also skips offers every current neighbour already holds. Offering to an altruistic
carrier, which wants everything, starts a new *epoch*: the whole cache is due once. Due offers go first-offers before repeats, then the best first: what a host in range
itself subscribed to before what it would only carry, complete messages before partial
sets, persistent before
non-persistent, higher priority first, newest first (the send queues per priority of FJM2).
Pure bookkeeping: the node decides what is eligible.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

Rank = tuple[int, int, int, float]
"""Offer order, lowest first: (tier, 0 persistent / 1 not, -priority, -date), where tier is
0 wanted by a host in range and complete, 1 wanted and partial, 2 complete, 3 partial."""

MAX_DOUBLINGS = 5


class Offers:
    """Due offers (a heap by rank) and offers waiting for their next repeat (a heap by time)."""

    __slots__ = ("_due", "_filled", "_heap", "_later", "_offered", "_popped", "epoch", "period")

    def __init__(self, period: float) -> None:
        self.period = period
        """Base repeat interval (the announcement period)."""
        self.epoch = 0
        """Neighbourhood epoch; :meth:`changed` starts a new one."""
        self._filled = -1
        self._due: dict[str, tuple[int, Rank]] = {}  # id -> (0 first offer / 1 repeat, rank)
        self._heap: list[tuple[tuple[int, Rank], str]] = []
        self._later: list[tuple[float, str]] = []
        self._offered: dict[str, tuple[int, float, int]] = {}  # id -> (epoch, next, count)
        self._popped: tuple[str, tuple[int, Rank]] = ("", (0, (0, 0, 0, 0.0)))

    def changed(self) -> None:
        """An altruistic neighbour arrived: everything eligible is worth offering again."""
        self.epoch += 1

    def add(self, msg_id: str, rank: Rank, repeat: bool = False) -> None:
        """Make ``msg_id`` due (a new message, a completed one, a fresh interest; or, with
        ``repeat``, an offer made before in this epoch, which waits behind first offers)."""
        key = (1 if repeat else 0, rank)
        old = self._due.get(msg_id)
        if old is not None and old <= key:
            return
        self._due[msg_id] = key
        heapq.heappush(self._heap, (key, msg_id))
        if len(self._heap) > 2 * len(self._due) + 64:  # drop stale heap entries
            self._heap = [(r, k) for k, r in self._due.items()]
            heapq.heapify(self._heap)

    def forget(self, msg_id: str) -> None:
        """The message is gone from the cache."""
        self._due.pop(msg_id, None)
        self._offered.pop(msg_id, None)

    def refill(self, pool: Callable[[], Iterable[tuple[str, Rank]]]) -> None:
        """At a new epoch, make the whole eligible ``pool`` due (once per epoch)."""
        if self._filled == self.epoch:
            return
        self._filled = self.epoch
        for msg_id, rank in pool():
            self.add(msg_id, rank)

    def wake(self, now: float, rank_of: Callable[[str], Rank | None]) -> None:
        """Offers whose repeat time has come are due again (if still eligible)."""
        later = self._later
        while later and later[0][0] <= now:
            at, msg_id = heapq.heappop(later)
            rec = self._offered.get(msg_id)
            if rec is not None and rec[1] == at:
                rank = rank_of(msg_id)
                if rank is not None:
                    self.add(msg_id, rank, repeat=rec[0] == self.epoch)
        if len(later) > 2 * len(self._offered) + 64:
            self._later = [(t, k) for k, (_, t, _) in self._offered.items()]
            heapq.heapify(self._later)

    def pop(self) -> str | None:
        """The best due offer (no longer due once popped), or None."""
        heap = self._heap
        while heap:
            key, msg_id = heapq.heappop(heap)
            if self._due.get(msg_id) == key:
                del self._due[msg_id]
                self._popped = (msg_id, key)
                return msg_id
        return None

    def popped(self) -> tuple[str, tuple[int, Rank]]:
        """The offer :meth:`pop` just returned, with its place (to :meth:`restore` later)."""
        return self._popped

    def restore(self, popped: tuple[str, tuple[int, Rank]]) -> None:
        """Make a popped offer due again, as it was (first offer or repeat, same rank)."""
        msg_id, key = popped
        self._due[msg_id] = key
        heapq.heappush(self._heap, (key, msg_id))

    def unpop(self) -> None:
        """Put the offer :meth:`pop` just returned back, as it was (it did not fit)."""
        self.restore(self._popped)

    def offered(self, msg_id: str, now: float) -> None:
        """``msg_id`` was offered now (or found held by every neighbour): repeat later."""
        epoch, _, count = self._offered.get(msg_id, (-1, 0.0, 0))
        count = count + 1 if epoch == self.epoch else 1
        at = now + self.period * 2 ** min(count, MAX_DOUBLINGS)
        self._offered[msg_id] = (self.epoch, at, count)
        heapq.heappush(self._later, (at, msg_id))

    def __len__(self) -> int:
        return len(self._due)
